"""The acceptance walk on the GPU: which draft nodes the target keeps, with one host sync.

Both kernels run as a single program over a tree of at most 64 nodes (the largest bucket), given as
``tokens`` and ``parents`` (topological order, node 0 the root). They write one int32 vector
``[count, bonus, path...]`` so the host reads the whole verdict in one copy, the step's only sync.

- Greedy: from the root, take the child whose token is the target's argmax at the current node;
  the argmax where no child matches is the bonus. Siblings are distinct, so at most one matches.
- Sampling: recursive rejection sampling over the siblings in draft (node) order, from uniforms
  passed in (``u[k]`` for the k-th acceptance test, ``u[T]`` for the final draw), so the kernel is
  a pure function testable against the torch reference and reproducible from a seeded generator.
  Point-mass drafts (n-gram, top-k trees): accept x with probability p(x) / (mass not yet
  refused); on refusal p(x) = 0. With the drafter's distribution q per node: accept with
  min(1, p(x)/q(x)); on refusal p = max(p - q, 0) renormalised and q(x) = 0 renormalised (the
  multi-candidate rule EAGLE uses). If every child is refused, the bonus is drawn from the residual
  by inverse CDF. Both keep the target's distribution exactly.
The walks modify ``probs`` (and ``q``) in place: they are per-step scratch.
"""

from __future__ import annotations

import torch

from engine.gpu import MAX_TREE
from engine.sampling import target_probs
from engine.tree import DraftTree, Verdict


def _build():
    import triton
    import triton.language as tl

    # T (the tree's size) changes step to step: not specialized, so a tree of 1 or 16 nodes does
    # not compile a kernel of its own in the middle of an answer.
    @triton.jit(do_not_specialize=["T"])
    def greedy_walk_kernel(PRED, TOKENS, PARENTS, OUT, T, BLOCK_T: tl.constexpr):
        j = tl.arange(0, BLOCK_T)
        ok = (j < T) & (j > 0)
        tok = tl.load(TOKENS + j, mask=ok, other=-1)
        par = tl.load(PARENTS + j, mask=ok, other=-2)
        node = tl.zeros([], tl.int32)
        count = tl.zeros([], tl.int32)
        alive = node == 0
        for _ in range(0, T):
            want = tl.load(PRED + node)
            nxt = tl.max(tl.where(ok & (par == node) & (tok == want), j, -1), axis=0)
            take = alive & (nxt >= 0)
            tl.store(OUT + 2 + count, nxt, mask=take)
            count += take.to(tl.int32)
            node = tl.where(take, nxt, node)
            alive = take
        tl.store(OUT, count)
        tl.store(OUT + 1, tl.load(PRED + node).to(tl.int32))

    @triton.jit(do_not_specialize=["T"])
    def sampling_walk_kernel(PROBS, Q, TOKENS, PARENTS, U, OUT, T, V, stride_p, stride_q,
                             HAS_Q: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr):
        j = tl.arange(0, BLOCK_T)
        ok = (j < T) & (j > 0)
        par = tl.load(PARENTS + j, mask=ok, other=-2)
        node = tl.zeros([], tl.int32)
        last = tl.zeros([], tl.int32)  # the last child of `node` tried
        count = tl.zeros([], tl.int32)
        trial = tl.zeros([], tl.int32)
        alive = node == 0
        mass = tl.full([], 1.0, tl.float32)  # what is left of p's row (refused mass removed)
        q_mass = tl.full([], 1.0, tl.float32)
        for _ in range(0, T):
            c = tl.min(tl.where(ok & (par == node) & (j > last), j, BLOCK_T), axis=0)
            has = alive & (c < BLOCK_T)
            x = tl.load(TOKENS + c, mask=has, other=0)
            px = tl.load(PROBS + node * stride_p + x, mask=has, other=0.0)
            u = tl.load(U + trial, mask=has, other=1.0)
            if HAS_Q:
                qx = tl.load(Q + node * stride_q + x, mask=has, other=1.0)
                accept = has & ((u * qx * mass < px * q_mass) | ((qx <= 0) & (px > 0)))
            else:
                accept = has & (u * mass < px)
            reject = has & (~accept)
            trial += has.to(tl.int32)
            tl.store(OUT + 2 + count, c, mask=accept)
            count += accept.to(tl.int32)
            if reject:
                if HAS_Q:
                    new_mass = tl.zeros([], tl.float32)
                    for start in range(0, V, BLOCK_V):
                        offs = start + tl.arange(0, BLOCK_V)
                        v_ok = offs < V
                        p = tl.load(PROBS + node * stride_p + offs, mask=v_ok, other=0.0)
                        q = tl.load(Q + node * stride_q + offs, mask=v_ok, other=0.0)
                        r = tl.maximum(p / mass - q / q_mass, 0.0)
                        tl.store(PROBS + node * stride_p + offs, r, mask=v_ok)
                        new_mass += tl.sum(r, axis=0)
                    mass = new_mass
                    tl.store(Q + node * stride_q + x, 0.0)
                    q_mass = q_mass - qx
                else:
                    tl.store(PROBS + node * stride_p + x, 0.0)
                    mass = mass - px
            node = tl.where(accept, c, node)
            last = tl.where(has, c, last)
            mass = tl.where(accept, 1.0, mass)
            q_mass = tl.where(accept, 1.0, q_mass)
            alive = has
        # the bonus: inverse CDF of the residual row at the final node
        total = tl.zeros([], tl.float32)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            total += tl.sum(tl.load(PROBS + node * stride_p + offs, mask=offs < V, other=0.0), axis=0)
        target = tl.load(U + T) * total
        running = tl.zeros([], tl.float32)
        found = tl.full([], 2147483647, tl.int32)
        last_nonzero = tl.zeros([], tl.int32)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            p = tl.load(PROBS + node * stride_p + offs, mask=offs < V, other=0.0)
            cdf = tl.cumsum(p, axis=0) + running
            found = tl.minimum(found, tl.min(tl.where((cdf > target) & (p > 0), offs, 2147483647), axis=0))
            last_nonzero = tl.maximum(last_nonzero, tl.max(tl.where(p > 0, offs, 0), axis=0))
            running += tl.sum(p, axis=0)
        tl.store(OUT, count)
        tl.store(OUT + 1, tl.where(found < V, found, last_nonzero))

    return {"greedy": greedy_walk_kernel, "sampling": sampling_walk_kernel}


def _kernel(name: str):
    from engine.gpu import kernel

    return kernel("accept", _build)[name]


def _verdict(out: torch.Tensor) -> Verdict:
    values = out.tolist()  # the one host sync of a step
    count = values[0]
    return Verdict(tuple(values[2 : 2 + count]), values[1])


def _tree_tensors(tree: DraftTree, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if len(tree) > MAX_TREE:
        raise ValueError(f"the GPU walk takes trees of at most {MAX_TREE} nodes, got {len(tree)}")
    host = torch.tensor([tree.tokens, tree.parents], dtype=torch.int64)
    if device.type == "cuda":
        host = host.pin_memory()
    both = host.to(device, non_blocking=True)
    return both[0], both[1].to(torch.int32)


def greedy_walk(predicted: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """predicted: [T] argmax per node; tokens [T]; parents [T] int32. Returns int32 [T+2]:
    count, bonus, then the accepted node indices (Triton)."""
    T = tokens.shape[0]
    out = torch.zeros(T + 2, dtype=torch.int32, device=tokens.device)
    _kernel("greedy")[(1,)](predicted, tokens, parents, out, T, BLOCK_T=MAX_TREE)
    return out


def sampling_walk(probs: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, uniforms: torch.Tensor,
                  draft_q: torch.Tensor | None = None) -> torch.Tensor:
    """probs: [T, V] float32 target distributions (overwritten); uniforms: [T+1] float32;
    draft_q: optional [T, V] drafter distributions for each node's children (overwritten).
    Returns int32 [T+2]: count, bonus, path (Triton)."""
    T, V = probs.shape
    out = torch.zeros(T + 2, dtype=torch.int32, device=probs.device)
    q = draft_q if draft_q is not None else probs
    _kernel("sampling")[(1,)](probs, q, tokens, parents, uniforms, out, T, V, probs.stride(0), q.stride(0),
                              HAS_Q=draft_q is not None, BLOCK_T=MAX_TREE, BLOCK_V=1024)
    return out


def verify_greedy_gpu(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    """engine.verify.verify_greedy with the walk on the device (same verdict)."""
    tokens, parents = _tree_tensors(tree, logits.device)
    return _verdict(greedy_walk(logits.argmax(dim=-1), tokens, parents))


def verify_sampling_gpu(tree: DraftTree, logits: torch.Tensor, temperature: float, top_p: float,
                        generator: torch.Generator | None = None) -> Verdict:
    """engine.verify.verify_sampling with the walk on the device: the same distribution of
    verdicts (uniforms come from ``generator`` on the host, so a seed still fixes the answer)."""
    tokens, parents = _tree_tensors(tree, logits.device)
    probs = target_probs(logits, temperature, top_p).float().contiguous()
    u = torch.rand(len(tree) + 1, generator=generator)
    if logits.device.type == "cuda":
        u = u.pin_memory()
    return _verdict(sampling_walk(probs, tokens, parents, u.to(logits.device, non_blocking=True)))


# ---- torch references (what the kernels are tested against) ------------------------------------
def greedy_walk_reference(predicted: list[int], tree: DraftTree) -> Verdict:
    children = tree.children()
    node, path = 0, []
    while True:
        nxt = next((c for c in children[node] if tree.tokens[c] == predicted[node]), None)
        if nxt is None:
            return Verdict(tuple(path), predicted[node])
        path.append(nxt)
        node = nxt


def sampling_walk_reference(probs: torch.Tensor, tree: DraftTree, uniforms: list[float],
                            draft_q: torch.Tensor | None = None) -> Verdict:
    """Recursive rejection sampling with explicit uniforms, in float64 on the host."""
    p_rows = probs.double().clone()
    q_rows = draft_q.double().clone() if draft_q is not None else None
    children = tree.children()
    node, path, trial = 0, [], 0
    p = p_rows[0]
    q = q_rows[0] if q_rows is not None else None
    while True:
        for child in children[node]:
            x = tree.tokens[child]
            u = uniforms[trial]
            trial += 1
            if q is None:
                ok = u * float(p.sum()) < float(p[x])
            else:
                ok = (u * float(q[x] / q.sum()) < float(p[x] / p.sum())) or (q[x] <= 0 < p[x])
            if ok:
                path.append(child)
                node = child
                p = p_rows[node]
                q = q_rows[node] if q_rows is not None else None
                break
            if q is None:
                p[x] = 0.0
            else:
                p = torch.clamp(p / p.sum() - q / q.sum(), min=0.0)
                q[x] = 0.0
        else:
            cdf = torch.cumsum(p, 0)
            hits = ((cdf > uniforms[len(tree)] * float(p.sum())) & (p > 0)).nonzero()
            bonus = int(hits[0]) if len(hits) else int((p > 0).nonzero()[-1])
            return Verdict(tuple(path), bonus)
