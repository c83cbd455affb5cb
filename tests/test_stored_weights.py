"""Stored-format weights: GGUF blocks read as stored and decoded inside the kernels.

The promise under test: for every format, the stored path computes exactly (``torch.equal``) what
today's fp32 path computes on the dequantized weights (gguf-py's reference ``dequantize``, then
our fp32 kernel), every row independent of how many rows share the call, and a whole model
loaded from a GGUF as stored gives the logits of its fp32 conversion.
"""

from __future__ import annotations

import builtins
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kernels import native
from engine.kernels.linear import Linear
from engine.kernels.stored import StoredEmbedding, StoredLinear
from engine.kernels.weights import QuantRows, StoredPanels
from engine.models.checkpoint import load_state_dict, read_config
from engine.models.gguf_convert import GGUFConversionError, convert_gguf, permute_rope_rows
from engine.models.gguf_weights import load_gguf_state, quant_rows
from engine.models.llama import LlamaConfig, LlamaModel
from engine.tree import DraftTree
from tests.numerics import assert_linear_within_fp32_bound

FORMATS = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K]
NATIVE = native.load() is not None


def gguf_bytes(w: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """``w`` [n, k] in GGUF format ``qtype``; K-quants (no numpy quantizer) get random blocks."""
    if qtype == Q.F32:
        return w
    if qtype == Q.F16:
        return w.astype(np.float16)
    if qtype in (Q.Q4_K, Q.Q6_K):
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(w.size // block, size), dtype=np.uint8)
        scale = (rng.random((raw.shape[0], 1)) * 0.02 + 0.001).astype(np.float16).view(np.uint8)
        if qtype == Q.Q4_K:
            raw[:, 0:2], raw[:, 2:4] = scale, scale
        else:
            raw[:, 208:210] = scale
        return raw.reshape(w.shape[0], -1)
    return gguf.quants.quantize(w, qtype)


def reference(data: np.ndarray, qtype: Q, shape: tuple[int, int]) -> torch.Tensor:
    """Today's fp32 path: gguf-py's dequantize."""
    return torch.from_numpy(np.array(gguf.quants.dequantize(data, qtype), dtype=np.float32).reshape(shape))


@pytest.fixture(params=FORMATS, ids=lambda q: q.name)
def stored_weight(request) -> tuple[QuantRows, torch.Tensor]:
    rng = np.random.default_rng(1)
    n, k = 37, 512  # n: not a multiple of the 16-column panel
    data = gguf_bytes(rng.standard_normal((n, k)).astype(np.float32) * 0.1, request.param, rng)
    return quant_rows(data, request.param.name, n, k), reference(data, request.param, (n, k))


def test_decoded_values_equal_reference_dequantize(stored_weight) -> None:
    rows, dense = stored_weight
    assert torch.equal(rows.dequantize(), dense)
    assert torch.equal(StoredPanels.from_rows(rows).dequantize(), dense)  # the repacking loses nothing


def test_embedding_lookup_decodes_the_reference_rows(stored_weight) -> None:
    """The lookup (our kernel for 8- and 4-bit codes, torch ops otherwise) gives exactly the rows
    of the reference dequantizer, in any order and with repeats; an id past the table is refused."""
    rows, ref = stored_weight
    embed = StoredEmbedding(rows)
    ids = torch.tensor([[3, 0, 3], [rows.shape[0] - 1, 1, 2]])
    assert torch.equal(embed(ids), ref[ids])
    if embed._kernel is not None:
        with pytest.raises(IndexError):
            embed(torch.tensor([rows.shape[0]]))


def test_q8_quantization_is_within_half_a_step_and_multiplies_like_its_dequantized_weight(each_variant: str) -> None:
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(4))
    w[3, :32] = 0.0  # an all-zero block: scale 0, codes 0, no division by zero
    rows = QuantRows.quantize_q8(w)
    assert rows.kind == "q8" and rows.codes.dtype == torch.int8 and rows.scales.shape == (40, 3)
    step = rows.scales.repeat_interleave(32, dim=1)
    assert bool(((rows.dequantize() - w).abs() <= step / 2 + 1e-7).all())
    assert torch.equal(rows.dequantize()[3, :32], torch.zeros(32))
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(5))
    assert torch.equal(StoredLinear([rows])(x), Linear(rows.dequantize())(x))
    with pytest.raises(ValueError, match="does not divide"):
        QuantRows.quantize_q8(torch.randn(4, 40))


@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 13, 20])
def test_stored_product_equals_fp32_path_and_is_row_invariant(stored_weight, m: int, kernel_variant: str) -> None:
    rows, dense = stored_weight
    bias = torch.randn(dense.shape[0], generator=torch.Generator().manual_seed(2))
    ours, fp32 = StoredLinear([rows], bias), Linear(dense, bias)
    assert ours.layout == fp32.layout
    x = torch.randn(m, dense.shape[1], generator=torch.Generator().manual_seed(m))
    y = ours(x)
    assert torch.equal(y, fp32(x))
    # that the shared answer is the product itself, against float64 (torch's fp32 x @ dense.T would
    # take the host's BLAS rounding: 1.4e-4 off on a Q6_K column under ATEN_CPU_CAPABILITY=default)
    assert_linear_within_fp32_bound(y, x, dense, bias)
    for i in range(m):  # a row alone gets the bits it gets inside a batch (a tree)
        assert torch.equal(ours(x[i : i + 1])[0], y[i])
    residual = torch.randn(m, dense.shape[0])
    expected = residual + fp32(x)
    assert torch.equal(ours.add_into(residual.clone(), x), expected)


def test_mixed_formats_in_one_fused_layer(each_variant: str) -> None:
    """q|k|v of a Q4_K_M file mix Q4_K and Q6_K: each part writes its own columns (in every variant
    of the tiles this CPU runs, not only its own pick: ``each_variant``)."""
    rng = np.random.default_rng(3)
    parts, dense = [], []
    for n, qtype in ((64, Q.Q4_K), (32, Q.Q6_K), (32, Q.Q8_0)):
        data = gguf_bytes(rng.standard_normal((n, 256)).astype(np.float32), qtype, rng)
        parts.append(quant_rows(data, qtype.name, n, 256))
        dense.append(reference(data, qtype, (n, 256)))
    ours, fp32 = StoredLinear(parts), Linear(torch.cat(dense))
    assert len(ours.parts) == 3
    x = torch.randn(9, 256)
    assert torch.equal(ours(x), fp32(x))
    assert ours.nbytes < fp32.nbytes / 3


def test_neighbouring_parts_of_one_format_run_as_one_product(each_variant: str) -> None:
    """q|k in Q4_K and v in Q6_K (a Q4_K_M layer) are two products, not three, with every answer the
    same as each part's own product (each panel's columns are computed alone); the fast precision too."""
    rng = np.random.default_rng(4)
    parts, dense = [], []
    for n, qtype in ((48, Q.Q4_K), (16, Q.Q4_K), (16, Q.Q6_K), (32, Q.Q4_K)):
        data = gguf_bytes(rng.standard_normal((n, 256)).astype(np.float32), qtype, rng)
        parts.append(quant_rows(data, qtype.name, n, 256))
        dense.append(reference(data, qtype, (n, 256)))
    ours = StoredLinear(parts)
    assert [(p.kind, p.n) for p in ours.parts] == [("q4", 64), ("q6", 16), ("q4", 32)]
    x = torch.randn(5, 256)
    assert torch.equal(ours(x), Linear(torch.cat(dense))(x))
    ours.fast = True
    alone = [StoredLinear([p]) for p in parts]
    for lin in alone:
        lin.fast = True
    assert torch.equal(ours(x), torch.cat([lin(x) for lin in alone], dim=1))


# kind q6: Q6_K's codes at 6 bits, the same values as their q8 form ---------------------------------
def _q6_and_q8(n: int, k: int, group: int, seed: int) -> tuple[QuantRows, QuantRows]:
    """A q6 weight and its q8 form: real Q6_K blocks (factored scales) for group 16 and k a multiple
    of 256, else random codes 0..63 with fp16-exact scales (the fp16 copies) for even seeds and
    arbitrary fp32 ones for odd."""
    gen = torch.Generator().manual_seed(seed)
    if group == 16 and k % 256 == 0:
        rng = np.random.default_rng(seed)
        rows = quant_rows(gguf_bytes(rng.standard_normal((n, k)).astype(np.float32), Q.Q6_K, rng), "Q6_K", n, k)
        q6 = rows if rows.kind == "q6" else rows.to_q6()
    else:
        scales = torch.rand(n, k // group, generator=gen) * 0.01
        q6 = QuantRows("q6", group, torch.randint(0, 64, (n, k), generator=gen, dtype=torch.uint8),
                       scales.half().float() if seed % 2 == 0 else scales)
    return q6, q6.to_q8()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), blocks=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_q6_panels_round_trip_the_codes(n: int, blocks: int, seed: int) -> None:
    """Kind q6's panels (two q4 words and one word of high bits per 16 k and column) give back every
    code; the q8 form and back is the identity; the values are the q8 form's; 6 bits a weight."""
    k = 16 * blocks
    q6, q8 = _q6_and_q8(n, k, 16, seed)
    panels = StoredPanels.from_rows(q6)
    assert torch.equal(panels.to_rows().codes, q6.codes)
    assert torch.equal(q8.to_q6().codes, q6.codes) and q8.codes.dtype == torch.int8
    assert torch.equal(q6.dequantize(), q8.dequantize()) and torch.equal(panels.dequantize(), q8.dequantize())
    n_pad = -(-n // 16) * 16
    assert panels.codes.numel() * 4 == n_pad * k * 6 // 8 == StoredPanels.from_rows(q8).codes.numel() * 6 // 8


def test_q6_refuses_codes_and_groups_it_cannot_hold() -> None:
    q8 = QuantRows.quantize_q8(torch.randn(4, 64))
    with pytest.raises(ValueError, match="do not fit 6 bits"):
        q8.to_q6()
    with pytest.raises(ValueError, match="only q8 weights"):
        QuantRows.quantize_q4(torch.randn(4, 64)).to_q6()
    with pytest.raises(ValueError, match=r"0\.\.63"):
        StoredPanels.from_rows(QuantRows("q6", 16, torch.full((4, 64), 64, dtype=torch.uint8), torch.ones(4, 4)))
    with pytest.raises(ValueError, match="multiple of 16"):
        StoredPanels.from_rows(QuantRows("q6", 8, torch.zeros(4, 64, dtype=torch.uint8), torch.ones(4, 8)))


@pytest.mark.parametrize("n,k,group", [(37, 256, 16), (1, 768, 16), (17, 96, 16), (33, 96, 32), (30, 512, 64)])
def test_q6_gives_the_bits_of_its_q8_form(n: int, k: int, group: int, kernel_variant: str) -> None:
    """Both products, in every variant this CPU runs, give a q6 weight's outputs the bits of its q8
    form's (the same integers, the same float steps), for every row count 1..30, written and
    accumulated, with a bias; the embedding lookup decodes the same rows."""
    q6, q8 = _q6_and_q8(n, k, group, seed=n + k + group)
    p6, p8 = StoredPanels.from_rows(q6), StoredPanels.from_rows(q8)
    assert p6.scale_form == p8.scale_form and p6.nbytes < p8.nbytes
    gen = torch.Generator().manual_seed(k)
    bias = torch.randn(n, generator=gen)
    kernel = native.load()
    for m in range(1, 31):
        x = torch.randn(m, k, generator=gen) * 2
        x[0, :group] = 0  # a zero block: activation scale 0 in the fast precision
        for product in (kernel.stored_linear, kernel.stored_linear_fast):
            for accumulate in (False, True):
                start = torch.randn(m, n, generator=gen)
                ours, theirs = start.clone(), start.clone()
                for weight, out in ((p6, ours), (p8, theirs)):
                    assert product(x, weight, bias, out, accumulate) in (None, True)  # exact: None; fast: True
                assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32)), (product.__name__, m, accumulate)
    ids = torch.tensor([n - 1, 0, n // 2, 0])
    assert torch.equal(StoredEmbedding(q6)(ids), StoredEmbedding(q8)(ids))
    assert torch.equal(StoredEmbedding(q6)(ids), q8.dequantize()[ids])


def test_fallback_without_native_kernel_gives_the_fp32_fallback_answers(stored_weight, monkeypatch) -> None:
    monkeypatch.setenv(native.ENV_SWITCH, "blocked")
    rows, dense = stored_weight
    ours, fp32 = StoredLinear([rows]), Linear(dense)
    assert ours.layout == "blocked"
    x = torch.randn(3, dense.shape[1])
    assert torch.equal(ours(x), fp32(x))


# whole models from GGUF files ----------------------------------------------------------------
HIDDEN, HEADS, KV_HEADS, LAYERS, FFN, VOCAB = 256, 4, 2, 2, 512, 300
LAYER_FORMATS = {  # one layer Q4_K_M-like, the other Q4_1 like the embedded model
    0: {"attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q6_K, "attn_output": Q.Q4_K,
        "ffn_gate": Q.Q4_K, "ffn_up": Q.Q4_K, "ffn_down": Q.Q6_K},
    1: {"attn_q": Q.Q4_1, "attn_k": Q.Q4_0, "attn_v": Q.BF16, "attn_output": Q.F16,
        "ffn_gate": Q.Q4_1, "ffn_up": Q.Q8_0, "ffn_down": Q.F32},
}  # fmt: skip


def write_model_gguf(path: Path, *, tied: bool) -> None:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)

    def add(name: str, shape: tuple[int, int], qtype: Q, heads: int = 0) -> None:
        arr = rng.standard_normal(shape).astype(np.float32) * 0.05
        if heads:
            arr = permute_rope_rows(arr, heads)
        data = gguf_bytes(arr, qtype, rng)
        w.add_tensor(name, data, raw_dtype=qtype if qtype not in (Q.F32, Q.F16) else None)

    add("token_embd.weight", (VOCAB, HIDDEN), Q.Q8_0)
    if not tied:
        add("output.weight", (VOCAB, HIDDEN), Q.Q6_K)
    w.add_tensor("output_norm.weight", 1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32))
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * 64, HIDDEN), "attn_v": (KV_HEADS * 64, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN),
              "ffn_down": (HIDDEN, FFN)}
    for i in range(LAYERS):
        for kind, qtype in LAYER_FORMATS[i].items():
            add(f"blk.{i}.{kind}.weight", shapes[kind], qtype, {"attn_q": HEADS, "attn_k": KV_HEADS}.get(kind, 0))
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", 1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _models(path: Path, out: Path) -> tuple[LlamaModel, LlamaModel]:
    convert_gguf(path, out, tokenizer=False)  # today's fp32 path
    fp32 = LlamaModel(LlamaConfig.from_dict(read_config(out)), load_state_dict(out))
    config, state = load_gguf_state(path)
    stored = LlamaModel(LlamaConfig.from_dict(config), state, weights="stored")
    return stored, fp32


@pytest.mark.parametrize("tied", [True, False])
def test_gguf_model_stored_logits_equal_fp32_conversion(tmp_path: Path, tied: bool, each_variant: str) -> None:
    """A whole model, in every variant of the stored tiles this CPU runs (``each_variant``): the
    AVX-512 and AVX2 tiles are each checked on any machine that has them, not only on its own pick."""
    write_model_gguf(tmp_path / "m.gguf", tied=tied)
    stored, fp32 = _models(tmp_path / "m.gguf", tmp_path / "fp32")
    assert stored.weights == "stored" and fp32.weights == "fp32"
    assert stored.kernels == fp32.kernels
    assert stored.weight_bytes < fp32.weight_bytes / 3
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(0))
    caches = [m.new_cache(64) for m in (stored, fp32)]
    outs = [m.forward(prompt, c, return_hidden=True, capture_layers=(0, 1)) for m, c in zip((stored, fp32), caches,
                                                                                            strict=True)]
    assert torch.equal(outs[0].logits, outs[1].logits)
    assert torch.equal(outs[0].hidden, outs[1].hidden)
    assert all(torch.equal(a, b) for a, b in zip(outs[0].aux, outs[1].aux, strict=True))
    assert torch.equal(stored.embed_tokens(prompt), fp32.embed_tokens(prompt))
    assert torch.equal(stored.logits_from_hidden(outs[0].hidden), fp32.logits_from_hidden(outs[1].hidden))
    for c in caches:
        c.commit(11)
    tree = DraftTree((5, 6, 7, 8, 9), (-1, 0, 0, 1, 1), (1.0,) * 5)
    tokens, positions = torch.tensor(tree.tokens), torch.tensor(tree.depths) + 11
    trees = [m.forward(tokens, c, positions=positions, tree_mask=tree.ancestor_mask()).logits
             for m, c in zip((stored, fp32), caches, strict=True)]
    assert torch.equal(trees[0], trees[1])
    # the tree's first node is what plain decoding of that token computes
    plain = stored.forward(tokens[:1], caches[0]).logits
    assert torch.equal(plain[0], trees[0][0]) or not NATIVE


def test_gguf_reader_refuses_a_non_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(GGUFConversionError, match="not a GGUF"):
        load_gguf_state(bad)


def test_llamacpp_peer_missing_package_is_one_clear_line(monkeypatch) -> None:
    from specchat.llamacpp_peer import MISSING, LlamaCppPeer
    from specchat.options import UsageError

    real_import = builtins.__import__

    def no_llama(name, *args, **kwargs):
        if name.startswith("llama_cpp"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llama)
    with pytest.raises(UsageError) as err:
        LlamaCppPeer.open(None, 8, 1)
    assert str(err.value) == MISSING and "\n" not in MISSING


def test_bench_weights_modes() -> None:
    import dataclasses

    from specchat.bench import weights_modes
    from specchat.options import UsageError
    from tests.parsed import parsed

    target = parsed("bench").target

    def modes(**kw):
        return weights_modes(dataclasses.replace(target, **{"weights": None, "precision": "exact", **kw}))

    assert modes(weights="stored,fp32") == ["stored", "fp32"]
    assert modes() == ["stored"]
    assert modes(precision="exact,fast") == ["stored/exact", "stored/fast"]
    fast = native.load() is not None and native.load().fast_variant is not None
    assert modes(precision="auto") == (["stored/fast"] if fast else ["stored"])  # the default: fast where it runs
    assert modes(weights="stored,fp32", precision="auto") == ["stored", "fp32"]  # comparing weights: exact
    for bad in ({"weights": "int8"}, {"precision": "fp8"}, {"precision": "auto,fast"},
                {"weights": "fp32", "precision": "fast"}):
        with pytest.raises(UsageError):
            modes(**bad)


@pytest.mark.slow
def test_embedded_model_stored_logits_equal_fp32_path() -> None:
    """The real embedded Q4_1/Q8_0 model: stored-weight logits are bit-identical to the fp32 path."""
    from engine.loader import load_model

    stored = load_model(None, weights="stored").model
    fp32 = load_model(None, weights="fp32").model
    assert stored.weights == "stored" and fp32.weights == "fp32"
    assert stored.weight_bytes * 4 < fp32.weight_bytes
    prompt = torch.randint(0, stored.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    caches = [m.new_cache(128) for m in (stored, fp32)]
    a, b = (m.forward(prompt, c).logits for m, c in zip((stored, fp32), caches, strict=True))
    assert torch.equal(a, b)
    for c in caches:
        c.commit(40)
    tree = DraftTree(tuple(range(100, 108)), (-1, 0, 0, 1, 1, 2, 2, 3), (1.0,) * 8)
    tokens, positions = torch.tensor(tree.tokens), torch.tensor(tree.depths) + 40
    a, b = (m.forward(tokens, c, positions=positions, tree_mask=tree.ancestor_mask()).logits
            for m, c in zip((stored, fp32), caches, strict=True))
    assert torch.equal(a, b)


def _amx_granted() -> bool:
    """Whether Linux grants this process AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, what
    fast_amx.c asks): a kernel before 5.16 or a seccomp profile refuses it though cpuinfo lists
    amx_tile, and the kernel then keeps the VNNI tiles."""
    import ctypes
    import platform

    if platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA


def test_kernel_variant_follows_cpu_flags() -> None:
    """AVX-512 tiles only where /proc/cpuinfo lists avx512f, avx512bw and avx512vl; the fast
    precision's VNNI tiles only with avx512_vnni and avx512vbmi, and AMX only with amx_tile and
    amx_int8 and a Linux that grants the tile state. Checked on the CPU's own pick, whatever
    SPECCHAT_KERNEL_VARIANT the run was started with (it is put back after)."""
    if not NATIVE:
        assert native.variant() == "torch"
        return
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    kernel = native.load()
    kernel.choose_variant("")
    try:
        wide = {"avx512f", "avx512bw", "avx512vl"} <= flags
        assert native.variant() == ("avx512" if wide else "avx2")
        vnni = wide and {"avx512_vnni", "avx512vbmi"} <= flags
        amx = vnni and {"amx_tile", "amx_int8"} <= flags and _amx_granted()
        vnni256 = "avx_vnni" in flags
        assert kernel.fast_variant == ("amx" if amx else "avx512vnni" if vnni else "avxvnni" if vnni256 else "avx2")
    finally:
        kernel.choose_variant(native.forced_variant())
