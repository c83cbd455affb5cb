"""From ``--draft NAME`` to a drafter factory: EAGLE heads (EAGLE-1/2, EAGLE-3), Medusa heads or a standalone model.

Everything that can fail is checked before the caller changes anything: a head that does not fit
the target raises DraftLoadError with one line, and the session (or the loading screen) keeps
what it had.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine import methods
from engine.drafters.eagle_checkpoint import DraftLoadError, HeadKind, guess_kind, is_eagle_config, read_head
from engine.drafters.medusa_checkpoint import is_medusa_config, medusa_layout, read_medusa, read_medusa_state
from engine.features import FeatureSpec
from engine.method_spec import resolve


@dataclass
class DraftBundle:
    """What a session needs to draft with a loaded draft."""

    method: str  # the registered method it drafts for (one that takes a draft)
    factory: Callable[[], Any]  # a new Drafter
    features: FeatureSpec | None  # target states the drafter reads
    description: str  # one line for the UI: what was loaded


def shipped_heads(model_key: str) -> dict[str, Path]:
    """Method -> the head shipped for this model (only those present), from the registrations."""
    found = {m.name: m.draft.shipped.get(model_key) for m in methods.all_methods() if m.draft is not None}
    return {m: p for m, p in found.items() if p is not None and (p / "config.json").is_file()}


def shipped_methods() -> tuple[str, ...]:
    """The methods a head is shipped for, for some model (shipped_heads says which are there)."""
    return tuple(m.name for m in methods.all_methods() if m.draft is not None and m.draft.shipped)


def feature_spec(method: str, capture_layers: tuple[int, ...] = ()) -> FeatureSpec | None:
    """The target states ``method``'s registration says its drafter reads (``capture_layers``: the
    layers a head names, for one that reads layers)."""
    spec = methods.get(method)
    if spec is None or spec.features is None:
        return None
    if spec.features == "layers":
        return FeatureSpec(capture_layers=capture_layers)
    return FeatureSpec(final_hidden=True)


@dataclass
class Checked:
    """A draft read and checked against the target's config (:func:`_check`): what to build."""

    kind: str  # the method it drafts for
    label: str
    path: Path
    config: dict[str, Any]
    state: dict[str, torch.Tensor]
    parts: tuple[Any, ...] = ()  # medusa: (spec, weights); eagle heads: (spec, weights, hot token ids)


def check_draft(source: str, target_config: Any, *, method: str | None = None, allow_pickle: bool = False,
                revision: str | None = None, token_map: str | None = None) -> tuple[str, Path]:
    """Every check of :func:`load_draft` that needs only files, against ``target_config`` (the
    target's LlamaConfig, read from its config.json or GGUF header): the draft exists, its format
    (a pickle needs ``allow_pickle``), its kind against ``method``, its widths and every weight's
    shape (read from the safetensors headers, no weights), the token map. Run before the target
    loads, so a head that does not fit is refused in seconds, not after minutes of loading.
    Returns the draft's kind and folder (a standalone draft's tokenizer and size are checked next:
    :func:`check_standalone`)."""
    found = _check(source, target_config, method=method, allow_pickle=allow_pickle, revision=revision,
                   token_map=token_map, header=True)
    return found.kind, found.path


def check_standalone(path: Path, label: str, target_config: Any, target_tokenizer: Any) -> str:
    """A standalone draft against the target, from files: its tokenizer must be the target's
    (``target_tokenizer``: a Tokenizer, a GGUF's token list, or None where it is known only once
    loaded), else DraftLoadError. Returns one warning line where the draft is no smaller than the
    target ("" otherwise): such a draft cannot pay (each drafted token costs a target forward or
    more), but the tests and benchmarks of the drafting machinery run random drafts of that size."""
    from engine.models.checkpoint import read_config

    if isinstance(target_tokenizer, list):
        if {t: i for i, t in enumerate(target_tokenizer)} != draft_tokenizer(path, label).backend.get_vocab():
            raise _other_tokenizer(label)
    elif target_tokenizer is not None:
        check_same_tokenizer(draft_tokenizer(path, label), target_tokenizer, label)
    draft = standalone_config(read_config(path), label)[0]
    if body_params(draft) < body_params(target_config):
        return ""
    return (f"the standalone draft {label} ({draft.num_layers} layers of {draft.hidden_size}) is no smaller than the "
            f"target ({target_config.num_layers} of {target_config.hidden_size}): it cannot pay; pick a smaller model "
            "of the same family")


def body_params(config: Any) -> int:
    """Weights of the decoder layers (embeddings left out): what one token's forward streams, to
    compare a draft's cost with the target's."""
    h, q, kv = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return config.num_layers * (2 * h * q + 2 * h * kv + 3 * h * config.intermediate_size)


def load_draft(source: str, target: Any, tokenizer: Any, *, method: str | None = None, allow_pickle: bool = False,
               revision: str | None = None, token_map: str | None = None) -> DraftBundle:
    """Load ``source`` (a local folder or a hub id) as a drafter for ``target`` (a LlamaModel).

    ``method`` None infers eagle / eagle3 / medusa / standalone from the checkpoint.
    """
    if not hasattr(target, "embed_tokens") or not hasattr(target, "config"):
        raise DraftLoadError("draft models need specchat's own forward for the target; drop --backend hf")
    found = _check(source, target.config, method=method, allow_pickle=allow_pickle, revision=revision,
                   token_map=token_map, header=False, stored=getattr(target, "weights", "fp32") == "stored")
    return resolve(methods.get(found.kind).draft.load)(found, target, tokenizer)  # type: ignore[union-attr]


def _check(source: str, target_config: Any, *, method: str | None, allow_pickle: bool, revision: str | None,
           token_map: str | None, header: bool, stored: bool = False) -> Checked:
    """Read ``source`` (``header``: config.json and the weights' headers only) and check it
    against ``target_config``; DraftLoadError (one line) at the first thing that does not fit.

    ``stored``: the target keeps its weights as stored, and so does the draft: a GGUF draft is read
    in place, its blocks kept, not converted to fp32 safetensors. Why: a standalone draft model
    streams its weights once a level; as fp32 the Qwen2.5-Coder 0.5B (a 491 MB file) read ~2 GB a
    level, where its 1.5B target reads ~1.1 GB a whole step. The header check reads a GGUF's tensor
    names and shapes in place too (nothing converted before the target loads)."""
    from engine.models.checkpoint import CheckpointError, load_state_dict, read_config, read_state_header
    from engine.models.gguf_convert import GGUFConversionError
    from engine.models.resolve import ModelResolutionError, resolve_model

    if method is not None and not methods.takes_draft(method):
        raise DraftLoadError(f"--draft goes with --method {methods.listed(sorted(methods.draft_methods()))}, "
                             f"not {method!r}")
    try:
        resolved = resolve_model(source, revision=revision, allow_pickle=allow_pickle,
                                 weights="stored" if stored or header else "fp32")
        config = read_config(resolved.path)
        medusa = is_medusa_config(config)
        read_state = read_state_header if header else load_state_dict
        if resolved.gguf is not None:
            from engine.models.gguf_weights import gguf_state_header, load_gguf_state

            state = gguf_state_header(resolved.gguf) if header else load_gguf_state(resolved.gguf)[1]
        else:
            state = (read_medusa_state(resolved.path, allow_pickle=allow_pickle, header=header) if medusa
                     else read_state(resolved.path, allow_pickle=allow_pickle))
    except (ModelResolutionError, CheckpointError, DraftLoadError, GGUFConversionError) as e:
        raise DraftLoadError(f"draft {source}: {e}") from None
    label = resolved.name or source
    found = Checked("", label, resolved.path, config, state)
    claimed = _claimed(found, target_config, method=method, token_map=token_map)
    if claimed is not None:
        return claimed
    kind: HeadKind | None = guess_kind(config, set(state))
    if medusa or (kind is None and medusa_layout(set(state)) is not None):
        if method not in (None, "medusa"):
            raise DraftLoadError(f"{label} holds Medusa heads, not an {method} draft; use --method medusa")
        if token_map:
            raise DraftLoadError("--speculative-token-map applies to EAGLE-1/2 heads only (vLLM Medusa heads carry "
                                 "their own token_map)")
        found.kind, found.parts = "medusa", read_medusa(config, state, target=target_config, source=label)
        return found
    if method == "medusa":
        what = {"eagle": "an EAGLE-1/2 head", "eagle3": "an EAGLE-3 head", None: "not a Medusa head"}[kind]
        hint = f"; use --method {kind}" if kind else " (no medusa_num_heads in its config.json, no Medusa weights)"
        raise DraftLoadError(f"{label} is {what}{hint}")
    if kind is None and not is_eagle_config(config):
        if method in ("eagle", "eagle3"):
            raise DraftLoadError(f"{label} is a full language model, not an EAGLE head; use --method standalone")
        if token_map:
            raise DraftLoadError("--speculative-token-map applies to EAGLE-1/2 heads only")
        found.kind, found.parts = "standalone", (standalone_config(config, label),)
        return found
    if method == "standalone":
        raise DraftLoadError(f"{label} is an EAGLE head, not a language model; use --method {kind or 'eagle3'}")
    spec, weights = read_head(config, state, kind=method, target=target_config, source=label)  # type: ignore[arg-type]
    hot = None
    if token_map:
        if spec.kind != "eagle":
            raise DraftLoadError("--speculative-token-map applies to EAGLE-1/2 heads (EAGLE-3 heads carry their "
                                 "own vocabulary map)")
        from engine.drafters.eagle_checkpoint import load_token_map

        hot = load_token_map(token_map, target_config.vocab_size)
    found.kind, found.parts = spec.kind, (spec, weights, hot)
    return found


def _claimed(found: Checked, target_config: Any, *, method: str | None, token_map: str | None) -> Checked | None:
    """A draft a registration with its own format claims (``DraftSpec.claims``), read and checked
    by its ``read``; None for the formats told apart below (EAGLE, Medusa, a language model)."""
    for spec in methods.all_methods():
        if spec.draft is None or not spec.draft.claims:
            continue
        if not resolve(spec.draft.claims)(found.config):
            if method == spec.name:
                raise DraftLoadError(f"{found.label} is not a {spec.name} draft")
            continue
        if method not in (None, spec.name):
            raise DraftLoadError(f"{found.label} holds a {spec.name} draft, not an {method} draft; "
                                 f"use --method {spec.name}")
        if token_map:
            raise DraftLoadError("--speculative-token-map applies to EAGLE-1/2 heads only")
        found.kind = spec.name
        found.parts = tuple(resolve(spec.draft.read)(found.config, found.state, target_config, found.label))
        return found
    return None


def standalone_config(config: dict[str, Any], label: str) -> Any:
    """A standalone draft's parsed config (and model class); DraftLoadError for one we do not run."""
    from engine.models.families import model_for_config
    from engine.models.llama_config import UnsupportedModelError

    try:
        return model_for_config(config)
    except UnsupportedModelError as e:
        raise DraftLoadError(f"draft {label}: {e}") from None


def draft_tokenizer(path: Path, label: str) -> Any:
    from engine.tokenizer import Tokenizer, TokenizerError

    try:
        return Tokenizer.from_dir(path)
    except (TokenizerError, OSError) as e:
        raise DraftLoadError(f"draft {label} has no usable tokenizer ({e}); a standalone draft must share the "
                             "target's tokenizer") from None


def check_same_tokenizer(draft: Any, target: Any, label: str) -> None:
    if not same_tokenizer(draft, target):
        raise _other_tokenizer(label)


def _other_tokenizer(label: str) -> DraftLoadError:
    return DraftLoadError(f"draft {label} uses a different tokenizer than the target; a standalone draft must "
                          "share the target's vocabulary (pick a smaller model of the same family)")


def same_tokenizer(a: Any, b: Any) -> bool:
    """Same vocabulary, same ids, same stop tokens."""
    try:
        return bool(a.backend.get_vocab() == b.backend.get_vocab() and a.stop_token_ids == b.stop_token_ids)
    except AttributeError:
        return bool(a.vocab_size == b.vocab_size)
