"""Fused Triton kernels for the linear form of polarity-aware attention (PolaFormer++ PaCS).

Computes exactly `pola_gnt.attention.linear.op.polarity_attention(..., form="linear")` (same
clamp bound and epsilon, from `features`), per flattened batch*head `b`:

    K+ = expm1(min(relu(k), B)),   K- = expm1(min(relu(-k), B))            [Nk, d] each, 0 for masked keys
    kv[b, p] = K_p^T v                                                       [2 polarities, d, d]
    ksum[b, p] = sum_j K_p[j]                                                [2 polarities, d]
    stream s = 0 (same sign):     Qa = expm1(min(ps[:d] * q+, B)), Qb = expm1(min(ps[d:] * q-, B))
    stream s = 1 (opposite sign): Qa = expm1(min(po[:d] * q-, B)), Qb = expm1(min(po[d:] * q+, B))
    num = Qa kv[b, +][:, cols_s] + Qb kv[b, -][:, cols_s]                   [Nq, d/2]
    den = Qa . ksum[b, +] + Qb . ksum[b, -] + eps                           [Nq]
    out[:, cols_s] = num / den,   cols_0 = [0, d/2), cols_1 = [d/2, d)

which is `[Qs, Qo] ([K+, K-]^T [v1, v2]) / (...)` with the 2d-wide features split into their
polarity halves, so every block matmul is a plain `[rows, d] x [d, d or d/2]` product.

Kernels (all accumulate in fp32 whatever the input dtype; features are never written to memory):
- forward  `_key_state_kernel`     grid (b, key split, polarity): partial `kv`, `ksum` per split;
- forward  `_output_kernel`        grid (b, query block): both streams' outputs and denominators;
- backward `_query_state_grad_kernel` grid (b, query split, stream): partial `d kv`, `d ksum`;
- backward `_query_grad_kernel`    grid (b, query block): `dq` and per-block temperature grads;
- backward `_key_grad_kernel`      grid (b, key block): `dk`, `dv`.
Partial sums over splits/blocks are reduced with `torch.sum` (deterministic, no atomics).
Input limits, `expm1`, the launch call and the interpreter notes (`TRITON_INTERPRET=1`): `triton_common`.
"""

from __future__ import annotations

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP, check_attention_shapes
from pola_gnt.attention.triton_common import (
    MAX_HEAD_DIM,
    MIN_BLOCK,
    SUPPORTED_DTYPES,
    expm1,
    launch,
    on_kernel_device,
)


def triton_supported(q: Tensor) -> bool:
    """Whether `polarity_attention_triton` can run for queries `q` `[..., Nq, d]`.

    Needs a CUDA tensor (or `TRITON_INTERPRET=1` for the CPU interpreter), an fp32/fp16/bf16 dtype
    and an even head dim up to `MAX_HEAD_DIM`.
    """
    head_dim = q.shape[-1]
    return on_kernel_device(q) and q.dtype in SUPPORTED_DTYPES and head_dim % 2 == 0 and 2 <= head_dim <= MAX_HEAD_DIM


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _key_state_kernel(
    k_ptr,  # [b, Nk, d]
    v_ptr,  # [b, Nk, d]
    mask_ptr,  # [b, Nk] uint8 (1 = key may be attended); unused without HAS_MASK
    kv_part_ptr,  # [b, splits, 2, d, d] fp32
    ksum_part_ptr,  # [b, splits, 2, d] fp32
    num_keys,
    blocks_per_split,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BOUND: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    batch = tl.program_id(0)
    split = tl.program_id(1)
    polarity = tl.program_id(2)  # 0: K+ = features of relu(k), 1: K- = features of relu(-k)
    sign = 1.0 - 2.0 * polarity

    channels = tl.arange(0, BLOCK_D)
    channel_ok = channels < HEAD_DIM
    kv = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
    ksum = tl.zeros((BLOCK_D,), dtype=tl.float32)
    token_base = batch.to(tl.int64) * num_keys
    for block in range(0, blocks_per_split):
        rows = (split * blocks_per_split + block) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < num_keys
        if HAS_MASK:
            row_ok = row_ok & (tl.load(mask_ptr + token_base + rows, mask=row_ok, other=0) != 0)
        offsets = (token_base + rows)[:, None] * HEAD_DIM + channels[None, :]
        tile_ok = row_ok[:, None] & channel_ok[None, :]
        k = tl.load(k_ptr + offsets, mask=tile_ok, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offsets, mask=tile_ok, other=0.0).to(tl.float32)
        # Masked and padding keys load as 0, and expm1(0) = 0: they add nothing to either sum.
        features = expm1(tl.minimum(tl.maximum(sign * k, 0.0), BOUND))  # [BLOCK_N, BLOCK_D]
        kv += tl.dot(tl.trans(features), v, input_precision=DOT_PRECISION)
        ksum += tl.sum(features, axis=0)

    state = (batch * num_splits + split) * 2 + polarity
    tl.store(
        kv_part_ptr + state.to(tl.int64) * HEAD_DIM * HEAD_DIM + channels[:, None] * HEAD_DIM + channels[None, :],
        kv,
        mask=channel_ok[:, None] & channel_ok[None, :],
    )
    tl.store(ksum_part_ptr + state.to(tl.int64) * HEAD_DIM + channels, ksum, mask=channel_ok)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _query_exponents(q, temps_ptr, batch, stream, channels, channel_ok, HEAD_DIM: tl.constexpr):
    """Exponent inputs of stream `stream`'s query features from a fp32 query tile `[rows, BLOCK_D]`.

    Stream 0 (same sign) pairs x_a = q+ with K+ and x_b = q- with K-; stream 1 (opposite sign)
    pairs x_a = q- with K+ and x_b = q+ with K-. Returns (x_a, x_b, z_a, z_b, t_a, t_b) with the
    unclamped exponent inputs `z = t * x` and the temperatures `t` `[BLOCK_D]` (0 on padding).
    """
    sign = 1.0 - 2.0 * stream
    x_a = tl.maximum(sign * q, 0.0)
    x_b = tl.maximum(-sign * q, 0.0)
    temp_base = temps_ptr + (batch.to(tl.int64) * 2 + stream) * 2 * HEAD_DIM
    t_a = tl.load(temp_base + channels, mask=channel_ok, other=0.0)
    t_b = tl.load(temp_base + HEAD_DIM + channels, mask=channel_ok, other=0.0)
    return x_a, x_b, t_a[None, :] * x_a, t_b[None, :] * x_b, t_a, t_b


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _load_stream_state(
    kv_ptr, ksum_ptr, batch, stream, channels, channel_ok, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr
):
    """The `[BLOCK_D, BLOCK_H]` columns of `kv[b, +]`, `kv[b, -]` for stream `stream`'s value half,
    and `ksum[b, +]`, `ksum[b, -]` `[BLOCK_D]`."""
    half: tl.constexpr = HEAD_DIM // 2
    columns = tl.arange(0, BLOCK_H)
    tile_ok = channel_ok[:, None] & (columns < half)[None, :]
    offsets = channels[:, None] * HEAD_DIM + stream * half + columns[None, :]
    pos_base = batch.to(tl.int64) * 2 * HEAD_DIM
    neg_base = pos_base + HEAD_DIM
    kv_pos = tl.load(kv_ptr + pos_base * HEAD_DIM + offsets, mask=tile_ok, other=0.0)
    kv_neg = tl.load(kv_ptr + neg_base * HEAD_DIM + offsets, mask=tile_ok, other=0.0)
    ksum_pos = tl.load(ksum_ptr + pos_base + channels, mask=channel_ok, other=0.0)
    ksum_neg = tl.load(ksum_ptr + neg_base + channels, mask=channel_ok, other=0.0)
    return kv_pos, kv_neg, ksum_pos, ksum_neg


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _output_kernel(
    q_ptr,  # [b, Nq, d]
    temps_ptr,  # [b, 2 streams, 2d] fp32
    kv_ptr,  # [b, 2, d, d] fp32
    ksum_ptr,  # [b, 2, d] fp32
    out_ptr,  # [b, Nq, d]
    den_ptr,  # [b, 2 streams, Nq] fp32
    num_queries,
    HEAD_DIM: tl.constexpr,
    BOUND: tl.constexpr,
    EPS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    batch = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_queries
    channels = tl.arange(0, BLOCK_D)
    channel_ok = channels < HEAD_DIM
    token_base = batch.to(tl.int64) * num_queries
    q = tl.load(
        q_ptr + (token_base + rows)[:, None] * HEAD_DIM + channels[None, :],
        mask=row_ok[:, None] & channel_ok[None, :],
        other=0.0,
    ).to(tl.float32)

    half: tl.constexpr = HEAD_DIM // 2
    columns = tl.arange(0, BLOCK_H)
    for stream in tl.static_range(2):
        _, _, z_a, z_b, _, _ = _query_exponents(q, temps_ptr, batch, stream, channels, channel_ok, HEAD_DIM)
        feat_a = expm1(tl.minimum(z_a, BOUND))
        feat_b = expm1(tl.minimum(z_b, BOUND))
        kv_pos, kv_neg, ksum_pos, ksum_neg = _load_stream_state(
            kv_ptr, ksum_ptr, batch, stream, channels, channel_ok, HEAD_DIM, BLOCK_H
        )
        num = tl.dot(feat_a, kv_pos, input_precision=DOT_PRECISION)
        num = tl.dot(feat_b, kv_neg, num, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_H]
        den = tl.sum(feat_a * ksum_pos[None, :], axis=1) + tl.sum(feat_b * ksum_neg[None, :], axis=1) + EPS
        out = num / den[:, None]
        tl.store(
            out_ptr + (token_base + rows)[:, None] * HEAD_DIM + stream * half + columns[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & (columns < half)[None, :],
        )
        tl.store(den_ptr + (batch.to(tl.int64) * 2 + stream) * num_queries + rows, den, mask=row_ok)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _load_output_grads(
    grad_out_ptr,
    out_ptr,
    den_ptr,
    batch,
    stream,
    rows,
    row_ok,
    num_queries,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """For `out = num / den`: `d num = g / den` `[rows, BLOCK_H]` and `d den = -(g . out) / den`
    `[rows]`, restricted to stream `stream`'s value half; zero on padding rows."""
    half: tl.constexpr = HEAD_DIM // 2
    columns = tl.arange(0, BLOCK_H)
    tile_ok = row_ok[:, None] & (columns < half)[None, :]
    offsets = (batch.to(tl.int64) * num_queries + rows)[:, None] * HEAD_DIM + stream * half + columns[None, :]
    grad_out = tl.load(grad_out_ptr + offsets, mask=tile_ok, other=0.0).to(tl.float32)
    out = tl.load(out_ptr + offsets, mask=tile_ok, other=0.0).to(tl.float32)
    den = tl.load(den_ptr + (batch.to(tl.int64) * 2 + stream) * num_queries + rows, mask=row_ok, other=1.0)
    grad_num = grad_out / den[:, None]
    grad_den = -tl.sum(grad_out * out, axis=1) / den
    return grad_num, grad_den


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _query_state_grad_kernel(
    q_ptr,  # [b, Nq, d]
    temps_ptr,  # [b, 2 streams, 2d] fp32
    grad_out_ptr,  # [b, Nq, d]
    out_ptr,  # [b, Nq, d]
    den_ptr,  # [b, 2 streams, Nq] fp32
    grad_kv_part_ptr,  # [b, splits, 2 polarities, d, d] fp32; stream s writes value columns cols_s
    grad_ksum_part_ptr,  # [b, splits, 2 streams, 2 polarities, d] fp32
    num_queries,
    blocks_per_split,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BOUND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """`d kv[+] = Qa^T d num`, `d kv[-] = Qb^T d num`, `d ksum[+] = sum_i d den_i Qa_i`, likewise
    for `-`, summed over this split's queries."""
    batch = tl.program_id(0)
    split = tl.program_id(1)
    stream = tl.program_id(2)
    channels = tl.arange(0, BLOCK_D)
    channel_ok = channels < HEAD_DIM
    grad_kv_pos = tl.zeros((BLOCK_D, BLOCK_H), dtype=tl.float32)
    grad_kv_neg = tl.zeros((BLOCK_D, BLOCK_H), dtype=tl.float32)
    grad_ksum_pos = tl.zeros((BLOCK_D,), dtype=tl.float32)
    grad_ksum_neg = tl.zeros((BLOCK_D,), dtype=tl.float32)
    token_base = batch.to(tl.int64) * num_queries
    for block in range(0, blocks_per_split):
        rows = (split * blocks_per_split + block) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < num_queries
        q = tl.load(
            q_ptr + (token_base + rows)[:, None] * HEAD_DIM + channels[None, :],
            mask=row_ok[:, None] & channel_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        _, _, z_a, z_b, _, _ = _query_exponents(q, temps_ptr, batch, stream, channels, channel_ok, HEAD_DIM)
        feat_a = expm1(tl.minimum(z_a, BOUND))
        feat_b = expm1(tl.minimum(z_b, BOUND))
        grad_num, grad_den = _load_output_grads(
            grad_out_ptr, out_ptr, den_ptr, batch, stream, rows, row_ok, num_queries, HEAD_DIM, BLOCK_H
        )
        grad_kv_pos = tl.dot(tl.trans(feat_a), grad_num, grad_kv_pos, input_precision=DOT_PRECISION)
        grad_kv_neg = tl.dot(tl.trans(feat_b), grad_num, grad_kv_neg, input_precision=DOT_PRECISION)
        grad_ksum_pos += tl.sum(feat_a * grad_den[:, None], axis=0)
        grad_ksum_neg += tl.sum(feat_b * grad_den[:, None], axis=0)

    half: tl.constexpr = HEAD_DIM // 2
    columns = tl.arange(0, BLOCK_H)
    tile_ok = channel_ok[:, None] & (columns < half)[None, :]
    offsets = channels[:, None] * HEAD_DIM + stream * half + columns[None, :]
    pos_state = ((batch * num_splits + split) * 2).to(tl.int64)
    tl.store(grad_kv_part_ptr + pos_state * HEAD_DIM * HEAD_DIM + offsets, grad_kv_pos, mask=tile_ok)
    tl.store(grad_kv_part_ptr + (pos_state + 1) * HEAD_DIM * HEAD_DIM + offsets, grad_kv_neg, mask=tile_ok)
    ksum_state = (((batch * num_splits + split) * 2 + stream) * 2).to(tl.int64)
    tl.store(grad_ksum_part_ptr + ksum_state * HEAD_DIM + channels, grad_ksum_pos, mask=channel_ok)
    tl.store(grad_ksum_part_ptr + (ksum_state + 1) * HEAD_DIM + channels, grad_ksum_neg, mask=channel_ok)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _query_grad_kernel(
    q_ptr,  # [b, Nq, d]
    temps_ptr,  # [b, 2 streams, 2d] fp32
    kv_ptr,  # [b, 2, d, d] fp32
    ksum_ptr,  # [b, 2, d] fp32
    grad_out_ptr,  # [b, Nq, d]
    out_ptr,  # [b, Nq, d]
    den_ptr,  # [b, 2 streams, Nq] fp32
    grad_q_ptr,  # [b, Nq, d]
    grad_temps_part_ptr,  # [b, query blocks, 2 streams, 2d] fp32
    num_queries,
    HEAD_DIM: tl.constexpr,
    BOUND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """`d Qa = d num kv[+]^T + d den ksum[+]` (likewise b), then through `expm1(min(t x, B))`:
    d/dz = exp(z) below the clamp, 0 above; dz/dx = t (x = relu(+-q)), dz/dt = x."""
    batch = tl.program_id(0)
    query_block = tl.program_id(1)
    rows = query_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_queries
    channels = tl.arange(0, BLOCK_D)
    channel_ok = channels < HEAD_DIM
    offsets = (batch.to(tl.int64) * num_queries + rows)[:, None] * HEAD_DIM + channels[None, :]
    tile_ok = row_ok[:, None] & channel_ok[None, :]
    q = tl.load(q_ptr + offsets, mask=tile_ok, other=0.0).to(tl.float32)

    grad_q = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for stream in tl.static_range(2):
        x_a, x_b, z_a, z_b, t_a, t_b = _query_exponents(q, temps_ptr, batch, stream, channels, channel_ok, HEAD_DIM)
        kv_pos, kv_neg, ksum_pos, ksum_neg = _load_stream_state(
            kv_ptr, ksum_ptr, batch, stream, channels, channel_ok, HEAD_DIM, BLOCK_H
        )
        grad_num, grad_den = _load_output_grads(
            grad_out_ptr, out_ptr, den_ptr, batch, stream, rows, row_ok, num_queries, HEAD_DIM, BLOCK_H
        )
        grad_feat_a = tl.dot(grad_num, tl.trans(kv_pos), input_precision=DOT_PRECISION)
        grad_feat_a += grad_den[:, None] * ksum_pos[None, :]
        grad_feat_b = tl.dot(grad_num, tl.trans(kv_neg), input_precision=DOT_PRECISION)
        grad_feat_b += grad_den[:, None] * ksum_neg[None, :]
        # Gradients w.r.t. the exponent inputs z = t * x.
        grad_z_a = tl.where(z_a <= BOUND, grad_feat_a * tl.exp(tl.minimum(z_a, BOUND)), 0.0)
        grad_z_b = tl.where(z_b <= BOUND, grad_feat_b * tl.exp(tl.minimum(z_b, BOUND)), 0.0)

        temp_row = (batch.to(tl.int64) * tl.num_programs(1) + query_block) * 2 + stream
        temp_grads = grad_temps_part_ptr + temp_row * 2 * HEAD_DIM
        tl.store(temp_grads + channels, tl.sum(grad_z_a * x_a, axis=0), mask=channel_ok)
        tl.store(temp_grads + HEAD_DIM + channels, tl.sum(grad_z_b * x_b, axis=0), mask=channel_ok)

        # x_a = relu(sign q), x_b = relu(-sign q); relu passes gradient only where its input > 0.
        sign = 1.0 - 2.0 * stream
        grad_x_a = tl.where(x_a > 0.0, grad_z_a * t_a[None, :], 0.0)
        grad_x_b = tl.where(x_b > 0.0, grad_z_b * t_b[None, :], 0.0)
        grad_q += sign * (grad_x_a - grad_x_b)

    tl.store(grad_q_ptr + offsets, grad_q.to(grad_q_ptr.dtype.element_ty), mask=tile_ok)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _key_grad_kernel(
    k_ptr,  # [b, Nk, d]
    v_ptr,  # [b, Nk, d]
    mask_ptr,  # [b, Nk] uint8; unused without HAS_MASK
    grad_kv_ptr,  # [b, 2, d, d] fp32
    grad_ksum_ptr,  # [b, 2, d] fp32
    grad_k_ptr,  # [b, Nk, d]
    grad_v_ptr,  # [b, Nk, d]
    num_keys,
    HEAD_DIM: tl.constexpr,
    BOUND: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """For each polarity p: `d K_p = v d kv[p]^T + d ksum[p]`, `dv += K_p d kv[p]`, and
    `dk += +-d K_p exp(x)` where `x = relu(+-k) <= B` (masked keys: features 0, gradients 0)."""
    batch = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < num_keys
    channels = tl.arange(0, BLOCK_D)
    channel_ok = channels < HEAD_DIM
    token_base = batch.to(tl.int64) * num_keys
    offsets = (token_base + rows)[:, None] * HEAD_DIM + channels[None, :]
    store_ok = row_ok[:, None] & channel_ok[None, :]
    if HAS_MASK:
        row_ok = row_ok & (tl.load(mask_ptr + token_base + rows, mask=row_ok, other=0) != 0)
    tile_ok = row_ok[:, None] & channel_ok[None, :]
    k = tl.load(k_ptr + offsets, mask=tile_ok, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offsets, mask=tile_ok, other=0.0).to(tl.float32)

    state_offsets = channels[:, None] * HEAD_DIM + channels[None, :]
    state_ok = channel_ok[:, None] & channel_ok[None, :]
    grad_k = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    grad_v = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    for polarity in tl.static_range(2):
        sign = 1.0 - 2.0 * polarity
        x = tl.maximum(sign * k, 0.0)  # masked keys load k = 0, so x = 0 and nothing flows back
        z = tl.minimum(x, BOUND)
        features = expm1(z)
        state = batch.to(tl.int64) * 2 + polarity
        grad_kv = tl.load(grad_kv_ptr + state * HEAD_DIM * HEAD_DIM + state_offsets, mask=state_ok, other=0.0)
        grad_ksum = tl.load(grad_ksum_ptr + state * HEAD_DIM + channels, mask=channel_ok, other=0.0)
        grad_features = tl.dot(v, tl.trans(grad_kv), input_precision=DOT_PRECISION) + grad_ksum[None, :]
        grad_v = tl.dot(features, grad_kv, grad_v, input_precision=DOT_PRECISION)
        passes = (x > 0.0) & (x <= BOUND) & tile_ok
        grad_k += sign * tl.where(passes, grad_features * tl.exp(z), 0.0)

    tl.store(grad_k_ptr + offsets, grad_k.to(grad_k_ptr.dtype.element_ty), mask=store_ok)
    tl.store(grad_v_ptr + offsets, grad_v.to(grad_v_ptr.dtype.element_ty), mask=store_ok)


# --------------------------------------------------------------------------------------------------
# Launch configuration


class _Config:
    """Block sizes, warps and split counts for one call (head dim `d`, flattened batch `b`), for a GPU
    of `multiprocessors` SMs (None: the interpreter)."""

    def __init__(self, head_dim: int, batch: int, dtype: torch.dtype, multiprocessors: int | None):
        self.head_dim = head_dim
        self.block_d = max(MIN_BLOCK, triton.next_power_of_2(head_dim))
        self.block_h = max(MIN_BLOCK, triton.next_power_of_2(head_dim // 2))
        # Wide heads hold [d, d] states in registers: fewer rows per block, more warps.
        self.block_rows = 64 if self.block_d <= 64 else 32
        self.num_warps = 4 if self.block_d <= 64 else 8
        # fp32 inputs: exact fp32 products. Half inputs carry ~3 digits anyway: TF32 tensor cores.
        self.dot_precision = "ieee" if dtype == torch.float32 else "tf32"
        self.batch = batch
        self.multiprocessors = multiprocessors

    def splits(self, num_blocks: int, programs_per_split: int) -> tuple[int, int]:
        """(splits, blocks per split) for a reduction over `num_blocks` row blocks.

        On a GPU: enough programs to fill its SMs 4 times over, each reducing a contiguous run of
        blocks. In the (serial) interpreter: two splits when possible, so the partial-sum path runs.
        """
        if num_blocks == 0:
            return 1, 0
        if self.multiprocessors is not None:
            wanted = max(1, 4 * self.multiprocessors // max(1, programs_per_split))
        else:
            wanted = 2
        blocks_per_split = triton.cdiv(num_blocks, min(wanted, num_blocks))
        return triton.cdiv(num_blocks, blocks_per_split), blocks_per_split


def device_multiprocessors(device: torch.device) -> int | None:
    """The SM count of a CUDA `device`, None elsewhere (the interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None


# --------------------------------------------------------------------------------------------------
# Autograd function on flattened tensors


class _PolarityAttentionTriton(torch.autograd.Function):
    """Inputs flattened to one batch*head axis `b`: q `[b, Nq, d]`, k and v `[b, Nk, d]`,
    temps `[b, 2 streams, 2d]` fp32, mask `[b, Nk]` uint8 or None; the SM count the split reductions
    fill (None: two splits). Returns `[b, Nq, d]`."""

    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, temps: Tensor, mask: Tensor | None, multiprocessors: int | None
    ) -> Tensor:
        batch, num_queries, head_dim = q.shape
        tiling = _Config(head_dim, batch, q.dtype, multiprocessors)
        kv, ksum = _key_state(k, v, mask, tiling)
        out = torch.empty_like(q)
        den = torch.empty(batch, 2, num_queries, device=q.device, dtype=torch.float32)
        if batch * num_queries > 0:
            grid = (batch, triton.cdiv(num_queries, tiling.block_rows))
            launch(_output_kernel, grid,
                q, temps, kv, ksum, out, den, num_queries,
                HEAD_DIM=head_dim, BOUND=EXPONENT_CLAMP, EPS=EPSILON, BLOCK_M=tiling.block_rows,
                BLOCK_D=tiling.block_d, BLOCK_H=tiling.block_h, DOT_PRECISION=tiling.dot_precision,
                num_warps=tiling.num_warps,
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, temps, mask, kv, ksum, out, den)
        ctx.tiling = tiling
        return out

    @staticmethod
    def backward(ctx, *grad_outputs: Tensor):
        (grad_out,) = grad_outputs
        q, k, v, temps, mask, kv, ksum, out, den = ctx.saved_tensors
        tiling: _Config = ctx.tiling
        batch, num_queries, head_dim = q.shape
        num_keys = k.shape[1]
        grad_out = grad_out.contiguous()
        need_q, need_k, need_v, need_temps, _, _ = ctx.needs_input_grad
        grad_q = grad_k = grad_v = grad_temps = None
        query_blocks = triton.cdiv(num_queries, tiling.block_rows)
        options = dict(
            HEAD_DIM=head_dim, BOUND=EXPONENT_CLAMP, BLOCK_M=tiling.block_rows, BLOCK_D=tiling.block_d,
            BLOCK_H=tiling.block_h, DOT_PRECISION=tiling.dot_precision, num_warps=tiling.num_warps,
        )  # fmt: skip

        if need_q or need_temps:
            grad_q = torch.empty_like(q)
            grad_temps_part = torch.zeros(batch, query_blocks, 2, 2 * head_dim, device=q.device, dtype=torch.float32)
            if batch * num_queries > 0:
                launch(
                    _query_grad_kernel,
                    (batch, query_blocks),
                    q,
                    temps,
                    kv,
                    ksum,
                    grad_out,
                    out,
                    den,
                    grad_q,
                    grad_temps_part,
                    num_queries,
                    **options,
                )
            grad_temps = grad_temps_part.sum(dim=1)

        if need_k or need_v:
            splits, blocks_per_split = tiling.splits(query_blocks, programs_per_split=2 * batch)
            grad_kv_part = torch.zeros(batch, splits, 2, head_dim, head_dim, device=q.device, dtype=torch.float32)
            grad_ksum_part = torch.zeros(batch, splits, 2, 2, head_dim, device=q.device, dtype=torch.float32)
            if batch * num_queries > 0:
                launch(_query_state_grad_kernel, (batch, splits, 2),
                    q, temps, grad_out, out, den, grad_kv_part, grad_ksum_part,
                    num_queries, blocks_per_split, splits, **options,
                )  # fmt: skip
            grad_kv = grad_kv_part.sum(dim=1)  # [b, 2 polarities, d, d]
            grad_ksum = grad_ksum_part.sum(dim=(1, 2))  # [b, 2 polarities, d]
            grad_k = torch.empty_like(k)
            grad_v = torch.empty_like(v)
            if batch * num_keys > 0:
                launch(_key_grad_kernel, (batch, triton.cdiv(num_keys, tiling.block_rows)),
                    k, v, _mask_or_dummy(mask, k), grad_kv, grad_ksum, grad_k, grad_v, num_keys,
                    HEAD_DIM=head_dim, BOUND=EXPONENT_CLAMP, HAS_MASK=mask is not None,
                    BLOCK_N=tiling.block_rows, BLOCK_D=tiling.block_d, DOT_PRECISION=tiling.dot_precision,
                    num_warps=tiling.num_warps,
                )  # fmt: skip

        return grad_q, grad_k, grad_v, grad_temps, None, None


def _mask_or_dummy(mask: Tensor | None, like: Tensor) -> Tensor:
    """Kernels take a pointer either way; without a mask it is never read (HAS_MASK=False)."""
    return mask if mask is not None else like


def _key_state(k: Tensor, v: Tensor, mask: Tensor | None, tiling: _Config) -> tuple[Tensor, Tensor]:
    """`kv` `[b, 2 polarities, d, d]` and `ksum` `[b, 2 polarities, d]`, fp32, reduced over key splits."""
    batch, num_keys, head_dim = k.shape
    splits, blocks_per_split = tiling.splits(triton.cdiv(num_keys, tiling.block_rows), programs_per_split=2 * batch)
    kv_part = torch.zeros(batch, splits, 2, head_dim, head_dim, device=k.device, dtype=torch.float32)
    ksum_part = torch.zeros(batch, splits, 2, head_dim, device=k.device, dtype=torch.float32)
    if batch * num_keys > 0:
        launch(_key_state_kernel, (batch, splits, 2),
            k, v, _mask_or_dummy(mask, k), kv_part, ksum_part, num_keys, blocks_per_split, splits,
            HEAD_DIM=head_dim, BOUND=EXPONENT_CLAMP, HAS_MASK=mask is not None, BLOCK_N=tiling.block_rows,
            BLOCK_D=tiling.block_d, DOT_PRECISION=tiling.dot_precision, num_warps=tiling.num_warps,
        )  # fmt: skip
    return kv_part.sum(dim=1), ksum_part.sum(dim=1)


# --------------------------------------------------------------------------------------------------
# Public entry point


def polarity_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    temp_same: Tensor,
    temp_opp: Tensor,
    key_mask: Tensor | None = None,
    *,
    multiprocessors: int | None = None,
) -> Tensor:
    """Linear-form polarity attention with fused Triton kernels (forward and backward).

    Args:
        q: `[..., Nq, d]` queries, fp32/fp16/bf16, d even and at most `MAX_HEAD_DIM`.
        k, v: `[..., Nk, d]` keys and values (batch dims broadcast with those of q).
        temp_same, temp_opp: temperatures in (0, 1], broadcastable to `[..., 1, 2d]`.
        key_mask: bool `[..., Nk]` (True = key may be attended) or None.
        multiprocessors: the SM count whose programs the key and query reductions are split over
            (4 per SM); default: the CUDA device's, and two splits elsewhere (the interpreter). The
            tests set a GPU's count to run its split reductions in the interpreter.

    Returns:
        `[..., Nq, d]` in q's dtype; differentiable w.r.t. q, k, v and both temperatures.
    """
    check_attention_shapes(q, k, v, key_mask)
    head_dim = q.shape[-1]
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be even and in [2, {MAX_HEAD_DIM}], got {head_dim}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q dtype must be one of {SUPPORTED_DTYPES}, got {q.dtype}")

    num_queries, num_keys = q.shape[-2], k.shape[-2]
    batch_dims = [q.shape[:-2], k.shape[:-2]] + ([key_mask.shape[:-1]] if key_mask is not None else [])
    batch_shape = torch.broadcast_shapes(*batch_dims)
    batch = batch_shape.numel()

    def flatten(x: Tensor, rows: int) -> Tensor:  # [..., rows, d] -> [b, rows, d], in q's dtype
        return x.to(q.dtype).expand(*batch_shape, rows, x.shape[-1]).reshape(batch, rows, x.shape[-1]).contiguous()

    def flatten_temperature(temp: Tensor, name: str) -> Tensor:  # -> [b, 2d] fp32
        try:
            return temp.float().expand(*batch_shape, 1, 2 * head_dim).reshape(batch, 2 * head_dim)
        except RuntimeError as err:
            target = (*batch_shape, 1, 2 * head_dim)
            raise ValueError(f"{name} of shape {tuple(temp.shape)} does not broadcast to {target}") from err

    temps = torch.stack(  # [b, 2 streams, 2d]
        [flatten_temperature(temp_same, "temp_same"), flatten_temperature(temp_opp, "temp_opp")], dim=1
    )
    mask = None
    if key_mask is not None:
        mask = key_mask.expand(*batch_shape, num_keys).reshape(batch, num_keys).to(torch.uint8).contiguous()

    if multiprocessors is None:
        multiprocessors = device_multiprocessors(q.device)
    out = _PolarityAttentionTriton.apply(
        flatten(q, num_queries), flatten(k, num_keys), flatten(v, num_keys), temps.contiguous(), mask, multiprocessors
    )
    return out.reshape(*batch_shape, num_queries, head_dim)
