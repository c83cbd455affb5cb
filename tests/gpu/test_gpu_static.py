"""The static-shape decode/verify path: buckets, padding, buffers and the static forward on CPU
(eager, torch attention; and Triton attention under the interpreter), the CUDA graph path where a
GPU exists."""

from __future__ import annotations

import pytest
import torch

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.events import Step
from engine.gpu.static import BUCKETS, StaticBuffers, StaticDecoder, bucket_for, cuda_capacity, pad_tree
from engine.session import Session
from engine.tree import DraftTree
from tests.drafters import RandomTreeDrafter
from tests.tiny import TinyTokenizer, our_model


def test_bucket_choice() -> None:
    assert [bucket_for(n) for n in (1, 2, 3, 4, 5, 8, 9, 17, 33, 64)] == [1, 2, 4, 4, 8, 8, 16, 32, 64, 64]
    assert BUCKETS == (1, 2, 4, 8, 16, 32, 64)
    with pytest.raises(ValueError, match="largest bucket"):
        bucket_for(65)
    with pytest.raises(ValueError):
        bucket_for(0)


def test_cuda_capacity_rounds_up_to_a_power_of_two() -> None:
    assert [cuda_capacity(c) for c in (1, 900, 1024, 1025, 5000)] == [1024, 1024, 1024, 2048, 8192]


def test_padding_masks_isolate_the_padding_rows() -> None:
    tree = DraftTree((5, 6, 7), (-1, 0, 0), (1.0,) * 3)
    tokens, positions, mask = pad_tree(torch.tensor(tree.tokens), torch.tensor(tree.depths) + 10,
                                       tree.ancestor_mask(), 4)
    assert tokens.tolist() == [5, 6, 7, 7]
    assert positions.tolist() == [10, 11, 11, 11]
    assert mask.tolist() == [[True, False, False, False], [True, True, False, False],
                             [True, False, True, False], [False, False, False, True]]


def test_buffers_are_reused_across_steps_and_buckets() -> None:
    buffers = StaticBuffers(torch.device("cpu"))
    base = buffers.device_buffer.data_ptr()
    first = buffers.load(*pad_tree(torch.tensor([3, 4]), torch.tensor([7, 8]), torch.ones(2, 2).tril(), 2), 7)
    again = buffers.load(*pad_tree(torch.tensor([9, 1]), torch.tensor([8, 9]), torch.ones(2, 2).tril(), 2), 8)
    assert first.tokens.tolist() == [9, 1] and int(first.length) == 8  # the same memory, rewritten
    big = buffers.load(*pad_tree(torch.tensor([2, 3, 4]), torch.tensor([9, 10, 10]), torch.eye(3), 4), 9)
    for views in (first, again, big):
        for t in (views.tokens, views.positions, views.mask, views.length):
            assert t.untyped_storage().data_ptr() == base
    assert first.tokens.data_ptr() == again.tokens.data_ptr() == big.tokens.data_ptr()
    assert int(big.length) == 9 and big.tokens.tolist() == [2, 3, 4, 4]
    assert big.mask.tolist() == torch.eye(4, dtype=torch.int64).tolist()


def _random_tree(n: int, seed: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    return DraftTree(tuple(int(t) for t in torch.randint(3, 97, (n,), generator=g)), tuple(parents), (1.0,) * n)


def _tree_logits(model, prefix, tree, decoder=None):
    cache = model.new_cache(96)
    model.forward(prefix, cache, logits="none")
    cache.commit(len(prefix))
    positions = torch.tensor(tree.depths) + len(prefix)
    if decoder is None:
        return model.forward(torch.tensor(tree.tokens), cache, positions=positions,
                             tree_mask=tree.ancestor_mask()).logits
    return decoder.forward(torch.tensor(tree.tokens), cache, positions, tree.ancestor_mask(), "all").logits


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "smollm2_tied"])
@pytest.mark.parametrize("n", [1, 3, 11])
def test_padded_static_forward_equals_the_unpadded_tree(family: str, n: int) -> None:
    """The tree padded to its bucket gives the real rows the logits of the ordinary forward
    (mistral: sliding window 24 crossed by the 40-token prefix)."""
    model, _ = our_model(family)
    prefix = torch.randint(3, 97, (40,), generator=torch.Generator().manual_seed(n))
    tree = _random_tree(n, seed=n)
    want = _tree_logits(model, prefix, tree)
    got = _tree_logits(model, prefix, tree, StaticDecoder(model, graphs=False, attention="torch"))
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_static_forward_with_triton_attention(interpret, family: str) -> None:
    model, _ = our_model(family)
    prefix = torch.randint(3, 97, (30,), generator=torch.Generator().manual_seed(4))
    tree = _random_tree(6, seed=4)
    want = _tree_logits(model, prefix, tree)
    got = _tree_logits(model, prefix, tree, StaticDecoder(model, graphs=False, attention="triton"))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("capture", [(), (1,), (0, 1, 2)])
def test_static_forward_returns_the_eager_features(capture: tuple[int, ...]) -> None:
    """EAGLE's verify forwards on the static path: the residual entering each captured layer (2:
    the last layer's output) and the final-normed hidden states, the eager forward's, real rows
    only, in layer order whatever order they were asked in (the tiny model has 2 layers)."""
    model, _ = our_model("llama")
    prefix = torch.randint(3, 97, (30,), generator=torch.Generator().manual_seed(7))
    tree = _random_tree(5, seed=7)
    outs = []
    for decoder in (None, StaticDecoder(model, graphs=False, attention="torch")):
        cache = model.new_cache(96)
        model.forward(prefix, cache, logits="none")
        cache.commit(len(prefix))
        model._static = decoder
        try:
            outs.append(model.forward(torch.tensor(tree.tokens), cache, positions=torch.tensor(tree.depths) + 30,
                                      tree_mask=tree.ancestor_mask(), return_hidden=True,
                                      capture_layers=capture[::-1]))
        finally:
            model._static = None
    want, got = outs
    assert len(got.aux) == len(want.aux) == len(capture)
    for g, w in zip([got.logits, got.hidden, *got.aux], [want.logits, want.hidden, *want.aux], strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_static_decoder_declines_what_it_cannot_take() -> None:
    model, _ = our_model("llama")
    decoder = StaticDecoder(model, graphs=False)
    cache = model.new_cache(10)
    assert decoder.forward(torch.arange(3, 68), cache, None, None, "all") is None  # > 64 tokens
    assert decoder.forward(torch.tensor([5]), cache, None, None, "none") is None
    cache.commit(8)
    assert decoder.forward(torch.tensor([5, 6, 7]), cache, None, None, "all") is None  # bucket 4 > room
    with pytest.raises(ValueError, match="CUDA"):
        StaticDecoder(model, graphs=True)


def _tokens(events) -> list[int]:
    return [c.id for e in events if isinstance(e, Step) for c in e.committed]


@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_session_on_the_static_path_equals_the_baseline(attention: str, request: pytest.FixtureRequest) -> None:
    """The whole loop with every verify forward (and the short prefill) going through buckets and
    the static forward gives the plain model's greedy answer, speculative or not (Triton attention
    under the interpreter too)."""
    if attention == "triton":
        request.getfixturevalue("interpret")
    model, _ = our_model("qwen2")
    prompt = [1, 5, 9, 14, 5, 9, 22]
    plain = Session(model, TinyTokenizer(), SpecConfig(max_new_tokens=30), drafters={"none": NoDrafter})
    want = _tokens(plain.generate_ids(prompt))
    model._static = StaticDecoder(model, graphs=False, attention=attention)
    try:
        oracle = {tuple(prompt + want)[:i]: (prompt + want)[i] for i in range(1, len(prompt + want))}
        for method, drafter in (("none", NoDrafter()), ("standalone", RandomTreeDrafter(1, oracle, 0.7))):
            config = SpecConfig(method=method, num_draft_tokens=12, max_new_tokens=30, adaptive_draft=False)
            session = Session(model, TinyTokenizer(), config, drafters={"none": NoDrafter, method: lambda d=drafter: d})
            assert _tokens(session.generate_ids(prompt)) == want
    finally:
        model._static = None


# ---- CUDA --------------------------------------------------------------------------------
def test_cuda_graphs_replay_the_eager_static_forward(cuda) -> None:
    model, _ = our_model("mistral")
    from engine.models.llama import LlamaConfig, LlamaModel
    from tests.tiny import hf_model

    hf, cfg = hf_model("mistral")
    gpu = LlamaModel(LlamaConfig.from_dict(cfg), dict(hf.state_dict()), device=cuda)
    assert gpu._static is not None and gpu._static.graphs
    prefix = torch.randint(3, 97, (40,), generator=torch.Generator().manual_seed(0))
    for n in (1, 5, 16, 40):
        tree = _random_tree(n, seed=n)
        want = _tree_logits(model, prefix, tree)
        got = _tree_logits(gpu, prefix, tree)
        torch.testing.assert_close(got.cpu(), want, atol=1e-3, rtol=1e-3)
    assert gpu._static.replays >= 4 and gpu._static.captures >= 4


def test_cuda_session_greedy_equals_baseline(cuda) -> None:
    from engine.models.llama import LlamaConfig, LlamaModel
    from tests.tiny import hf_model

    hf, cfg = hf_model("llama")
    gpu = LlamaModel(LlamaConfig.from_dict(cfg), dict(hf.state_dict()), device=cuda)
    prompt = [1, 5, 9, 14, 5, 9, 22]
    plain = Session(gpu, TinyTokenizer(), SpecConfig(max_new_tokens=40), drafters={"none": NoDrafter})
    want = _tokens(plain.generate_ids(prompt))
    oracle = {tuple(prompt + want)[:i]: (prompt + want)[i] for i in range(1, len(prompt + want))}
    config = SpecConfig(method="standalone", num_draft_tokens=16, max_new_tokens=40, adaptive_draft=False)
    session = Session(gpu, TinyTokenizer(), config,
                      drafters={"none": NoDrafter, "standalone": lambda: RandomTreeDrafter(2, oracle, 0.8)})
    assert _tokens(session.generate_ids(prompt)) == want
