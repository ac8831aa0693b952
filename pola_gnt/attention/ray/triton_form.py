"""Fused Triton kernels for Pola-GNT's ray attention: the linear form over the samples of each ray.

Computes exactly `ray.op.polarity_ray_attention` (the short linear form of `ray.pytorch_form`, same
clamp bound and epsilon) for `q, k, v` `[rays, samples, heads * d]`, heads in place. Per (ray, head),
with `B = EXPONENT_CLAMP`, `vis_j` the sample's 0/1 visibility, `F(x) = expm1(min(x, B))`:

    K_j  = F(|k_j|) vis_j,   K+_j = K_j [k_j > 0],   K-_j = K_j [k_j < 0]             [S, d] each
    kv[p] = K_p^T [v_lo, v_hi],   ksum[p] = sum_j K_p[j]        p in {+, -}; v_lo = v[:, :d/2], v_hi = v[:, d/2:]
    stream s = 0 (same sign):     Fs = F(t |q|), t = ts[:d] where q > 0, ts[d:] where q < 0
                                  A = Fs [q > 0] meets K+,  Bq = Fs [q < 0] meets K-
    stream s = 1 (opposite sign): Fo = F(t |q|), t = to[d:] where q > 0, to[:d] where q < 0
                                  A = Fo [q < 0] meets K+,  Bq = Fo [q > 0] meets K-
    out[:, cols_s] = (A kv[+][:, cols_s] + Bq kv[-][:, cols_s]) / (A . ksum[+] + Bq . ksum[-] + eps)

with `cols_0 = [0, d/2)` (v_lo) and `cols_1 = [d/2, d)` (v_hi). This is `Qs (K^T v) / (...)` of
`linear.pytorch_form` with the 2d-wide features split by the sign of each channel: a query or key channel has
one non-zero polarity part, so each feature map is one `expm1` over d channels (half width), and the
parts are selected by sign (exact; no sum cancels).

Layout: q, k, v are read in place with their own ray and sample strides (the chunks of one
projection have rows of `4 heads d`), channels contiguous; head `h` owns channels `[h d, (h + 1) d)`.
Temperatures are stacked `[heads, 2 streams, 2d]` fp32; visibility `[rays, samples]`.

Grid `(rays, heads)`, one program per (ray, head), made for short rays (`MAX_SAMPLES`): the ray's
statistics `kv` (4 blocks `[d, d/2]`) and `ksum` stay in fp32 registers.
- forward  `_ray_forward_kernel`: a loop over key tiles accumulates the statistics, a loop over query
  tiles writes the output. Only the inputs are saved for backward.
- backward `_ray_backward_kernel`: recomputes the statistics, a loop over query tiles writes `dq` and
  accumulates `d kv`, `d ksum` and the temperature gradients, a loop over key tiles writes `dk`, `dv`.
  Temperature gradients are per-program partials `[rays, heads, 2, 2d]` reduced with `torch.sum`
  (deterministic, no atomics).
Features and sums are fp32 whatever the input dtype; no feature tensor is written to memory.
At an exponent input of exactly `B` the slope of `F` is kept (`exp(B)`), as in every other fast path
(`ray.pytorch_form`, `linear.triton_form`, the CPU kernels); only the fp64 reference's torch.clamp gives 0 there.
Input limits, `expm1`, the launch call and the interpreter notes (`TRITON_INTERPRET=1`): `triton_common`.
"""

from __future__ import annotations

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP
from pola_gnt.attention.triton_common import (
    MAX_HEAD_DIM,
    MIN_BLOCK,
    SUPPORTED_DTYPES,
    expm1,
    launch,
    on_kernel_device,
)

# Rays longer than this take `polarity_attention` (one program per (ray, head) walks the whole ray,
# so long rays would leave the GPU with few, long programs).
MAX_SAMPLES = 1024


def ray_triton_supported(q: Tensor, head_dim: int, samples: int) -> bool:
    """Whether `polarity_ray_attention_triton` takes queries `q` `[rays, samples, heads * head_dim]`.

    Needs a CUDA tensor (or `TRITON_INTERPRET=1` for the CPU interpreter), an fp32/fp16/bf16 dtype,
    an even head dim in `[2, MAX_HEAD_DIM]` and at most `MAX_SAMPLES` samples per ray.
    """
    head_dim_ok = head_dim % 2 == 0 and 2 <= head_dim <= MAX_HEAD_DIM
    return on_kernel_device(q) and q.dtype in SUPPORTED_DTYPES and head_dim_ok and samples <= MAX_SAMPLES


# --------------------------------------------------------------------------------------------------
# Kernels


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _load_tile(ptr, ray_offset, rows, row_stride, columns, row_ok, column_ok):
    """fp32 tile `[rows, columns]` of a `[rays, samples, channels]` tensor; 0 outside the masks."""
    offsets = ray_offset + rows.to(tl.int64)[:, None] * row_stride + columns[None, :]
    return tl.load(ptr + offsets, mask=row_ok[:, None] & column_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _store_tile(ptr, ray_offset, rows, row_stride, columns, row_ok, column_ok, values):
    offsets = ray_offset + rows.to(tl.int64)[:, None] * row_stride + columns[None, :]
    tl.store(ptr + offsets, values.to(ptr.dtype.element_ty), mask=row_ok[:, None] & column_ok[None, :])


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _key_tile(
    k_ptr, v_ptr, vis_ptr, ray, rows, channel_base, num_samples,
    k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
    HEAD_DIM: tl.constexpr, BOUND: tl.constexpr, HAS_VISIBLE: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """A tile of keys: `k` `[BLOCK_S, BLOCK_D]`, `K = F(|k|) vis`, the value halves `[BLOCK_S, BLOCK_H]`
    and `vis` `[BLOCK_S]` (rows past the ray and padding channels load 0, so their features are 0)."""
    half: tl.constexpr = HEAD_DIM // 2
    row_ok = rows < num_samples
    channels = tl.arange(0, BLOCK_D)
    columns = tl.arange(0, BLOCK_H)
    k_base = ray.to(tl.int64) * k_ray_stride + channel_base
    v_base = ray.to(tl.int64) * v_ray_stride + channel_base
    k = _load_tile(k_ptr, k_base, rows, k_row_stride, channels, row_ok, channels < HEAD_DIM)
    v_lo = _load_tile(v_ptr, v_base, rows, v_row_stride, columns, row_ok, columns < half)
    v_hi = _load_tile(v_ptr, v_base + half, rows, v_row_stride, columns, row_ok, columns < half)
    if HAS_VISIBLE:
        vis = tl.load(vis_ptr + ray.to(tl.int64) * num_samples + rows, mask=row_ok, other=0.0).to(tl.float32)
    else:
        vis = tl.where(row_ok, 1.0, 0.0)
    features = expm1(tl.minimum(tl.abs(k), BOUND)) * vis[:, None]
    return k, features, v_lo, v_hi, vis


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _key_stats(
    k_ptr, v_ptr, vis_ptr, ray, channel_base, num_samples,
    k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
    HEAD_DIM: tl.constexpr, BOUND: tl.constexpr, HAS_VISIBLE: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """The ray's statistics: `kv[+]`, `kv[-]` for each value half (`[BLOCK_D, BLOCK_H]` each, order
    pos_lo, pos_hi, neg_lo, neg_hi) and `ksum[+]`, `ksum[-]` `[BLOCK_D]`."""
    kv_pos_lo = tl.zeros((BLOCK_D, BLOCK_H), dtype=tl.float32)
    kv_pos_hi = tl.zeros((BLOCK_D, BLOCK_H), dtype=tl.float32)
    kv_neg_lo = tl.zeros((BLOCK_D, BLOCK_H), dtype=tl.float32)
    kv_neg_hi = tl.zeros((BLOCK_D, BLOCK_H), dtype=tl.float32)
    ksum_pos = tl.zeros((BLOCK_D,), dtype=tl.float32)
    ksum_neg = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for start in range(0, num_samples, BLOCK_S):
        rows = start + tl.arange(0, BLOCK_S)
        k, features, v_lo, v_hi, _ = _key_tile(
            k_ptr, v_ptr, vis_ptr, ray, rows, channel_base, num_samples,
            k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
            HEAD_DIM, BOUND, HAS_VISIBLE, BLOCK_S, BLOCK_D, BLOCK_H,
        )  # fmt: skip
        keys_pos = tl.trans(tl.where(k > 0.0, features, 0.0))
        keys_neg = tl.trans(tl.where(k < 0.0, features, 0.0))
        kv_pos_lo = tl.dot(keys_pos, v_lo, kv_pos_lo, input_precision=DOT_PRECISION)
        kv_pos_hi = tl.dot(keys_pos, v_hi, kv_pos_hi, input_precision=DOT_PRECISION)
        kv_neg_lo = tl.dot(keys_neg, v_lo, kv_neg_lo, input_precision=DOT_PRECISION)
        kv_neg_hi = tl.dot(keys_neg, v_hi, kv_neg_hi, input_precision=DOT_PRECISION)
        ksum_pos += tl.sum(keys_pos, axis=1)
        ksum_neg += tl.sum(keys_neg, axis=1)
    return kv_pos_lo, kv_pos_hi, kv_neg_lo, kv_neg_hi, ksum_pos, ksum_neg


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _stream_temperatures(temps_ptr, head, channels, HEAD_DIM: tl.constexpr):
    """Per stream, the temperatures of the non-zero part of a channel where `q > 0` and where `q < 0`
    `[BLOCK_D]` (0 on padding): same sign `ts[:d]`, `ts[d:]`; opposite sign `to[d:]`, `to[:d]`."""
    channel_ok = channels < HEAD_DIM
    same = temps_ptr + (head * 2) * 2 * HEAD_DIM
    opp = temps_ptr + (head * 2 + 1) * 2 * HEAD_DIM
    same_pos = tl.load(same + channels, mask=channel_ok, other=0.0)
    same_neg = tl.load(same + HEAD_DIM + channels, mask=channel_ok, other=0.0)
    opp_pos = tl.load(opp + HEAD_DIM + channels, mask=channel_ok, other=0.0)
    opp_neg = tl.load(opp + channels, mask=channel_ok, other=0.0)
    return same_pos, same_neg, opp_pos, opp_neg


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _stream_forward(
    magnitude, positive, negative, meets_pos, meets_neg, temp_pos, temp_neg,
    kv_pos, kv_neg, ksum_pos, ksum_neg,
    BOUND: tl.constexpr, EPS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One stream over a query tile: exponent inputs `z = t |q|`, features `F(z)`, the coefficients
    that meet `K+` and `K-`, and the stream's output `[BLOCK_S, BLOCK_H]` and denominator `[BLOCK_S]`."""
    temps = tl.where(positive, temp_pos[None, :], tl.where(negative, temp_neg[None, :], 0.0))
    exponents = temps * magnitude
    features = expm1(tl.minimum(exponents, BOUND))
    coeff_pos = tl.where(meets_pos, features, 0.0)
    coeff_neg = tl.where(meets_neg, features, 0.0)
    num = tl.dot(coeff_pos, kv_pos, input_precision=DOT_PRECISION)
    num = tl.dot(coeff_neg, kv_neg, num, input_precision=DOT_PRECISION)
    den = tl.sum(coeff_pos * ksum_pos[None, :], axis=1) + tl.sum(coeff_neg * ksum_neg[None, :], axis=1) + EPS
    return temps, exponents, features, coeff_pos, coeff_neg, num / den[:, None], den


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _ray_forward_kernel(
    q_ptr, k_ptr, v_ptr,  # [rays, samples, heads d], rows strided, channels contiguous
    temps_ptr,  # [heads, 2 streams, 2d] fp32
    vis_ptr,  # [rays, samples] 0/1; unused without HAS_VISIBLE
    out_ptr,  # [rays, samples, heads d] contiguous
    num_samples,
    q_ray_stride, q_row_stride, k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
    out_ray_stride, out_row_stride,
    HEAD_DIM: tl.constexpr, BOUND: tl.constexpr, EPS: tl.constexpr, HAS_VISIBLE: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    ray = tl.program_id(0)
    head = tl.program_id(1)
    channel_base = head * HEAD_DIM
    kv_pos_lo, kv_pos_hi, kv_neg_lo, kv_neg_hi, ksum_pos, ksum_neg = _key_stats(
        k_ptr, v_ptr, vis_ptr, ray, channel_base, num_samples,
        k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
        HEAD_DIM, BOUND, HAS_VISIBLE, BLOCK_S, BLOCK_D, BLOCK_H, DOT_PRECISION,
    )  # fmt: skip
    same_pos, same_neg, opp_pos, opp_neg = _stream_temperatures(temps_ptr, head, tl.arange(0, BLOCK_D), HEAD_DIM)

    half: tl.constexpr = HEAD_DIM // 2
    channels = tl.arange(0, BLOCK_D)
    columns = tl.arange(0, BLOCK_H)
    q_base = ray.to(tl.int64) * q_ray_stride + channel_base
    out_base = ray.to(tl.int64) * out_ray_stride + channel_base
    for start in range(0, num_samples, BLOCK_S):
        rows = start + tl.arange(0, BLOCK_S)
        row_ok = rows < num_samples
        q = _load_tile(q_ptr, q_base, rows, q_row_stride, channels, row_ok, channels < HEAD_DIM)
        positive = q > 0.0
        negative = q < 0.0
        magnitude = tl.abs(q)
        _, _, _, _, _, out_same, _ = _stream_forward(
            magnitude, positive, negative, positive, negative, same_pos, same_neg,
            kv_pos_lo, kv_neg_lo, ksum_pos, ksum_neg, BOUND, EPS, DOT_PRECISION,
        )  # fmt: skip
        _, _, _, _, _, out_opp, _ = _stream_forward(
            magnitude, positive, negative, negative, positive, opp_pos, opp_neg,
            kv_pos_hi, kv_neg_hi, ksum_pos, ksum_neg, BOUND, EPS, DOT_PRECISION,
        )  # fmt: skip
        _store_tile(out_ptr, out_base, rows, out_row_stride, columns, row_ok, columns < half, out_same)
        _store_tile(out_ptr, out_base + half, rows, out_row_stride, columns, row_ok, columns < half, out_opp)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _stream_backward(
    grad_out, magnitude, positive, negative, meets_pos, meets_neg, temp_pos, temp_neg,
    kv_pos, kv_neg, ksum_pos, ksum_neg,
    BOUND: tl.constexpr, EPS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One stream's backward over a query tile, from its output gradient `[BLOCK_S, BLOCK_H]`.

    `out = num / den`: `d num = g / den`, `d den = -(g . out) / den`; a coefficient meets one row of
    the statistics, `d A = d num kv[+]^T + d den ksum[+]` (likewise `Bq`); through `F(z)`:
    `d z = d F exp(z)` below the clamp, 0 at and above it (torch.clamp's gradient, as in the
    reference); `d|q| = t d z`, `d t = |q| d z`. Returns `dq` of this stream, the temperature
    gradients where `q > 0` and `q < 0` `[BLOCK_D]`, the coefficients and `d num`, `d den` (for the
    statistics' gradients)."""
    temps, exponents, features, coeff_pos, coeff_neg, out, den = _stream_forward(
        magnitude, positive, negative, meets_pos, meets_neg, temp_pos, temp_neg,
        kv_pos, kv_neg, ksum_pos, ksum_neg, BOUND, EPS, DOT_PRECISION,
    )  # fmt: skip
    grad_num = grad_out / den[:, None]
    grad_den = -tl.sum(grad_out * out, axis=1) / den
    grad_coeff_pos = tl.dot(grad_num, tl.trans(kv_pos), input_precision=DOT_PRECISION)
    grad_coeff_pos += grad_den[:, None] * ksum_pos[None, :]
    grad_coeff_neg = tl.dot(grad_num, tl.trans(kv_neg), input_precision=DOT_PRECISION)
    grad_coeff_neg += grad_den[:, None] * ksum_neg[None, :]
    grad_features = tl.where(meets_pos, grad_coeff_pos, tl.where(meets_neg, grad_coeff_neg, 0.0))
    # Zero channels have no non-zero part (z = 0 and both selections false): d z = 0, like relu's slope.
    grad_exponents = tl.where(exponents <= BOUND, grad_features * (features + 1.0), 0.0)
    grad_magnitude = grad_exponents * temps
    grad_q = tl.where(positive, grad_magnitude, -grad_magnitude)
    weighted = grad_exponents * magnitude
    grad_temp_pos = tl.sum(tl.where(positive, weighted, 0.0), axis=0)
    grad_temp_neg = tl.sum(tl.where(negative, weighted, 0.0), axis=0)
    return grad_q, grad_temp_pos, grad_temp_neg, coeff_pos, coeff_neg, grad_num, grad_den


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _ray_backward_kernel(
    grad_out_ptr,  # [rays, samples, heads d], rows strided, channels contiguous
    q_ptr, k_ptr, v_ptr,  # [rays, samples, heads d], rows strided, channels contiguous
    temps_ptr,  # [heads, 2 streams, 2d] fp32
    vis_ptr,  # [rays, samples] 0/1; unused without HAS_VISIBLE
    grad_q_ptr, grad_k_ptr, grad_v_ptr,  # [rays, samples, heads d] contiguous
    grad_temps_part_ptr,  # [rays, heads, 2 streams, 2d] fp32
    num_samples,
    g_ray_stride, g_row_stride,
    q_ray_stride, q_row_stride, k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
    out_ray_stride, out_row_stride,
    HEAD_DIM: tl.constexpr, BOUND: tl.constexpr, EPS: tl.constexpr, HAS_VISIBLE: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    ray = tl.program_id(0)
    head = tl.program_id(1)
    channel_base = head * HEAD_DIM
    kv_pos_lo, kv_pos_hi, kv_neg_lo, kv_neg_hi, ksum_pos, ksum_neg = _key_stats(
        k_ptr, v_ptr, vis_ptr, ray, channel_base, num_samples,
        k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
        HEAD_DIM, BOUND, HAS_VISIBLE, BLOCK_S, BLOCK_D, BLOCK_H, DOT_PRECISION,
    )  # fmt: skip
    channels = tl.arange(0, BLOCK_D)
    channel_ok = channels < HEAD_DIM
    same_pos, same_neg, opp_pos, opp_neg = _stream_temperatures(temps_ptr, head, channels, HEAD_DIM)

    # Pass 1 (queries): dq, and the gradients of the statistics and the temperatures.
    half: tl.constexpr = HEAD_DIM // 2
    columns = tl.arange(0, BLOCK_H)
    column_ok = columns < half
    grad_kv_pos_lo = tl.zeros((BLOCK_D, BLOCK_H), dtype=tl.float32)
    grad_kv_pos_hi = tl.zeros((BLOCK_D, BLOCK_H), dtype=tl.float32)
    grad_kv_neg_lo = tl.zeros((BLOCK_D, BLOCK_H), dtype=tl.float32)
    grad_kv_neg_hi = tl.zeros((BLOCK_D, BLOCK_H), dtype=tl.float32)
    grad_ksum_pos = tl.zeros((BLOCK_D,), dtype=tl.float32)
    grad_ksum_neg = tl.zeros((BLOCK_D,), dtype=tl.float32)
    grad_same_pos = tl.zeros((BLOCK_D,), dtype=tl.float32)
    grad_same_neg = tl.zeros((BLOCK_D,), dtype=tl.float32)
    grad_opp_pos = tl.zeros((BLOCK_D,), dtype=tl.float32)
    grad_opp_neg = tl.zeros((BLOCK_D,), dtype=tl.float32)
    q_base = ray.to(tl.int64) * q_ray_stride + channel_base
    g_base = ray.to(tl.int64) * g_ray_stride + channel_base
    out_base = ray.to(tl.int64) * out_ray_stride + channel_base
    for start in range(0, num_samples, BLOCK_S):
        rows = start + tl.arange(0, BLOCK_S)
        row_ok = rows < num_samples
        q = _load_tile(q_ptr, q_base, rows, q_row_stride, channels, row_ok, channel_ok)
        positive = q > 0.0
        negative = q < 0.0
        magnitude = tl.abs(q)
        grad_same = _load_tile(grad_out_ptr, g_base, rows, g_row_stride, columns, row_ok, column_ok)
        grad_opp = _load_tile(grad_out_ptr, g_base + half, rows, g_row_stride, columns, row_ok, column_ok)

        grad_q_same, grad_temp_pos, grad_temp_neg, coeff_pos, coeff_neg, grad_num, grad_den = _stream_backward(
            grad_same, magnitude, positive, negative, positive, negative, same_pos, same_neg,
            kv_pos_lo, kv_neg_lo, ksum_pos, ksum_neg, BOUND, EPS, DOT_PRECISION,
        )  # fmt: skip
        grad_same_pos += grad_temp_pos
        grad_same_neg += grad_temp_neg
        grad_kv_pos_lo = tl.dot(tl.trans(coeff_pos), grad_num, grad_kv_pos_lo, input_precision=DOT_PRECISION)
        grad_kv_neg_lo = tl.dot(tl.trans(coeff_neg), grad_num, grad_kv_neg_lo, input_precision=DOT_PRECISION)
        grad_ksum_pos += tl.sum(coeff_pos * grad_den[:, None], axis=0)
        grad_ksum_neg += tl.sum(coeff_neg * grad_den[:, None], axis=0)

        grad_q_opp, grad_temp_pos, grad_temp_neg, coeff_pos, coeff_neg, grad_num, grad_den = _stream_backward(
            grad_opp, magnitude, positive, negative, negative, positive, opp_pos, opp_neg,
            kv_pos_hi, kv_neg_hi, ksum_pos, ksum_neg, BOUND, EPS, DOT_PRECISION,
        )  # fmt: skip
        grad_opp_pos += grad_temp_pos
        grad_opp_neg += grad_temp_neg
        grad_kv_pos_hi = tl.dot(tl.trans(coeff_pos), grad_num, grad_kv_pos_hi, input_precision=DOT_PRECISION)
        grad_kv_neg_hi = tl.dot(tl.trans(coeff_neg), grad_num, grad_kv_neg_hi, input_precision=DOT_PRECISION)
        grad_ksum_pos += tl.sum(coeff_pos * grad_den[:, None], axis=0)
        grad_ksum_neg += tl.sum(coeff_neg * grad_den[:, None], axis=0)

        _store_tile(grad_q_ptr, out_base, rows, out_row_stride, channels, row_ok, channel_ok, grad_q_same + grad_q_opp)

    # Temperature partials in the layout of the stacked temperatures: ts[:d] is the same-sign stream's
    # temperature where q > 0, to[:d] the opposite-sign stream's where q < 0 (see _stream_temperatures).
    temp_part = grad_temps_part_ptr + (ray.to(tl.int64) * tl.num_programs(1) + head) * 2 * 2 * HEAD_DIM
    tl.store(temp_part + channels, grad_same_pos, mask=channel_ok)
    tl.store(temp_part + HEAD_DIM + channels, grad_same_neg, mask=channel_ok)
    tl.store(temp_part + 2 * HEAD_DIM + channels, grad_opp_neg, mask=channel_ok)
    tl.store(temp_part + 3 * HEAD_DIM + channels, grad_opp_pos, mask=channel_ok)

    # Pass 2 (keys): d v = K+ d kv[+] + K- d kv[-]; d K_p = v d kv[p]^T + d ksum[p], and through
    # K = F(|k|) vis: d k = sign(k) vis exp(|k|) d K below the clamp, 0 at and above
    # it (masked samples: 0).
    for start in range(0, num_samples, BLOCK_S):
        rows = start + tl.arange(0, BLOCK_S)
        row_ok = rows < num_samples
        k, features, v_lo, v_hi, vis = _key_tile(
            k_ptr, v_ptr, vis_ptr, ray, rows, channel_base, num_samples,
            k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
            HEAD_DIM, BOUND, HAS_VISIBLE, BLOCK_S, BLOCK_D, BLOCK_H,
        )  # fmt: skip
        keys_pos = tl.where(k > 0.0, features, 0.0)
        keys_neg = tl.where(k < 0.0, features, 0.0)
        grad_v_lo = tl.dot(keys_pos, grad_kv_pos_lo, input_precision=DOT_PRECISION)
        grad_v_lo = tl.dot(keys_neg, grad_kv_neg_lo, grad_v_lo, input_precision=DOT_PRECISION)
        grad_v_hi = tl.dot(keys_pos, grad_kv_pos_hi, input_precision=DOT_PRECISION)
        grad_v_hi = tl.dot(keys_neg, grad_kv_neg_hi, grad_v_hi, input_precision=DOT_PRECISION)
        grad_keys_pos = tl.dot(v_lo, tl.trans(grad_kv_pos_lo), input_precision=DOT_PRECISION)
        grad_keys_pos = tl.dot(v_hi, tl.trans(grad_kv_pos_hi), grad_keys_pos, input_precision=DOT_PRECISION)
        grad_keys_neg = tl.dot(v_lo, tl.trans(grad_kv_neg_lo), input_precision=DOT_PRECISION)
        grad_keys_neg = tl.dot(v_hi, tl.trans(grad_kv_neg_hi), grad_keys_neg, input_precision=DOT_PRECISION)
        grad_keys_pos += grad_ksum_pos[None, :]
        grad_keys_neg += grad_ksum_neg[None, :]
        # features + vis = (F + 1) vis = exp(|k|) vis below the clamp.
        slope = tl.where(tl.abs(k) <= BOUND, features + vis[:, None], 0.0)
        grad_k = tl.where(k > 0.0, grad_keys_pos * slope, tl.where(k < 0.0, -grad_keys_neg * slope, 0.0))
        _store_tile(grad_k_ptr, out_base, rows, out_row_stride, channels, row_ok, channel_ok, grad_k)
        _store_tile(grad_v_ptr, out_base, rows, out_row_stride, columns, row_ok, column_ok, grad_v_lo)
        _store_tile(grad_v_ptr, out_base + half, rows, out_row_stride, columns, row_ok, column_ok, grad_v_hi)


# --------------------------------------------------------------------------------------------------
# Launch configuration and autograd


class _RayConfig:
    """Block sizes and warps for head dim `d` and input dtype."""

    def __init__(self, head_dim: int, dtype: torch.dtype):
        self.block_d = max(MIN_BLOCK, triton.next_power_of_2(head_dim))
        self.block_h = max(MIN_BLOCK, triton.next_power_of_2(head_dim // 2))
        # The statistics and their gradients (8 blocks [d, d/2] in backward) live in registers:
        # wide heads take shorter tiles and more warps.
        self.block_s = 32 if self.block_d <= 32 else 16
        self.num_warps = 4 if self.block_d <= 32 else 8
        # fp32 inputs: exact fp32 products. Half inputs carry ~3 digits anyway: TF32 tensor cores.
        self.dot_precision = "ieee" if dtype == torch.float32 else "tf32"

    def options(self, head_dim: int, has_visible: bool) -> dict[str, object]:
        return dict(
            HEAD_DIM=head_dim, BOUND=EXPONENT_CLAMP, EPS=EPSILON, HAS_VISIBLE=has_visible,
            BLOCK_S=self.block_s, BLOCK_D=self.block_d, BLOCK_H=self.block_h,
            DOT_PRECISION=self.dot_precision, num_warps=self.num_warps,
        )  # fmt: skip


def _rows_strides(x: Tensor) -> tuple[int, int]:
    return x.stride(0), x.stride(1)


class _RayAttentionTriton(torch.autograd.Function):
    """q, k, v `[rays, samples, heads d]` in one dtype, channels contiguous; temperatures `[heads, 2d]`;
    visible `[rays, samples]` contiguous or None. Saves only the inputs."""

    @staticmethod
    def forward(ctx, q, k, v, temp_same, temp_opp, visible, heads):
        rays, samples, dim = q.shape
        head_dim = dim // heads
        temps = torch.stack([temp_same, temp_opp], dim=1).float().contiguous()  # [heads, 2, 2d]
        tiling = _RayConfig(head_dim, q.dtype)
        out = torch.empty(rays, samples, dim, device=q.device, dtype=q.dtype)
        if rays * samples > 0:
            launch(_ray_forward_kernel, (rays, heads),
                q, k, v, temps, visible if visible is not None else q, out, samples,
                *_rows_strides(q), *_rows_strides(k), *_rows_strides(v), *_rows_strides(out),
                **tiling.options(head_dim, visible is not None),
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, temps, visible)
        ctx.heads = heads
        ctx.temp_dtypes = (temp_same.dtype, temp_opp.dtype)
        return out

    @staticmethod
    def backward(ctx, *grad_outputs: Tensor):
        (grad_out,) = grad_outputs
        q, k, v, temps, visible = ctx.saved_tensors
        heads: int = ctx.heads
        rays, samples, dim = q.shape
        head_dim = dim // heads
        tiling = _RayConfig(head_dim, q.dtype)
        grad_out = grad_out.to(q.dtype)
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        grad_q, grad_k, grad_v = (torch.empty(rays, samples, dim, device=q.device, dtype=q.dtype) for _ in range(3))
        grad_temps_part = torch.zeros(rays, heads, 2, 2 * head_dim, device=q.device, dtype=torch.float32)
        if rays * samples > 0:
            launch(_ray_backward_kernel, (rays, heads),
                grad_out, q, k, v, temps, visible if visible is not None else q,
                grad_q, grad_k, grad_v, grad_temps_part, samples,
                *_rows_strides(grad_out), *_rows_strides(q), *_rows_strides(k), *_rows_strides(v),
                *_rows_strides(grad_q), **tiling.options(head_dim, visible is not None),
            )  # fmt: skip
        grad_temps = grad_temps_part.sum(dim=0)  # [heads, 2, 2d]
        same_dtype, opp_dtype = ctx.temp_dtypes
        return grad_q, grad_k, grad_v, grad_temps[:, 0].to(same_dtype), grad_temps[:, 1].to(opp_dtype), None, None


# --------------------------------------------------------------------------------------------------
# Public entry point


def polarity_ray_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    temp_same: Tensor,
    temp_opp: Tensor,
    visible: Tensor | None,
    heads: int,
) -> Tensor:
    """Polarity self-attention over the samples of each ray with fused Triton kernels (forward and backward).

    Args:
        q, k, v: `[rays, samples, heads * d]`, fp32/fp16/bf16 (k, v are cast to q's dtype), d even and
            at most `MAX_HEAD_DIM`; rows may be strided (chunks of one projection), channels are
            read in place where contiguous.
        temp_same, temp_opp: temperatures `[heads, 2d]`.
        visible: `[rays, samples]` 0/1 (float or bool), 0 where a sample may not be attended, or None.
        heads: number of heads.

    Returns:
        `[rays, samples, heads * d]` in q's dtype (per head: same-sign stream in channels `[0, d/2)`,
        opposite-sign in `[d/2, d)`); differentiable w.r.t. q, k, v and both temperatures.
    """
    if q.dim() != 3 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"expected q, k, v [rays, samples, heads * d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    rays, samples, dim = q.shape
    if heads <= 0 or dim % heads:
        raise ValueError(f"channels ({dim}) must be divisible by heads ({heads})")
    head_dim = dim // heads
    if head_dim % 2 or not 2 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be even and in [2, {MAX_HEAD_DIM}], got {head_dim}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q dtype must be one of {SUPPORTED_DTYPES}, got {q.dtype}")
    for name, temp in (("temp_same", temp_same), ("temp_opp", temp_opp)):
        if temp.shape != (heads, 2 * head_dim):
            raise ValueError(f"{name} must be [heads={heads}, 2d={2 * head_dim}], got {tuple(temp.shape)}")
    if visible is not None and visible.shape != (rays, samples):
        raise ValueError(f"visible must be [rays={rays}, samples={samples}], got {tuple(visible.shape)}")

    def channels_contiguous(x: Tensor) -> Tensor:
        x = x.to(q.dtype)
        return x if x.stride(-1) == 1 else x.contiguous()

    q, k, v = (channels_contiguous(x) for x in (q, k, v))
    if visible is not None:
        visible = visible.to(torch.float32).contiguous()
    return _RayAttentionTriton.apply(q, k, v, temp_same, temp_opp, visible, heads)
