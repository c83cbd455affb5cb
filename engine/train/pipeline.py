"""``specchat train-draft``: from a model name to an exported EAGLE-3 head, resumable at every stage.

Stages: resolve the target, generate (or reuse) self-distilled data in the user cache, build the
draft vocabulary, train with the target's features computed on the fly, export. Every stage can
be interrupted; ``--resume`` continues from the last checkpoint in the output folder.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import MissingFileError
from engine.train.data import (
    FEATURE_FILES,
    HIDDEN_FILES,
    DataCache,
    GenSettings,
    builtin_prompt_file,
    generate_data,
    load_prompt_list,
)


@dataclass
class Target:
    hf: torch.nn.Module  # transformers causal LM: training features (and generation on a GPU)
    tokenizer: Any
    name: str
    model_id: str  # identifies the exact weights (part of the data cache key)
    engine: Any = None  # our LlamaModel on CPU: generates the data ~2.5x faster than hf's batches
    former_ids: tuple[str, ...] = ()  # ids the same weights had before (data written then is resumed)

    @property
    def generator_model(self) -> Any:
        return self.engine if self.engine is not None else self.hf


def load_target(name: str | None, *, device: str = "cpu", revision: str | None = None) -> Target:
    from transformers import AutoModelForCausalLM

    from engine.models.resolve import resolve_model, weights_ids
    from engine.tokenizer import Tokenizer

    resolved = resolve_model(name, revision=revision)
    model_id, *former = weights_ids(resolved.path)
    hf = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch.float32).to(device).eval()
    for p in hf.parameters():
        p.requires_grad_(False)
    engine = None
    if device == "cpu":
        from engine.loader import load_model
        from engine.models.llama import UnsupportedModelError

        try:
            engine = load_model(name, backend="specchat", revision=revision, threads=torch.get_num_threads()).model
        except UnsupportedModelError:
            engine = None  # an architecture our engine does not run: transformers generates
    return Target(hf, Tokenizer.from_dir(resolved.path), resolved.name, model_id, engine, tuple(former))


def data_folder(target: Target, settings: GenSettings) -> Path:
    """The data cache for these weights and settings: a folder written under one of the weights'
    former ids if there is one (so ``--resume`` goes on with it), else the current id's."""
    from engine.models.resolve import cache_dir

    folders = [cache_dir() / "train-data" / settings.digest(i) for i in (target.model_id, *target.former_ids)]
    return next((f for f in folders if f.is_dir()), folders[0])


def prompt_list_and_digest(prompts: str | None, use_builtin: bool = True) -> tuple[list, str]:
    files = [Path(prompts)] if prompts else []
    if use_builtin:
        files.append(builtin_prompt_file())
    rows: list = []
    h = hashlib.sha256()
    for f in files:
        rows += load_prompt_list(f)
        h.update(f.read_bytes())
    return rows, (h.hexdigest()[:16] if files else "")


def prepare_data(target: Target, settings: GenSettings, token_budget: int, prompts: str | None = None,
                 *, use_builtin_prompts: bool = True, aux_layer_ids: list[int] | None = None, rows: int = 48,
                 precision: str = "auto", import_from: Sequence[str | Path] = (), hidden_only: bool = False,
                 budget_features: bool = False, features: bool = True, log=print) -> tuple[list, DataCache]:
    """Generate (resuming) until the cache holds ``token_budget`` answer tokens.

    On our native CPU engine the rows engine generates many conversations per forward and
    stores the target's features for ``aux_layer_ids`` beside them, in the fast precision where
    this CPU has it (``precision="auto"``; its answers differ from exact ones only where two tokens
    are nearly tied, which does not matter to a draft head); elsewhere the one-at-a-time
    (or transformers-batched) path writes ids only and training runs the target itself.
    ``hidden_only`` (Medusa) captures only the last hidden state and argmax in new shards; the
    cache folder is the same, so an EAGLE-3 run later fills in the features it lacks.
    ``budget_features`` (a trainer that reads only its first ``token_budget`` training tokens):
    imported shards get features only until they hold that many, as Medusa's always do.
    ``features`` False (training runs the target itself: ``--live-target``): imported shards
    get none.
    """
    from tqdm.auto import tqdm

    from engine.train.data_engine import fill_features, generate_data_rows
    from engine.train.eagle3_head import default_aux_layer_ids

    prompt_rows, digest = prompt_list_and_digest(prompts, use_builtin_prompts)
    settings.prompt_digest = digest
    engine = target.engine
    use_rows = engine is not None and getattr(engine, "runs_rows", False)
    aux = list(aux_layer_ids or default_aux_layer_ids(int(target.hf.config.num_hidden_layers)))
    if use_rows:
        if precision == "auto":
            precision = "fast" if engine.fast_available else "exact"
        engine.precision = precision
        settings.extra = {**settings.extra, "engine": "rows", "aux_layer_ids": aux, "precision": precision}
    folder = data_folder(target, settings)
    cache = DataCache(folder, target.hf.config.vocab_size)
    (folder / "settings.json").write_text(json.dumps({"model": target.name, "model_id": target.model_id,
                                                      **settings.__dict__}, indent=2))
    log(f"data cache: {folder}")
    for source in import_from:
        log(f"imported {import_shards(Path(source), cache)} shards of ids from {source}")
    bar = tqdm(total=token_budget, desc="generating data (answer tokens)", unit="tok", dynamic_ncols=True)
    start = time.monotonic()

    def progress(done: int, total: int) -> None:
        bar.n = done
        bar.set_postfix(rate=f"{done / max(time.monotonic() - start, 1e-6):.0f}/s", refresh=False)
        bar.refresh()

    if use_rows:
        log(f"data engine: {rows} conversations per forward, {precision} precision")
        capture = [] if hidden_only else [i + 1 for i in aux]
        samples = generate_data_rows(engine, target.tokenizer, cache, token_budget=token_budget, settings=settings,
                                     capture_layers=capture, prompt_list=prompt_rows, rows=rows, progress=progress)
        if features and not cache.has_features(samples, HIDDEN_FILES if hidden_only else FEATURE_FILES):
            bar.close()
            bar = tqdm(desc="target features (shards)", unit="shard", dynamic_ncols=True)

            def shards_done(done: int, total: int) -> None:
                bar.total = total
                bar.n = done
                bar.refresh()

            # imported or one-row shards; Medusa (and a budget_features run) trains on the first --tokens only
            filled = fill_features(engine, cache, capture_layers=capture, rows=rows, progress=shards_done,
                                   train_tokens=token_budget if hidden_only or budget_features else None)
            log(f"stored the target's features for {filled} shards")
            samples = cache.samples()
    else:
        samples = generate_data(target.generator_model, target.tokenizer, cache, token_budget=token_budget,
                                settings=settings, prompt_list=prompt_rows, progress=progress)
    bar.close()
    return samples, cache


def import_shards(source: Path, cache: DataCache) -> int:
    """Copy the id shards (``batch-*.npz``) of ``source`` that ``cache`` lacks: data generated on
    another machine (a GPU, an earlier session), whose features are then computed here.

    A shard whose bytes the cache already holds is skipped, so importing a folder again adds
    nothing; one whose name another shard holds (two folders both numbered from 0: the CPU's and
    the GPU's data) takes the next free number. Each copy is renamed into place whole, since a
    ``batch-*.npz`` marks a finished shard."""
    import os
    import shutil

    if not source.is_dir():
        raise MissingFileError(f"--import-data {source}: no such folder")
    held = {_file_digest(p) for p in cache.folder.glob("batch-*.npz")}
    free = 0
    copied = 0
    for shard in sorted(source.glob("batch-*.npz")):
        digest = _file_digest(shard)
        if digest in held:
            continue
        target = cache.folder / shard.name
        while target.exists():
            target = cache.folder / f"batch-{free:06d}.npz"
            free += 1
        part = cache.folder / f".import-{target.name}.tmp"
        shutil.copyfile(shard, part)
        os.replace(part, target)
        held.add(digest)
        copied += 1
    return copied


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
