"""The Python bindings of our native CPU kernels (``skinny.c``, ``ops.c``, ``attention.c``,
``attention_shared.c``, ``stored.c``, ``fast.c``, ``fast_bf16.c``, ``decoder.c``, ``eagle_native.c``): one
loaded library, its C signatures, and thin typed wrappers.

``build.py`` compiles and caches the library; here it is loaded once per process. Where it
cannot run (no compiler, no AVX2/FMA, a failed build, or ``SPECCHAT_LINEAR=torch``) ``load()``
returns None with the reason in ``why_not``, and the callers keep torch's own products: slower,
never wrong.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.kernels import build

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.kernels.weights import StoredPanels

ENV_SWITCH = "SPECCHAT_LINEAR"  # "torch" turns the native kernel off
# "avx2": the AVX2 tiles everywhere; "avxvnni": what an AVX2 CPU with AVX-VNNI runs (Intel client
# cores since Alder Lake), on any CPU that has the instructions; "avx512": no AMX
VARIANT_SWITCH = "SPECCHAT_KERNEL_VARIANT"
VARIANTS = ("", "avx2", "avxvnni", "avx512")


_p, _i, _l, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
_SIGNATURES = {
    "skinny_linear": [_p, _l, _l, _p, _l, _p, _p, _i, _i],
    "stored_linear": [_p, _l, _l, _i, _l, _p, _p, _p, _l, _p, _p, _l, _i, _i, _i],
    "rms_norm": [_p, _l, _l, _p, _f, _p],
    "silu_mul": [_p, _l, _l, _p],
    "tree_attention": [_p, _l, _p, _p, _l, _l, _l, _i, _i, _i, _p, _l, _p, _f, _p, _i, _i],
    "decoder_layers": [_p, _l, _p, _p, _l, _p, _p, _l, _l, _l, _p, _p, _p, _p, _l, _p],
    "decoder_rows": [_p, _l, _p, _p, _l, _p, _p, _l, _l, _p, _p, _p, _p, _p, _l, _p],
    "keyed_attention": [_p, _l, _p, _p, _l, _l, _i, _i, _i, _p, _p, _p, _l, _p, _l, _p, _f, _p, _i, _i],
    "eagle_head_forward": [_p, _p, _p, _p, _l, _l, _p, _p, _l, _p, _l, _p, _l, _p, _p, _p, _p, _l, _p, _p, _l, _p,
                           _l, _p, _p, _p],
    "log_softmax_topk": [_p, _l, _l, _l, _p, _p, _p],
    "perturbed_topk": [_p, _l, _l, _l, _f, _p, _p, _p, _p],
    "argmax_rows": [_p, _l, _l, _p],
    "perturbed_argmax_rows": [_p, _l, _l, _f, _p, _p],
    "dequantize_rows": [_i, _l, _p, _p, _p, _l, _l, _p, _l, _p],
    "corpus_tree": [_p, _l, _p, _l, _p, _p, _p, _l, _l, _p, _l, _l, _l, ctypes.c_double, _p, _p, _p],
}


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def split_rows(flat: Any, rows: int, k: int) -> list[list[Any]]:
    """A ctypes array of rows * k values as ``rows`` lists of k (the kernels' picks, read without torch)."""
    values = list(flat)
    return [values[r * k:(r + 1) * k] for r in range(rows)]


class NativeKernel:
    """The loaded library, called with fp32 CPU tensors (callers check shapes and contiguity)."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self.variant = "avx2"  # "avx512" where stored.c's wide tiles run (set by load())
        self.attention_wide = False  # attention's 16-lane loops run (AVX-512F; set by choose_variant)
        for name, args in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = None
        self._lib = lib
        self.decoder_layers = lib.decoder_layers  # driven by engine/kernels/decoder.py
        self.decoder_layers.restype = _i
        self.decoder_rows = lib.decoder_rows
        self.decoder_rows.restype = _i
        self.eagle_head_forward = lib.eagle_head_forward  # driven by engine/kernels/eagle_native.py
        self.eagle_head_forward.restype = _i
        self._lib.dequantize_rows.restype = _i
        self._lib.corpus_tree.restype = _l
        self._lib.stored_linear_fast.argtypes = _SIGNATURES["stored_linear"]
        self._lib.stored_linear_fast.restype = _i
        self._lib.fast_variant.argtypes = [_i]
        self._lib.attention_variant.argtypes = [_i]
        self._lib.attention_variant.restype = _i
        self._lib.fast_variant.restype = _i
        self._lib.fast_bf16_enabled.restype = _i
        # the fast precision's tiles: "amx" (AMX-INT8 for several rows, VNNI for one), "avx512vnni",
        # "avxvnni" (vpdpbusd on 8 lanes: AVX2 CPUs with AVX-VNNI), "avx2"; None: no fast kernel here
        self.fast_variant: str | None = None
        # whether the fast precision multiplies bf16 weights by vdpbf16ps (AVX512_BF16: fast_bf16.c);
        # where it does not, bf16 weights keep the exact kernel in either precision
        self.fast_bf16 = False

    def choose_variant(self, force: str = "") -> None:
        """Pick the tiles from the CPU flags. ``force``: "avx2" keeps even an AVX-512 CPU on the
        AVX2 tiles, "avxvnni" runs what an AVX2 CPU with AVX-VNNI runs (the AVX2 tiles where the CPU
        lacks AVX-VNNI), "avx512" keeps an AMX CPU's fast products on the VNNI tiles; what
        ``SPECCHAT_KERNEL_VARIANT`` asks, and how the tests check every variant on one machine."""
        if force not in VARIANTS:
            raise ValueError(f"{VARIANT_SWITCH}={force!r}: use one of {', '.join(v for v in VARIANTS if v)}")
        self._lib.stored_variant.argtypes = [_i]
        self._lib.stored_variant.restype = _i
        narrow = force in ("avx2", "avxvnni")  # an AVX2-class CPU: no AVX-512 anywhere
        self.variant = "avx512" if self._lib.stored_variant(2 if narrow else 0) == 512 else "avx2"
        code = self._lib.fast_variant({"avx2": 2, "avxvnni": 3, "avx512": 1}.get(force, 0))
        self.fast_variant = {513: "amx", 512: "avx512vnni", 256: "avxvnni", 2: "avx2"}.get(code)
        self.fast_bf16 = bool(self._lib.fast_bf16_enabled())
        # attention's 16-lane loops (the same bits as its 8-lane ones): off on an AVX2-class pick
        self.use_wide_attention(not narrow)

    def use_wide_attention(self, on: bool) -> None:
        """Attention's 16-lane loops where the CPU has AVX-512F (``on``), else its 8-lane ones: the
        same bits either way; how scripts/kernel_ab.py times the two against each other."""
        self.attention_wide = bool(self._lib.attention_variant(0 if on else 2))

    def linear(
        self,
        x: torch.Tensor,
        panels: torch.Tensor,
        n: int,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: [M, K] contiguous; panels: [ceil(n/16), K, 16]. Returns [M, n], or adds into
        ``residual`` ([M, n] contiguous) in place and returns it."""
        m, k = x.shape
        y = torch.empty(m, n, dtype=torch.float32) if residual is None else residual
        self._lib.skinny_linear(
            x.data_ptr(),
            m,
            k,
            panels.data_ptr(),
            n,
            ptr(bias),
            y.data_ptr(),
            int(residual is not None),
            torch.get_num_threads(),
        )
        return y

    def stored_linear(
        self,
        x: torch.Tensor,
        weight: StoredPanels,
        bias: torch.Tensor | None,
        out: torch.Tensor,
        accumulate: bool,
    ) -> None:
        """x: [M, K] contiguous fp32; ``out``: an [M, weight.n] view with unit column stride (a
        column slice of a bigger output is fine), written or (``accumulate``) added to."""
        m, k = x.shape
        sc, of, hs = _scale_args(weight)
        self._lib.stored_linear(x.data_ptr(), m, k, weight.kind_id, weight.group, weight.codes.data_ptr(), sc, of,
                                weight.n, ptr(bias), out.data_ptr(), out.stride(0), int(accumulate),
                                torch.get_num_threads(), hs)

    def stored_linear_fast(self, x: torch.Tensor, weight: StoredPanels, bias: torch.Tensor | None, out: torch.Tensor,
                           accumulate: bool) -> bool:
        """The fast precision's product (fast.c), arguments as :meth:`stored_linear`; False when
        this weight's kind or this CPU has no fast kernel (nothing was written)."""
        m, k = x.shape
        sc, of, hs = _scale_args(weight)
        rc = self._lib.stored_linear_fast(
            x.data_ptr(), m, k, weight.kind_id, weight.group, weight.codes.data_ptr(), sc, of, weight.n, ptr(bias),
            out.data_ptr(), out.stride(0), int(accumulate), torch.get_num_threads(), hs,
        )
        if rc == -2:
            raise MemoryError("the fast kernel could not allocate its activation buffers")
        return rc == 0

    def keyed_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: torch.Tensor,
                        last: torch.Tensor, extra: torch.Tensor, nextra: torch.Tensor, scale: float) -> torch.Tensor:
        """q: [T, nh, hd] (contiguous heads); k, v: [nkv, cap, hd]; query t sees slots
        first[t]..last[t] (int64) then extra[t, :nextra[t]] (int32 [T, E]). Returns [T, nh*hd]."""
        t, nh, hd = q.shape
        nkv, cap, _ = k.shape
        out = torch.empty(t, nh * hd, dtype=torch.float32)
        self._lib.keyed_attention(q.data_ptr(), q.stride(0), k.data_ptr(), v.data_ptr(), cap, t, nh, nkv, hd,
                                  first.data_ptr(), last.data_ptr(), extra.data_ptr(), extra.shape[1],
                                  nextra.data_ptr(), 0, None, scale, out.data_ptr(), torch.get_num_threads(),
                                  kv16(k, v))
        return out

    def argmax_rows(self, x: torch.Tensor) -> list[int]:
        """x: [rows, n] contiguous fp32 -> the first index of each row's maximum (torch.argmax's
        answer, NaN included), as a list."""
        rows, n = x.shape
        out = torch.empty(rows, dtype=torch.int64)
        self._lib.argmax_rows(x.data_ptr(), rows, n, out.data_ptr())
        return out.tolist()

    def perturbed_argmax_rows(self, x: torch.Tensor, scale: float, noise: torch.Tensor) -> list[int]:
        """x: [rows, n] contiguous fp32, noise: [n] contiguous fp32 -> each row's first index of the
        largest ``x * scale + noise`` (each step rounded to fp32; NaN as in :meth:`argmax_rows`)."""
        rows, n = x.shape
        out = torch.empty(rows, dtype=torch.int64)
        self._lib.perturbed_argmax_rows(x.data_ptr(), rows, n, scale, noise.data_ptr(), out.data_ptr())
        return out.tolist()

    def corpus_tree(self, arrays: tuple[Any, Any, Any, Any, Any], max_n: int
                    ) -> Callable[[list[int], int, int, float], tuple[list[int], list[int], list[float]] | None]:
        """The n-gram corpus's best-first draft tree (corpus.c; engine/drafters/ngram_corpus.py
        says what it computes) as a function of (context, max_drafts, width, min_path), bound to
        one index: ``arrays`` are its keys (uint64 [M]), hash slots (int32, a power of two), tokens
        and counts (int32 [M, top]) and totals (int32 [M]), contiguous numpy arrays the caller keeps
        alive; ``context``: the last max_n - 1 history tokens and the root. The function returns
        None past the kernel's limits.

        Why a bound function: the call is a few microseconds of C, and reading eight arrays'
        pointers and allocating the outputs at every call cost several times that in Python."""
        keys, slots, tokens, counts, totals = arrays
        fixed = (keys.ctypes.data, len(keys), slots.ctypes.data, len(slots).bit_length() - 1, tokens.ctypes.data,
                 counts.ctypes.data, totals.ctypes.data, tokens.shape[1], max_n)
        cap = 256  # corpus.c's MAX_NODES
        out_tokens, out_parents = (ctypes.c_int64 * cap)(), (ctypes.c_int64 * cap)()
        out_probs = (ctypes.c_double * cap)()
        ctx = (ctypes.c_int64 * max_n)()
        fn = self._lib.corpus_tree

        def tree(context: list[int], max_drafts: int, width: int, min_path: float
                 ) -> tuple[list[int], list[int], list[float]] | None:
            if not 0 < len(context) <= max_n or max_drafts + 1 > cap:
                return None
            ctx[: len(context)] = context
            n = fn(*fixed, ctx, len(context), max_drafts, width, min_path, out_tokens, out_parents, out_probs)
            return None if n < 0 else (out_tokens[:n], out_parents[:n], out_probs[:n])

        return tree

    def log_softmax_topk_(self, x: torch.Tensor, k: int = 0, vocab: torch.Tensor | None = None
                          ) -> tuple[list[list[int]], list[list[float]]] | None:
        """x: [rows, n] contiguous fp32, made its log-softmax in place; with k > 0 also each row's k
        largest as plain lists (best first, ties to the lower index): their indices, mapped through
        ``vocab`` (int64 [n]: a draft head's index -> target id) where given, and their values."""
        rows, n = x.shape
        count = rows * max(k, 0)
        ids, vals = (ctypes.c_long * count)(), (ctypes.c_float * count)()
        self._lib.log_softmax_topk(x.data_ptr(), rows, n, k, ptr(vocab), ids, vals)
        return (split_rows(ids, rows, k), split_rows(vals, rows, k)) if k > 0 else None

    def perturbed_topk(self, logp: torch.Tensor, k: int, temperature: float, noise: torch.Tensor,
                       vocab: torch.Tensor | None) -> tuple[list[list[int]], list[list[float]]]:
        """Coupled drafting's top-k (ops.c): for [rows, V] contiguous fp32 log-probabilities, each row's
        k largest ``logp / temperature + noise[vocab]`` (noise: fp32 over the target's vocabulary;
        vocab: int64 [V] head index -> target id, or None), as target ids and log-probabilities."""
        if not 0 < k <= 64:
            raise ValueError(f"perturbed_topk takes 1 to 64 picks a row, not {k}")
        rows, n = logp.shape
        ids, vals = (ctypes.c_long * (rows * k))(), (ctypes.c_float * (rows * k))()
        self._lib.perturbed_topk(logp.data_ptr(), rows, n, k, 1.0 / temperature, noise.data_ptr(), ptr(vocab), ids,
                                 vals)
        return split_rows(ids, rows, k), split_rows(vals, rows, k)

    def dequantize_rows(self, kind_id: int, group: int, codes: torch.Tensor, scales: torch.Tensor,
                        offsets: torch.Tensor | None, ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Rows ``ids`` (an int64 contiguous tensor, or a list) of a q8/q4 row-form weight ([rows, K]
        contiguous codes, [rows, K/group] fp32 scales and offsets) as fp32 [len(ids), K] (stored.c)."""
        nrows, k = codes.shape
        n = len(ids)
        held = None if isinstance(ids, torch.Tensor) else (ctypes.c_long * n)(*ids)  # alive until the call returns
        at = ids.data_ptr() if held is None else ctypes.addressof(held)
        out = torch.empty(n, k, dtype=torch.float32)
        if self._lib.dequantize_rows(kind_id, group, codes.data_ptr(), scales.data_ptr(), ptr(offsets), nrows, k,
                                     at, n, out.data_ptr()) != 0:
            raise IndexError(f"a token id outside 0..{nrows - 1}")
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x: [T, H] contiguous, H a multiple of 8."""
        y = torch.empty_like(x)
        self._lib.rms_norm(x.data_ptr(), x.shape[0], x.shape[1], weight.data_ptr(), eps, y.data_ptr())
        return y

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2I] contiguous, I a multiple of 8 -> silu(gate) * up, [T, I]."""
        t, two_i = gate_up.shape
        y = torch.empty(t, two_i // 2, dtype=torch.float32)
        self._lib.silu_mul(gate_up.data_ptr(), t, two_i // 2, y.data_ptr())
        return y

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        length: int,
        tree: torch.Tensor | None,
        window: int,
        positions: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        """q: [T, nh, hd] with contiguous heads (any token stride); k, v: one layer's cache
        [nkv, cap, hd] (fp32 or fp16), the new tokens already at ``length..length+T-1``; tree: [T, T] bool or
        None (causal); positions: [T] int64 (only read with a sliding window). Returns [T, nh*hd]."""
        t, nh, hd = q.shape
        nkv, cap, _ = k.shape
        out = torch.empty(t, nh * hd, dtype=torch.float32)
        self._lib.tree_attention(
            q.data_ptr(),
            q.stride(0),
            k.data_ptr(),
            v.data_ptr(),
            cap,
            length,
            t,
            nh,
            nkv,
            hd,
            ptr(tree),
            window,
            ptr(positions),
            scale,
            out.data_ptr(),
            torch.get_num_threads(),
            kv16(k, v),
        )
        return out


def _scale_args(weight: StoredPanels) -> tuple[int | None, int | None, int]:
    """The scale and offset pointers both products take, and their form (scales.h): the compact
    copies where the weight has them (the same floats from fewer bytes), else the fp32 ones."""
    if weight.scale_form and weight.compact_scales is not None:
        return ptr(weight.compact_scales), ptr(weight.compact_offsets), weight.scale_form
    return ptr(weight.scales), ptr(weight.offsets), 0


def kv16(k: torch.Tensor, v: torch.Tensor) -> int:
    """1 when a KV cache holds fp16 values (the fast precision's), 0 for fp32; anything else is refused
    before C reads it as either."""
    if k.dtype != v.dtype or k.dtype not in (torch.float32, torch.float16):
        raise TypeError(f"the native attention reads fp32 or fp16 K/V, not {k.dtype}/{v.dtype}")
    return int(k.dtype == torch.float16)


@cache
def load() -> NativeKernel | None:
    """The kernel, built on first use; None where it cannot run here (the reason is in ``why_not``)."""
    global why_not
    if os.environ.get(ENV_SWITCH, "").lower() == "torch":
        why_not = f"{ENV_SWITCH}=torch"
        return None
    try:
        path = build.library()
        lib = ctypes.CDLL(str(path))
    except build.BuildError as exc:
        why_not = str(exc)
        return None
    except OSError as exc:  # a library that does not load (a truncated file, another libc)
        why_not = f"build failed: {exc}"
        return None
    if not (lib.skinny_supported() and lib.stored_supported()):
        why_not = "this CPU lacks AVX2/FMA/F16C"
        return None
    why_not = ""
    kernel = NativeKernel(lib, path)
    kernel.choose_variant(forced_variant())
    return kernel


why_not = "not loaded yet"


def forced_variant() -> str:
    """The tiles ``SPECCHAT_KERNEL_VARIANT`` asks for: "avx2", "avxvnni", "avx512", or "" (the CPU's
    own pick, also for any other value)."""
    forced = os.environ.get(VARIANT_SWITCH, "").lower()
    return forced if forced in VARIANTS else ""


def row_argmax(logits: torch.Tensor) -> list[int]:
    """``logits.argmax(dim=-1).tolist()`` for [rows, vocab] logits, in our kernel where it runs
    (torch's CPU argmax takes ~45 us for one row of the embedded model's vocabulary)."""
    kernel = load() if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2 else None
    if kernel is None or logits.shape[1] == 0:
        return logits.argmax(dim=-1).tolist()
    return kernel.argmax_rows(logits.contiguous())


def perturbed_argmax(logits: torch.Tensor, scale: float, noise: torch.Tensor) -> int | None:
    """``int((logits * scale + noise).argmax())`` for a [vocab] fp32 row, in our kernel where it runs;
    None where it does not (a device tensor, another dtype, no kernel): the caller computes it."""
    if (logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() != 1 or noise.device.type != "cpu"
            or noise.dtype != torch.float32 or noise.shape != logits.shape or logits.shape[0] == 0):
        return None
    kernel = load()
    if kernel is None:
        return None
    return kernel.perturbed_argmax_rows(logits.contiguous()[None], scale, noise.contiguous())[0]


def variant() -> str:
    """Which kernel variant runs here: "avx512" (stored-weight tiles of 12 rows, on CPUs with
    AVX-512 F/BW/VL; untested on hardware so far), "avx2", or "torch" (no native kernel)."""
    kernel = load()
    return kernel.variant if kernel is not None else "torch"
