"""Fused Triton kernels (forward and backward) for GNT's view attention in polarity form.

Computes exactly `pola_gnt.attention.view.op.polarity_view_attention`: one query per point
over its source views, per (point, head), with `B = EXPONENT_CLAMP` and `eps = EPSILON`:

    Fs_c = expm1(min(ts_c |q_c|, B))   ts_c = temp_same[c] if q_c > 0 else temp_same[d + c]
    Fo_c = expm1(min(to_c |q_c|, B))   to_c = temp_opp[d + c] if q_c > 0 else temp_opp[c]
    K_jc = expm1(min(|k_jc|, B)),      same_jc = [k_jc > 0] == [q_c > 0]
    w_same_j = vis_j sum_c Fs_c K_jc same_jc,   w_opp_j = vis_j sum_c Fo_c K_jc (1 - same_jc)
    out = [sum_j w_same_j v_j[:d/2], sum_j w_opp_j v_j[d/2:]] / ([sum_j w_same_j, sum_j w_opp_j] + eps)

Layout as in `view.pytorch_form`: q `[P, heads, d]`, k and v `[P, views, heads, d]` with any point,
view and head strides (the model's k and v are chunks of one projection `[P, views, 2 heads d]`;
channels must be contiguous), temperatures `[heads, 2d]`, `visible` `[P, views]` (0/1) or None.

Kernels, grid (point block, head), each program `BLOCK_P` points of one head, all in fp32 registers
whatever the input dtype; no `[P, views, ...]` feature tensor is ever written:
- forward  `_view_forward_kernel`: one pass over the views (weights, numerators, denominators);
- backward `_view_backward_kernel`: the forward pass again (the output is needed before any weight
  gradient), then a second pass over the views writing `dk`, `dv` and summing the query-feature
  gradients, then `dq` and the program's temperature-gradient partials, which are reduced with
  `torch.sum` (deterministic, no atomics).
Only the inputs are saved for backward. The views are a runtime loop, so any number of them works.
On CPU the kernels run in Triton's interpreter with `TRITON_INTERPRET=1`; that and `expm1`: `triton_common`.
"""

from __future__ import annotations

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP
from pola_gnt.attention.triton_common import SUPPORTED_DTYPES, expm1, interpreting, launch, on_kernel_device

# This kernel's own head-dim limit (the linear and ray kernels': `triton_common.MAX_HEAD_DIM`).
MAX_HEAD_DIM = 64

# Points x channels per program: 1024 fp32 values per live tile in the forward (8 registers a thread
# at 4 warps), 512 in the backward, whose dozen live tiles took 140-186 registers at 1024 and spilled
# in some dtypes (docs/benchmarks.md, the AOT table). The interpreter runs each program's tile ops as
# numpy calls, so its blocks only need to be small enough that the tests cover several programs.
_FORWARD_TILE_ELEMENTS = 1024
_BACKWARD_TILE_ELEMENTS = 512
_INTERPRETER_BLOCK_POINTS = 16
_NUM_WARPS = 4


def view_triton_supported(q: Tensor) -> bool:
    """Whether `polarity_view_attention_triton` can run for queries `q` `[P, heads, d]`.

    Needs a CUDA tensor (or `TRITON_INTERPRET=1` for the CPU interpreter), an fp32/fp16/bf16 dtype
    and an even head dim in [2, `MAX_HEAD_DIM`]. Any number of views and heads.
    """
    head_dim = q.shape[-1]
    return on_kernel_device(q) and q.dtype in SUPPORTED_DTYPES and head_dim % 2 == 0 and 2 <= head_dim <= MAX_HEAD_DIM


# --------------------------------------------------------------------------------------------------
# Kernels. Tiles are `[BLOCK_P points, BLOCK_D channels]` of one head; per-point values `[BLOCK_P]`.


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _query_terms(
    q_ptr,
    temp_same_ptr,
    temp_opp_ptr,
    points,
    head,
    channels,
    tile_ok,
    channel_ok,
    q_stride_p,
    q_stride_h,
    HEAD_DIM: tl.constexpr,
    BOUND: tl.constexpr,
):
    """The query `q` (fp32), the temperatures in use `ts`, `to`, the exponent inputs `zs = ts |q|`,
    `zo = to |q|` and the features `Fs`, `Fo` (0 on padding and on zero channels)."""
    offsets = points.to(tl.int64)[:, None] * q_stride_p + head * q_stride_h + channels[None, :]
    q = tl.load(q_ptr + offsets, mask=tile_ok, other=0.0).to(tl.float32)
    temp_row = head * 2 * HEAD_DIM
    same_pos = tl.load(temp_same_ptr + temp_row + channels, mask=channel_ok, other=0.0)
    same_neg = tl.load(temp_same_ptr + temp_row + HEAD_DIM + channels, mask=channel_ok, other=0.0)
    opp_pos = tl.load(temp_opp_ptr + temp_row + HEAD_DIM + channels, mask=channel_ok, other=0.0)
    opp_neg = tl.load(temp_opp_ptr + temp_row + channels, mask=channel_ok, other=0.0)
    positive = q > 0.0
    magnitude = tl.abs(q)
    temp_s = tl.where(positive, same_pos[None, :], same_neg[None, :])
    temp_o = tl.where(positive, opp_pos[None, :], opp_neg[None, :])
    exp_s = temp_s * magnitude
    exp_o = temp_o * magnitude
    feat_s = expm1(tl.minimum(exp_s, BOUND))
    feat_o = expm1(tl.minimum(exp_o, BOUND))
    return q, temp_s, temp_o, exp_s, exp_o, feat_s, feat_o


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _view_terms(
    k_ptr,
    visible_ptr,
    view,
    points,
    point_ok,
    head,
    channels,
    tile_ok,
    positive,
    feat_s,
    feat_o,
    k_stride_p,
    k_stride_v,
    k_stride_h,
    vis_stride_p,
    vis_stride_v,
    BOUND: tl.constexpr,
    HAS_VISIBLE: tl.constexpr,
):
    """View `view`'s key `k` (fp32), features `K`, the same-sign pairing `same`, the visibility `vis`
    `[BLOCK_P]` and both weights `[BLOCK_P]` (times `vis`)."""
    point_offsets = points.to(tl.int64)
    k_offsets = point_offsets[:, None] * k_stride_p + view * k_stride_v + head * k_stride_h + channels[None, :]
    k = tl.load(k_ptr + k_offsets, mask=tile_ok, other=0.0).to(tl.float32)
    key = expm1(tl.minimum(tl.abs(k), BOUND))
    same = (k > 0.0) == positive
    if HAS_VISIBLE:
        vis_offsets = point_offsets * vis_stride_p + view * vis_stride_v
        vis = tl.load(visible_ptr + vis_offsets, mask=point_ok, other=0.0).to(tl.float32)
    else:
        vis = tl.where(point_ok, 1.0, 0.0)
    weight_s = tl.sum(tl.where(same, feat_s * key, 0.0), axis=1) * vis
    weight_o = tl.sum(tl.where(same, 0.0, feat_o * key), axis=1) * vis
    return k, key, same, vis, weight_s, weight_o


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _load_view_values(v_ptr, view, points, head, channels, tile_ok, v_stride_p, v_stride_v, v_stride_h):
    offsets = points.to(tl.int64)[:, None] * v_stride_p + view * v_stride_v + head * v_stride_h + channels[None, :]
    return tl.load(v_ptr + offsets, mask=tile_ok, other=0.0).to(tl.float32)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _attend(
    k_ptr,
    v_ptr,
    visible_ptr,
    num_views,
    points,
    point_ok,
    head,
    channels,
    tile_ok,
    first_half,
    positive,
    feat_s,
    feat_o,
    k_stride_p,
    k_stride_v,
    k_stride_h,
    v_stride_p,
    v_stride_v,
    v_stride_h,
    vis_stride_p,
    vis_stride_v,
    BOUND: tl.constexpr,
    EPS: tl.constexpr,
    HAS_VISIBLE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One pass over the views: the output `[BLOCK_P, BLOCK_D]` and both denominators `[BLOCK_P]`."""
    num = tl.zeros((BLOCK_P, BLOCK_D), dtype=tl.float32)
    den_s = tl.zeros((BLOCK_P,), dtype=tl.float32)
    den_o = tl.zeros((BLOCK_P,), dtype=tl.float32)
    for view in range(0, num_views):
        _, _, _, _, weight_s, weight_o = _view_terms(
            k_ptr, visible_ptr, view, points, point_ok, head, channels, tile_ok, positive, feat_s, feat_o,
            k_stride_p, k_stride_v, k_stride_h, vis_stride_p, vis_stride_v, BOUND, HAS_VISIBLE,
        )  # fmt: skip
        values = _load_view_values(v_ptr, view, points, head, channels, tile_ok, v_stride_p, v_stride_v, v_stride_h)
        num += tl.where(first_half[None, :], weight_s[:, None], weight_o[:, None]) * values
        den_s += weight_s
        den_o += weight_o
    den_s += EPS
    den_o += EPS
    out = num / tl.where(first_half[None, :], den_s[:, None], den_o[:, None])
    return out, den_s, den_o


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _view_forward_kernel(
    q_ptr,  # [P, heads, d], channels contiguous
    k_ptr,  # [P, views, heads, d], channels contiguous
    v_ptr,  # [P, views, heads, d], channels contiguous
    temp_same_ptr,  # [heads, 2d] fp32
    temp_opp_ptr,  # [heads, 2d] fp32
    visible_ptr,  # [P, views]; unused without HAS_VISIBLE
    out_ptr,  # [P, heads, d] contiguous
    num_points,
    num_views,
    num_heads,
    q_stride_p,
    q_stride_h,
    k_stride_p,
    k_stride_v,
    k_stride_h,
    v_stride_p,
    v_stride_v,
    v_stride_h,
    vis_stride_p,
    vis_stride_v,
    HEAD_DIM: tl.constexpr,
    BOUND: tl.constexpr,
    EPS: tl.constexpr,
    HAS_VISIBLE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    head = tl.program_id(1)
    points = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    point_ok = points < num_points
    channels = tl.arange(0, BLOCK_D)
    channel_ok = channels < HEAD_DIM
    tile_ok = point_ok[:, None] & channel_ok[None, :]
    first_half = channels < HEAD_DIM // 2  # the same-sign stream's value channels

    q, _, _, _, _, feat_s, feat_o = _query_terms(
        q_ptr, temp_same_ptr, temp_opp_ptr, points, head, channels, tile_ok, channel_ok, q_stride_p, q_stride_h,
        HEAD_DIM, BOUND,
    )  # fmt: skip
    out, _, _ = _attend(
        k_ptr, v_ptr, visible_ptr, num_views, points, point_ok, head, channels, tile_ok, first_half, q > 0.0,
        feat_s, feat_o, k_stride_p, k_stride_v, k_stride_h, v_stride_p, v_stride_v, v_stride_h, vis_stride_p,
        vis_stride_v, BOUND, EPS, HAS_VISIBLE, BLOCK_P, BLOCK_D,
    )  # fmt: skip
    out_offsets = (points.to(tl.int64)[:, None] * num_heads + head) * HEAD_DIM + channels[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=tile_ok)


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def _view_backward_kernel(
    grad_out_ptr,  # [P, heads, d] contiguous
    q_ptr,
    k_ptr,
    v_ptr,
    temp_same_ptr,
    temp_opp_ptr,
    visible_ptr,
    grad_q_ptr,  # [P, heads, d] contiguous, q's dtype
    grad_k_ptr,  # [P, views, heads, d] contiguous, k's dtype
    grad_v_ptr,  # [P, views, heads, d] contiguous, v's dtype
    grad_temps_part_ptr,  # [point blocks, heads, 2 (same, opp), 2d] fp32
    num_points,
    num_views,
    num_heads,
    q_stride_p,
    q_stride_h,
    k_stride_p,
    k_stride_v,
    k_stride_h,
    v_stride_p,
    v_stride_v,
    v_stride_h,
    vis_stride_p,
    vis_stride_v,
    HEAD_DIM: tl.constexpr,
    BOUND: tl.constexpr,
    EPS: tl.constexpr,
    HAS_VISIBLE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """out = num / den per stream: d v_j = g w_j / den, d w_j = vis_j (g . v_j - g . out) / den;
    d K_jc = d w_same_j Fs_c same_jc + d w_opp_j Fo_c (1 - same_jc), dk = dK (K + 1) sign(k) below the
    clamp; d Fs_c = sum_j d w_same_j K_jc same_jc (d Fo likewise), dz = dF (F + 1) below the clamp,
    dq = (dzs ts + dzo to) sign(q), and d t = dz |q| into the slot of q's polarity."""
    block = tl.program_id(0)
    head = tl.program_id(1)
    points = block * BLOCK_P + tl.arange(0, BLOCK_P)
    point_ok = points < num_points
    channels = tl.arange(0, BLOCK_D)
    channel_ok = channels < HEAD_DIM
    tile_ok = point_ok[:, None] & channel_ok[None, :]
    first_half = channels < HEAD_DIM // 2

    q, temp_s, temp_o, exp_s, exp_o, feat_s, feat_o = _query_terms(
        q_ptr, temp_same_ptr, temp_opp_ptr, points, head, channels, tile_ok, channel_ok, q_stride_p, q_stride_h,
        HEAD_DIM, BOUND,
    )  # fmt: skip
    positive = q > 0.0
    out, den_s, den_o = _attend(
        k_ptr, v_ptr, visible_ptr, num_views, points, point_ok, head, channels, tile_ok, first_half, positive,
        feat_s, feat_o, k_stride_p, k_stride_v, k_stride_h, v_stride_p, v_stride_v, v_stride_h, vis_stride_p,
        vis_stride_v, BOUND, EPS, HAS_VISIBLE, BLOCK_P, BLOCK_D,
    )  # fmt: skip
    out_offsets = (points.to(tl.int64)[:, None] * num_heads + head) * HEAD_DIM + channels[None, :]
    grad_out = tl.load(grad_out_ptr + out_offsets, mask=tile_ok, other=0.0).to(tl.float32)
    grad_out_over_den = grad_out / tl.where(first_half[None, :], den_s[:, None], den_o[:, None])
    grad_dot_out = grad_out_over_den * out
    grad_dot_out_s = tl.sum(tl.where(first_half[None, :], grad_dot_out, 0.0), axis=1)  # (g . out) / den
    grad_dot_out_o = tl.sum(tl.where(first_half[None, :], 0.0, grad_dot_out), axis=1)

    grad_feat_s = tl.zeros((BLOCK_P, BLOCK_D), dtype=tl.float32)
    grad_feat_o = tl.zeros((BLOCK_P, BLOCK_D), dtype=tl.float32)
    for view in range(0, num_views):
        k, key, same, vis, weight_s, weight_o = _view_terms(
            k_ptr, visible_ptr, view, points, point_ok, head, channels, tile_ok, positive, feat_s, feat_o,
            k_stride_p, k_stride_v, k_stride_h, vis_stride_p, vis_stride_v, BOUND, HAS_VISIBLE,
        )  # fmt: skip
        values = _load_view_values(v_ptr, view, points, head, channels, tile_ok, v_stride_p, v_stride_v, v_stride_h)
        grad_dot_values = grad_out_over_den * values
        grad_weight_s = (tl.sum(tl.where(first_half[None, :], grad_dot_values, 0.0), axis=1) - grad_dot_out_s) * vis
        grad_weight_o = (tl.sum(tl.where(first_half[None, :], 0.0, grad_dot_values), axis=1) - grad_dot_out_o) * vis
        grad_values = grad_out_over_den * tl.where(first_half[None, :], weight_s[:, None], weight_o[:, None])

        grad_key = tl.where(same, grad_weight_s[:, None] * feat_s, grad_weight_o[:, None] * feat_o)
        grad_feat_s += tl.where(same, grad_weight_s[:, None] * key, 0.0)
        grad_feat_o += tl.where(same, 0.0, grad_weight_o[:, None] * key)
        # d|k| = dK exp(|k|) below the clamp; zero keys have sign 0 (relu's gradient at its kink).
        sign_k = tl.where(k > 0.0, 1.0, tl.where(k < 0.0, -1.0, 0.0))
        grad_k = tl.where(tl.abs(k) <= BOUND, grad_key * (key + 1.0), 0.0) * sign_k

        grad_token = (points.to(tl.int64) * num_views + view) * num_heads + head  # [P, views, heads, d] contiguous
        grad_offsets = grad_token[:, None] * HEAD_DIM + channels[None, :]
        tl.store(grad_k_ptr + grad_offsets, grad_k.to(grad_k_ptr.dtype.element_ty), mask=tile_ok)
        tl.store(grad_v_ptr + grad_offsets, grad_values.to(grad_v_ptr.dtype.element_ty), mask=tile_ok)

    grad_exp_s = tl.where(exp_s <= BOUND, grad_feat_s * (feat_s + 1.0), 0.0)
    grad_exp_o = tl.where(exp_o <= BOUND, grad_feat_o * (feat_o + 1.0), 0.0)
    sign_q = tl.where(positive, 1.0, tl.where(q < 0.0, -1.0, 0.0))
    grad_q = (grad_exp_s * temp_s + grad_exp_o * temp_o) * sign_q
    tl.store(grad_q_ptr + out_offsets, grad_q.to(grad_q_ptr.dtype.element_ty), mask=tile_ok)

    # Temperatures: z = t |q|, so d t = dz |q| (zero where q is 0), summed over this block's points into
    # the slot of q's polarity: same-sign q+ -> temp_same[c], q- -> temp_same[d + c]; opposite-sign
    # q+ -> temp_opp[d + c], q- -> temp_opp[c].
    magnitude = tl.abs(q)
    slope_s = grad_exp_s * magnitude
    slope_o = grad_exp_o * magnitude
    part = grad_temps_part_ptr + ((block.to(tl.int64) * num_heads + head) * 2) * 2 * HEAD_DIM
    tl.store(part + channels, tl.sum(tl.where(positive, slope_s, 0.0), axis=0), mask=channel_ok)
    tl.store(part + HEAD_DIM + channels, tl.sum(tl.where(positive, 0.0, slope_s), axis=0), mask=channel_ok)
    part += 2 * HEAD_DIM
    tl.store(part + HEAD_DIM + channels, tl.sum(tl.where(positive, slope_o, 0.0), axis=0), mask=channel_ok)
    tl.store(part + channels, tl.sum(tl.where(positive, 0.0, slope_o), axis=0), mask=channel_ok)


# --------------------------------------------------------------------------------------------------
# Autograd function


def _block_sizes(head_dim: int, tile_elements: int) -> tuple[int, int]:
    """(points per program, channel block) for head dim `head_dim`: compiled (a GPU), or interpreted."""
    block_d = triton.next_power_of_2(head_dim)
    block_p = _INTERPRETER_BLOCK_POINTS if interpreting() else max(1, tile_elements // block_d)
    return block_p, block_d


def _strides(visible: Tensor | None) -> tuple[int, int]:
    return (0, 0) if visible is None else (visible.stride(0), visible.stride(1))


class _PolarityViewAttentionTriton(torch.autograd.Function):
    """q `[P, heads, d]`, k, v `[P, views, heads, d]` (channels contiguous), temperatures `[heads, 2d]`
    fp32 contiguous, visible `[P, views]` or None. Saves only the inputs."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor, visible: Tensor | None):
        points, views, heads, head_dim = k.shape
        block_p, block_d = _block_sizes(head_dim, _FORWARD_TILE_ELEMENTS)
        out = torch.empty(points, heads, head_dim, device=q.device, dtype=q.dtype)
        if points * heads > 0:
            launch(_view_forward_kernel, (triton.cdiv(points, block_p), heads),
                q, k, v, temp_same, temp_opp, k if visible is None else visible, out, points, views, heads,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
                v.stride(2), *_strides(visible),
                HEAD_DIM=head_dim, BOUND=EXPONENT_CLAMP, EPS=EPSILON, HAS_VISIBLE=visible is not None,
                BLOCK_P=block_p, BLOCK_D=block_d, num_warps=_NUM_WARPS,
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, temp_same, temp_opp, visible)
        return out

    @staticmethod
    def backward(ctx, *grad_outputs: Tensor):
        (grad_out,) = grad_outputs
        q, k, v, temp_same, temp_opp, visible = ctx.saved_tensors
        points, views, heads, head_dim = k.shape
        block_p, block_d = _block_sizes(head_dim, _BACKWARD_TILE_ELEMENTS)
        blocks = triton.cdiv(points, block_p)
        grad_out = grad_out.contiguous()
        grad_q = torch.empty(points, heads, head_dim, device=q.device, dtype=q.dtype)
        grad_k = torch.empty(k.shape, device=k.device, dtype=k.dtype)
        grad_v = torch.empty(v.shape, device=v.device, dtype=v.dtype)
        grad_temps_part = torch.zeros(blocks, heads, 2, 2 * head_dim, device=q.device, dtype=torch.float32)
        if points * heads > 0:
            launch(_view_backward_kernel, (blocks, heads),
                grad_out, q, k, v, temp_same, temp_opp, k if visible is None else visible, grad_q, grad_k, grad_v,
                grad_temps_part, points, views, heads,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
                v.stride(2), *_strides(visible),
                HEAD_DIM=head_dim, BOUND=EXPONENT_CLAMP, EPS=EPSILON, HAS_VISIBLE=visible is not None,
                BLOCK_P=block_p, BLOCK_D=block_d, num_warps=_NUM_WARPS,
            )  # fmt: skip
        grad_temps = grad_temps_part.sum(dim=0)  # [heads, 2, 2d]
        need_q, need_k, need_v, need_same, need_opp, _ = ctx.needs_input_grad
        return (
            grad_q if need_q else None,
            grad_k if need_k else None,
            grad_v if need_v else None,
            grad_temps[:, 0] if need_same else None,
            grad_temps[:, 1] if need_opp else None,
            None,
        )


# --------------------------------------------------------------------------------------------------
# Public entry point


def polarity_view_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    temp_same: Tensor,
    temp_opp: Tensor,
    visible: Tensor | None = None,
) -> Tensor:
    """Polarity view attention with fused Triton kernels (forward and backward); see the module docstring.

    Args:
        q: `[P, heads, d]` one query per point, fp32/fp16/bf16, d even and in [2, `MAX_HEAD_DIM`].
        k, v: `[P, views, heads, d]`, any point/view/head strides (copied only if channels are strided).
        temp_same, temp_opp: temperatures broadcastable to `[heads, 2d]`.
        visible: `[P, views]` 0/1 (float or bool), or None for all views visible. A point with no
            visible view gets zeros.

    Returns:
        `[P, heads, d]` in q's dtype (channels `[0, d/2)` the same-sign stream, `[d/2, d)` the
        opposite-sign one); differentiable w.r.t. q, k, v and both temperatures.
    """
    if q.dim() != 3 or k.dim() != 4 or k.shape != v.shape or k.shape[:1] + k.shape[2:] != q.shape:
        raise ValueError(
            f"expected q [P, heads, d], k and v [P, views, heads, d]; got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    points, views, heads, head_dim = k.shape
    if head_dim % 2 or not 2 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be even and in [2, {MAX_HEAD_DIM}], got {head_dim}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name} dtype must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
    if visible is not None and visible.shape != (points, views):
        raise ValueError(f"visible must be [{points}, {views}], got {tuple(visible.shape)}")

    def temperature(temp: Tensor, name: str) -> Tensor:  # -> [heads, 2d] fp32, contiguous
        try:
            return temp.float().expand(heads, 2 * head_dim).contiguous()
        except RuntimeError as err:
            raise ValueError(
                f"{name} of shape {tuple(temp.shape)} does not broadcast to {(heads, 2 * head_dim)}"
            ) from err

    def channels_contiguous(x: Tensor) -> Tensor:
        return x if x.stride(-1) == 1 else x.contiguous()

    if visible is not None and visible.dtype == torch.bool:
        visible = visible.to(torch.float32)
    return _PolarityViewAttentionTriton.apply(
        channels_contiguous(q),
        channels_contiguous(k),
        channels_contiguous(v),
        temperature(temp_same, "temp_same"),
        temperature(temp_opp, "temp_opp"),
        None if visible is None else visible.detach(),
    )
