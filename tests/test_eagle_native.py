"""An EAGLE head's forward in one native call (engine/kernels/eagle_native.c) against the per-op path.

The promise: the one-call forward is the per-op forward with the same kernels (rms_norm, the
stored products in the head's precision, the rotation, attention over listed keys, silu_mul),
so its outputs and log-probabilities are bit-identical to it, for EAGLE-3 and EAGLE-1/2 heads,
for a catch-up over committed positions and for a tree level whose nodes see their ancestors
only; and close to the torch path (SDPA, F.rms_norm) the head ran before.
"""

from __future__ import annotations

import pytest
import torch
from heads import head_config, head_state
from tiny import hf_model

from engine.config import SpecConfig
from engine.drafters.eagle_checkpoint import read_head
from engine.drafters.eagle_head import EagleHead
from engine.drafters.tree_search import Coupled, Level, Picks, coupled_scores, grow_tree
from engine.kernels import native
from engine.kernels.eagle_native import Keys
from engine.kernels.stored import StoredLinear
from engine.models.llama import LlamaConfig, LlamaModel
from engine.models.rope import apply_rotary_interleaved
from engine.sampling import GumbelNoise

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"no native kernel: {native.why_not}")
LAYERS = 6


@pytest.fixture(scope="module")
def target() -> tuple[LlamaModel, dict]:
    hf, cfg = hf_model("llama", 0, num_hidden_layers=LAYERS, hidden_size=64)
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    return LlamaModel(LlamaConfig.from_dict(cfg), sd, weights="stored"), cfg


def _head(target, kind: str) -> EagleHead:
    model, cfg = target
    hcfg = head_config(cfg, kind, draft_vocab=40 if kind == "eagle3" else None, aux_ids=[1, 2, 4])
    spec, weights = read_head(hcfg, head_state(cfg, kind, draft_vocab=40 if kind == "eagle3" else None),
                              kind=None, target=model.config)
    head = EagleHead(spec, weights, model)
    assert head.native is not None
    return head


def _per_op(head: EagleHead, tokens, stream, positions, cache, start: int, keys: Keys, logits: int):
    """The same kernels one by one, in the native call's order."""
    ops, s = head.target.ops, head.spec
    eps, T, H = s.rms_norm_eps, tokens.shape[0], s.hidden_size
    nh, nkv, hd = s.num_heads, s.num_kv_heads, s.head_dim
    e = head.target.embed_tokens(tokens).float().contiguous()
    if s.kind == "eagle3":
        h = head.fc(stream) if stream.shape[1] != H else stream.clone()
        a = torch.cat([ops.rms_norm(e, head.ln_in, eps), ops.rms_norm(h, head.ln_hidden, eps)], -1).contiguous()
    else:
        h = head.fc(torch.cat([e, stream], -1).contiguous())
        a = h
    qkv = head.qkv(a)
    head.rotary.ensure(int(positions.max()) + 1)
    qk = apply_rotary_interleaved(qkv[:, :(nh + nkv) * hd].reshape(T, nh + nkv, hd), head.rotary.lookup(positions))
    cache.k[0, :, start:start + T] = qk[:, nh:].transpose(0, 1)
    cache.v[0, :, start:start + T] = qkv[:, (nh + nkv) * hd:].reshape(T, nkv, hd).transpose(0, 1)
    first, last, extra, width, count = keys.arrays()  # what eagle_native.c reads, as the kernel's tensors
    att = ops.keyed_attention(qk[:, :nh].contiguous(), cache.k[0], cache.v[0], torch.tensor(list(first)),
                              torch.tensor(list(last)), torch.tensor(list(extra), dtype=torch.int32).view(T, width),
                              torch.tensor(list(count), dtype=torch.int32), head.scale)
    x = h.clone()
    head.o.add_into(x, att)
    head.down.add_into(x, ops.silu_mul(head.gate_up(ops.rms_norm(x, head.ln_post, eps))))
    y = x[T - logits:].contiguous()
    out = head.lm_head(ops.rms_norm(y, head.norm, eps)) if s.kind == "eagle3" else head.target.lm_head(y)
    out = out.contiguous()
    ops.log_softmax_topk_(out)
    return x, out


def _set_fast(head: EagleHead, on: bool) -> None:
    head.native.fast = on
    lm = head.lm_head if head.lm_head is not None else head.target.lm_head
    for lin in (head.fc, head.qkv, head.o, head.gate_up, head.down, lm):
        if isinstance(lin, StoredLinear):
            lin.fast = on


@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
@pytest.mark.parametrize("fast", [False, True])
def test_native_head_equals_the_per_op_forward(target, kind: str, fast: bool) -> None:
    kernel = native.load()
    if fast and kernel.fast_variant is None:
        pytest.skip("no fast kernel on this CPU")
    head = _head(target, kind)
    _set_fast(head, fast)
    try:
        gen = torch.Generator().manual_seed(0)
        H = head.spec.hidden_size
        width = 3 * H if kind == "eagle3" else H
        n = 7  # catch-up over 7 committed positions, then a level of 3 nodes with ancestors at 7, 8
        tokens = torch.randint(0, 97, (n,), generator=gen)
        stream = torch.randn(n, width, generator=gen)
        level_tokens = torch.tensor([5, 6, 7])
        level_stream = torch.randn(3, H, generator=gen)
        level_keys = Keys.build([n] * 3, [[n, 9], [n + 1, 10], [11]])
        results = []
        for run in ("native", "per-op"):
            cache = head.new_cache(32)
            if run == "native":
                g0, lv0 = head.run(tokens, stream, torch.arange(n), cache, 0, Keys.causal(0, n), logits=1)
                cache.length = n
                head.run(torch.tensor([1, 2]), torch.randn(2, H, generator=torch.Generator().manual_seed(5)),
                         torch.tensor([n, n]), cache, n, Keys.build([n, n], [[n], [n + 1]]))
                g1, lv1 = head.run(level_tokens, level_stream, torch.tensor([n + 1, n + 1, n]), cache, n + 2,
                                   level_keys, logits=3)
                assert lv0 is not None and lv1 is not None
                lp0, lp1 = lv0.logp, lv1.logp
            else:
                g0, lp0 = _per_op(head, tokens, stream, torch.arange(n), cache, 0, Keys.causal(0, n), 1)
                cache.length = n
                _per_op(head, torch.tensor([1, 2]), torch.randn(2, H, generator=torch.Generator().manual_seed(5)),
                        torch.tensor([n, n]), cache, n, Keys.build([n, n], [[n], [n + 1]]), 1)
                g1, lp1 = _per_op(head, level_tokens, level_stream, torch.tensor([n + 1, n + 1, n]), cache, n + 2,
                                  level_keys, 3)
            results.append((g0, lp0, g1, lp1, cache.k[0, :, :n + 5].clone()))
        for a, b in zip(*results, strict=True):
            assert torch.equal(a, b)
    finally:
        _set_fast(head, False)


def test_native_head_is_close_to_the_torch_path(target) -> None:
    head = _head(target, "eagle3")
    _set_fast(head, False)  # the exact arithmetic: the torch path has no fast precision
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 97, (6,), generator=gen)
    stream = torch.randn(6, 3 * head.spec.hidden_size, generator=gen)
    g, lv = head.run(tokens, stream, torch.arange(6), head.new_cache(16), 0, Keys.causal(0, 6), logits=6)
    native, head.native = head.native, None
    try:
        g_ref, lv_ref = head.run(tokens, stream, torch.arange(6), head.new_cache(16), 0, Keys.causal(0, 6), logits=6)
    finally:
        head.native = native
    assert lv is not None and lv_ref is not None
    torch.testing.assert_close(g, g_ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(lv.logp, lv_ref.logp, rtol=1e-3, atol=1e-3)


def test_keys_mask_matches_the_key_lists() -> None:
    keys = Keys.build([2, 3], [[5], [4, 6]])
    mask = keys.mask(7)
    assert mask.tolist() == [[True, True, False, False, False, True, False],
                             [True, True, True, False, True, False, True]]
    assert Keys.causal(2, 3).mask(5).tolist() == [[True, True, True, False, False], [True] * 4 + [False], [True] * 5]
    for k in (keys, Keys.causal(2, 3), Keys.build([4], [[]])):  # the C arrays eagle_native.c reads say the same
        first, last, extra, width, count = k.arrays()
        m = k.mask(7).tolist()
        for t in range(len(k.prefix)):
            seen = set(range(first[t], last[t] + 1)) | set(extra[t * width: t * width + count[t]])
            assert seen == {j for j in range(7) if m[t][j]}


@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
def test_native_picks_are_the_top_k_of_the_log_probabilities(target, kind: str) -> None:
    """The kernel's picks for the greedy search: each row's k best, as target ids, ties to the lower index."""
    head = _head(target, kind)
    gen = torch.Generator().manual_seed(3)
    H = head.spec.hidden_size
    tokens = torch.randint(0, 97, (5,), generator=gen)
    stream = torch.randn(5, 3 * H if kind == "eagle3" else H, generator=gen)
    _, level = head.run(tokens, stream, torch.arange(5), head.new_cache(16), 0, Keys.causal(0, 5), logits=3, picks=4)
    assert level is not None and level.picks is not None
    values, index = level.logp.topk(4, dim=-1)
    assert level.picks.logp == values.tolist()
    assert level.picks.ids == head.to_target(index).tolist()


def test_log_softmax_topk_matches_torch() -> None:
    ops = native.load()
    gen = torch.Generator().manual_seed(0)
    for V in (1, 7, 8, 61, 8192):
        x = torch.randn(3, V, generator=gen) * 4
        x[1, V // 2] = x[1].max()  # a tie with the maximum: the lower index first
        ref = torch.log_softmax(x, -1)
        ids, vals = ops.log_softmax_topk_(x, min(5, V))
        torch.testing.assert_close(x, ref, rtol=1e-6, atol=1e-5)
        assert vals == x.gather(1, torch.tensor(ids)).tolist()
        for row in range(3):
            want = sorted(range(V), key=lambda i, r=row: (-x[r, i].item(), i))[:min(5, V)]
            assert ids[row] == want
        mapped, _ = ops.log_softmax_topk_(x.clone(), min(5, V), torch.arange(V) * 3 + 1)  # through a vocabulary
        assert mapped == [[3 * i + 1 for i in row] for row in ids]


@pytest.mark.parametrize("topk", [1, 3])
def test_greedy_search_on_the_kernels_picks_builds_the_same_tree(topk: int) -> None:
    """The picks only save the host's top-k: trees, scores and probabilities are the tensor path's."""
    ops = native.load()
    gen = torch.Generator().manual_seed(7)
    vocab = torch.randperm(50, generator=gen)[:40]  # head index -> target id
    table = torch.randn(60, 40, generator=gen) * 3  # a row of logits per candidate index (+1)

    def level(rows: list[int], picked: bool) -> Level:
        logp = table[rows].contiguous()
        top = ops.log_softmax_topk_(logp, topk)
        assert top is not None
        ids, vals = top
        return Level(logp, Picks(vocab[torch.tensor(ids)].tolist(), vals) if picked else None)

    trees = []
    for picked in (True, False):
        tree, cands, _ = grow_tree(5, level([0], picked), lambda f, c, p=picked: level([i + 1 for i in f], p),
                                   lambda ix: vocab[ix], num_steps=4, topk=topk, num_draft_tokens=8)
        trees.append((tree, cands.score, cands.logp))
    assert trees[0] == trees[1]


def test_native_head_embeds_like_the_target_and_refuses_unknown_positions(target) -> None:
    model, _ = target
    tokens = torch.tensor([3, 1, 4])
    assert torch.equal(model.embed_rows(tokens), model.embed_tokens(tokens).float())
    head = _head(target, "eagle3")
    stream = torch.randn(1, 3 * head.spec.hidden_size)
    head.rotary.ensure(1)
    with pytest.raises(ValueError, match="rotary table"):
        head.run(torch.tensor([5]), stream, torch.tensor([10**6]), head.new_cache(8), 0, Keys.causal(0, 1), logits=1)


def test_a_catch_up_without_keys_is_the_causal_one(target) -> None:
    """``positions``/``keys`` None (built in the kernel) mean each entry at its slot, seeing slots up to its own."""
    head = _head(target, "eagle3")
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 97, (4,), generator=gen)
    stream = torch.randn(4, 3 * head.spec.hidden_size, generator=gen)
    outs = []
    for explicit in (True, False):
        cache = head.new_cache(16)
        head.run(tokens[:2], stream[:2], None, cache, 0, None)  # two committed entries first
        cache.length = 2
        if explicit:
            outs.append(head.run(tokens[2:], stream[2:], torch.arange(2, 4), cache, 2, Keys.causal(2, 2), logits=2))
        else:
            outs.append(head.run(tokens[2:], stream[2:], None, cache, 2, None, logits=2))
    (g0, l0), (g1, l1) = outs
    assert l0 is not None and l1 is not None
    assert torch.equal(g0, g1) and torch.equal(l0.logp, l1.logp)


@pytest.mark.parametrize("native_head", [True, False])
def test_tokens_and_positions_as_lists_are_the_tensors(target, native_head: bool) -> None:
    """The drafter hands a level's tokens and positions over as lists (no torch operation on the
    native path): the same level as with tensors, on either path."""
    head = _head(target, "eagle3")
    kernel = head.native
    if not native_head:
        head.native = None
    try:
        gen = torch.Generator().manual_seed(4)
        stream = torch.randn(5, 3 * head.spec.hidden_size, generator=gen)
        level_stream = torch.randn(2, head.spec.hidden_size, generator=gen)
        outs = []
        for as_list in (True, False):
            cache = head.new_cache(16)
            tokens = [7, 3, 9, 1, 4]
            head.run(tokens if as_list else torch.tensor(tokens), stream, None, cache, 0, None)
            cache.length = 5
            keys = Keys.build([5, 5], [[5], [6]])
            outs.append(head.run([2, 8] if as_list else torch.tensor([2, 8]), level_stream,  # int32 positions too
                                 [5, 5] if as_list else torch.tensor([5, 5], dtype=torch.int32), cache, 5, keys,
                                 logits=2, picks=2))
        (g0, l0), (g1, l1) = outs
        assert l0 is not None and l1 is not None
        assert torch.equal(g0, g1) and torch.equal(l0.logp, l1.logp) and l0.picks == l1.picks
    finally:
        head.native = kernel


@pytest.mark.parametrize("topk", [1, 3])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_coupled_picks_build_the_tree_the_perturbed_scores_do(topk: int, temperature: float) -> None:
    """The kernel's coupled top-k (logp / T + noise) is the tensor path's log(softmax(logp / T)) + noise."""
    ops = native.load()
    gen = torch.Generator().manual_seed(11)
    vocab = torch.randperm(50, generator=gen)[:40]
    table = torch.log_softmax(torch.randn(60, 40, generator=gen) * 3, -1)
    noise = GumbelNoise(5, 50)
    config = SpecConfig(temperature=temperature)
    fast = coupled_scores(config, noise, 10, vocab, ops)
    assert fast is not None and fast.picks is not None
    trees = []
    for coupled in (fast, Coupled(fast.scores)):
        tree, cands, _ = grow_tree(5, table[0], lambda f, c: table[[i + 1 for i in f]], lambda ix: vocab[ix],
                                   num_steps=4, topk=topk, num_draft_tokens=8, coupled=coupled)
        trees.append((tree, cands.tokens, cands.logp))
    assert trees[0] == trees[1]
    processed = coupled_scores(SpecConfig(temperature=temperature, top_p=0.9), noise, 10, vocab, ops)
    assert processed is not None and processed.picks is None  # top-p reorders: the tensor path
