"""Running tokens through the target on top of its KV cache, in chunks: a prompt's prefill, and the
catch-up that gives every cached token its target features when a method that reads them starts.

Why chunks: a long prompt takes tens of seconds on a CPU; between chunks cancel() is honoured and
progress is reported. A chunk's size follows the measured speed so that one takes about
``CHUNK_S``. Rows are computed independently of how many share a forward, so chunking does not
change the cached K/V.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from typing import Any

import torch

from engine.events import PrefillProgress
from engine.features import FeatureCapture

CHUNK_S = 0.25  # a prefill chunk takes about this long, so cancel() acts within it
CHUNK_MIN, CHUNK_MAX = 16, 4096


class ChunkedPrefill:
    """Chunked forwards over one target; ``chunk`` adapts to the measured speed."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.chunk = 64

    def run(self, tokens: list[int], cache: Any, capture: FeatureCapture, cancel: threading.Event
            ) -> Generator[PrefillProgress, None, torch.Tensor | None]:
        """Run ``tokens`` on top of the cache; returns the last token's logits, or None when
        ``cancel`` came first (the cache and the captured features are then as they were)."""
        start = cache.length
        total = len(tokens)
        done = 0
        t0 = time.perf_counter()
        while True:
            if done and cancel.is_set():
                cache.truncate(start)
                capture.store.truncate(start)
                return None
            n = min(self.chunk, total - done)
            last = done + n >= total
            t = time.perf_counter()
            out = self._forward(tokens[done:done + n], cache, capture, "last" if last else "none")
            done += n
            dt = time.perf_counter() - t
            if n == self.chunk and dt > 0:
                self.chunk = max(CHUNK_MIN, min(CHUNK_MAX, int(n * CHUNK_S / dt)))
            if last:
                return out.logits[-1]
            yield PrefillProgress(done=done, total=total, elapsed_ms=(time.perf_counter() - t0) * 1e3)

    def catch_up(self, cached: list[int], cache: Any, capture: FeatureCapture) -> None:
        """Give every cached token its features before a feature-reading drafter starts mid-answer.

        The tokens committed while capture was off are run through the target again on top of the
        prefix that has features (their K/V are recomputed in place). Costs one prefill of those
        tokens, once per switch to such a method."""
        done = capture.store.length
        if done >= len(cached):
            return
        cache.truncate(done)
        while done < len(cached):
            n = min(CHUNK_MAX, len(cached) - done)
            self._forward(cached[done:done + n], cache, capture, "none")
            done += n

    def _forward(self, tokens: list[int], cache: Any, capture: FeatureCapture, logits: str) -> Any:
        out = self.model.forward(torch.tensor(tokens, device=self.model.device), cache, logits=logits,
                                 **capture.forward_kwargs)
        cache.commit(len(tokens))
        capture.keep(out)
        return out
