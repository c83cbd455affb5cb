"""The DFlash drafter as a module: its shape, its public weight names, and its forward.

A DFlash drafter is a few Qwen3-style decoder layers run over a *block*: the anchor (the last
token the target produced) followed by ``block_size - 1`` mask tokens, all embedded with the
target's own embedding. It reads the target through its *context*: for every token before the
anchor, the residual streams entering some target layers (z-lab's ``target_layer_ids``, outputs
of those layers), concatenated, projected by ``fc`` and normed by ``hidden_norm``. In every layer
the context rows go through that layer's ``k_proj``/``v_proj`` (and ``k_norm`` and RoPE at their
own positions) and are keys and values beside the block's own; the block's queries attend to all
of them and to every block position, in both directions (no causal mask inside the block). The
output at block position j (after the final ``norm``) is the drafter's guess of the token j
places after the anchor, through the target's LM head (or, in the speculators layout with a
reduced vocabulary, its own ``lm_head`` and ``d2t``). Positions are absolute: context row p sits
at RoPE position p, block position j at anchor + j.

One forward therefore proposes the whole block, which is why the later positions, guessed without
seeing the guesses before them, are accepted less often.

:func:`run_layer` is that layer, written once for both uses:

* training and the reference (:class:`DFlashDraft`, an ``nn.Module`` named by the public keys, so
  ``state_dict()`` is a checkpoint): a batch of blocks over one sequence's context, each block
  seeing the context strictly before its anchor and its own positions (:func:`block_mask`);
* inference (engine/drafters/dflash/runner.py): our kernels' products, the context's keys and
  values kept in a KV cache so each step adds only the newly committed rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.gpu.rms_norm import rms_norm
from engine.models.llama_config import DecoderShape
from engine.models.rope import RotaryTable


@dataclass(frozen=True, kw_only=True)
class DFlashSpec(DecoderShape):
    """One drafter's shape and meaning. ``vocab_size`` is the target's vocabulary; ``hidden_size``
    the target's width too (the block is the target's embeddings)."""

    num_layers: int  # draft decoder layers
    block_size: int  # positions of a block, the anchor included (drafts: block_size - 1)
    # target layers whose *input* residual the context reads, in the drafter's order (z-lab's
    # target_layer_ids + 1: the output of layer i is the input of layer i + 1)
    capture_layers: tuple[int, ...]
    mask_token_id: int  # the token the block's positions after the anchor are embedded as
    attention_bias: bool = False  # q/k/v/o biases
    draft_vocab_size: int = 0  # rows of its own lm_head (speculators' reduced vocabulary); 0: the target's
    layout: str = "z-lab"  # the checkpoint layout it was read from ("z-lab" or "speculators")
    source: str = ""

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        """The target layers in z-lab's convention: the output of each (SGLang's and the card's)."""
        return tuple(i - 1 for i in self.capture_layers)

    @property
    def feature_width(self) -> int:
        return len(self.capture_layers) * self.hidden_size

    @property
    def drafts(self) -> int:
        """Tokens one block proposes (the anchor is the target's own)."""
        return self.block_size - 1


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's choice when a config names no ``target_layer_ids``: one layer in the middle for a
    one-layer drafter, else ``num_draft_layers`` ids spread evenly from layer 1 to layer L - 3."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    first, span = 1, num_target_layers - 4  # layer 1 to layer L - 3; round() as z-lab's (half to even)
    return tuple(round(first + (i * span) / (num_draft_layers - 1)) for i in range(num_draft_layers))


def weight_shapes(spec: DFlashSpec) -> dict[str, tuple[int, ...]]:
    """Every weight a drafter of this shape has, by its public name (biases only with
    ``attention_bias``; ``lm_head``/``d2t`` only with a vocabulary of its own)."""
    H, I, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q, kv = spec.num_heads * hd, spec.num_kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (H, spec.feature_width),
        "hidden_norm.weight": (H,),
        "norm.weight": (H,),
    }
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (q, H),
            p + "self_attn.k_proj.weight": (kv, H),
            p + "self_attn.v_proj.weight": (kv, H),
            p + "self_attn.o_proj.weight": (H, q),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (I, H),
            p + "mlp.up_proj.weight": (I, H),
            p + "mlp.down_proj.weight": (H, I),
        })
        if spec.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,), p + "self_attn.o_proj.bias": (H,)})
    if spec.draft_vocab_size:
        shapes["lm_head.weight"] = (spec.draft_vocab_size, H)
        if spec.draft_vocab_size < spec.vocab_size:
            shapes["d2t"] = (spec.draft_vocab_size,)
    return shapes


# -- the layer, written once ---------------------------------------------------------------------------
Linear = Callable[[torch.Tensor], torch.Tensor]
# keep(k, v) for the new rows' keys/values [T, nkv, hd] -> every key/value the block attends to,
# [1, nkv, S, hd] each (the training forward: these rows; inference: the cache, with them written in)
Keep = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class LayerOps:
    """One draft layer's products and norm weights, however they are computed: ``qkv`` gives
    q | k | v side by side (public row order: RoPE rotates each head's two halves)."""

    qkv: Linear
    o: Linear
    gate_up: Linear  # gate | up side by side
    down: Linear
    ln_in: torch.Tensor
    ln_post: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor


def rotate(x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """RoPE on x [T, heads, hd] in the public (rotate-half) layout; ``factors``: [T, 1, hd/2]
    complex rotations (engine/models/rope.py's table rows)."""
    a, b = x.float().chunk(2, dim=-1)
    c, s = factors.real, factors.imag
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1).to(x.dtype)


def run_layer(spec: DFlashSpec, ops: LayerOps, h: torch.Tensor, ctx: torch.Tensor, rot: torch.Tensor, keep: Keep,
              mask: torch.Tensor | None) -> torch.Tensor:
    """One draft layer over the block stream ``h`` [Tb, H]; ``ctx`` [Tc, H]: the projected context
    rows whose keys and values this call adds (Tc may be 0); ``rot`` [Tc + Tb, 1, hd/2]: the rows'
    rotations, context first; ``mask`` [Tb, S] bool over what ``keep`` returns (None: all of it).

    The context rows share the block's q|k|v product (their q is computed and dropped): one pass
    over the layer's weights for both, which on a CPU costs no more than the block's alone."""
    eps, nh, nkv, hd = spec.rms_norm_eps, spec.num_heads, spec.num_kv_heads, spec.head_dim
    Tc, Tb = ctx.shape[0], h.shape[0]
    x = rms_norm(h, ops.ln_in, eps)
    qkv = ops.qkv(torch.cat([ctx, x]) if Tc else x)
    q_end, k_end = nh * hd, (nh + nkv) * hd
    q = rotate(rms_norm(qkv[Tc:, :q_end].reshape(Tb, nh, hd), ops.q_norm, eps), rot[Tc:])
    k = rotate(rms_norm(qkv[:, q_end:k_end].reshape(Tc + Tb, nkv, hd), ops.k_norm, eps), rot)
    keys, values = keep(k, qkv[:, k_end:].reshape(Tc + Tb, nkv, hd))
    out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), keys, values, attn_mask=mask,
                                         scale=hd**-0.5, enable_gqa=nkv != nh)
    h = h + ops.o(out[0].transpose(0, 1).reshape(Tb, nh * hd))
    gate, up = ops.gate_up(rms_norm(h, ops.ln_post, eps)).chunk(2, dim=-1)
    return h + ops.down(F.silu(gate) * up)


# -- blocks for training -------------------------------------------------------------------------------
def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """[N * block_size] RoPE positions of N blocks: anchor, anchor + 1, ... for each."""
    return (anchors[:, None] + torch.arange(block_size, device=anchors.device)).reshape(-1)


def block_ids(tokens: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int) -> torch.Tensor:
    """[N * block_size] token ids of N blocks over ``tokens`` [S]: each block's anchor token, then
    mask tokens (what inference embeds: the root, then the mask)."""
    ids = torch.full((anchors.shape[0], block_size), mask_token_id, dtype=torch.int64, device=tokens.device)
    ids[:, 0] = tokens[anchors]
    return ids.reshape(-1)


def block_mask(anchors: torch.Tensor, block_size: int, context: int) -> torch.Tensor:
    """[N * block_size, context + N * block_size] bool: block i sees the context rows before its
    anchor (at inference the anchor's own features are not computed yet) and its own positions,
    in both directions; never another block."""
    zeros = torch.zeros(context, dtype=torch.int64, device=anchors.device)
    return packed_block_mask(anchors, torch.zeros_like(anchors), block_size,
                             torch.arange(context, device=anchors.device), zeros)


def packed_block_mask(anchors: torch.Tensor, segments: torch.Tensor, block_size: int,
                      context_positions: torch.Tensor, context_segments: torch.Tensor) -> torch.Tensor:
    """:func:`block_mask` for the blocks of several sequences in one forward (a GPU's training step:
    one forward for many conversations instead of one each). Block i belongs to sequence
    ``segments[i]``; context row c is position ``context_positions[c]`` of sequence
    ``context_segments[c]``. Block i sees the context rows of its own sequence before its anchor and
    its own positions; never another sequence's rows, nor another block."""
    n = anchors.shape[0]
    rows = torch.arange(n, device=anchors.device).repeat_interleave(block_size)
    sees_context = (context_positions[None, :] < anchors[rows][:, None]) & \
        (context_segments[None, :] == segments[rows][:, None])
    sees_block = rows[:, None] == rows[None, :]
    return torch.cat([sees_context, sees_block], dim=1)


# -- the module ----------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, spec: DFlashSpec) -> None:
        super().__init__()
        H, hd, bias = spec.hidden_size, spec.head_dim, spec.attention_bias
        self.q_proj = nn.Linear(H, spec.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(H, spec.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(H, spec.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(spec.num_heads * hd, H, bias=bias)
        self.q_norm = RMSNorm(hd, spec.rms_norm_eps)
        self.k_norm = RMSNorm(hd, spec.rms_norm_eps)


class MLP(nn.Module):
    def __init__(self, spec: DFlashSpec) -> None:
        super().__init__()
        H, I = spec.hidden_size, spec.intermediate_size
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)


class Layer(nn.Module):
    def __init__(self, spec: DFlashSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec)

    def ops(self) -> LayerOps:
        """This layer as :func:`run_layer` takes it (torch's products, differentiable)."""
        a, m = self.self_attn, self.mlp
        return LayerOps(
            qkv=lambda x: torch.cat([a.q_proj(x), a.k_proj(x), a.v_proj(x)], dim=-1),
            o=a.o_proj, gate_up=lambda x: torch.cat([m.gate_proj(x), m.up_proj(x)], dim=-1), down=m.down_proj,
            ln_in=self.input_layernorm.weight, ln_post=self.post_attention_layernorm.weight,
            q_norm=a.q_norm.weight, k_norm=a.k_norm.weight)


class DFlashDraft(nn.Module):
    """A DFlash drafter whose ``state_dict()`` keys are the public checkpoint's (z-lab's and the
    speculators export's: ``fc``, ``hidden_norm``, ``layers.N.*``, ``norm``; ``lm_head``/``d2t``
    for a vocabulary of its own). The target's embedding and LM head are passed in, never stored.

    :meth:`forward` is the training contract: given one sequence's context features and a batch of
    blocks over it, the hidden state at every block position, from which ``logits`` gives the
    guesses (position j of the block anchored at a guesses the token at a + j; position 0's
    output is the anchor's and is not a guess)."""

    def __init__(self, spec: DFlashSpec) -> None:
        super().__init__()
        self.spec = spec
        H = spec.hidden_size
        self.fc = nn.Linear(spec.feature_width, H, bias=False)
        self.hidden_norm = RMSNorm(H, spec.rms_norm_eps)
        self.layers = nn.ModuleList([Layer(spec) for _ in range(spec.num_layers)])
        self.norm = RMSNorm(H, spec.rms_norm_eps)
        self.lm_head = nn.Linear(H, spec.draft_vocab_size, bias=False) if spec.draft_vocab_size else None
        if 0 < spec.draft_vocab_size < spec.vocab_size:
            self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.int64))
        self._rotary: RotaryTable | None = None  # made on the device of the first forward

    def _rotations(self, positions: torch.Tensor) -> torch.Tensor:
        if self._rotary is None or self._rotary.device != positions.device:
            self._rotary = RotaryTable.for_shape(self.spec, positions.device)
        self._rotary.ensure(int(positions.max()) + 1)
        return self._rotary.lookup(positions)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Context rows [S, H] from target features [S, feature_width]."""
        return self.hidden_norm(self.fc(features))

    def forward(self, features: torch.Tensor, block_embeds: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor | None = None, context_positions: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [R, H] (after the final norm) of R block rows.

        ``features`` [S, feature_width]: the context, one row per token at positions 0..S-1
        (``context_positions`` [S]: at those positions instead, several sequences side by side);
        ``block_embeds`` [R, H]: the blocks' rows, embedded by the target (:func:`block_ids`);
        ``positions`` [R]: their RoPE positions (:func:`block_positions`); ``mask`` [R, S + R]:
        what each row sees of the context rows then the block rows (:func:`block_mask`,
        :func:`packed_block_mask`; None: everything, a single block anchored after the whole
        context, as at inference)."""
        S = features.shape[0]
        ctx = self.project(features)
        if context_positions is None:
            context_positions = torch.arange(S, device=positions.device)
        rot = self._rotations(torch.cat([context_positions, positions]))

        def keep(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)

        h = block_embeds
        for layer in self.layers:
            h = run_layer(self.spec, layer.ops(), h, ctx, rot, keep, mask)
        return self.norm(h)

    def logits(self, hidden: torch.Tensor, target_lm_head: Linear) -> torch.Tensor:
        """Logits over the drafter's vocabulary: its own ``lm_head`` where it has one (map indices
        to target ids with ``d2t``), else the target's LM head."""
        return self.lm_head(hidden) if self.lm_head is not None else target_lm_head(hidden)
