"""Our Llama-family forward against transformers, and tree forwards against path-by-path decoding.

Every test runs twice: on our native CPU kernels (where they build) and on torch's ops."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import native
from engine.models.llama import LlamaConfig, UnsupportedModelError
from engine.models.paths import NativeDecoderPath, NativeOpsPath, TorchPath
from engine.tree import DraftTree
from tests.tiny import FAMILIES, check_incremental_decoding, family_config, our_model


@pytest.fixture(autouse=True, params=["native", "torch"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "torch":
        monkeypatch.setenv(native.ENV_SWITCH, "torch")
    elif native.load() is None:
        pytest.skip(f"native kernels unavailable: {native.why_not}")
    return request.param


def test_the_layer_path_is_picked_once_at_construction(kernels: str) -> None:
    """forward never asks which backend runs: the model holds one path, chosen from what runs here."""
    native_here = kernels == "native"
    assert type(our_model("llama")[0]._path) is (NativeDecoderPath if native_here else TorchPath)
    assert type(our_model("qwen3")[0]._path) is (NativeOpsPath if native_here else TorchPath)  # q/k norms


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(family: str) -> None:
    ours, hf = our_model(family)
    ids = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    out = ours.forward(ids, ours.new_cache(64))
    assert out.logits.shape == ref.shape
    torch.testing.assert_close(out.logits, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_decoding_matches_one_shot(family: str) -> None:
    ours, _ = our_model(family)
    check_incremental_decoding(ours)


def _random_tree(n: int, seed: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    tokens = [int(t) for t in torch.randint(3, 97, (n,), generator=g)]
    return DraftTree(tuple(tokens), tuple(parents), (1.0,) * n)


def _tree_logits(model, prefix: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """Logits of every tree node, verified in one forward on top of the cached prefix."""
    cache = model.new_cache(64)
    model.forward(prefix, cache, logits="none")
    cache.commit(len(prefix))
    positions = torch.tensor(tree.depths) + len(prefix)
    return model.forward(torch.tensor(tree.tokens), cache, positions=positions,
                         tree_mask=tree.ancestor_mask()).logits


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_forward_equals_each_path_decoded_alone(family: str, seed: int) -> None:
    ours, _ = our_model(family)
    prefix = torch.randint(3, 97, (27,), generator=torch.Generator().manual_seed(seed))
    tree = _random_tree(12, seed)
    tree_logits = _tree_logits(ours, prefix, tree)
    for node in range(len(tree)):
        path = [0, *tree.path_to(node)]
        seq = torch.cat([prefix, torch.tensor([tree.tokens[i] for i in path])])
        ref = ours.forward(seq, ours.new_cache(64)).logits[-1]
        torch.testing.assert_close(tree_logits[node], ref, atol=1e-4, rtol=1e-4)


def test_commit_moves_an_accepted_tree_path_into_place() -> None:
    ours, _ = our_model("llama")
    prefix = torch.randint(3, 97, (10,), generator=torch.Generator().manual_seed(5))
    tree = DraftTree((50, 51, 52, 53, 54), (-1, 0, 0, 2, 3), (1.0,) * 5)
    cache = ours.new_cache(64)
    ours.forward(prefix, cache, logits="none")
    cache.commit(10)
    ours.forward(torch.tensor(tree.tokens), cache, positions=torch.tensor(tree.depths) + 10,
                 tree_mask=tree.ancestor_mask())
    cache.commit([0, 2, 3])  # root -> node 2 -> node 3
    after = ours.forward(torch.tensor([54]), cache).logits[0]
    ref = ours.forward(torch.cat([prefix, torch.tensor([50, 52, 53, 54])]), ours.new_cache(64)).logits[-1]
    torch.testing.assert_close(after, ref, atol=1e-4, rtol=1e-4)


def test_hidden_states_and_captures() -> None:
    ours, hf = our_model("llama")
    ids = torch.randint(0, 97, (9,), generator=torch.Generator().manual_seed(3))
    out = ours.forward(ids, ours.new_cache(16), return_hidden=True, capture_layers=(0, 1, 2))
    with torch.no_grad():
        ref = hf(ids[None], output_hidden_states=True).hidden_states
    # hidden_states[i] is the residual entering layer i; the last one is after the final norm
    torch.testing.assert_close(out.aux[0], ref[0][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.aux[1], ref[1][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.hidden, ref[-1][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.logits_from_hidden(out.hidden), out.logits)


def test_unsupported_architecture_is_refused_with_a_hint() -> None:
    cfg = family_config("llama") | {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}
    with pytest.raises(UnsupportedModelError, match="backend hf"):
        LlamaConfig.from_dict(cfg)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3", "smollm2_tied"])
def test_native_tree_rows_are_bit_identical_to_plain_decoding(family: str, kernels: str) -> None:
    """On our kernels a tree node's logits are exactly (not just closely) those that decoding its
    path one token at a time gives: what makes greedy speculation lossless by construction."""
    if kernels != "native":
        pytest.skip("torch's attention and matrix products do not promise batch invariance")
    ours, _ = our_model(family)
    assert ours.kernels == "native"
    prefix = torch.randint(3, 97, (30,), generator=torch.Generator().manual_seed(5))
    tree = _random_tree(14, 5)
    tree_logits = _tree_logits(ours, prefix, tree)
    for node in range(len(tree)):
        path = [0, *tree.path_to(node)]
        step_cache = ours.new_cache(64)
        ours.forward(prefix, step_cache, logits="none")
        step_cache.commit(len(prefix))
        for i in path:
            out = ours.forward(torch.tensor([tree.tokens[i]]), step_cache).logits[-1]
            step_cache.commit(1)
        assert torch.equal(tree_logits[node], out), f"node {node}"
