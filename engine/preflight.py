"""The checks that need only files, run before the target model is read.

Why a module: reading a target takes seconds (the embedded model) to minutes (a big one from the
hub), and a draft head of the wrong width, a pickle without ``--allow-pickle``, a missing n-gram
corpus or a damaged config.json used to be refused only after that. Every check here reads small
files (the target's config.json or GGUF header, the draft's config.json and safetensors headers,
the token map, a folder listing) and calls the same check the loader makes later, so there is one
check per mistake, met early. What cannot be known without downloading (a hub model, a hub
draft) is left to the loader.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.models.llama_config import LlamaConfig, UnsupportedModelError

if TYPE_CHECKING:
    from engine.config import SpecConfig


def target_config(model: str | None, *, backend: str = "auto") -> LlamaConfig | None:
    """The target's parsed config, read from its config.json (a local folder) or its GGUF header
    (the embedded model, a .gguf file), and validated (ModelConfigError for nonsense values).

    None where it is not known from local files (a hub id), or our forward does not run the
    model (``--backend hf``, a family only transformers runs): the loader then speaks."""
    from engine.models.checkpoint import read_config
    from engine.models.families import model_for_config
    from engine.models.resolve import embedded_gguf, is_embedded, is_hub_id, resolve_model

    path = None if is_embedded(model) else Path(str(model).strip()).expanduser()
    local_gguf = path is not None and path.is_file() and path.suffix.lower() == ".gguf"
    if path is not None and not local_gguf and (path.exists() or not is_hub_id(str(model).strip())):
        # no such path, a folder without config.json or weights: the resolver's own line, no work done
        path = resolve_model(model, backend=backend).path
    if backend == "hf":
        return None
    if path is None:
        raw = _gguf_config(embedded_gguf()[0])
    elif local_gguf:
        raw = _gguf_config(path)
    elif path.is_dir() and (path / "config.json").is_file():
        raw = read_config(path)
    else:
        return None  # a hub id: known once downloaded
    if raw is None:
        return None
    try:
        return model_for_config(raw)[0]
    except UnsupportedModelError as exc:
        if backend == "specchat" or type(exc) is not UnsupportedModelError:
            raise  # a damaged config (ModelConfigError), or a family --backend specchat cannot run
        _check_transformers_knows(raw)
        return None  # a family transformers runs: the loader hands it over


def _check_transformers_knows(raw: dict[str, Any]) -> None:
    """A model_type neither we nor transformers run (a typo, a damaged config.json) is refused in one
    line now, instead of a transformers traceback after the weights are read."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = str(raw.get("model_type", ""))
    if model_type not in CONFIG_MAPPING_NAMES:
        raise UnsupportedModelError(f"config.json: model_type {model_type!r} is not a model family specchat or "
                                    "transformers runs; check the folder's config.json")


def _gguf_config(path: Path) -> dict[str, Any] | None:
    """The config.json a GGUF converts to, from its header; None for a family we do not run (the
    loader words that), GGUFFormatError / ModelResolutionError (one line) for a damaged file."""
    from engine.models.gguf_convert import ForeignArchitectureError, GGUFConversionError, config_from_header
    from engine.models.resolve import ModelResolutionError

    try:
        return config_from_header(path)
    except ForeignArchitectureError:
        return None
    except GGUFConversionError as exc:
        raise ModelResolutionError(f"cannot use {path.name}: {exc}") from None


def check_files(model: str | None, *, backend: str = "auto", method: str = "none", draft: str | None = None,
                draft_revision: str | None = None, token_map: str | None = None, ngram_corpus: str = "auto",
                allow_pickle: bool = False, method_from_draft: bool = False,
                answer: SpecConfig | None = None, warn: Callable[[str], None] | None = None
                ) -> LlamaConfig | None:
    """Every check :func:`engine.loader.load_session` makes that needs only files, with its
    arguments: the target's config, the n-gram corpus folders, a draft method's draft, and the
    draft itself against the target (format, pickle, kind, widths, weight shapes, token map).
    ``answer``: settings whose ``max_new_tokens`` the user gave, refused where longer than the
    context the config says (the session's own check, met before the weights open).
    ``warn``: takes one line about a draft that runs but cannot pay (a standalone draft no smaller
    than the target).
    Returns the target's config (None where it is not known before loading: see
    :func:`target_config`). Raises the loader's own UserErrors, each one line."""
    from engine import methods
    from engine.drafters.corpus_files import shard_files
    from engine.drafters.draft_loader import check_draft, shipped_heads
    from engine.loader import corpus_folders, draft_source
    from engine.models.resolve import EMBEDDED_NAME, is_embedded, is_hub_id

    config = target_config(model, backend=backend)
    if answer is not None and config is not None:
        from engine.conversation import check_answer_length

        check_answer_length(answer, config.max_position_embeddings)  # what LlamaModel.context_limit says
    if ngram_corpus not in ("auto", "none"):
        shard_files(corpus_folders(ngram_corpus))
    shipped = shipped_heads(EMBEDDED_NAME) if is_embedded(model) and backend != "hf" else {}
    draft_source(method, draft, shipped)  # a draft method without a draft (or a head shipped for it)
    if draft is None or config is None:
        return config
    if not Path(draft).expanduser().exists() and is_hub_id(draft):
        return config  # fetched and checked by the loader
    wanted = method if methods.takes_draft(method) and not method_from_draft else None
    kind, draft_path = check_draft(draft, config, method=wanted, allow_pickle=allow_pickle, revision=draft_revision,
                                   token_map=token_map)
    if kind == "standalone":
        _check_standalone(model, draft, draft_path, config, warn)
    return config


def _check_standalone(model: str | None, draft: str, draft_path: Path, config: LlamaConfig,
                      warn: Callable[[str], None] | None) -> None:
    """A standalone draft, from the files of both: not the target itself, the target's tokenizer
    (it was refused only once both models had loaded, 17-33 s in), and smaller than the target
    (else one warning line)."""
    from engine.drafters.draft_loader import DraftLoadError, check_standalone
    from engine.models.resolve import is_embedded

    target = None if is_embedded(model) else Path(str(model).strip()).expanduser()
    if target is not None and target.exists() and _same_model(target, (Path(draft).expanduser(), draft_path)):
        raise DraftLoadError(f"--draft {draft} is the target itself, which cannot draft faster than it answers; "
                             "pick a smaller model of the same family, or --method ngram")
    note = check_standalone(draft_path, draft, config, _target_tokenizer(target))
    if note and warn is not None:
        warn(note)


def _same_model(target: Path, drafts: Sequence[Path]) -> bool:
    """Whether a draft is the target: the same folder or GGUF file (by a link or a hard link too; ``drafts``:
    the path given and the folder it was read from, a GGUF's conversion), or a folder whose weights are
    the target's file."""
    weights = target / "model.safetensors"
    for draft in drafts:
        if draft.exists() and target.samefile(draft):
            return True
        theirs = draft / "model.safetensors"
        if weights.is_file() and theirs.is_file() and weights.samefile(theirs):
            return True
    return False


def _target_tokenizer(target: Path | None) -> Any:
    """What the target's tokenizer is, from its files: a Tokenizer (a folder), the token list of a
    GGUF's header, or None where only the loader knows it (the embedded model, a hub id)."""
    if target is None:
        return None
    if target.is_dir() and (target / "tokenizer.json").is_file():
        from engine.tokenizer import Tokenizer

        return Tokenizer.from_dir(target)
    if target.is_file() and target.suffix.lower() == ".gguf":
        from gguf import GGUFReader

        from engine.models.gguf_convert import read_metadata

        tokens = read_metadata(GGUFReader(str(target)), with_vocab=True).get("tokenizer.ggml.tokens")
        return list(tokens) if tokens else None
    return None
