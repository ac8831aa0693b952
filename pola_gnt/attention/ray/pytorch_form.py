"""The ray attention's PyTorch forms: the linear form of polarity attention over whole short
sequences (GNT's ray attention, a few hundred samples), and the LePE's convolution along the samples.

The same function as `polarity_attention(..., form="linear")`, for sequences short enough that the
whole batch of them fits in memory at once: no chunk loop, and no `[..., 2d]` feature tensor built by
sign scattering through bool masks (PyTorch's CPU kernels for `where` do not vectorise). Per channel,
with `K = expm1(min(|k|, B))` and `G = sign(k) K`, the key features are

    [k+ part, k- part] = [(K + G) / 2, (K - G) / 2]            (exact: each is K or 0)

and the query features are `expm1(temp_same * [q+, q-])` (same-sign stream) and
`expm1(temp_opp * [q-, q+])` (opposite-sign stream, which pairs `q+` with `k-`). The parts are kept
apart (rather than summing the signed `G` into one statistic) so that no sum over keys cancels: every weight is a sum of
non-negative terms. Both streams share the key statistic `[k+ part, k- part]^T [v, 1]`.
Numerics as in `features`; the query features are `features.StackedQueryFeatures`.

Memory: the custom autograd keeps the inputs, the key features and the key statistic; the query
features are recomputed in backward. For long sequences use the chunked linear form in `linear.pytorch_form`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP, StackedQueryFeatures, expm1_


def _key_part_features(k: Tensor, visible: Tensor | None) -> tuple[Tensor, Tensor]:
    """`[k+ part, k- part]` `[..., Nk, 2d]` (zero rows for masked keys) and `sign(k)`."""
    sign = torch.sign(k)
    keys = expm1_(k.abs().clamp_(max=EXPONENT_CLAMP)).mul_(0.5)
    if visible is not None:
        keys = keys.mul_(visible)
    signed = keys * sign
    return torch.cat([keys + signed, keys - signed], dim=-1), sign


def _value_half_stats(key_stats: Tensor) -> Tensor:
    """`[..., 2d, d + 1]` = `[k+ part, k- part]^T [v, 1]` -> per stream `[..., 2, 2d, d/2 + 1]`.

    Each stream keeps its value half, then the sum.
    """
    half = (key_stats.shape[-1] - 1) // 2
    same = torch.cat([key_stats[..., :half], key_stats[..., -1:]], dim=-1)
    opp = key_stats[..., half:]
    return torch.stack([same, opp], dim=-3)


def _value_half_stats_backward(grad: Tensor) -> Tensor:
    """Adjoint of `_value_half_stats`."""
    half = grad.shape[-1] - 1
    same, opp = grad.unbind(dim=-3)
    return torch.cat([same[..., :half], opp[..., :half], same[..., half:] + opp[..., half:]], dim=-1)


def _with_ones(v: Tensor) -> Tensor:
    return torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)


class _ShortPolarityAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, temp_same, temp_opp, visible):
        key_features, _ = _key_part_features(k, visible)
        key_stats = key_features.transpose(-1, -2) @ _with_ones(v)  # [..., 2d, d + 1]
        queries = StackedQueryFeatures(q, temp_same, temp_opp)
        result = queries.features @ _value_half_stats(key_stats)  # [..., 2, Nq, d/2 + 1]
        out = result[..., :-1] / (result[..., -1:] + EPSILON)
        ctx.save_for_backward(q, k, v, temp_same, temp_opp, visible, key_features, key_stats, out)
        return out.transpose(-3, -2).flatten(-2)  # [..., Nq, d]: same-sign channels first

    @staticmethod
    def backward(ctx, *grad_outputs: Tensor):
        (grad_out,) = grad_outputs
        q, k, v, temp_same, temp_opp, visible, key_features, key_stats, out = ctx.saved_tensors
        d = q.shape[-1]
        with torch.autocast(device_type=q.device.type, enabled=False):
            grad_out = grad_out.to(q.dtype).unflatten(-1, (2, d // 2)).transpose(-3, -2)  # [..., 2, Nq, d/2]
            queries = StackedQueryFeatures(q, temp_same, temp_opp)
            stats = _value_half_stats(key_stats)
            denominators = (queries.features @ stats[..., -1:]) + EPSILON  # [..., 2, Nq, 1]
            # out = num / den: d num = g / den, d den = -(g . out) / den.
            grad_result = torch.cat([grad_out, -(grad_out * out).sum(dim=-1, keepdim=True)], dim=-1) / denominators
            grad_key_stats = _value_half_stats_backward(
                queries.features.transpose(-1, -2) @ grad_result
            )  # [..., 2d, d + 1]
            grad_features = grad_result @ stats.transpose(-1, -2)  # [..., 2, Nq, 2d]
            grad_exponents = grad_features.mul_(queries.features + 1).mul_(queries.unclamped)
            # Back to [q+, q-]: the opposite-sign stream holds them swapped.
            grad_parts = grad_exponents * queries.temperatures
            grad_plus = grad_parts[..., 0, :, :d] + grad_parts[..., 1, :, d:]
            grad_minus = grad_parts[..., 0, :, d:] + grad_parts[..., 1, :, :d]
            # relu slopes as exact 0/1 factors (0 at q = 0, like relu's gradient).
            sign_q = torch.sign(q)
            grad_q = (grad_plus * sign_q.clamp(min=0.0)).sub_(grad_minus * (-sign_q).clamp_(min=0.0))
            grad_temp_same = grad_temp_opp = None
            if ctx.needs_input_grad[3] or ctx.needs_input_grad[4]:
                grad_temps = (grad_exponents * queries.parts).sum(dim=-2, keepdim=True)  # [..., 2, 1, 2d]
                grad_temp_same = grad_temps[..., 0, :, :].sum_to_size(temp_same.shape)
                grad_temp_opp = grad_temps[..., 1, :, :].sum_to_size(temp_opp.shape)

            # Keys: key_stats = [(K + G) / 2, (K - G) / 2]^T [v, 1] with G = sign(k) K.
            grad_v = key_features @ grad_key_stats[..., :d]
            grad_key_features = _with_ones(v) @ grad_key_stats.transpose(-1, -2)  # [..., Nk, 2d]
            sign_k = torch.sign(k)
            grad_keys = (grad_key_features[..., :d] * sign_k.clamp(min=0.0)).addcmul_(
                grad_key_features[..., d:], (-sign_k).clamp_(min=0.0)
            )
            if visible is not None:  # masked keys: zero gradient (so their `K + 1` below does not matter)
                grad_keys = grad_keys.mul_(visible)
            unclamped = (k.abs() <= EXPONENT_CLAMP).to(k.dtype)
            keys = key_features[..., :d] + key_features[..., d:]  # K (one of the two parts is 0)
            grad_k = grad_keys.mul_(keys + 1).mul_(unclamped).mul_(sign_k)
        return grad_q, grad_k, grad_v, grad_temp_same, grad_temp_opp, None


def polarity_attention_short(
    q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor, key_mask: Tensor | None = None
) -> Tensor:
    """Linear form over whole (short) sequences. Inputs already in compute dtype; `key_mask` bool `[..., Nk]`."""
    visible = None if key_mask is None else key_mask.unsqueeze(-1).to(q.dtype)
    return _ShortPolarityAttention.apply(q, k, v, temp_same, temp_opp, visible)


def depthwise_conv_along_samples(x: Tensor, conv: nn.Conv1d) -> Tensor:
    """`conv(x^T)^T` for `x` `[..., samples, channels]` and a depthwise, zero-padded, odd-sized `conv`,
    as a sum of shifted copies scaled per channel: it stays in the channels-last layout, and on the
    CPU it is several times faster than PyTorch's depthwise convolution (its backward especially)."""
    kernel = conv.kernel_size[0]
    pad = kernel // 2
    samples = x.shape[-2]
    padded = F.pad(x, (0, 0, pad, pad))  # [..., samples + 2 pad, channels]
    weight = conv.weight[:, 0, :].t()  # [kernel, channels]
    out = padded[..., :samples, :] * weight[0]
    for offset in range(1, kernel):
        out = out + padded[..., offset : offset + samples, :] * weight[offset]
    return out if conv.bias is None else out + conv.bias
