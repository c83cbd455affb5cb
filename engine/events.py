"""The event contract between the engine and everything downstream.

A session yields events; the TUI, the benchmark, the trace writer and the replay all consume
the same objects. Events carry decoded text for every token they mention (tree nodes too), so a
consumer never needs a tokenizer: a recorded trace replays with no model loaded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from engine.tree import DraftTree

Origin = Literal["draft", "target"]
FinishReason = Literal["stop", "length", "cancelled", "context", "error"]


@dataclass(frozen=True)
class CommittedToken:
    """One token appended to the answer, with where it came from."""

    id: int
    origin: Origin  # "draft": an accepted draft token; "target": produced by the target (bonus/correction)
    text: str  # the text this token adds to the answer (may be "" while a multi-byte char is pending)


@dataclass(frozen=True)
class StepTiming:
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    other_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.other_ms


@dataclass(frozen=True)
class RunningStats:
    """Aggregates over the answer so far; tau counts the bonus token (tokens per verify)."""

    tokens: int = 0
    steps: int = 0
    elapsed_s: float = 0.0
    tokens_per_s: float = 0.0
    tau: float = 0.0
    # accept_per_depth[d] = fraction of steps whose tree reached depth d+1 that accepted a token there
    accept_per_depth: tuple[float, ...] = ()
    draft_ms: float = 0.0
    verify_ms: float = 0.0


@dataclass(frozen=True)
class Started:
    """An answer begins: the prompt is prefilled (or reused from the cache) and decoding starts."""

    kind: Literal["started"] = field(default="started", init=False)
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prefix tokens whose K/V came from earlier turns
    prefill_ms: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    drafter: str = ""
    precision: str = ""  # the target's arithmetic, exact or fast ("" for a backend with one)
    context_limit: int = 0  # the model's context length (0: unknown); prompt + answer must fit
    dropped_turns: int = 0  # oldest messages left out so the prompt fits (context_overflow=drop_oldest)
    # the relative verify cost by tree size the adaptive budget was calibrated with, (size, relative)
    # pairs (engine/calibrate.py); () when it learns costs from its steps alone. The TUI's charts
    # redraw the budget's cost curve from it and the steps' timings.
    cost_shape: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class PrefillProgress:
    """The prompt is being prefilled in chunks: ``done`` of ``total`` new tokens are in the cache.

    Comes before ``Started`` for long prompts; between chunks the session checks cancel(), so a
    cancelled prefill ends with Finished(reason="cancelled") and no Started.
    """

    kind: Literal["prefill"] = field(default="prefill", init=False)
    done: int = 0
    total: int = 0
    elapsed_ms: float = 0.0


@dataclass(frozen=True)
class DraftPayoff:
    """Whether drafting can pay on this machine, in the adaptive budget's prices (engine/payoff.py
    derives it): what drafting one level costs against a plain target step, the acceptance per draft
    a chain would need for a drafted step to commit tokens faster than a plain step, and the
    acceptance the drafter's verified chains reached lately."""

    draft_share: float = 0.0  # drafting a chain of one draft, over a plain step's time
    needed: float | None = None  # acceptance per draft that pays at the best chain length; None: none below 1 does
    depth: int = 0  # that chain length (0: none pays)
    reached: float = 0.0  # acceptance per draft of its verified chains lately (kept / tried)

    @property
    def pays(self) -> bool:
        return self.needed is not None and self.reached >= self.needed


@dataclass(frozen=True)
class Step:
    """One speculative step: draft a tree, verify it with one target forward, commit."""

    kind: Literal["step"] = field(default="step", init=False)
    index: int = 0
    tree: DraftTree = field(default_factory=lambda: DraftTree.root_only(0))
    tree_text: tuple[str, ...] = ()  # decoded piece of each tree node (tree.tokens[i])
    accepted: tuple[int, ...] = ()  # node indices of the accepted path, root excluded
    bonus: int = -1  # the token the target produced after the accepted path
    committed: tuple[CommittedToken, ...] = ()
    text: str = ""  # the text these committed tokens add
    timing: StepTiming = field(default_factory=StepTiming)
    stats: RunningStats = field(default_factory=RunningStats)
    config_version: int = 0  # bumps when update_config() took effect at this step
    proposed: int = 0  # nodes the drafter proposed, before the adaptive budget pruned the tree
    draft_paused: bool = False  # the adaptive budget skipped drafting (it recently cost more than it saved)
    # levels asked of a drafter that pays per level (EAGLE, standalone) under the adaptive budget,
    # which may ask for fewer than the configured num_steps; 0 for other drafters
    draft_levels: int = 0
    # top-k the adaptive budget drafted such a drafter with: the configured eagle_topk (a tree) or 1
    # (a chain), whichever has been paying more (engine/adaptive.py); 0 for other drafters
    draft_width: int = 0
    # the adaptive budget's reckoning of whether drafting can pay here (refreshed now and then while it
    # drafts, kept while paused); None before it has measured enough, and for the baseline
    payoff: DraftPayoff | None = None

    @property
    def accepted_len(self) -> int:
        return len(self.accepted)

    @property
    def rejected(self) -> tuple[int, ...]:
        """Children of the last accepted node (or root) that the target refused, in draft order."""
        last = self.accepted[-1] if self.accepted else 0
        return tuple(i for i, p in enumerate(self.tree.parents) if p == last and i not in self.accepted)


@dataclass(frozen=True)
class Finished:
    kind: Literal["finished"] = field(default="finished", init=False)
    reason: FinishReason = "stop"
    text: str = ""
    tokens: int = 0
    stats: RunningStats = field(default_factory=RunningStats)
    error: str = ""


@dataclass(frozen=True)
class ConfigApplied:
    """A hot-swapped config took effect at a step boundary."""

    kind: Literal["config"] = field(default="config", init=False)
    version: int = 0
    config: dict[str, Any] = field(default_factory=dict)


Event = Started | PrefillProgress | Step | Finished | ConfigApplied


def event_to_dict(event: Event) -> dict[str, Any]:
    data = asdict(event)
    if isinstance(event, Step):
        data["tree"] = event.tree.to_dict()
    return data


def event_from_dict(data: dict[str, Any]) -> Event:
    kind = data.get("kind")
    payload = {k: v for k, v in data.items() if k != "kind"}
    if kind == "started":
        payload["cost_shape"] = tuple((int(n), float(r)) for n, r in payload.get("cost_shape", ()))
        return Started(**payload)
    if kind == "config":
        return ConfigApplied(**payload)
    if kind == "prefill":
        return PrefillProgress(**payload)
    if kind == "finished":
        payload["stats"] = _stats(payload.get("stats", {}))
        return Finished(**payload)
    if kind == "step":
        payload["tree"] = DraftTree.from_dict(payload["tree"])
        payload["tree_text"] = tuple(payload.get("tree_text", ()))
        payload["accepted"] = tuple(payload.get("accepted", ()))
        payload["committed"] = tuple(CommittedToken(**c) for c in payload.get("committed", ()))
        payload["timing"] = StepTiming(**payload.get("timing", {}))
        payload["stats"] = _stats(payload.get("stats", {}))
        payoff = payload.get("payoff")
        payload["payoff"] = DraftPayoff(**payoff) if isinstance(payoff, dict) else payoff
        return Step(**payload)
    raise ValueError(f"unknown event kind {kind!r}")


def _stats(data: dict[str, Any]) -> RunningStats:
    data = dict(data)
    data["accept_per_depth"] = tuple(data.get("accept_per_depth", ()))
    return RunningStats(**data)
