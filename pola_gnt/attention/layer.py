"""`PolarityAttention`: PolaFormer++'s polarity-aware linear attention as a drop-in `nn.Module` over
token sequences `[batch, tokens, dim]`, for self-attention and cross-attention (docs/pola_attention.md).

    layer = PolarityAttention(dim, heads)
    out = layer(x)                                   # self-attention, x [B, N, dim] -> [B, N, dim]
    out = layer(x, context=c, mask=keep)             # cross-attention, c [B, M, dim], keep bool [B, M]
    out = PolarityAttention(dim, heads, lepe="2d")(x, grid=(h, w))   # image tokens, N = h w, row-major

Per head (head dim d, even), as in the official code:
1. `q, g = to_qg(x)`, `k, v = to_kv(x)` (self) or `to_kv(context)` (cross): four `[B, *, dim]` chunks.
   For self-attention the two projections run as one matmul (the same function, one pass over x).
2. The polarity split `q = q+ - q-`, `k = k+ - k-`; the PaCS (channel-wise spiky) feature maps
   `Qs = expm1(ts [q+, q-])`, `Qo = expm1(to [q-, q+])`, `K = expm1([k+, k-])`, with the learnable
   per-head, per-channel temperatures `ts = sigmoid(s1)`, `to = sigmoid(s2)` `[heads, 2d]` (zero
   initialised: 0.5), i.e. the exponent scale of each channel, half and stream.
3. Same-sign terms `(+,+), (-,-)` weigh the first value half `v[:d/2]`, opposite-sign terms
   `(+,-), (-,+)` the second `v[d/2:]`, each normalised by its own sum of weights over the keys
   (linear form, `O(N d^2)`).
4. `out = proj(g * (attention + LePE(v)))`: the gate multiplies element-wise (no activation; its two
   halves per head are PolaFormer++'s `Gs`, `Go`), `proj` is `Linear(dim, dim)`.

LePE (locally-enhanced positional encoding, a depthwise convolution of the values, zero padded):
- `lepe="1d"` (default): along the token sequence (`Conv1d`, `lepe_kernel` taps), for 1-D sequences
  (GNT's rays, text-like token streams);
- `lepe="2d"`: over the `grid=(h, w)` given to `forward` (`Conv2d`, `lepe_kernel` x `lepe_kernel`, as
  PolaFormer++'s 5x5 for images), the tokens in row-major order; forward without a grid is an error;
- `lepe=None`: none.
Masked tokens' values are zeroed before the convolution, so a masked token reaches no other token
through the LePE either. In cross-attention the LePE is not applied: the values belong to the
context's tokens, which have no position aligned with the queries (a cross call leaves the LePE's
parameters without gradients).

Which kernels run (the existing dispatch, `dispatch`): self-attention goes through
`ray.op.polarity_ray_attention` (heads in place: the fused Triton ray kernel on CUDA up to its
`MAX_SAMPLES` tokens, the fused C++ kernel on the CPU for head dims in `cpu_extension.HEAD_DIMS`, else
`linear.op.polarity_attention`, whose fused Triton linear kernel takes longer sequences on CUDA and
whose PyTorch forms take the rest); cross-attention goes through `polarity_attention` (the Triton
linear kernel on CUDA, the PyTorch forms elsewhere). The 1-D LePE has a C++ form (`ray.op.add_lepe`).
Every form computes the same function and is differentiable.

Numerics: the feature maps and both sums run in fp32 (fp64 for fp64 inputs) whatever the input
dtype, with autocast off inside the attention, exponent inputs clamped at `EXPONENT_CLAMP`
(`features`); outputs come back in the input dtype. bf16 / fp16 work either with the module cast to
that dtype or with an fp32 module under autocast.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn

from pola_gnt.attention.linear.op import polarity_attention
from pola_gnt.attention.modules import PolaAttentionBase, merge_heads, split_heads
from pola_gnt.attention.ray.op import add_lepe, polarity_ray_attention

Lepe = Literal["1d", "2d"]
LEPE_KINDS = ("1d", "2d", None)


class PolarityAttention(PolaAttentionBase):
    """Polarity-aware linear attention (PolaFormer++) over `[batch, tokens, dim]` (see the module
    docstring): `PolarityAttention(dim, heads)(x, context=None, mask=None, grid=None)`.

    Args:
        dim: token width; `dim / heads` must be even (the two value halves).
        heads: number of heads.
        qkv_bias: bias of the input projections (`to_qg`, `to_kv`).
        lepe: "1d" (along the sequence), "2d" (over `forward`'s `grid`) or None: see the module docstring.
        lepe_kernel: the LePE's taps per axis (odd).
    """

    def __init__(self, dim: int, heads: int = 8, qkv_bias: bool = True, lepe: Lepe | None = "1d", lepe_kernel: int = 5):
        super().__init__(dim, heads)
        if lepe not in LEPE_KINDS:
            raise ValueError(f"lepe must be one of {LEPE_KINDS}, got {lepe!r}")
        if lepe_kernel < 1 or lepe_kernel % 2 == 0:
            raise ValueError(f"lepe_kernel must be odd and positive, got {lepe_kernel}")
        self.to_qg = nn.Linear(dim, 2 * dim, bias=qkv_bias)  # queries and gate (from the query tokens)
        self.to_kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)  # keys and values (from the context)
        self.lepe_kind = lepe
        self.lepe: nn.Conv1d | nn.Conv2d | None = None
        if lepe == "1d":
            self.lepe = nn.Conv1d(dim, dim, lepe_kernel, padding=lepe_kernel // 2, groups=dim)
        elif lepe == "2d":
            self.lepe = nn.Conv2d(dim, dim, lepe_kernel, padding=lepe_kernel // 2, groups=dim)

    def forward(
        self,
        x: Float[Tensor, "batch tokens dim"],
        context: Float[Tensor, "batch ctx_tokens dim"] | None = None,
        mask: Bool[Tensor, "batch ctx_tokens"] | None = None,
        grid: tuple[int, int] | None = None,
    ) -> Float[Tensor, "batch tokens dim"]:
        """Self-attention of `x` (`context` None) or cross-attention of `x` over `context`.

        Args:
            x: `[B, N, dim]` query tokens.
            context: `[B, M, dim]` key/value tokens, or None for self-attention (M = N).
            mask: bool `[B, M]`, True where a key may be attended; masked keys count in no sum (and
                their values in no LePE). A query whose keys are all masked gets an attention term
                of zeros, never NaN.
            grid: `(h, w)` with `h w = N`, the token grid of the 2-D LePE (`lepe="2d"` only).

        Returns:
            `[B, N, dim]` in the dtype of `x` (or of autocast).
        """
        self._check_inputs(x, context, mask, grid)
        if context is None:
            # One matmul for the four chunks q, g, k, v (strided views of one [B, N, 4 dim] tensor).
            weight = torch.cat([self.to_qg.weight, self.to_kv.weight])
            bias = None if self.to_qg.bias is None else torch.cat([self.to_qg.bias, self.to_kv.bias])
            q, gate, k, v = F.linear(x, weight, bias).chunk(4, dim=-1)
        else:
            q, gate = self.to_qg(x).chunk(2, dim=-1)
            k, v = self.to_kv(context).chunk(2, dim=-1)
        q_heads, k_heads, v_heads = (split_heads(t, self.heads) for t in (q, k, v))  # [B, heads, *, d]
        attended = merge_heads(self._attend(q_heads, k_heads, v_heads, mask))  # [B, N, dim]
        if context is None and self.lepe is not None:
            attended = self._add_lepe(attended, v, mask, grid)
        return self._gated_output(attended, gate)

    def _polarity_attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        """q `[B, heads, N, d]`, k, v `[B, heads, M, d]`, key_mask `[B, M]` -> `[B, heads, N, d]`.
        Equal query and key counts (self-attention): the ray op with the heads in place (views of the
        projection's chunks, no copies); otherwise the heads-split linear op."""
        temp_same, temp_opp = self.temperatures()
        if q.shape == k.shape:
            q, k, v = (merge_heads(t) for t in (q, k, v))  # [B, N, dim]
            out = polarity_ray_attention(q, k, v, temp_same, temp_opp, key_mask, self.heads)
            return split_heads(out, self.heads)
        mask = None if key_mask is None else key_mask.unsqueeze(-2)  # [B, 1 (heads), M]
        return polarity_attention(q, k, v, temp_same.unsqueeze(-2), temp_opp.unsqueeze(-2), mask)

    def _add_lepe(self, attended: Tensor, v: Tensor, mask: Tensor | None, grid: tuple[int, int] | None) -> Tensor:
        """`attended + LePE(v)` (masked tokens' values zeroed), `[B, N, dim]` each."""
        if isinstance(self.lepe, nn.Conv1d):
            if attended.dtype != v.dtype:  # autocast: the attention came back in x's dtype
                attended = attended.to(v.dtype)
            return add_lepe(attended, v, mask, self.lepe)
        assert isinstance(self.lepe, nn.Conv2d) and grid is not None
        if mask is not None:
            v = v * mask.unsqueeze(-1).to(v.dtype)
        height, width = grid
        image = v.transpose(-1, -2).unflatten(-1, (height, width))  # [B, dim, h, w]
        return attended + self.lepe(image).flatten(-2).transpose(-1, -2).to(attended.dtype)

    def _check_inputs(
        self, x: Tensor, context: Tensor | None, mask: Tensor | None, grid: tuple[int, int] | None
    ) -> None:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [batch, tokens, dim={self.dim}], got {tuple(x.shape)}")
        keys = x.shape[1]
        if context is not None:
            if context.dim() != 3 or context.shape[0] != x.shape[0] or context.shape[-1] != self.dim:
                raise ValueError(
                    f"context must be [batch={x.shape[0]}, ctx_tokens, dim={self.dim}], got {tuple(context.shape)}"
                )
            keys = context.shape[1]
        if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != (x.shape[0], keys)):
            raise ValueError(f"mask must be bool [batch={x.shape[0]}, {keys}], got {mask.dtype} {tuple(mask.shape)}")
        if grid is not None and self.lepe_kind != "2d":
            raise ValueError(f"grid is for the 2-D LePE (lepe='2d'); this layer has lepe={self.lepe_kind!r}")
        if self.lepe_kind == "2d" and context is None:
            if grid is None or len(grid) != 2 or grid[0] * grid[1] != x.shape[1]:
                raise ValueError(f"lepe='2d' needs grid=(h, w) with h * w = tokens ({x.shape[1]}), got {grid}")
