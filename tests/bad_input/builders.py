"""The files a bad-input case needs, as small builders: each returns ``make(where)``.

Why builders rather than fixtures: a case is one row of data (tests/bad_input/cases.py); what it
needs on disk is part of that row. ``make`` receives a :class:`Where` (the case's own folder and the
shared tiny model) and writes under the case's folder only.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Where:
    tmp: Path  # the case's own folder: {tmp} in an argv
    model: Path  # the shared tiny model folder: {model} in an argv (never written to)


Make = Callable[[Where], None]


def text(name: str, content: str | bytes) -> Make:
    """A file of this content (bytes for undecodable ones)."""
    def make(w: Where) -> None:
        path = w.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return make


def jsonl(name: str, *rows: Any) -> Make:
    """A JSON-lines file, one row a line (a str row is written as is: a damaged line)."""
    return text(name, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def json_file(name: str, value: Any) -> Make:
    return text(name, json.dumps(value))


def folder(name: str) -> Make:
    def make(w: Where) -> None:
        (w.tmp / name).mkdir(parents=True, exist_ok=True)
    return make


def fifo(name: str) -> Make:
    """A named pipe: opening it for reading blocks until a writer comes (none will)."""
    def make(w: Where) -> None:
        os.mkfifo(w.tmp / name)
    return make


def symlink(name: str, target: str) -> Make:
    """A symbolic link to ``target`` (relative to the link's folder): dangling where nothing is there, a
    loop where ``target`` is the link itself."""
    def make(w: Where) -> None:
        (w.tmp / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, w.tmp / name)
    return make


def tiny_gguf(name: str, *, tokenizer: bool = True) -> Make:
    """A complete tiny llama GGUF (weights, tokenizer; a context of 256), as llama.cpp's converter writes one
    (``tokenizer=False``: without its vocabulary)."""
    def make(w: Where) -> None:
        from test_gguf_convert import write_tiny_gguf

        write_tiny_gguf(w.tmp / name, tokenizer=tokenizer)
    return make


def model_copy(name: str, config: dict[str, Any] | None = None, *, drop: tuple[str, ...] = (),
               weights: bytes | None = None) -> Make:
    """A copy of the tiny model with config.json fields changed (None removes a field), files left
    out, or model.safetensors replaced by these bytes."""
    def make(w: Where) -> None:
        out = w.tmp / name
        shutil.copytree(w.model, out)
        for f in drop:
            (out / f).unlink()
        if config:
            cfg = json.loads((out / "config.json").read_text())
            for key, value in config.items():
                if value is None:
                    cfg.pop(key, None)
                else:
                    cfg[key] = value
            (out / "config.json").write_text(json.dumps(cfg))
        if weights is not None:
            (out / "model.safetensors").write_bytes(weights)
    return make


def gguf(name: str, *, magic: bytes = b"GGUF", version: int = 3, n_tensors: int = 0, n_kv: int = 0,
         tail: bytes = b"") -> Make:
    """A GGUF file of just a header (crafted counts), then ``tail``."""
    return text(name, magic + struct.pack("<IQQ", version, n_tensors, n_kv) + tail)


def other_tokenizer(name: str) -> Make:
    """A copy of the tiny model whose tokenizer stops on another token: a vocabulary of its own in effect."""
    def make(w: Where) -> None:
        from test_tokenizer import write_tiny

        model_copy(name)(w)
        write_tiny(w.tmp / name, eos_token="<|endoftext|>")
    return make


def trace(name: str, *records: Any, header: dict[str, Any] | None = None) -> Make:
    """A trace: a specchat-trace header (or ``header``), then the records."""
    from specchat.tui.trace import make_header

    return jsonl(name, header if header is not None else make_header("tiny", "ngram", {}), *records)


def head(name: str, *, hidden: int | None = None, kind: str = "eagle3", pickle: bool = False) -> Make:
    """An EAGLE head for the tiny model (``hidden``: another width, a head for some other model)."""
    def make(w: Where) -> None:
        from heads import write_head

        target = json.loads((w.model / "config.json").read_text())
        if hidden is not None:
            target = {**target, "hidden_size": hidden}
        write_head(w.tmp / name, target, kind, pickle=pickle)
    return make


def dflash(name: str, *, target: dict[str, Any] | None = None, ids: list[int] | None = None,
           config: dict[str, Any] | None = None, draft_vocab: int | None = None) -> Make:
    """A DFlash drafter in the z-lab layout for the tiny model (2 layers: it reads the outputs of layers
    0 and 1 unless ``ids`` says otherwise); ``target``: fields of another model it was made for;
    ``config``: config.json fields changed (None removes one; ``dflash_config`` is replaced whole);
    ``draft_vocab``: the speculators layout with a reduced vocabulary of that many tokens instead."""
    def make(w: Where) -> None:
        from dflash_drafts import write_dflash, zlab_config

        model = json.loads((w.model / "config.json").read_text())
        made_for = {**model, **(target or {})}
        if draft_vocab is not None:
            write_dflash(w.tmp / name, made_for, layout="speculators", ids=ids or [0, 1], draft_vocab=draft_vocab)
            return
        cfg = zlab_config(made_for, ids=ids or [0, 1])
        for key, value in (config or {}).items():
            if value is None:
                cfg.pop(key, None)
            else:
                cfg[key] = value
        write_dflash(w.tmp / name, made_for, ids=ids or [0, 1], config=cfg)
    return make


def write_tiny_model(folder: Path) -> Path:
    """A complete tiny Llama folder (config.json, model.safetensors, a byte-level BPE tokenizer), built
    without transformers: random weights of the shape the config says."""
    import torch
    from safetensors.torch import save_file
    from test_tokenizer import write_tiny
    from tiny import family_config

    from engine.models.llama import LlamaConfig
    from engine.models.random_init import random_state_dict

    write_tiny(folder)
    from engine.tokenizer import Tokenizer

    vocab = Tokenizer.from_dir(folder).vocab_size
    cfg = {**family_config("llama"), "vocab_size": vocab, "num_hidden_layers": 2, "eos_token_id": None,
           "bos_token_id": None, "max_position_embeddings": 256}
    (folder / "config.json").write_text(json.dumps(cfg))
    state = random_state_dict(LlamaConfig.from_dict(cfg), torch.float32, "cpu")
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder
