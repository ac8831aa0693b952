"""The PyTorch forms of polarity-aware attention (PolaFormer++ PaCS): quadratic and chunked linear.

Math (`docs/pola_attention.md`), per head with head dim `d`:

    [q+, q-] = [relu(q), relu(-q)]                       (likewise for k)
    Qs = expm1(temp_same * [q+, q-])                     same-sign query features   [..., Nq, 2d]
    Qo = expm1(temp_opp  * [q-, q+])                     opposite-sign query features
    K  = expm1([k+, k-])                                 key features (no temperature)
    out_s = Qs (K^T v1) / (Qs . sum_j K_j + eps)         v1 = v[..., :d/2]
    out_o = Qo (K^T v2) / (Qo . sum_j K_j + eps)         v2 = v[..., d/2:]
    out   = [out_s, out_o]                               [..., Nq, d]

Two association orders compute the same function:
- quadratic: `w_ij = Qs_i . K_j`, `out_i = sum_j w_ij v_j / (sum_j w_ij + eps)`, cost O(Nq Nk 2d);
- linear: `Qs (K^T v)`, cost O((Nq + Nk) 2d d), memory O((Nq + Nk) d) with the custom autograd
  function below, which recomputes the feature maps in backward instead of storing them and walks
  long sequences in chunks so that no `[..., N, 2d]` feature tensor is ever held whole. Short
  sequences take the linear form over whole sequences instead (`ray.pytorch_form`).

Numerics (fp32 or fp64 with autocast off, `EXPONENT_CLAMP`, `EPSILON`) and the feature maps: `features`.
Inputs come in the compute dtype; which form runs, and the checkpointing of the quadratic form under
autograd: `linear.op`.
"""

from __future__ import annotations

from typing import Literal, overload

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP, expm1_, key_feature_map, query_feature_maps

# Sequence chunks of the linear form. A chunk's temporaries are about 20 [..., chunk, d] tensors; with
# a sixteenth of the sequence per chunk they stay near one [..., N, d] tensor, so forward+backward
# needs little more than the output and the three input gradients (the memory of SDPA). Chunks hold
# at least _MIN_CHUNK_ELEMENTS (below PyTorch's parallel grain size, ops run on one thread and per-op
# overhead would dominate) and at most _MAX_CHUNK_ELEMENTS feature elements ([..., chunk, 2d]).
_CHUNKS_PER_SEQUENCE = 8
_MIN_CHUNK_ELEMENTS = 2**15
_MAX_CHUNK_ELEMENTS = 2**21


# --------------------------------------------------------------------------------------------------
# Quadratic form


def polarity_attention_quadratic(
    q: Float[Tensor, "*#batch queries d"],
    k: Float[Tensor, "*#batch keys d"],
    v: Float[Tensor, "*#batch keys d"],
    temp_same: Float[Tensor, "*temps 2*d"],
    temp_opp: Float[Tensor, "*temps 2*d"],
    key_mask: Bool[Tensor, "*#batch keys"] | None = None,
) -> Float[Tensor, "*#batch queries d"]:
    """Explicit weights `[..., Nq, Nk]` per stream; plain autograd. Inputs already in compute dtype."""
    half = v.shape[-1] // 2
    q_same, q_opp = query_feature_maps(q, temp_same, temp_opp)
    keys_t = key_feature_map(k, key_mask).transpose(-1, -2)  # [..., 2d, Nk]
    outputs = []
    for q_feat, values in ((q_same, v[..., :half]), (q_opp, v[..., half:])):
        weights = q_feat @ keys_t  # [..., Nq, Nk], >= 0
        outputs.append((weights @ values) / (weights.sum(dim=-1, keepdim=True) + EPSILON))
    return torch.cat(outputs, dim=-1)


# --------------------------------------------------------------------------------------------------
# Linear form: custom autograd with recomputation
#
# Half-width evaluation. Of the two parts `x+`, `x-` of a channel at most one is non-zero, so a
# feature tensor `[expm1(t+ x+), expm1(t- x-)]` `[..., n, 2d]` is `expm1(t_x |x|)` `[..., n, d]`, with
# `t_x` the temperature of the part that is non-zero, scattered into the `x+` or `x-` slot by the sign
# of `x`: the expensive exponential runs on d channels instead of 2d. Both query streams are stacked
# on a stream axis, `[..., 2, n, ...]`: the same-sign stream pairs the `q+` slot with the key rows of
# `k+`, the opposite-sign stream pairs it with the rows of `k-` (and vice versa), which amounts to
# swapping the two row halves of the key statistics. Per stream, one matmul with the statistics
# `W = [K^T v (its half of the value channels), sum K]` `[2d, d/2 + 1]` gives numerator and denominator.


def _swap_halves(x: Tensor, dim: int = -1) -> Tensor:
    """Exchange the two halves of `dim` (the `x+` and `x-` parts of a 2d feature axis)."""
    first, second = x.chunk(2, dim=dim)
    return torch.cat([second, first], dim=dim)


def _chunk_tokens(x: Tensor) -> int:
    """Tokens per chunk of `x` `[..., N, d]` (see `_CHUNKS_PER_SEQUENCE`)."""
    per_token = max(1, x[..., 0, :].numel() * 2)  # feature elements of one token
    target = x.numel() * 2 // _CHUNKS_PER_SEQUENCE
    elements = min(max(target, _MIN_CHUNK_ELEMENTS), _MAX_CHUNK_ELEMENTS)
    return max(1, elements // per_token)


def _chunks(length: int, size: int):
    for start in range(0, length, size):
        yield slice(start, min(start + size, length))


def _scatter_by_sign(values: Tensor, positive: Tensor) -> Tensor:
    """`[values where x > 0 else 0, values where x <= 0 else 0]`: `[..., n, d]` -> `[..., n, 2d]`."""
    d = values.shape[-1]
    out = values.new_empty(*torch.broadcast_shapes(values.shape, positive.shape)[:-1], 2 * d)
    zero = values.new_zeros(())
    torch.where(positive, values, zero, out=out[..., :d])
    torch.where(positive, zero, values, out=out[..., d:])
    return out


def _gather_by_sign(grad: Tensor, positive: Tensor) -> Tensor:
    """Adjoint of `_scatter_by_sign`: `[..., n, 2d]` -> `[..., n, d]`."""
    d = grad.shape[-1] // 2
    return torch.where(positive, grad[..., :d], grad[..., d:])


@overload
def _spiky_inplace(exponent: Tensor, for_backward: Literal[True]) -> tuple[Tensor, Tensor]: ...


@overload
def _spiky_inplace(exponent: Tensor, for_backward: Literal[False]) -> tuple[Tensor, None]: ...


def _spiky_inplace(exponent: Tensor, for_backward: bool) -> tuple[Tensor, Tensor | None]:
    """`expm1(min(z, B))` written over `z`; with `for_backward`, also where the clamp is active."""
    clamped = exponent > EXPONENT_CLAMP if for_backward else None
    return expm1_(exponent.clamp_max_(EXPONENT_CLAMP)), clamped


def _exponent_backward(grad_features: Tensor, features: Tensor, clamped: Tensor) -> Tensor:
    """Gradient w.r.t. `z` of `features = expm1(min(z, B))`: times `exp(z) = features + 1` below the
    clamp, 0 above it. Overwrites `grad_features`."""
    return grad_features.addcmul_(grad_features, features).masked_fill_(clamped, 0.0)


def _stream_temperatures(temp_same: Tensor, temp_opp: Tensor) -> tuple[Tensor, Tensor]:
    """Temperatures of the positive and of the negative part of `q`, `[..., 2 (stream), 1, d]` each.

    Same-sign stream: `q+` uses `temp_same[:d]`, `q-` uses `temp_same[d:]`; opposite-sign stream
    (features `expm1(temp_opp * [q-, q+])`): `q+` uses `temp_opp[d:]`, `q-` uses `temp_opp[:d]`.
    """
    temp_same, temp_opp = torch.broadcast_tensors(temp_same, temp_opp)
    if temp_same.dim() == 1:
        temp_same, temp_opp = temp_same.unsqueeze(0), temp_opp.unsqueeze(0)
    same_pos, same_neg = temp_same.chunk(2, dim=-1)
    opp_neg, opp_pos = temp_opp.chunk(2, dim=-1)
    return torch.stack([same_pos, opp_pos], dim=-3), torch.stack([same_neg, opp_neg], dim=-3)


def _temperature_grads(grad_pos: Tensor, grad_neg: Tensor) -> tuple[Tensor, Tensor]:
    """Adjoint of `_stream_temperatures`: `[..., 2, 1, d]` pairs -> `[..., 1, 2d]` (same, opp)."""
    grad_same = torch.cat([grad_pos[..., 0, :, :], grad_neg[..., 0, :, :]], dim=-1)
    grad_opp = torch.cat([grad_neg[..., 1, :, :], grad_pos[..., 1, :, :]], dim=-1)
    return grad_same, grad_opp


QuerySaved = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]
KeySaved = tuple[Tensor, Tensor, Tensor]


@overload
def _half_width_query_features(
    x: Tensor, temp_pos: Tensor, temp_neg: Tensor, for_backward: Literal[True]
) -> tuple[Tensor, QuerySaved]: ...


@overload
def _half_width_query_features(
    x: Tensor, temp_pos: Tensor, temp_neg: Tensor, for_backward: Literal[False] = False
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor, None, Tensor]]: ...


def _half_width_query_features(
    x: Tensor, temp_pos: Tensor, temp_neg: Tensor, for_backward: bool = False
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]]:
    """Both streams' query features `[..., 2, n, 2d]` of `x` `[..., n, d]`, and what backward reuses:
    sign mask `[..., 1, n, d]`, `|x|`, per-element temperatures, clamp mask, half-width features
    (`[..., 2, n, d]` each)."""
    positive = (x > 0).unsqueeze(-3)
    magnitude = x.abs().unsqueeze(-3)
    temps = torch.where(positive, temp_pos, temp_neg)
    exponents = temps * magnitude
    half_features, clamped = _spiky_inplace(exponents, True) if for_backward else _spiky_inplace(exponents, False)
    return _scatter_by_sign(half_features, positive), (positive, magnitude, temps, clamped, half_features)


@overload
def _half_width_key_features(
    x: Tensor, visible: Tensor | None, for_backward: Literal[True]
) -> tuple[Tensor, KeySaved]: ...


@overload
def _half_width_key_features(
    x: Tensor, visible: Tensor | None, for_backward: Literal[False] = False
) -> tuple[Tensor, tuple[Tensor, None, Tensor]]: ...


def _half_width_key_features(
    x: Tensor, visible: Tensor | None, for_backward: bool = False
) -> tuple[Tensor, tuple[Tensor, Tensor | None, Tensor]]:
    """Key features `[..., n, 2d]` (zero for masked keys) of `x` `[..., n, d]`, and what backward reuses:
    sign mask, clamp mask and (masked) half-width features, `[..., n, d]` each."""
    positive = x > 0
    half_features, clamped = _spiky_inplace(x.abs(), True) if for_backward else _spiky_inplace(x.abs(), False)
    if visible is not None:
        half_features = half_features.mul_(visible)
    return _scatter_by_sign(half_features, positive), (positive, clamped, half_features)


def _stream_stats(key_stats: Tensor) -> Tensor:
    """Per-stream matrices `[..., 2, 2d, d/2 + 1]` from `[K^T v, sum K]` `[..., 2d, d + 1]`."""
    d = key_stats.shape[-1] - 1
    half = d // 2
    same = torch.cat([key_stats[..., :half], key_stats[..., d:]], dim=-1)
    opp = _swap_halves(key_stats[..., half:], dim=-2)  # q+ slot meets k- rows
    return torch.stack([same, opp], dim=-3)


def _stream_stats_backward(grad: Tensor) -> Tensor:
    """Adjoint of `_stream_stats`: `[..., 2, 2d, d/2 + 1]` -> `[..., 2d, d + 1]`."""
    half = grad.shape[-1] - 1
    grad_same, grad_opp = grad[..., 0, :, :], _swap_halves(grad[..., 1, :, :], dim=-2)
    return torch.cat(
        [grad_same[..., :half], grad_opp[..., :half], grad_same[..., half:] + grad_opp[..., half:]], dim=-1
    )


def _streams_to_channels(x: Tensor) -> Tensor:
    """`[..., 2, n, d/2]` -> `[..., n, d]` (same-sign channels first)."""
    return x.transpose(-3, -2).flatten(-2)


def _normalise(numerators_and_denominators: Tensor) -> tuple[Tensor, Tensor]:
    """`[..., 2, n, d/2 + 1]` -> outputs `[..., 2, n, d/2]` and denominators + eps `[..., 2, n, 1]`."""
    denominators = numerators_and_denominators[..., -1:] + EPSILON
    return numerators_and_denominators[..., :-1] / denominators, denominators


class _PolarityLinearAttention(torch.autograd.Function):
    """Linear form storing only the inputs and the key statistics `[K^T v, sum K]` `[..., 2d, d + 1]`.

    Forward: pass 1 over key chunks accumulates the statistics; pass 2 over query chunks writes the
    output. Backward repeats both passes in reverse order, recomputing each chunk's features, so peak
    memory is the inputs, their gradients and one chunk's features.
    """

    @staticmethod
    def forward(ctx, q, k, v, temp_same, temp_opp, key_mask):
        d = q.shape[-1]
        key_stats = q.new_zeros(*k.shape[:-2], 2 * d, d + 1)
        for chunk in _chunks(k.shape[-2], _chunk_tokens(k)):
            visible = None if key_mask is None else key_mask[..., chunk, None].to(k.dtype)
            keys, _ = _half_width_key_features(k[..., chunk, :], visible)
            key_stats[..., :d] += keys.transpose(-1, -2) @ v[..., chunk, :]
            key_stats[..., d] += keys.sum(dim=-2)

        temp_pos, temp_neg = _stream_temperatures(temp_same, temp_opp)
        stats = _stream_stats(key_stats)
        out = q.new_empty(*q.shape[:-1], d)
        for chunk in _chunks(q.shape[-2], _chunk_tokens(q)):
            features, _ = _half_width_query_features(q[..., chunk, :], temp_pos, temp_neg)
            result, _ = _normalise(features @ stats)
            out[..., chunk, :] = _streams_to_channels(result)

        ctx.save_for_backward(q, k, v, temp_same, temp_opp, key_mask, key_stats)
        return out

    @staticmethod
    def backward(ctx, *grad_outputs: Tensor):
        (grad_out,) = grad_outputs
        q, k, v, temp_same, temp_opp, key_mask, key_stats = ctx.saved_tensors
        d = q.shape[-1]
        with torch.autocast(device_type=q.device.type, enabled=False):
            grad_out = grad_out.to(q.dtype)
            temp_pos, temp_neg = _stream_temperatures(temp_same, temp_opp)
            stats = _stream_stats(key_stats)
            grad_q = torch.empty_like(q)
            grad_stats = torch.zeros_like(stats)
            grad_temp_pos = q.new_zeros(*q.shape[:-2], *temp_pos.shape[-3:])
            grad_temp_neg = torch.zeros_like(grad_temp_pos)

            # Pass 1 (queries): out = num / den, so d num = g / den and d den = -(g . out) / den.
            # Chunk temporaries are dropped (del) as soon as they are used: they set the peak memory.
            for chunk in _chunks(q.shape[-2], _chunk_tokens(q)):
                x = q[..., chunk, :]
                features, saved = _half_width_query_features(x, temp_pos, temp_neg, for_backward=True)
                positive, magnitude, temps, clamped, half_features = saved
                result, denominators = _normalise(features @ stats)  # [..., 2, n, d/2], [..., 2, n, 1]
                grad_result = grad_out[..., chunk, :].unflatten(-1, (2, d // 2)).transpose(-3, -2)
                grad_den = -(grad_result * result).sum(dim=-1, keepdim=True)
                del result
                grad_nd = torch.cat([grad_result, grad_den], dim=-1).div_(denominators)  # [..., 2, n, d/2 + 1]
                grad_stats += features.transpose(-1, -2) @ grad_nd
                del features
                grad_half = _gather_by_sign(grad_nd @ stats.transpose(-1, -2), positive)  # [..., 2, n, d]
                del grad_nd
                grad_exponent = _exponent_backward(grad_half, half_features, clamped)
                del half_features, clamped
                grad_q[..., chunk, :] = (grad_exponent * temps).sum(dim=-3).mul_(torch.sign(x))
                del temps
                # d/dT+ = sum_n grad_exponent * x+ and d/dT- = sum_n grad_exponent * x-: the diagonals of
                # the two halves of one [d, 2d] product per stream (one matmul instead of four passes).
                split = _scatter_by_sign(magnitude, positive)  # [..., 1, n, 2d] = [x+, x-]
                products = grad_exponent.transpose(-1, -2) @ split  # [..., 2, d, 2d]
                grad_temp_pos += products[..., :d].diagonal(dim1=-2, dim2=-1).unsqueeze(-2)
                grad_temp_neg += products[..., d:].diagonal(dim1=-2, dim2=-1).unsqueeze(-2)

            # Pass 2 (keys): key_stats = [K^T v, sum K].
            grad_key_stats = _stream_stats_backward(grad_stats)  # [..., 2d, d + 1]
            grad_kv, grad_k_sum = grad_key_stats[..., :d], grad_key_stats[..., d:].transpose(-1, -2)
            grad_k = torch.empty_like(k)
            grad_v = torch.empty_like(v)
            for chunk in _chunks(k.shape[-2], _chunk_tokens(k)):
                x = k[..., chunk, :]
                visible = None if key_mask is None else key_mask[..., chunk, None].to(k.dtype)
                keys, (positive, clamped, half_features) = _half_width_key_features(x, visible, for_backward=True)
                grad_v[..., chunk, :] = keys @ grad_kv
                del keys
                grad_keys = v[..., chunk, :] @ grad_kv.transpose(-1, -2) + grad_k_sum  # [..., n, 2d]
                grad_half = _gather_by_sign(grad_keys, positive)
                del grad_keys
                if visible is not None:  # masked keys: zero gradient (their slope below is then moot)
                    grad_half = grad_half.mul_(visible)
                grad_k[..., chunk, :] = _exponent_backward(grad_half, half_features, clamped).mul_(torch.sign(x))

            grad_temp_same, grad_temp_opp = _temperature_grads(grad_temp_pos, grad_temp_neg)
        return (
            grad_q,
            grad_k,
            grad_v,
            grad_temp_same.sum_to_size(temp_same.shape) if ctx.needs_input_grad[3] else None,
            grad_temp_opp.sum_to_size(temp_opp.shape) if ctx.needs_input_grad[4] else None,
            None,
        )


def polarity_attention_linear(
    q: Float[Tensor, "*#batch queries d"],
    k: Float[Tensor, "*#batch keys d"],
    v: Float[Tensor, "*#batch keys d"],
    temp_same: Float[Tensor, "*temps 2*d"],
    temp_opp: Float[Tensor, "*temps 2*d"],
    key_mask: Bool[Tensor, "*#batch keys"] | None = None,
) -> Float[Tensor, "*#batch queries d"]:
    """Linear form in PyTorch (memory-lean custom autograd). Inputs already in compute dtype."""
    return _PolarityLinearAttention.apply(q, k, v, temp_same, temp_opp, key_mask)
