"""Feature maps of polarity-aware attention (PolaFormer++ PaCS), the numerical constants, and what
every entry point does first (shape checks, compute precision). Shared by the quadratic form, the
linear forms (`linear.pytorch_form`, `ray.pytorch_form`), the view form (`view.pytorch_form`), the
Triton kernels and the diagnostics; the fp64 reference (`reference`) takes only the constants.

Numerics:
- `EPSILON = 1e-6` is added to each stream's denominator `sum_j w_ij` (a *sum*, not the mean used by
  the official code). It only matters when every weight is ~0: a query whose keys are all masked,
  or a query of all zeros, then gets an output of exactly 0 instead of 0 / 0.
- `EXPONENT_CLAMP = 20` bounds every exponent input (the features are `expm1(min(z, 20))`, so each
  is at most e^20 ~ 4.9e8). A query-key weight is then at most 2d * e^40 ~ 6e19 for d = 128, a sum
  over 1e6 keys at most ~6e25, and times |v| <= 6.5e4 (the fp16 maximum) at most ~4e30, well below
  the fp32 maximum 3.4e38; backward terms are of the same size. Without the bound exp overflows fp32
  at 88.7 (fp16 at 11.1), and sums of many large features would overflow long before that.
  A ratio of e^20 between two features is already a one-hot weight, so the bound costs nothing in
  expressiveness.
- Everything (feature maps, both sums, the division) runs in fp32 with autocast disabled, or in fp64
  for fp64 inputs (`compute_precision`); the output is cast back to the dtype of `q`.

Query features come in four layouts, one per form (named by what they hold):
- `query_feature_maps`: the math's `Qs`, `Qo`, `[..., Nq, 2d]` each, plain autograd (quadratic form,
  diagnostics);
- `StackedQueryFeatures`: both streams stacked, full width `[..., 2, Nq, 2d]`, columns in the order of
  the key rows they meet, with what a custom backward needs (`ray.pytorch_form`);
- `PointQueryTerms`: one query per point, half width `[P, 2, heads, d]` (only the non-zero polarity
  part of each channel is exponentiated), split by the key part each coefficient meets
  (`view.pytorch_form`);
- `linear.pytorch_form._half_width_query_features` (chunked linear form): half width, scattered back into the
  `x+` / `x-` slots by sign.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from jaxtyping import Bool, Float
from torch import Tensor

EPSILON = 1e-6
EXPONENT_CLAMP = 20.0

# Added to log(e^z) so that z = 0 (e^z = 1) divides 0 by a tiny number instead of 0 by 0.
_TINY = 1e-30


# --------------------------------------------------------------------------------------------------
# Entry points: shapes and compute precision


def check_attention_shapes(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> None:
    """`q [..., Nq, d]`, `k, v [..., Nk, d]` (d even), `key_mask` bool `[..., Nk]`: ValueError otherwise."""
    same_d = q.shape[-1] == k.shape[-1] == v.shape[-1]
    if q.dim() < 2 or k.dim() < 2 or not same_d or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"expected q [..., Nq, d], k and v [..., Nk, d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    check_even_head_dim(q)
    if key_mask is not None and (key_mask.dtype != torch.bool or key_mask.shape[-1] != k.shape[-2]):
        raise ValueError(f"key_mask must be bool [..., Nk={k.shape[-2]}], got {key_mask.dtype} {tuple(key_mask.shape)}")


def check_even_head_dim(q: Tensor) -> None:
    if q.shape[-1] % 2:
        raise ValueError(f"head dim must be even (two value halves), got {q.shape[-1]}")


@contextlib.contextmanager
def compute_precision(q: Tensor, *tensors: Tensor) -> Iterator[list[Tensor]]:
    """Autocast off, and `q, *tensors` cast to the compute dtype: fp64 for fp64 queries, else fp32."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=q.device.type, enabled=False):
        yield [t.to(dtype) for t in (q, *tensors)]


# --------------------------------------------------------------------------------------------------
# Feature maps


def polarity_split(x: Tensor) -> tuple[Tensor, Tensor]:
    """`x = x+ - x-` with both parts >= 0: `(relu(x), relu(-x))`."""
    return torch.relu(x), torch.relu(-x)


def expm1_(z: Tensor) -> Tensor:
    """`expm1(z)` for `z >= 0`, written over `z`.

    PyTorch's fp32 `expm1` on the CPU is over 10x slower than its `exp` and `log` (no vectorised
    path), and the feature maps are the largest elementwise work of the attention. So fp32 on the CPU
    uses Kahan's formula `expm1(z) = (e - 1) z / log(e)` with `e = fl(exp(z))`: the rounding error of
    `e` cancels between numerator and denominator, leaving a few ulp (measured: < 2e-7 relative over
    [1e-40, 21]), where the naive `e - 1` loses all digits as z -> 0. Where `e` rounds to 1 (z < 6e-8)
    the quotient is 0 and `max(., z)` restores `expm1(z) = z` to within an ulp (expm1(z) >= z always).
    Other dtypes and CUDA use `torch.expm1` (fast there; fp64 is the reference path).
    """
    if z.dtype != torch.float32 or z.is_cuda:
        return z.expm1_()
    e = torch.exp(z)
    numerator = (e - 1.0).mul_(z)
    return torch.maximum(numerator.div_(e.log_().add_(_TINY)), z, out=z)


def spiky(z: Tensor) -> Tensor:
    """The PaCS map `expm1(min(z, EXPONENT_CLAMP))`; `z >= 0` here, so features are >= 0 and 0 at 0.
    Plain autograd (the quadratic form, the diagnostics): `torch.expm1`, not the in-place `expm1_`."""
    return torch.expm1(z.clamp(max=EXPONENT_CLAMP))


def spiky_with_slope_(exponents: Tensor) -> tuple[Tensor, Tensor]:
    """The PaCS map written over `exponents` (custom-backward forms), and the 0/1 factor that is 1
    where the clamp is not active (the map's slope there is `features + 1`, above it 0)."""
    unclamped = (exponents <= EXPONENT_CLAMP).to(exponents.dtype)
    return expm1_(exponents.clamp_(max=EXPONENT_CLAMP)), unclamped


def query_feature_maps(
    q: Float[Tensor, "*batch queries d"], temp_same: Tensor, temp_opp: Tensor
) -> tuple[Float[Tensor, "*batch queries d2"], Float[Tensor, "*batch queries d2"]]:
    """The math's same-sign and opposite-sign query features `Qs = spiky(temp_same * [q+, q-])`,
    `Qo = spiky(temp_opp * [q-, q+])`, each `[..., Nq, 2d]` from `q` `[..., Nq, d]`."""
    pos, neg = polarity_split(q)
    same = spiky(temp_same * torch.cat([pos, neg], dim=-1))
    opp = spiky(temp_opp * torch.cat([neg, pos], dim=-1))
    return same, opp


def key_feature_map(
    k: Float[Tensor, "*batch keys d"], key_mask: Bool[Tensor, "*mask_batch keys"] | None = None
) -> Float[Tensor, "*batch keys d2"]:
    """The math's key features `K = spiky([k+, k-])` `[..., Nk, 2d]`; masked keys get all-zero
    features so they drop out of every sum."""
    pos, neg = polarity_split(k)
    features = spiky(torch.cat([pos, neg], dim=-1))
    if key_mask is not None:
        features = features * key_mask.unsqueeze(-1).to(features.dtype)
    return features


class StackedQueryFeatures:
    """Both streams' query features `[..., 2 (stream), Nq, 2d]`, with columns in the order of the key
    rows they meet (`k+` part, then `k-` part): same-sign `expm1(temp_same * [q+, q-])`, opposite-sign
    `expm1(temp_opp * [q-, q+])`. Also what backward needs: the parts `[..., 2, Nq, 2d]`, the stacked
    temperatures `[..., 2, 1, 2d]` and the slope factor (`spiky_with_slope_`)."""

    def __init__(self, q: Tensor, temp_same: Tensor, temp_opp: Tensor):
        d = q.shape[-1]
        self.parts = q.new_empty(*q.shape[:-2], 2, q.shape[-2], 2 * d)
        torch.clamp(q, min=0.0, out=self.parts[..., 0, :, :d])  # q+
        torch.clamp(-q, min=0.0, out=self.parts[..., 0, :, d:])  # q-
        self.parts[..., 1, :, :d] = self.parts[..., 0, :, d:]
        self.parts[..., 1, :, d:] = self.parts[..., 0, :, :d]
        self.temperatures = torch.stack(torch.broadcast_tensors(temp_same, temp_opp), dim=-3)  # [..., 2, 1, 2d]
        self.features, self.unclamped = spiky_with_slope_(self.parts * self.temperatures)


def sign_parts(sign: Tensor) -> tuple[Tensor, Tensor]:
    """0/1 factors `[sign > 0]`, `[sign < 0]` from `sign` in {-1, 0, 1} (exact selections by multiplying)."""
    return sign.clamp(min=0.0), (-sign).clamp_(min=0.0)


class PointQueryTerms:
    """One query per point `q` `[P, heads, d]`: `F = [Fs, Fo]` `[P, 2, heads, d]` at half width (only
    the non-zero polarity part of a channel is exponentiated, with its temperature), and the
    coefficients that the `k+` and the `k-` part of each key channel meet: same-sign stream
    `Fs [q > 0]` and `Fs [q < 0]`, opposite-sign stream `Fo [q < 0]` and `Fo [q > 0]`. Selections
    multiply by exact 0/1 factors, so no sum cancels."""

    def __init__(self, q: Tensor, temp_same: Tensor, temp_opp: Tensor):
        d = q.shape[-1]
        self.sign = torch.sign(q)
        self.magnitude = q.abs()
        positive, negative = sign_parts(self.sign)
        # Temperature of the non-zero part of each channel: same-sign q+ -> temp_same[:d], q- -> [d:];
        # opposite-sign q+ -> temp_opp[d:], q- -> temp_opp[:d].
        temp_s = temp_same[..., d:] + positive * (temp_same[..., :d] - temp_same[..., d:])
        temp_o = temp_opp[..., :d] + positive * (temp_opp[..., d:] - temp_opp[..., :d])
        self.temperatures = torch.stack(torch.broadcast_tensors(temp_s, temp_o), dim=1)  # [P, 2, heads, d]
        self.features, self.unclamped = spiky_with_slope_(self.temperatures * self.magnitude.unsqueeze(1))
        self.meets_plus = torch.stack([positive, negative], dim=1)  # [P, 2, heads, d]: 1 where the k+ part counts
        self.meets_minus = torch.stack([negative, positive], dim=1)
        self.plus = self.features * self.meets_plus
        self.minus = self.features * self.meets_minus
