"""``specchat bench --peers llamacpp``: llama.cpp on the same GGUF and the same prompt ids.

Why: llama.cpp is the usual CPU reference for GGUF models, so a user should see it beside our rows
in one run: plain greedy decoding and its prompt-lookup drafting, tokens/s and whether its greedy
output equals ours (its quantized dot products round activations to 8 bits, so it may not).

It runs through the optional ``llama-cpp-python`` package (``pip install llama-cpp-python``, or
the ``llamacpp`` extra); without it the peer refuses with one line saying so.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engine.prompts import Prompt
from specchat.bench_peers import peer_run, warm_kinds
from specchat.bench_report import Run
from specchat.options import UsageError

MISSING = ("--peers llamacpp needs the optional llama-cpp-python package: "
           "pip install llama-cpp-python (or pip install 'specchat[llamacpp]')")


def gguf_for(model: str | None) -> Path:
    """The GGUF file llama.cpp should load for our model name."""
    from engine.models.resolve import EMBEDDED_ALIASES, embedded_gguf

    if model is None or model.strip().lower() in EMBEDDED_ALIASES:
        return embedded_gguf()[0]
    path = Path(model).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path
    raise UsageError("--peers llamacpp compares on a GGUF file: use the embedded model or a path to a .gguf")


class LlamaCppPeer:
    """Two llama.cpp instances on one GGUF: plain greedy, and with prompt-lookup drafting."""

    kinds = ("plain", "prompt-lookup")  # its rows, in bench's order

    def __init__(self, plain: Any, lookup: Any, max_new_tokens: int) -> None:
        self.plain, self.lookup, self.max_new_tokens = plain, lookup, max_new_tokens

    def labels(self) -> list[str]:
        return ["llamacpp", "llamacpp-prompt-lookup"]

    @classmethod
    def open(cls, model: str | None, max_new_tokens: int, threads: int | None) -> LlamaCppPeer:
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError:
            raise UsageError(MISSING) from None
        import os

        path = str(gguf_for(model))
        n = threads or os.cpu_count() or 1
        common: dict[str, Any] = {"model_path": path, "n_ctx": 4096, "n_threads": n, "n_threads_batch": n,
                                  "verbose": False}
        plain = Llama(**common)
        lookup = Llama(**common, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))
        return cls(plain, lookup, max_new_tokens)

    def warm(self, session: Any, prompt: Prompt) -> None:
        """One short answer of each kind, untimed."""
        warm_kinds(self, session, prompt)

    def run(self, session: Any, prompt: Prompt, kind: str) -> Run:
        """Greedy answer on our prompt ids (steps 0, no prefill time: llama.cpp reports neither)."""
        tok = session.tokenizer
        stops = set(tok.stop_token_ids)
        llm = self.lookup if kind == "prompt-lookup" else self.plain
        out: list[int] = []
        t0 = time.perf_counter()
        for token in llm.generate(prompt.ids(tok), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                  reset=True):
            out.append(int(token))
            if token in stops or len(out) >= self.max_new_tokens:
                break
        return peer_run(out, stops, time.perf_counter() - t0)
