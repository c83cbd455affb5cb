"""From a model name to a ready Session: resolve, load weights, pick the forward, build drafters."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import SpecConfig
from engine.errors import UserError

ProgressCallback = Callable[[str, int, int], None]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


class LoadError(UserError, RuntimeError):
    """The model could not be loaded; the message is one line saying what to do."""


@dataclass
class LoadedModel:
    model: object  # LlamaModel (or a subclass: Gemma3Model) or HFModel
    tokenizer: object  # engine.tokenizer.Tokenizer
    name: str
    path: str
    backend: str  # "specchat" (our forward) or "hf"
    source: str = ""  # "embedded", "local" or "hub"
    key: str = ""  # the embedded model's short name, for the assets shipped with it


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LoadError(f"device {device!r} asked for but no CUDA GPU is visible; use --device cpu")
    try:
        return torch.device(device)
    except RuntimeError:
        raise LoadError(f"--device {device!r} is not a device; use auto, cpu or cuda[:N]") from None


def pick_dtype(dtype: str, device: torch.device | None = None) -> torch.dtype:
    """``auto``: bfloat16 on a GPU (half the bytes to stream per token), float32 (the exact
    reference, and what our CPU kernels run) elsewhere."""
    if dtype.lower() == "auto":
        return torch.bfloat16 if device is not None and device.type == "cuda" else torch.float32
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise LoadError(f"unknown dtype {dtype!r}; choose auto, float32 or bfloat16") from None


def configure_threads(threads: int | None = None, *, reserve: int = 0) -> int:
    """Set torch's intra-op threads: ``threads``, else $SPECCHAT_THREADS / $OMP_NUM_THREADS, else
    all cores minus ``reserve``.

    Why reserve: a forward is ~120 matrix products, each ending in a barrier of all OpenMP
    threads. If another runnable thread (the TUI's event loop, a progress bar) takes one of those
    cores, every barrier waits a scheduler slice. Measured on a 2-core VM with other work running
    beside it: 2 threads gave 46-480 ms per token, 1 thread a steady 54 ms. On a quiet machine 2
    threads are faster (40 ms). The TUI used to reserve a core for its event loop; it now drains the
    engine at a frame rate and stays idle between frames, so it too uses every core (reserve 0).
    """
    if threads is None:
        env = os.environ.get("SPECCHAT_THREADS") or os.environ.get("OMP_NUM_THREADS")
        threads = int(env) if env and env.isdigit() else (os.cpu_count() or 1) - reserve
    torch.set_num_threads(max(1, threads))
    return torch.get_num_threads()


def threads_chosen(threads: int | None) -> bool:
    """Whether the user fixed the thread count (``--threads``, $SPECCHAT_THREADS, $OMP_NUM_THREADS)."""
    return threads is not None or any((os.environ.get(v) or "").isdigit() for v in ("SPECCHAT_THREADS",
                                                                                     "OMP_NUM_THREADS"))


def thread_governor(threads: int | None, model):
    """A :class:`engine.threads.ThreadGovernor` for a CPU model running on all cores by default
    (None where the user chose the count, on a GPU, with one core, or with SPECCHAT_THREAD_GOVERNOR=0)."""
    from engine.threads import ThreadGovernor

    full = torch.get_num_threads()
    if threads_chosen(threads) or full < 2 or getattr(model, "device", torch.device("cpu")).type != "cpu":
        return None
    if os.environ.get("SPECCHAT_THREAD_GOVERNOR", "1") == "0":
        return None
    return ThreadGovernor(full, torch.set_num_threads)


def resolve_precision(precision: str, *, weights: str = "stored", device: torch.device | None = None,
                      dtype: torch.dtype = torch.float32, backend: str = "auto") -> str:
    """"auto" -> "fast" where it runs (specchat's CPU forward on stored weights, a CPU with the fast
    kernel: measured 1.4x the exact decode on the embedded model, docs/BENCHMARKS.md), else
    "exact"; an explicit choice is checked (:func:`check_precision`) and returned."""
    if precision != "auto":
        check_precision(precision, weights=weights, device=device, dtype=dtype, backend=backend)
        return precision
    try:
        check_precision("fast", weights=weights, device=device, dtype=dtype, backend=backend)
    except LoadError:
        return "exact"
    return "fast"


def check_precision(precision: str, *, weights: str = "stored", device: torch.device | None = None,
                    dtype: torch.dtype = torch.float32, backend: str = "auto") -> None:
    """Refuse a precision this machine or these options cannot run, in one line, before loading."""
    if precision == "exact":
        return
    if precision != "fast":
        raise LoadError(f"unknown --precision {precision!r}; choose exact or fast")
    if backend == "hf" or weights != "stored" or (device is not None and device.type != "cpu") \
            or dtype != torch.float32:
        raise LoadError("--precision fast needs specchat's CPU forward on stored weights (--weights stored, "
                        "float32, no --backend hf); use --precision exact")
    from engine.kernels import native

    kernel = native.load()
    if kernel is None or kernel.fast_variant is None:
        why = native.why_not or "this CPU lacks AVX2"
        raise LoadError(f"--precision fast needs our native kernel ({why}); use --precision exact")


def load_model(
    model: str | None,
    *,
    dtype: str = "auto",
    device: str = "auto",
    backend: str = "auto",
    allow_pickle: bool = False,
    progress: ProgressCallback | None = None,
    threads: int | None = None,
    reserve_cores: int = 0,
    revision: str | None = None,
    weights: str = "stored",
    precision: str = "exact",
) -> LoadedModel:
    """``weights``: "stored" keeps GGUF blocks / bf16 / f16 as stored (decoded in our kernels, same
    logits); "fp32" upcasts once (GGUFs go through the cached fp32 safetensors conversion).
    ``precision``: "exact" (fp32 arithmetic), "fast" (8-bit activations, integer products on the
    stored blocks; engine/kernels/fast.c) or "auto" (fast where it runs), checked before the
    weights are read."""
    from engine.models.checkpoint import load_state_dict, read_config
    from engine.models.families import model_for_config
    from engine.models.llama_config import ModelConfigError, UnsupportedModelError
    from engine.models.resolve import resolve_model
    from engine.tokenizer import Tokenizer

    configure_threads(threads, reserve=reserve_cores)
    torch_device = pick_device(device)
    torch_dtype = pick_dtype(dtype, torch_device)
    if weights not in ("stored", "fp32"):
        raise LoadError(f"unknown --weights {weights!r}; choose stored or fp32")
    asked = precision
    precision = resolve_precision(precision, weights=weights, device=torch_device, dtype=torch_dtype,
                                  backend=backend)
    stored = (weights == "stored" and torch_device.type == "cpu" and torch_dtype == torch.float32
              and backend != "hf")
    resolved = resolve_model(model, revision=revision, progress=progress, weights="stored" if stored else "fp32",
                             backend=backend)
    raw_config = read_config(resolved.path)
    tokenizer = Tokenizer.from_dir(resolved.path)
    if backend in ("auto", "specchat"):
        try:
            config, model_class = model_for_config(raw_config)
        except ModelConfigError:
            raise  # a damaged config.json of a family we run: transformers would not run it either
        except UnsupportedModelError:
            if backend == "specchat":
                raise
            backend = "hf"
        else:
            if progress:
                progress("loading weights", 0, 1)
            if resolved.gguf is not None:
                from engine.models.gguf_weights import load_gguf_state

                state = load_gguf_state(resolved.gguf)[1]
            else:
                state = load_state_dict(resolved.path, allow_pickle=allow_pickle)
            net = model_class(config, state, dtype=torch_dtype, device=torch_device, consume=True,
                             weights="stored" if stored else "fp32")
            del state
            try:
                net.precision = precision
            except ValueError as exc:
                raise LoadError(str(exc)) from None
            if progress:
                progress("loading weights", 1, 1)
            key = "smollm2-135m" if resolved.source == "embedded" else ""
            return LoadedModel(net, tokenizer, resolved.name, str(resolved.path), "specchat", resolved.source, key)
    if asked == "auto":
        precision = "exact"  # `auto` picks what the model can run: transformers' forward computes in fp32
    elif precision != "exact":
        raise LoadError("the fast precision runs on specchat's own forward; this model needs --backend hf: "
                        "use --precision exact")
    from engine.models.hf import HFModel

    # a GGUF of a family only transformers runs: transformers reads (and dequantizes) it itself
    gguf = resolved.gguf if backend == "hf" else None
    net = HFModel.from_pretrained(resolved.path, dtype=torch_dtype, device=torch_device, gguf=gguf)
    return LoadedModel(net, tokenizer, resolved.name, str(resolved.path), "hf", resolved.source)


def load_session(
    model: str | None,
    config: SpecConfig,
    *,
    progress: ProgressCallback | None = None,
    draft: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    backend: str = "auto",
    allow_pickle: bool = False,
    system_prompt: str | None = None,
    threads: int | None = None,
    reserve_cores: int = 0,
    revision: str | None = None,
    token_map: str | None = None,
    draft_revision: str | None = None,
    method_from_draft: bool = False,
    given: Collection[str] = (),
    weights: str = "stored",
    precision: str = "exact",
    also: Sequence[str] = (),
    ngram_corpus: str = "auto",
):
    """Load everything a chat needs; raises LoadError / ModelResolutionError / ConfigError /
    DraftLoadError.

    ``draft``: an EAGLE head or a small model (folder or hub id). Without one, ``--method
    eagle3`` on the embedded model uses the head shipped for it, and that head is loaded anyway
    so the method can be chosen mid-chat (loaded, not run: the session captures the head's target
    features only while eagle3 drafts, so the baseline and n-gram forwards stay plain).
    ``method_from_draft``: run the method the draft implies (the user gave --draft without --method);
    the knobs in ``given`` (those the user set) keep their values, the others take that method's defaults
    (SpecConfig.with_method).
    ``ngram_corpus``: the n-gram drafter's corpus of the model's own answers: ``auto`` (the one
    shipped with the embedded model; for others, what ``train-draft --data-only`` generated for
    their weights, if anything), ``none``, or shard folders, comma-separated
    (engine/drafters/corpus_files.py).
    ``also``: other methods the caller will run (``--compare A,B``, bench's ``--methods``): the heads
    shipped for them are installed beside the draft, so two heads can be compared in one session.
    """
    from engine import methods
    from engine.drafters.draft_loader import load_draft, shipped_heads
    from engine.method_spec import resolve
    from engine.session import Session, default_drafters

    loaded = load_model(model, dtype=dtype, device=device, backend=backend, allow_pickle=allow_pickle,
                        progress=progress, threads=threads, reserve_cores=reserve_cores,
                        revision=revision, weights=weights, precision=precision)
    drafters = default_drafters()
    corpus = open_corpus(ngram_corpus, loaded)
    # the methods that read the corpus (the ngram_corpus knob) get it, built when they first draft
    corpus_methods = methods.reading("ngram_corpus")
    if corpus is not None:
        for name in corpus_methods:
            drafters[name] = functools.partial(_with_corpus, resolve(methods.get(name).drafter), corpus)
    features = None
    description = ""
    shipped = shipped_heads(loaded.key) if loaded.backend == "specchat" else {}
    source = draft_source(config.method, draft, shipped)
    if source is not None:
        if progress:
            progress("loading the draft", 0, 1)
        wanted = config.method if methods.takes_draft(config.method) and not method_from_draft else None
        bundle = load_draft(source, loaded.model, loaded.tokenizer, method=wanted, allow_pickle=allow_pickle,
                            revision=draft_revision, token_map=token_map)
        drafters[bundle.method] = bundle.factory
        features, description = bundle.features, bundle.description
        if method_from_draft:
            config = config.with_method(bundle.method, given)
        if progress:
            progress("loading the draft", 1, 1)
    if corpus is not None and config.method in corpus_methods:
        # the first chat drafts n-grams at once: index behind the loading screen (once per machine,
        # ~17 s on 2 cores), not beside the first answers, which it would slow by half. Before the
        # Session: it makes the first method's drafter, which would start the build unannounced
        corpus.wait_shown(progress)
    session = Session(loaded.model, loaded.tokenizer, config, model_name=loaded.name, model_path=loaded.path,
                      drafters=drafters, system_prompt=system_prompt, features=features,
                      calibrate_costs=os.environ.get("SPECCHAT_CALIBRATE", "1") != "0",
                      threads=thread_governor(threads, loaded.model))
    for method in dict.fromkeys(also):
        if method in shipped and method not in session.methods:
            extra = load_draft(str(shipped[method]), loaded.model, loaded.tokenizer, method=method)
            session.set_draft(extra.method, extra.factory, extra.features)
    session.draft_description = description
    session.ngram_corpus = corpus
    if config.method != "none" and config.adaptive_draft and session.calibrates:
        if progress:
            progress("measuring verify costs", 0, 1)
        session.cost_shape()  # now, behind the loading screen, not before the first answer
        if progress:
            progress("measuring verify costs", 1, 1)
    return session


def _with_corpus(make, corpus):
    """A corpus-reading drafter, made when its method first drafts (the corpus indexes then)."""
    return make(corpus=corpus.start())


def draft_source(method: str, draft: str | None, shipped: Mapping[str, Path]) -> str | None:
    """The draft a session loads: ``draft``, else the head ``shipped`` for ``method`` (under a method
    that takes no draft, the head of the method registered to preload, eagle3's, so that it can be
    chosen mid-chat), else None; LoadError (one line) for a draft method with neither. Also asked
    before the target loads (engine/preflight.py)."""
    from engine import methods

    if draft is not None:
        return draft
    preload = next((m.name for m in methods.all_methods() if m.draft is not None and m.draft.preload), "")
    head = method if method in shipped else "" if methods.takes_draft(method) else preload
    if head in shipped:
        return str(shipped[head])
    if methods.takes_draft(method):
        raise LoadError(f"--method {method} needs --draft (the folder or hub id of a {method} draft: a head, a "
                        "drafter, or for standalone a small model with the same tokenizer)")
    return None


def corpus_folders(spec: str) -> list[Path]:
    """The folders of ``--ngram-corpus DIR[,DIR]`` (not auto, not none)."""
    return [Path(p).expanduser() for p in spec.split(",") if p.strip()]


def open_corpus(spec: str, loaded: LoadedModel):
    """The n-gram corpus ``spec`` names for ``loaded`` (see :func:`load_session`), or None.
    Raises DraftLoadError for folders without shards or shards of another vocabulary."""
    from engine.drafters.corpus_files import CorpusHandle, generated_corpus, shipped_corpus
    from engine.models.resolve import cache_dir

    if spec == "none":
        return None
    if spec == "auto":  # the embedded model's shipped answers, else those train-draft generated here
        folders = shipped_corpus(loaded.key) if loaded.key else []
        if not folders and loaded.path:
            folders = generated_corpus(Path(loaded.path), cache_dir())
        if not folders:
            return None
    else:
        folders = corpus_folders(spec)
    return CorpusHandle(folders, int(loaded.model.config.vocab_size), cache_dir() / "ngram")
