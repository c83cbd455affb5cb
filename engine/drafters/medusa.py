"""The Medusa drafter: K heads on the target's last hidden state guess the next K positions at once.

Head i reads the hidden state the target's lm_head read at the last verified position (after the
final norm: the session captures it as for EAGLE-1/2, ``FeatureSpec(final_hidden=True)``) and
guesses the token i+1 places after the root. No head sees what the heads before it guessed, which
is why Medusa is cheap (one batched call per step, no draft KV cache) and why its deeper guesses
miss more often than EAGLE's, whose head runs on its own outputs.

The residual blocks of all heads run together: stacked into [K, L, H, H] and applied with one
``baddbmm`` per block depth (L is 1 in every published head). The lm_heads dominate the cost: on the
embedded model each is 49152x576, so 4 distinct heads read as many weights per step as the target's
whole forward. Measured on the 2-core VM (one thread, stored-weights target, 4 heads as 8-bit
codes): one layer of the 4 matrices stacked by rows over the 4 rows took 21 ms a step (the skinny
product reads each weight once but does 4x the arithmetic, and at 1-4 rows it is arithmetic-bound);
one product per head on its own row took 13 ms; one shared lm_head over the 4 rows took 4.5 ms. So:
distinct lm_heads run one product per head (K native calls, each reading only its own matrix, and
only for the heads a step uses); identical lm_heads (vLLM's ``original_lm_head``, or heads trained
with a frozen lm_head) keep one copy and one product over all rows; and on a full-precision target
whose own lm_head is that copy, the target's layer runs it (no second copy in memory).

Trees (engine.tree.DraftTree) are paths of ranks: (r1..rd) takes head 0's rank-r1 candidate, then
head 1's rank-r2 one below it, and so on. ``dynamic`` (the default) keeps the ``num_draft_tokens - 1``
best nodes of the Cartesian tree of each head's top-k (``tree_width``, SGLang's ``eagle_topk``) ranked
by the product of the heads' probabilities, found best first; ``topk 1`` is a chain of ``num_steps``
drafts (capped by the number of heads), grown by the tree search every drafter shares so a sampled chain carries its
distributions for rejection sampling. ``static`` is the Medusa paper's 63-node tree
(``mc_sim_7b_63``) trimmed to ``num_draft_tokens``. Both are verified like every tree, so greedy
output equals plain greedy decoding and sampling keeps the target's distribution (coupled
Gumbel-top-k or rejection sampling, as for EAGLE).
"""

from __future__ import annotations

import heapq
import math
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from engine.config import SpecConfig
from engine.drafters.base import dist_to_target, heads_take_fast_products, vocab_to_target
from engine.drafters.draft_loader import Checked, DraftBundle, feature_spec
from engine.drafters.medusa_checkpoint import MedusaSpec, MedusaWeights
from engine.drafters.tree_search import (
    Candidates,
    Coupled,
    DraftRandom,
    StopRule,
    check_topk,
    coupled_scores,
    grow_tree,
    to_host,
)
from engine.kernels.linear import Linear
from engine.kernels.stored import StoredLinear
from engine.kernels.weights import QuantRows
from engine.models.layer import as_weight, make_linear
from engine.sampling import GumbelNoise
from engine.tree import DraftTree

# The Medusa paper's tree for Vicuna-7B (FasterDecoding/Medusa, medusa_choices.py: mc_sim_7b_63): each
# entry is a path of ranks, [0, 1] = head 0's best token, then head 1's second best below it. Listed
# best first and every prefix before its extensions, so a trimmed list is still a tree.
MC_SIM_7B_63: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,), (9,),
    (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1),
    (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0),
    (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0),
    (0, 0, 0, 1), (1, 6), (0, 7, 0),
)


class MedusaHeads:
    """K Medusa heads bound to one target (its dtype, device, weight form and, where shared, its lm_head)."""

    def __init__(self, spec: MedusaSpec, weights: MedusaWeights, target) -> None:
        self.spec = spec
        self.target = target
        dt, dev = target.dtype, target.device
        self.blocks = weights.blocks.to(device=dev, dtype=dt)
        self.biases = weights.biases.to(device=dev, dtype=dt)
        lm = weights.lm_heads
        self.shared = bool(all(torch.equal(lm[0], lm[i]) for i in range(1, lm.shape[0])))
        # On a stored-weights target the lm_heads become 8-bit codes like an EAGLE head's (drafts are
        # verified, so their exact values never reach the output): faster than the target's own form.
        stored = target.weights == "stored"
        q8 = stored and os.environ.get("SPECCHAT_HEAD_WEIGHTS", "q8") != "stored"
        self.uses_target_lm_head = not q8 and self.shared and weights.token_map is None and _is_targets(target, lm[0])

        def matrix(w: torch.Tensor) -> Linear | StoredLinear:
            w = QuantRows.quantize_q8(w) if q8 and w.shape[-1] % 32 == 0 else w
            return make_linear([as_weight(w, stored, dt, dev)], None)

        # one layer per distinct lm_head (one when shared; none when it is the target's): see the module docstring
        self.lm_layers: list[Linear | StoredLinear] = (
            [] if self.uses_target_lm_head else [matrix(w) for w in (lm[:1] if self.shared else lm)])
        # Every head's first block reads the same hidden state, so on a stored-weights target they
        # run as one stacked 8-bit product [K * H, H]: as fp32 matrices through baddbmm they cost
        # ~0.9 ms a drafted step on the 2-core EPYC (5.3 MB streamed for the four shipped heads)
        K, H = weights.blocks.shape[0], weights.blocks.shape[-1]
        self.first_blocks = matrix(weights.blocks[:, 0].reshape(K * H, H)) if q8 else None
        self.vocab_ids = weights.token_map.to(dev) if weights.token_map is not None else None
        # our native kernel, where the logits are host fp32: it takes each head's best candidates
        # as plain lists (ops.c's log_softmax_topk and perturbed_topk; MedusaDrafter._ranked says why)
        ops = target.ops
        self.kernel = ops if ops is not None and dev.type == "cpu" else None
        if q8 and heads_take_fast_products(ops):
            # as for EAGLE heads (the four shipped heads on the Xeon VM: the 4-row lm_head 0.27 ->
            # 0.14-0.15 ms, a propose 0.65 -> 0.46-0.51 ms;
            # docs/history/benchmarks-sessions.md, "Session 30")
            for layer in [self.first_blocks, *self.lm_layers]:
                if isinstance(layer, StoredLinear):
                    layer.fast = True

    @property
    def num_heads(self) -> int:
        return self.spec.num_heads

    @property
    def vocab_size(self) -> int:
        return self.spec.head_vocab

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, heads: int) -> torch.Tensor:
        """[heads, head vocab] float32 contiguous logits of the first ``heads`` heads for one hidden state [H]."""
        x = hidden.to(self.blocks.dtype).expand(heads, -1)  # [K, H]
        for j in range(self.spec.num_layers):  # block depth (1 in published heads), never per head
            if j == 0 and self.first_blocks is not None:
                y = self.first_blocks(x[:1]).view(-1, x.shape[-1])[:heads] + self.biases[:heads, 0]
            else:
                y = torch.baddbmm(self.biases[:heads, j, :, None], self.blocks[:heads, j], x[:, :, None])[..., 0]
            x = x + F.silu(y)
        x = x.contiguous()
        if not self.lm_layers:
            logits = self.target.logits_from_hidden(x)
        elif self.shared:
            logits = self.lm_layers[0](x)
        else:  # each head's own matrix on its own row: K products that each read one matrix once
            logits = torch.cat([self.lm_layers[k](x[k: k + 1]) for k in range(heads)])
        return logits.float().contiguous()

    def log_probs(self, hidden: torch.Tensor, heads: int) -> torch.Tensor:
        """[heads, head vocab] float32 log-probabilities of the first ``heads`` heads for one hidden state [H]."""
        return torch.log_softmax(self.logits(hidden, heads), dim=-1)

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Head vocabulary indices -> target token ids."""
        return vocab_to_target(self.vocab_ids, ids)

    def to_target_dist(self, q: torch.Tensor) -> torch.Tensor:
        """A distribution over the head vocabulary as one over the target's (zero elsewhere)."""
        return dist_to_target(self.vocab_ids, self.spec.vocab_size, q)


class MedusaDrafter:
    name = "medusa"
    needs_features = True
    # one batched call drafts every level: fewer levels would save nothing worth a rule
    pays_per_level = False

    def __init__(self, heads: MedusaHeads) -> None:
        self.heads = heads
        self._hidden: torch.Tensor | None = None  # the target's last hidden state at the last cached token
        self._random = DraftRandom()

    # -- the Drafter protocol ------------------------------------------------------------------
    def check(self, config: SpecConfig) -> None:
        check_topk(config, self.heads.vocab_size, "Medusa heads")

    def reset(self, history: Sequence[int], features: torch.Tensor | None = None) -> None:
        if features is None or features.shape[0] != len(history):
            raise ValueError("the Medusa drafter needs one target hidden state per history token")
        self._hidden = self._last_hidden(features) if len(history) else None

    def observe(self, committed: Sequence[int], features: torch.Tensor | None = None) -> None:
        """Keep the last committed row's hidden state: a view of the session's feature store (the
        rows stay valid until the store is cut below them, which truncate() and reset() follow),
        read by the next :meth:`propose`. Why not a copy: while the adaptive budget pauses drafting,
        a step should do what a plain step does, and a copy per step was the one thing left."""
        if features is None or features.shape[0] != len(committed):
            raise ValueError("the Medusa drafter needs one target hidden state per committed token")
        if len(committed):
            self._hidden = self._last_hidden(features)

    def _last_hidden(self, features: torch.Tensor) -> torch.Tensor:
        """The last row's final hidden state: its last ``hidden_size`` columns, so rows that also
        carry other captured layers in front (a session feeding EAGLE-3 too) read the same."""
        return features[-1, -self.heads.spec.hidden_size:]

    def truncate(self, length: int) -> None:
        """The cache was cut back: the last hidden state is stale until the session's next ``reset``."""
        self._hidden = None

    def propose(self, history: Sequence[int], root: int, config: SpecConfig, *,
                noise: GumbelNoise | None = None, stop: StopRule | None = None) -> DraftTree:
        heads = self.heads
        depth = min(config.num_steps, heads.num_heads)
        if self._hidden is None or depth < 1 or config.num_draft_tokens < 2:
            return DraftTree.root_only(root)
        logits = heads.logits(self._hidden, depth)  # [depth, head vocab]: every level in one call
        n = len(history)  # the root sits at position n, a depth-d node at n + d
        coupled = coupled_scores(config, noise, n, heads.vocab_ids, heads.kernel)
        drafts = config.num_draft_tokens - 1
        if config.medusa_tree == "static":
            paths = static_paths(drafts, depth, heads.vocab_size)
            width = [1 + max((p[-1] for p in paths if len(p) == d + 1), default=0) for d in range(depth)]
            return _tree(root, self._ranked(logits, width, coupled), paths)
        if config.tree_width > 1:
            ranked = self._ranked(logits, [config.tree_width] * depth, coupled)
            return _tree(root, ranked, cartesian_paths([lp for _, lp in ranked], drafts))
        logp = torch.log_softmax(logits, dim=-1)

        # topk 1: a chain, through the tree search every drafter shares (it samples the chain and
        # records the distributions for rejection sampling, or follows the coupled noise)
        def expand(frontier: list[int], cands: Candidates) -> torch.Tensor:
            return logp[cands.depth[frontier[0]]].expand(len(frontier), -1)  # a guess ignores its parent

        tree, _, _ = grow_tree(root, logp[0], expand, heads.to_target, num_steps=depth, topk=1,
                               num_draft_tokens=min(config.num_draft_tokens, depth + 1),
                               sampling=self._random.sampling(config, heads.to_target_dist), coupled=coupled, stop=stop)
        return tree

    # -- trees from rank paths ------------------------------------------------------------------
    def _ranked(self, logits: torch.Tensor, width: list[int], coupled: Coupled | None) -> list[Ranked]:
        """Each head's ``width[d]`` best candidates in rank order, as target ids and log-probabilities:
        by probability, or with coupled sampling by the perturbed scores the target will sample with
        (rank 0 is the token it would draw from that head's distribution). ``logits`` [depth, head
        vocab] fp32 contiguous (made log-probabilities in place where the kernel runs).

        Why the kernel: in torch a drafted step was a log-softmax, then a top-k, a gather and two
        reads back per head; the kernel returns each head's picks as lists in one call (greedy), or
        one call per head on the coupled noise of its depth. A drafted tree's propose took 425 us
        before, 273-308 after (each after a target forward, as in a step; 2-core Zen 5 EPYC,
        session 33)."""
        kernel, heads = self.heads.kernel, self.heads
        if kernel is not None and coupled is None:
            top = kernel.log_softmax_topk_(logits, max(width), heads.vocab_ids)
            assert top is not None  # k > 0 asks for the picks
            ids, logps = top
            return [(ids[d][:k], logps[d][:k]) for d, k in enumerate(width)]
        if kernel is not None:
            kernel.log_softmax_topk_(logits)
            logp = logits
        else:
            logp = torch.log_softmax(logits, dim=-1)
        ranked: list[Ranked | None] = [None] * len(width)
        if coupled is not None and coupled.picks is not None:
            for d, k in enumerate(width):
                picked = coupled.picks(logp[d: d + 1], d + 1, min(k, logp.shape[-1]))
                if picked is not None:
                    ranked[d] = (picked[0][0], picked[1][0])
        rest = [d for d, r in enumerate(ranked) if r is None]
        if rest:
            for d, r in zip(rest, self._ranked_at_once(logp, rest, width, coupled), strict=True):
                ranked[d] = r
        return [r for r in ranked if r is not None]

    def _ranked_at_once(self, logp: torch.Tensor, rows: list[int], width: list[int], coupled: Coupled | None
                        ) -> list[Ranked]:
        """Heads ``rows``' best candidates from one top-k over all of them and one host read: on a
        GPU each read drains the queue, and a head apiece was a wait a head (two, with the log-probs)."""
        k = min(max(width[d] for d in rows), logp.shape[-1])
        mine = torch.stack([logp[d] for d in rows])  # (a list index would send the list over first)
        picked = mine if coupled is None else torch.cat([coupled.scores(logp[d][None], d + 1) for d in rows])
        ix = picked.topk(k, dim=-1).indices  # [len(rows), k]
        ids, lps = to_host(self.heads.to_target(ix.flatten()), mine.gather(-1, ix).flatten())
        return [(ids[r * k: r * k + min(width[d], k)], lps[r * k: r * k + min(width[d], k)])
                for r, d in enumerate(rows)]


# each head's candidates in rank order: (target ids, log-probabilities)
Ranked = tuple[list[int], list[float]]


def _tree(root: int, ranked: list[Ranked], paths: list[tuple[int, ...]]) -> DraftTree:
    """The tree of ``paths`` (each after its prefix): path (r1..rd) takes head d-1's rank-rd candidate."""
    row = {(): 0}
    parents = [-1]
    for r, path in enumerate(paths, start=1):
        row[path] = r
        parents.append(row[path[:-1]])
    tokens = [ranked[len(p) - 1][0][p[-1]] for p in paths]
    probs = [1.0] + [math.exp(ranked[len(p) - 1][1][p[-1]]) for p in paths]
    return DraftTree((root, *tokens), tuple(parents), tuple(probs))


def _is_targets(target, weight: torch.Tensor) -> bool:
    """Whether ``weight`` is exactly the target's lm_head (read only when a shared copy could be dropped)."""
    dense = getattr(getattr(target, "lm_head", None), "dense_weight", None)
    return bool(dense is not None and dense.shape == weight.shape and torch.equal(dense.detach().float().cpu(), weight))


def cartesian_paths(scores: list[list[float]], drafts: int) -> list[tuple[int, ...]]:
    """The ``drafts`` best nodes of the Cartesian tree whose depth-d level offers ``scores[d]`` (log-
    probabilities in rank order), a node scoring the sum along its path: the product of the heads'
    probabilities. Best first, each node reached from its previous sibling or (rank 0) its parent,
    so every node comes after its parent and the list is a tree."""
    heap = [(-scores[0][0], (0,))] if scores and scores[0] else []
    out: list[tuple[int, ...]] = []
    while heap and len(out) < drafts:
        neg, path = heapq.heappop(heap)
        out.append(path)
        d, r = len(path) - 1, path[-1]
        if r + 1 < len(scores[d]):
            heapq.heappush(heap, (neg + scores[d][r] - scores[d][r + 1], (*path[:-1], r + 1)))
        if d + 1 < len(scores):
            heapq.heappush(heap, (neg - scores[d + 1][0], (*path, 0)))
    return out


def static_paths(drafts: int, depth: int, vocab: int) -> list[tuple[int, ...]]:
    """The first ``drafts`` paths of MC_SIM_7B_63 that the heads can fill, each after its prefix."""
    out: list[tuple[int, ...]] = []
    kept: set[tuple[int, ...]] = {()}
    for path in MC_SIM_7B_63:
        if len(out) == drafts:
            break
        if len(path) <= depth and max(path) < vocab and path[:-1] in kept:
            out.append(path)
            kept.add(path)
    return out


def load_heads(found: Checked, target, tokenizer) -> DraftBundle:
    """The medusa registration's load: checked Medusa heads (engine/drafters/draft_loader.py) as a
    drafter on ``target``'s last hidden state."""
    spec, weights = found.parts
    heads = MedusaHeads(spec, weights, target)
    vocab = f", {spec.head_vocab} draft tokens" if spec.head_vocab != spec.vocab_size else ""
    layout = {"medusa": "Medusa", "vllm": "vLLM Medusa"}[spec.layout]
    return DraftBundle("medusa", lambda: MedusaDrafter(heads), feature_spec("medusa"),
                       f"{layout} heads {found.label} ({spec.num_heads} heads of {spec.num_layers} "
                       f"block{'s' if spec.num_layers != 1 else ''}{vocab})")
