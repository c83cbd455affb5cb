"""``specchat bench --peers hf``: transformers' own ``generate()``, greedy and with prompt lookup.

Why a peer: our baseline and n-gram rows are only as credible as their agreement with the
reference implementation, so it runs on the same prompt ids in the same run. llama.cpp, the other
peer, is in llamacpp_peer.py (an optional package).
"""

from __future__ import annotations

import time
from typing import Any

from engine.prompts import Prompt
from specchat.bench_report import Run


def peer_run(new: list[int], stops: set[int] | list[int], seconds: float) -> Run:
    """A peer's answer as a bench Run: a final stop token counts as produced, not as a token."""
    produced = len(new)
    if new and new[-1] in stops:
        new = new[:-1]
    return Run(new, 0, produced, seconds, None)


def warm_kinds(peer: Any, session: Any, prompt: Prompt) -> None:
    """A llama.cpp peer's warm-up: one short answer of each of its kinds, untimed (the model files
    into the page cache, its first-call costs paid)."""
    saved, peer.max_new_tokens = peer.max_new_tokens, 8
    for kind in peer.kinds:
        peer.run(session, prompt, kind)
    peer.max_new_tokens = saved


class HFPeer:
    """transformers' own generate(): greedy, and its prompt-lookup decoding."""

    def __init__(self, path: str, session: Any, max_new_tokens: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.session = session
        self.stops = sorted(session.tokenizer.stop_token_ids)
        self.max_new_tokens = max_new_tokens

    def warm(self, prompt: Prompt) -> None:
        """One short answer of each kind, untimed."""
        saved, self.max_new_tokens = self.max_new_tokens, 8
        self.run(prompt, False)
        self.run(prompt, True)
        self.max_new_tokens = saved

    def run(self, prompt: Prompt, lookup: bool) -> Run:
        torch = self.torch
        ids = prompt.ids(self.session.tokenizer)
        inputs = torch.tensor([ids])
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": False,
                                  "eos_token_id": self.stops, "pad_token_id": self.stops[0],
                                  "attention_mask": torch.ones_like(inputs)}
        if lookup:
            kwargs["prompt_lookup_num_tokens"] = 10
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(inputs, **kwargs)
        seconds = time.perf_counter() - t0
        return peer_run(out[0, len(ids):].tolist(), self.stops, seconds)
