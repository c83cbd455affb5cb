"""The protocol every drafter follows: exactly what the session's step loop calls, nothing probed.

A drafter sees the whole token history of the conversation (prompt, earlier turns and the
answer so far, ending with the root) and proposes a :class:`DraftTree` whose node 0 is the root.
After verification it observes what was committed, so stateful drafters (the n-gram cache, the
EAGLE draft KV cache) stay in step with the target.

Target features (the hidden states an EAGLE head reads) travel with ``reset`` and ``observe``
whenever the session captures them (``needs_features``), and are None otherwise; a drafter that
does not read them ignores the argument, so the loop calls every drafter the same way. What the
session decides per step (the coupled-sampling noise, the adaptive budget's stop rule) is passed
to ``propose``, never set on the drafter from outside.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from engine.config import SpecConfig
from engine.tree import DraftTree

if TYPE_CHECKING:
    from engine.drafters.tree_search import StopRule
    from engine.sampling import GumbelNoise



def head_codes(stored: bool) -> str:
    """How a draft head's matrices are kept on a target with stored weights: "q4" (the default),
    "q8" or "stored" (the checkpoint's own values), from ``SPECCHAT_HEAD_WEIGHTS``; "stored" on any
    other target. Drafts are verified, so the codes' rounding never reaches the answer, and bytes
    are a head's price on a CPU (engine/drafters/eagle_head.py has the measurements)."""
    import os

    return os.environ.get("SPECCHAT_HEAD_WEIGHTS", "q4") if stored else "stored"


def head_matrix(weight: torch.Tensor, codes: str, stored: bool, dtype: torch.dtype, device: torch.device) -> Any:
    """A draft head's matrix as our products take it: quantized to ``codes`` (q4/q8, where the width
    is a multiple of the 32-k groups) and kept as stored rows on a stored-weights target, else a
    dense tensor of ``dtype`` on ``device`` (engine/models/layer.py's as_weight)."""
    from engine.kernels.weights import QuantRows
    from engine.models.layer import as_weight

    if codes in ("q4", "q8") and weight.shape[-1] % 32 == 0:
        weight = QuantRows.quantize_q4(weight) if codes == "q4" else QuantRows.quantize_q8(weight)
    return as_weight(weight, stored, dtype, device)


def vocab_to_target(vocab_ids: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor:
    """A reduced draft vocabulary's indices as target token ids (``vocab_ids``: the target id of each
    draft row, None for the target's own vocabulary). One rule for every head with a ``d2t`` map."""
    return ids if vocab_ids is None else vocab_ids[ids.to(vocab_ids.device)]


def dist_to_target(vocab_ids: torch.Tensor | None, vocab_size: int, q: torch.Tensor) -> torch.Tensor:
    """A distribution over a reduced draft vocabulary as one over the target's ``vocab_size`` tokens
    (zero elsewhere), as the verifier's rejection sampling reads it."""
    if vocab_ids is None:
        return q
    out = torch.zeros(vocab_size, dtype=q.dtype, device=q.device)
    return out.index_copy_(0, vocab_ids.to(q.device), q)


def heads_take_fast_products(ops) -> bool:
    """Whether a draft head's 8-bit codes run the fast precision's integer products (``ops``: the
    target's native kernel, or None). Drafts are verified, so their arithmetic never reaches the
    answer; ``SPECCHAT_HEAD_PRECISION=exact`` keeps heads on exact products (README)."""
    import os

    return (ops is not None and getattr(ops, "fast_variant", None) is not None
            and os.environ.get("SPECCHAT_HEAD_PRECISION", "fast") == "fast")

class Drafter(Protocol):
    name: str
    # True when the drafter reads target hidden states (EAGLE heads): the session then captures
    # them in its forwards and passes them to reset() and observe().
    needs_features: bool
    # True when each level of ``config.num_steps`` costs a model forward (EAGLE heads, a draft
    # model): the adaptive budget may then ask for fewer levels (engine.adaptive.draft_depth) and
    # stop growing early (``stop``). Drafters without it (n-gram: a lookup) get the configured depth.
    pays_per_level: bool

    def check(self, config: SpecConfig) -> None:
        """Raise engine.config.ConfigError when ``config`` asks what this drafter cannot do (a
        top-k beyond its vocabulary): called before the settings are accepted, so the old stay."""

    def reset(self, history: Sequence[int], features: torch.Tensor | None = None) -> None:
        """Forget per-sequence state and take ``history`` (tokens already in the target cache),
        with one feature row per token when the session captures them."""

    def propose(self, history: Sequence[int], root: int, config: SpecConfig, *,
                noise: GumbelNoise | None = None, stop: StopRule | None = None) -> DraftTree:
        """Draft a tree rooted at ``root``; ``history`` ends just before the root.

        ``noise``: the coupled-sampling noise the target will sample with (engine/sampling.py), or
        None; ``stop``: the adaptive budget's rule for when another level is not worth a forward,
        or None to grow every level (only a drafter that pays per level uses it)."""

    def observe(self, committed: Sequence[int], features: torch.Tensor | None = None) -> None:
        """``committed``: tokens now in the target cache since the last call (root + accepted
        drafts), with their feature rows when the session captures them."""

    def truncate(self, length: int) -> None:
        """The target cache was cut back to ``length`` tokens (a new turn re-rendered the prompt)."""


class NoDrafter:
    """The baseline: a tree of the root alone, so each step is one plain decoding step."""

    name = "none"
    needs_features = False
    pays_per_level = False

    def check(self, config: SpecConfig) -> None:
        pass

    def reset(self, history: Sequence[int], features: torch.Tensor | None = None) -> None:
        pass

    def propose(self, history: Sequence[int], root: int, config: SpecConfig, *,
                noise: GumbelNoise | None = None, stop: StopRule | None = None) -> DraftTree:
        return DraftTree.root_only(root)

    def observe(self, committed: Sequence[int], features: torch.Tensor | None = None) -> None:
        pass

    def truncate(self, length: int) -> None:
        pass
