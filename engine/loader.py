"""From a model name to a ready Session: resolve, load weights, pick the forward, build drafters."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.config import SpecConfig

ProgressCallback = Callable[[str, int, int], None]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


class LoadError(RuntimeError):
    """The model could not be loaded; the message is one line saying what to do."""


@dataclass
class LoadedModel:
    model: object  # LlamaModel or HFModel
    tokenizer: object  # engine.tokenizer.Tokenizer
    name: str
    path: str
    backend: str  # "specchat" (our forward) or "hf"


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LoadError(f"device {device!r} asked for but no CUDA GPU is visible; use --device cpu")
    return torch.device(device)


def pick_dtype(dtype: str) -> torch.dtype:
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise LoadError(f"unknown dtype {dtype!r}; choose float32 or bfloat16") from None


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


def load_model(
    model: str | None,
    *,
    dtype: str = "float32",
    device: str = "auto",
    backend: str = "auto",
    allow_pickle: bool = False,
    progress: ProgressCallback | None = None,
    threads: int | None = None,
    reserve_cores: int = 0,
    revision: str | None = None,
) -> LoadedModel:
    from engine.models.checkpoint import load_state_dict, read_config
    from engine.models.llama import LlamaConfig, LlamaModel, UnsupportedModelError
    from engine.models.resolve import resolve_model
    from engine.tokenizer import Tokenizer

    configure_threads(threads, reserve=reserve_cores)
    torch_device, torch_dtype = pick_device(device), pick_dtype(dtype)
    resolved = resolve_model(model, revision=revision, progress=progress)
    raw_config = read_config(resolved.path)
    tokenizer = Tokenizer.from_dir(resolved.path)
    if backend in ("auto", "specchat"):
        try:
            config = LlamaConfig.from_dict(raw_config)
        except UnsupportedModelError:
            if backend == "specchat":
                raise
            backend = "hf"
        else:
            if progress:
                progress("loading weights", 0, 1)
            state = load_state_dict(resolved.path, allow_pickle=allow_pickle)
            net = LlamaModel(config, state, dtype=torch_dtype, device=torch_device, consume=True)
            del state
            if progress:
                progress("loading weights", 1, 1)
            return LoadedModel(net, tokenizer, resolved.name, str(resolved.path), "specchat")
    from engine.models.hf import HFModel

    net = HFModel.from_pretrained(resolved.path, dtype=torch_dtype, device=torch_device)
    return LoadedModel(net, tokenizer, resolved.name, str(resolved.path), "hf")


def load_session(
    model: str | None,
    config: SpecConfig,
    *,
    progress: ProgressCallback | None = None,
    draft: str | None = None,
    dtype: str = "float32",
    device: str = "auto",
    backend: str = "auto",
    allow_pickle: bool = False,
    system_prompt: str | None = None,
    threads: int | None = None,
    reserve_cores: int = 0,
    revision: str | None = None,
):
    """Load everything a chat needs; raises LoadError / ModelResolutionError / ConfigError."""
    from engine.session import Session, default_drafters

    if draft is not None:
        raise LoadError("draft models (EAGLE heads, standalone drafts) are not supported yet; use --method ngram")
    loaded = load_model(model, dtype=dtype, device=device, backend=backend, allow_pickle=allow_pickle,
                        progress=progress, threads=threads, reserve_cores=reserve_cores,
                        revision=revision)
    return Session(loaded.model, loaded.tokenizer, config, model_name=loaded.name, model_path=loaded.path,
                   drafters=default_drafters(), system_prompt=system_prompt)
