"""Fused Triton kernels for Pola-GNT's ray attention: the linear form over the samples of each ray.

Computes exactly `ray.op.polarity_ray_attention` (the short linear form of `ray.pytorch_form`, same
clamp bound and epsilon) for `q, k, v` `[rays, samples, heads * d]`, heads in place. Per (ray, head),
with `B = EXPONENT_CLAMP`, `vis_j` the sample's 0/1 visibility, `F(x) = expm1(min(x, B))`:

    K_j  = F(|k_j|) vis_j,   K+_j = K_j [k_j > 0],   K-_j = K_j [k_j < 0]             [S, d] each
    kv[p] = K_p^T v,   ksum[p] = sum_j K_p[j]                      p in {+, -}       [d, d], [d]
    stream s = 0 (same sign):     Fs = F(t |q|), t = ts[:d] where q > 0, ts[d:] where q < 0
                                  A = Fs [q > 0] meets K+,  Bq = Fs [q < 0] meets K-
    stream s = 1 (opposite sign): Fo = F(t |q|), t = to[d:] where q > 0, to[:d] where q < 0
                                  A = Fo [q < 0] meets K+,  Bq = Fo [q > 0] meets K-
    out[:, cols_s] = (A kv[+] + Bq kv[-])[:, cols_s] / (A . ksum[+] + Bq . ksum[-] + eps)

with `cols_0 = [0, d/2)` (the value half `v_lo`) and `cols_1 = [d/2, d)` (`v_hi`). This is `Qs (K^T v) / (...)`
of `linear.pytorch_form` with the 2d-wide features split by the sign of each channel: a query or key
channel has one non-zero polarity part, so each feature map is one `expm1` over d channels (half
width), and the parts are selected by sign (exact; no sum cancels).

Tiles fill the dots (at least 16 wide) without padding lanes where the heads are narrow:
- the value halves stay together: `kv[p]` is one `[d, d]` block whose columns serve both streams
  (each stream's product keeps its own columns), so no `[d, d/2]` block is padded to 16 columns;
- heads are packed side by side: a program takes `GROUP = 16 / SLOT` heads (`SLOT` = d rounded up to
  a power of two), channel `c` of its `[rows, GROUP SLOT]` tiles being channel `c % SLOT` of head
  `c // SLOT`; products across heads are masked out of the statistics, and each head's denominators
  are sums over its own slot. At d = 8 two heads fill the 16 lanes of a dot, at d = 16 one.

Layout: q, k, v are read in place with their own ray and sample strides (the chunks of one
projection have rows of `4 heads d`), channels contiguous; head `h` owns channels `[h d, (h + 1) d)`.
Temperatures are stacked `[heads, 2 streams, 2d]` fp32; visibility `[rays, samples]`.

Grid `(rays, head groups)`, one program per (ray, head group), made for short rays (`MAX_SAMPLES`): the
statistics (`kv`, `ksum`) and their gradients stay in fp32 registers.
- forward  `_ray_forward_kernel`: a loop over key tiles accumulates the statistics, a loop over query
  tiles writes the output. Only the inputs are saved for backward.
- backward, in two kernels so that neither holds more than two `[d, d]` blocks besides its tiles (one
  kernel held four and spilled at 255 registers):
  `_ray_query_grad_kernel` recomputes the statistics, and a loop over query tiles writes `dq` and
  accumulates `d kv`, `d ksum` (written to an fp32 scratch `[rays, groups, 2, BLOCK_D, BLOCK_D]`)
  and the temperature gradients; `_ray_key_grad_kernel` reads `d kv`, `d ksum` and a loop over key
  tiles writes `dk`, `dv`. Temperature gradients are per-program partials `[rays, heads, 2, 2d]`
  reduced with `torch.sum` (deterministic, no atomics).
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
# Kernels. A program's tiles are `[BLOCK_S rows, BLOCK_D channels]` of one ray and head group; channel
# `c` is channel `c % SLOT` of the group's head `c // SLOT` (see `_channels`).


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _channels(group, heads, HEAD_DIM: tl.constexpr, SLOT: tl.constexpr, GROUP: tl.constexpr, BLOCK_D: tl.constexpr):
    """The program's channels: their offsets in a row (`head d + j`), head, channel within the head
    `j`, whether they exist (`j < d`, `head < heads`), and whether they are a first value half (`j < d/2`)."""
    lanes = tl.arange(0, BLOCK_D)
    head = group * GROUP + lanes // SLOT
    within = lanes % SLOT
    exists = (within < HEAD_DIM) & (head < heads)
    return head * HEAD_DIM + within, head, within, exists, within < HEAD_DIM // 2


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _same_head(SLOT: tl.constexpr, BLOCK_D: tl.constexpr):
    """`[BLOCK_D, BLOCK_D]`: whether two channels belong to the same head (the statistics' blocks)."""
    lanes = tl.arange(0, BLOCK_D)
    return (lanes[:, None] // SLOT) == (lanes[None, :] // SLOT)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _head_sums(x, BLOCK_S: tl.constexpr, SLOT: tl.constexpr, GROUP: tl.constexpr):
    """Each row's sum over the channels of each head, in every channel of that head: `[BLOCK_S, 1]`
    for one head a program, `[BLOCK_S, BLOCK_D]` for several."""
    if GROUP == 1:
        return tl.sum(x, axis=1)[:, None]
    else:
        sums = tl.sum(tl.reshape(x, (BLOCK_S, GROUP, SLOT)), axis=2)
        return tl.reshape(tl.broadcast_to(sums[:, :, None], (BLOCK_S, GROUP, SLOT)), (BLOCK_S, GROUP * SLOT))


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _load_tile(ptr, ray_offset, rows, row_stride, offsets, row_ok, channel_ok):
    """fp32 tile `[rows, channels]` of a `[rays, samples, channels]` tensor; 0 outside the masks."""
    addresses = ray_offset + rows.to(tl.int64)[:, None] * row_stride + offsets[None, :]
    return tl.load(ptr + addresses, mask=row_ok[:, None] & channel_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _store_tile(ptr, ray_offset, rows, row_stride, offsets, row_ok, channel_ok, values):
    addresses = ray_offset + rows.to(tl.int64)[:, None] * row_stride + offsets[None, :]
    tl.store(ptr + addresses, values.to(ptr.dtype.element_ty), mask=row_ok[:, None] & channel_ok[None, :])


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _key_tile(
    k_ptr, v_ptr, vis_ptr, ray, rows, offsets, channel_ok, num_samples,
    k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
    BOUND: tl.constexpr, HAS_VISIBLE: tl.constexpr,
):  # fmt: skip
    """A tile of keys: `k`, `K = F(|k|) vis`, `v` `[BLOCK_S, BLOCK_D]` and `vis` `[BLOCK_S]` (rows past
    the ray and missing channels load 0, so their features are 0)."""
    row_ok = rows < num_samples
    k = _load_tile(k_ptr, ray.to(tl.int64) * k_ray_stride, rows, k_row_stride, offsets, row_ok, channel_ok)
    v = _load_tile(v_ptr, ray.to(tl.int64) * v_ray_stride, rows, v_row_stride, offsets, row_ok, channel_ok)
    if HAS_VISIBLE:
        vis = tl.load(vis_ptr + ray.to(tl.int64) * num_samples + rows, mask=row_ok, other=0.0).to(tl.float32)
    else:
        vis = tl.where(row_ok, 1.0, 0.0)
    features = expm1(tl.minimum(tl.abs(k), BOUND)) * vis[:, None]
    return k, features, v, vis


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _key_stats(
    k_ptr, v_ptr, vis_ptr, ray, offsets, channel_ok, num_samples,
    k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
    BOUND: tl.constexpr, HAS_VISIBLE: tl.constexpr, SLOT: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """The ray's statistics of each head: `kv[+]`, `kv[-]` `[BLOCK_D, BLOCK_D]` (zero across heads)
    and `ksum[+]`, `ksum[-]` `[BLOCK_D]`."""
    kv_pos = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
    kv_neg = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
    ksum_pos = tl.zeros((BLOCK_D,), dtype=tl.float32)
    ksum_neg = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for start in range(0, num_samples, BLOCK_S):
        rows = start + tl.arange(0, BLOCK_S)
        k, features, v, _ = _key_tile(
            k_ptr, v_ptr, vis_ptr, ray, rows, offsets, channel_ok, num_samples,
            k_ray_stride, k_row_stride, v_ray_stride, v_row_stride, BOUND, HAS_VISIBLE,
        )  # fmt: skip
        keys_pos = tl.trans(tl.where(k > 0.0, features, 0.0))
        keys_neg = tl.trans(tl.where(k < 0.0, features, 0.0))
        kv_pos = tl.dot(keys_pos, v, kv_pos, input_precision=DOT_PRECISION)
        kv_neg = tl.dot(keys_neg, v, kv_neg, input_precision=DOT_PRECISION)
        ksum_pos += tl.sum(keys_pos, axis=1)
        ksum_neg += tl.sum(keys_neg, axis=1)
    same_head = _same_head(SLOT, BLOCK_D)
    return tl.where(same_head, kv_pos, 0.0), tl.where(same_head, kv_neg, 0.0), ksum_pos, ksum_neg


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _stream_temperatures(temps_ptr, head, within, channel_ok, HEAD_DIM: tl.constexpr):
    """Per stream, the temperatures of the non-zero part of a channel where `q > 0` and where `q < 0`
    `[BLOCK_D]` (0 on missing channels): same sign `ts[:d]`, `ts[d:]`; opposite sign `to[d:]`, `to[:d]`."""
    same = temps_ptr + head * 4 * HEAD_DIM + within
    opp = same + 2 * HEAD_DIM
    same_pos = tl.load(same, mask=channel_ok, other=0.0)
    same_neg = tl.load(same + HEAD_DIM, mask=channel_ok, other=0.0)
    opp_pos = tl.load(opp + HEAD_DIM, mask=channel_ok, other=0.0)
    opp_neg = tl.load(opp, mask=channel_ok, other=0.0)
    return same_pos, same_neg, opp_pos, opp_neg


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _query_features(q, same_pos, same_neg, opp_pos, opp_neg, BOUND: tl.constexpr):
    """Both streams' temperatures in use `ts`, `to`, exponent inputs `zs = ts |q|`, `zo = to |q|` and
    features `Fs = F(zs)`, `Fo = F(zo)` of a query tile (0 on zero and missing channels)."""
    positive = q > 0.0
    negative = q < 0.0
    magnitude = tl.abs(q)
    temp_s = tl.where(positive, same_pos[None, :], tl.where(negative, same_neg[None, :], 0.0))
    temp_o = tl.where(positive, opp_pos[None, :], tl.where(negative, opp_neg[None, :], 0.0))
    exp_s = temp_s * magnitude
    exp_o = temp_o * magnitude
    return temp_s, temp_o, exp_s, exp_o, expm1(tl.minimum(exp_s, BOUND)), expm1(tl.minimum(exp_o, BOUND))


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _attend(
    positive, negative, feat_s, feat_o, first_half, kv_pos, kv_neg, ksum_pos, ksum_neg,
    EPS: tl.constexpr, BLOCK_S: tl.constexpr, SLOT: tl.constexpr, GROUP: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """The output `[BLOCK_S, BLOCK_D]` of a query tile: each stream's coefficients that meet `K+` and
    `K-` (same sign `A = Fs [q > 0]`, `Bq = Fs [q < 0]`; opposite sign `A = Fo [q < 0]`, `Bq = Fo [q > 0]`)
    against the statistics, each column over its head's denominator of the stream its value half belongs to."""
    a_s = tl.where(positive, feat_s, 0.0)
    b_s = tl.where(negative, feat_s, 0.0)
    a_o = tl.where(negative, feat_o, 0.0)
    b_o = tl.where(positive, feat_o, 0.0)
    num_s = tl.dot(a_s, kv_pos, input_precision=DOT_PRECISION)
    num_s = tl.dot(b_s, kv_neg, num_s, input_precision=DOT_PRECISION)
    num_o = tl.dot(a_o, kv_pos, input_precision=DOT_PRECISION)
    num_o = tl.dot(b_o, kv_neg, num_o, input_precision=DOT_PRECISION)
    den_s = _head_sums(a_s * ksum_pos[None, :] + b_s * ksum_neg[None, :], BLOCK_S, SLOT, GROUP) + EPS
    den_o = _head_sums(a_o * ksum_pos[None, :] + b_o * ksum_neg[None, :], BLOCK_S, SLOT, GROUP) + EPS
    den = tl.where(first_half[None, :], den_s, den_o)
    return tl.where(first_half[None, :], num_s, num_o) / den


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _ray_forward_kernel(
    q_ptr, k_ptr, v_ptr,  # [rays, samples, heads d], rows strided, channels contiguous
    temps_ptr,  # [heads, 2 streams, 2d] fp32
    vis_ptr,  # [rays, samples] 0/1; unused without HAS_VISIBLE
    out_ptr,  # [rays, samples, heads d] contiguous
    num_samples, num_heads,
    q_ray_stride, q_row_stride, k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
    out_ray_stride, out_row_stride,
    HEAD_DIM: tl.constexpr, BOUND: tl.constexpr, EPS: tl.constexpr, HAS_VISIBLE: tl.constexpr,
    SLOT: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    ray = tl.program_id(0)
    offsets, head, within, channel_ok, first_half = _channels(
        tl.program_id(1), num_heads, HEAD_DIM, SLOT, GROUP, BLOCK_D
    )
    kv_pos, kv_neg, ksum_pos, ksum_neg = _key_stats(
        k_ptr, v_ptr, vis_ptr, ray, offsets, channel_ok, num_samples,
        k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
        BOUND, HAS_VISIBLE, SLOT, BLOCK_S, BLOCK_D, DOT_PRECISION,
    )  # fmt: skip
    same_pos, same_neg, opp_pos, opp_neg = _stream_temperatures(temps_ptr, head, within, channel_ok, HEAD_DIM)
    q_base = ray.to(tl.int64) * q_ray_stride
    out_base = ray.to(tl.int64) * out_ray_stride
    for start in range(0, num_samples, BLOCK_S):
        rows = start + tl.arange(0, BLOCK_S)
        row_ok = rows < num_samples
        q = _load_tile(q_ptr, q_base, rows, q_row_stride, offsets, row_ok, channel_ok)
        _, _, _, _, feat_s, feat_o = _query_features(q, same_pos, same_neg, opp_pos, opp_neg, BOUND)
        out = _attend(
            q > 0.0, q < 0.0, feat_s, feat_o, first_half, kv_pos, kv_neg, ksum_pos, ksum_neg,
            EPS, BLOCK_S, SLOT, GROUP, DOT_PRECISION,
        )  # fmt: skip
        _store_tile(out_ptr, out_base, rows, out_row_stride, offsets, row_ok, channel_ok, out)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _ray_query_grad_kernel(
    grad_out_ptr,  # [rays, samples, heads d], rows strided, channels contiguous
    q_ptr, k_ptr, v_ptr,  # [rays, samples, heads d], rows strided, channels contiguous
    temps_ptr,  # [heads, 2 streams, 2d] fp32
    vis_ptr,  # [rays, samples] 0/1; unused without HAS_VISIBLE
    grad_q_ptr,  # [rays, samples, heads d] contiguous
    grad_state_ptr,  # [rays, groups, 2 polarities, BLOCK_D, BLOCK_D + 1] fp32: d kv, then d ksum as the last column
    grad_temps_part_ptr,  # [rays, heads, 2 streams, 2d] fp32
    num_samples, num_heads,
    g_ray_stride, g_row_stride,
    q_ray_stride, q_row_stride, k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
    out_ray_stride, out_row_stride,
    HEAD_DIM: tl.constexpr, BOUND: tl.constexpr, EPS: tl.constexpr, HAS_VISIBLE: tl.constexpr,
    SLOT: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Per query tile, for `out = num / den` per stream: `d num = g / den`, `d den = -(g . out) / den`
    (summed over the head's columns of that stream); `d A = d num kv[+]^T + d den ksum[+]` (likewise
    `Bq`), restricted to the stream's columns; through `F(z)`: `d z = d F exp(z)` below the clamp, 0
    at and above it (torch.clamp's gradient, as in the reference); `d|q| = t d z`, `d t = |q| d z`.
    The statistics' gradients: `d kv[+] = A^T d num` (both streams' columns), `d ksum[+] = sum A d den`."""
    ray = tl.program_id(0)
    group = tl.program_id(1)
    offsets, head, within, channel_ok, first_half = _channels(group, num_heads, HEAD_DIM, SLOT, GROUP, BLOCK_D)
    kv_pos, kv_neg, ksum_pos, ksum_neg = _key_stats(
        k_ptr, v_ptr, vis_ptr, ray, offsets, channel_ok, num_samples,
        k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
        BOUND, HAS_VISIBLE, SLOT, BLOCK_S, BLOCK_D, DOT_PRECISION,
    )  # fmt: skip
    same_pos, same_neg, opp_pos, opp_neg = _stream_temperatures(temps_ptr, head, within, channel_ok, HEAD_DIM)

    grad_kv_pos = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
    grad_kv_neg = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
    grad_ksum_pos = tl.zeros((BLOCK_D,), dtype=tl.float32)
    grad_ksum_neg = tl.zeros((BLOCK_D,), dtype=tl.float32)
    grad_same_pos = tl.zeros((BLOCK_D,), dtype=tl.float32)
    grad_same_neg = tl.zeros((BLOCK_D,), dtype=tl.float32)
    grad_opp_pos = tl.zeros((BLOCK_D,), dtype=tl.float32)
    grad_opp_neg = tl.zeros((BLOCK_D,), dtype=tl.float32)
    q_base = ray.to(tl.int64) * q_ray_stride
    g_base = ray.to(tl.int64) * g_ray_stride
    out_base = ray.to(tl.int64) * out_ray_stride
    for start in range(0, num_samples, BLOCK_S):
        rows = start + tl.arange(0, BLOCK_S)
        row_ok = rows < num_samples
        q = _load_tile(q_ptr, q_base, rows, q_row_stride, offsets, row_ok, channel_ok)
        positive = q > 0.0
        negative = q < 0.0
        temp_s, temp_o, exp_s, exp_o, feat_s, feat_o = _query_features(q, same_pos, same_neg, opp_pos, opp_neg, BOUND)
        a_s = tl.where(positive, feat_s, 0.0)
        b_s = tl.where(negative, feat_s, 0.0)
        a_o = tl.where(negative, feat_o, 0.0)
        b_o = tl.where(positive, feat_o, 0.0)
        den_s = _head_sums(a_s * ksum_pos[None, :] + b_s * ksum_neg[None, :], BLOCK_S, SLOT, GROUP) + EPS
        den_o = _head_sums(a_o * ksum_pos[None, :] + b_o * ksum_neg[None, :], BLOCK_S, SLOT, GROUP) + EPS
        grad_out = _load_tile(grad_out_ptr, g_base, rows, g_row_stride, offsets, row_ok, channel_ok)
        grad_s = tl.where(first_half[None, :], grad_out, 0.0)  # each stream's columns
        grad_o = tl.where(first_half[None, :], 0.0, grad_out)
        # g kv^T per stream and polarity; with the coefficients they give g . num, so the output
        # itself (num) is never formed: d den = -(g . num) / den^2.
        back_pos_s = tl.dot(grad_s, tl.trans(kv_pos), input_precision=DOT_PRECISION)
        back_neg_s = tl.dot(grad_s, tl.trans(kv_neg), input_precision=DOT_PRECISION)
        back_pos_o = tl.dot(grad_o, tl.trans(kv_pos), input_precision=DOT_PRECISION)
        back_neg_o = tl.dot(grad_o, tl.trans(kv_neg), input_precision=DOT_PRECISION)
        grad_den_s = -_head_sums(a_s * back_pos_s + b_s * back_neg_s, BLOCK_S, SLOT, GROUP) / (den_s * den_s)
        grad_den_o = -_head_sums(a_o * back_pos_o + b_o * back_neg_o, BLOCK_S, SLOT, GROUP) / (den_o * den_o)

        grad_feat_s = tl.where(
            positive,
            back_pos_s / den_s + grad_den_s * ksum_pos[None, :],
            tl.where(negative, back_neg_s / den_s + grad_den_s * ksum_neg[None, :], 0.0),
        )
        grad_feat_o = tl.where(
            negative,
            back_pos_o / den_o + grad_den_o * ksum_pos[None, :],
            tl.where(positive, back_neg_o / den_o + grad_den_o * ksum_neg[None, :], 0.0),
        )
        # Zero channels have no non-zero part (z = 0 and both selections false): d z = 0, like relu's slope.
        grad_exp_s = tl.where(exp_s <= BOUND, grad_feat_s * (feat_s + 1.0), 0.0)
        grad_exp_o = tl.where(exp_o <= BOUND, grad_feat_o * (feat_o + 1.0), 0.0)
        grad_magnitude = grad_exp_s * temp_s + grad_exp_o * temp_o
        grad_q = tl.where(positive, grad_magnitude, -grad_magnitude)
        _store_tile(grad_q_ptr, out_base, rows, out_row_stride, offsets, row_ok, channel_ok, grad_q)

        magnitude = tl.abs(q)
        weighted_s = grad_exp_s * magnitude
        weighted_o = grad_exp_o * magnitude
        grad_same_pos += tl.sum(tl.where(positive, weighted_s, 0.0), axis=0)
        grad_same_neg += tl.sum(tl.where(negative, weighted_s, 0.0), axis=0)
        grad_opp_pos += tl.sum(tl.where(positive, weighted_o, 0.0), axis=0)
        grad_opp_neg += tl.sum(tl.where(negative, weighted_o, 0.0), axis=0)

        # d kv[p] = A^T d num, d num = g / den (both streams' columns); d ksum[p] = sum A d den.
        grad_num_s = grad_s / den_s
        grad_num_o = grad_o / den_o
        grad_kv_pos = tl.dot(tl.trans(a_s), grad_num_s, grad_kv_pos, input_precision=DOT_PRECISION)
        grad_kv_pos = tl.dot(tl.trans(a_o), grad_num_o, grad_kv_pos, input_precision=DOT_PRECISION)
        grad_kv_neg = tl.dot(tl.trans(b_s), grad_num_s, grad_kv_neg, input_precision=DOT_PRECISION)
        grad_kv_neg = tl.dot(tl.trans(b_o), grad_num_o, grad_kv_neg, input_precision=DOT_PRECISION)
        grad_ksum_pos += tl.sum(a_s * grad_den_s + a_o * grad_den_o, axis=0)
        grad_ksum_neg += tl.sum(b_s * grad_den_s + b_o * grad_den_o, axis=0)

    # Temperature partials in the layout of the stacked temperatures: ts[:d] is the same-sign stream's
    # temperature where q > 0, to[:d] the opposite-sign stream's where q < 0 (see _stream_temperatures).
    temp_part = grad_temps_part_ptr + (ray.to(tl.int64) * num_heads + head) * 4 * HEAD_DIM + within
    tl.store(temp_part, grad_same_pos, mask=channel_ok)
    tl.store(temp_part + HEAD_DIM, grad_same_neg, mask=channel_ok)
    tl.store(temp_part + 2 * HEAD_DIM, grad_opp_neg, mask=channel_ok)
    tl.store(temp_part + 3 * HEAD_DIM, grad_opp_pos, mask=channel_ok)

    # The statistics' gradients for the key pass; products across heads are dropped.
    same_head = _same_head(SLOT, BLOCK_D)
    lanes = tl.arange(0, BLOCK_D)
    state = grad_state_ptr + (ray.to(tl.int64) * tl.num_programs(1) + group) * 2 * BLOCK_D * (BLOCK_D + 1)
    block = lanes[:, None] * (BLOCK_D + 1) + lanes[None, :]
    tl.store(state + block, tl.where(same_head, grad_kv_pos, 0.0))
    tl.store(state + lanes * (BLOCK_D + 1) + BLOCK_D, grad_ksum_pos)
    state += BLOCK_D * (BLOCK_D + 1)
    tl.store(state + block, tl.where(same_head, grad_kv_neg, 0.0))
    tl.store(state + lanes * (BLOCK_D + 1) + BLOCK_D, grad_ksum_neg)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _ray_key_grad_kernel(
    k_ptr, v_ptr,  # [rays, samples, heads d], rows strided, channels contiguous
    vis_ptr,  # [rays, samples] 0/1; unused without HAS_VISIBLE
    grad_state_ptr,  # [rays, groups, 2 polarities, BLOCK_D, BLOCK_D + 1] fp32 (`_ray_query_grad_kernel`'s)
    grad_k_ptr, grad_v_ptr,  # [rays, samples, heads d] contiguous
    num_samples, num_heads,
    k_ray_stride, k_row_stride, v_ray_stride, v_row_stride,
    out_ray_stride, out_row_stride,
    HEAD_DIM: tl.constexpr, BOUND: tl.constexpr, HAS_VISIBLE: tl.constexpr,
    SLOT: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """`d v = K+ d kv[+] + K- d kv[-]`; `d K_p = v d kv[p]^T + d ksum[p]`, and through `K = F(|k|) vis`:
    `d k = sign(k) vis exp(|k|) d K` below the clamp, 0 at and above it (masked samples: 0)."""
    ray = tl.program_id(0)
    group = tl.program_id(1)
    offsets, _, _, channel_ok, _ = _channels(group, num_heads, HEAD_DIM, SLOT, GROUP, BLOCK_D)
    lanes = tl.arange(0, BLOCK_D)
    state = grad_state_ptr + (ray.to(tl.int64) * tl.num_programs(1) + group) * 2 * BLOCK_D * (BLOCK_D + 1)
    block = lanes[:, None] * (BLOCK_D + 1) + lanes[None, :]
    grad_kv_pos = tl.load(state + block)
    grad_ksum_pos = tl.load(state + lanes * (BLOCK_D + 1) + BLOCK_D)
    state += BLOCK_D * (BLOCK_D + 1)
    grad_kv_neg = tl.load(state + block)
    grad_ksum_neg = tl.load(state + lanes * (BLOCK_D + 1) + BLOCK_D)

    out_base = ray.to(tl.int64) * out_ray_stride
    for start in range(0, num_samples, BLOCK_S):
        rows = start + tl.arange(0, BLOCK_S)
        row_ok = rows < num_samples
        k, features, v, vis = _key_tile(
            k_ptr, v_ptr, vis_ptr, ray, rows, offsets, channel_ok, num_samples,
            k_ray_stride, k_row_stride, v_ray_stride, v_row_stride, BOUND, HAS_VISIBLE,
        )  # fmt: skip
        keys_pos = tl.where(k > 0.0, features, 0.0)
        keys_neg = tl.where(k < 0.0, features, 0.0)
        grad_v = tl.dot(keys_pos, grad_kv_pos, input_precision=DOT_PRECISION)
        grad_v = tl.dot(keys_neg, grad_kv_neg, grad_v, input_precision=DOT_PRECISION)
        grad_keys_pos = tl.dot(v, tl.trans(grad_kv_pos), input_precision=DOT_PRECISION) + grad_ksum_pos[None, :]
        grad_keys_neg = tl.dot(v, tl.trans(grad_kv_neg), input_precision=DOT_PRECISION) + grad_ksum_neg[None, :]
        # features + vis = (F + 1) vis = exp(|k|) vis below the clamp.
        slope = tl.where(tl.abs(k) <= BOUND, features + vis[:, None], 0.0)
        grad_k = tl.where(k > 0.0, grad_keys_pos * slope, tl.where(k < 0.0, -grad_keys_neg * slope, 0.0))
        _store_tile(grad_k_ptr, out_base, rows, out_row_stride, offsets, row_ok, channel_ok, grad_k)
        _store_tile(grad_v_ptr, out_base, rows, out_row_stride, offsets, row_ok, channel_ok, grad_v)


# --------------------------------------------------------------------------------------------------
# Launch configuration and autograd


class _RayConfig:
    """Head packing, block sizes and warps for head dim `d`, `heads` heads and the input dtype."""

    def __init__(self, head_dim: int, heads: int, dtype: torch.dtype):
        # Each head in a power-of-two slot; as many heads side by side as fill a 16-wide dot.
        self.slot = triton.next_power_of_2(head_dim)
        self.group = max(1, MIN_BLOCK // self.slot)
        self.block_d = self.group * self.slot
        self.groups = triton.cdiv(heads, self.group)
        # The statistics (two [BLOCK_D, BLOCK_D] blocks, and two of their gradients in the query
        # kernel) live in registers: wide heads take shorter tiles and more warps.
        self.block_s = 32 if self.block_d <= 32 else 16
        self.num_warps = 4 if self.block_d <= 32 else 8
        # fp32 inputs: exact fp32 products. Half inputs carry ~3 digits anyway: TF32 tensor cores.
        self.dot_precision = "ieee" if dtype == torch.float32 else "tf32"

    def options(self, head_dim: int, has_visible: bool, kernel: str) -> dict[str, object]:
        """The launch options of `kernel` (`forward`, `query_grad` or `key_grad`). The query-gradient
        kernel holds a dozen tiles at once besides four statistics' blocks: in the tensor cores' layouts
        (TF32) they spilled past 255 registers, at 32 rows in exact fp32 they took 238-250 (A100), so it
        takes 16-row tiles and exact fp32 products (130-140 registers; its dots are [16, 16] x [16, 16],
        a few GFLOP a training step, well within the FMA units' time for its memory traffic). From
        d = 64 the key-gradient kernel's TF32 operands alone took 280 KB of shared memory at d = 128,
        more than an H100 has: exact fp32 products there too (168 KB).

        At 16-wide tiles (the presets' heads, packed) the exact-fp32 forward and the query-gradient
        kernel take 8 warps: with 4, their FMA dots' operands (the loop-invariant statistics among
        them) held 128-142 registers a thread, at the edge of spilling (under a 128-register cap the
        H100's query-gradient kernel spilled); with 8 each thread holds half the rows, 80-105
        registers at the presets on A100 and H100, no spill even under that cap. The products and
        sums are the same; only their split over threads changes."""
        query_grad = kernel == "query_grad"
        exact = query_grad or (kernel == "key_grad" and self.block_d >= 64)
        precision = "ieee" if exact else self.dot_precision
        warps = self.num_warps
        if self.block_d == MIN_BLOCK and kernel != "key_grad" and precision == "ieee":
            warps = 8
        options: dict[str, object] = dict(
            HEAD_DIM=head_dim, BOUND=EXPONENT_CLAMP, HAS_VISIBLE=has_visible, SLOT=self.slot, GROUP=self.group,
            BLOCK_S=16 if query_grad else self.block_s, BLOCK_D=self.block_d, num_warps=warps,
            DOT_PRECISION=precision,
        )  # fmt: skip
        if kernel != "key_grad":
            options["EPS"] = EPSILON
        return options


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
        tiling = _RayConfig(head_dim, heads, q.dtype)
        out = torch.empty(rays, samples, dim, device=q.device, dtype=q.dtype)
        if rays * samples > 0:
            launch(_ray_forward_kernel, (rays, tiling.groups),
                q, k, v, temps, visible if visible is not None else q, out, samples, heads,
                *_rows_strides(q), *_rows_strides(k), *_rows_strides(v), *_rows_strides(out),
                **tiling.options(head_dim, visible is not None, "forward"),
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
        tiling = _RayConfig(head_dim, heads, q.dtype)
        grad_out = grad_out.to(q.dtype)
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        grad_q, grad_k, grad_v = (torch.empty(rays, samples, dim, device=q.device, dtype=q.dtype) for _ in range(3))
        grad_temps_part = torch.zeros(rays, heads, 2, 2 * head_dim, device=q.device, dtype=torch.float32)
        if rays * samples > 0:
            block_d = tiling.block_d
            grad_state = torch.empty(rays, tiling.groups, 2, block_d, block_d + 1, device=q.device, dtype=torch.float32)
            visible_or_any = visible if visible is not None else q
            launch(_ray_query_grad_kernel, (rays, tiling.groups),
                grad_out, q, k, v, temps, visible_or_any, grad_q, grad_state, grad_temps_part, samples, heads,
                *_rows_strides(grad_out), *_rows_strides(q), *_rows_strides(k), *_rows_strides(v),
                *_rows_strides(grad_q), **tiling.options(head_dim, visible is not None, "query_grad"),
            )  # fmt: skip
            launch(_ray_key_grad_kernel, (rays, tiling.groups),
                k, v, visible_or_any, grad_state, grad_k, grad_v, samples, heads,
                *_rows_strides(k), *_rows_strides(v), *_rows_strides(grad_k),
                **tiling.options(head_dim, visible is not None, "key_grad"),
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
