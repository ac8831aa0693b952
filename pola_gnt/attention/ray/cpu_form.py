"""The ray attention's C++ forms (`cpu_extension`, `csrc/polarity_cpu.cpp`): the linear form over the
samples of each ray (`ray.pytorch_form`'s function) one (ray, head) at a time, and the LePE's
convolution along the samples, each forward and backward in one pass.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pola_gnt.attention.cpu_extension import ops


class _RayAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, temp_same, temp_opp, visible, heads):
        ctx.save_for_backward(q, k, v, temp_same, temp_opp, visible)
        ctx.heads = heads
        return ops().ray_forward(q, k, v, temp_same, temp_opp, visible, heads)

    @staticmethod
    def backward(ctx, *grad_outputs: Tensor):
        (grad_out,) = grad_outputs
        q, k, v, temp_same, temp_opp, visible = ctx.saved_tensors
        grad_q, grad_k, grad_v, grad_same, grad_opp = ops().ray_backward(
            grad_out.to(q.dtype), q, k, v, temp_same, temp_opp, visible, ctx.heads
        )
        return grad_q, grad_k, grad_v, grad_same.sum(dim=0), grad_opp.sum(dim=0), None, None


class _SamplesConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, visible, residual):
        ctx.save_for_backward(x, weight, visible)
        ctx.has_bias = bias is not None
        return ops().samples_conv_forward(x, weight, bias, visible, residual)

    @staticmethod
    def backward(ctx, *grad_outputs: Tensor):
        (grad_out,) = grad_outputs
        x, weight, visible = ctx.saved_tensors
        grad_x, grad_weight, grad_bias = ops().samples_conv_backward(grad_out.to(x.dtype), x, weight, visible)
        return grad_x, grad_weight.sum(dim=0), grad_bias.sum(dim=0) if ctx.has_bias else None, None, grad_out


def _channels_contiguous(x: Tensor) -> Tensor:
    """`x`, copied only if its last axis is strided (the kernels read rows of contiguous channels)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def polarity_ray_attention_cpu(
    q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor, visible: Tensor | None, heads: int
) -> Tensor:
    """Self-attention over each ray's samples: `q, k, v [R, S, heads * d]` (channels contiguous, rows
    may be strided), temperatures `[heads, 2d]`, `visible [R, S]` (0/1) or None. Returns `[R, S, heads * d]`."""
    q, k, v = (_channels_contiguous(x) for x in (q, k, v))
    visible = None if visible is None else visible.contiguous()
    return _RayAttention.apply(q, k, v, temp_same.contiguous(), temp_opp.contiguous(), visible, heads)


def samples_conv_cpu(
    x: Tensor, weight: Tensor, bias: Tensor | None, visible: Tensor | None, residual: Tensor
) -> Tensor:
    """`residual + conv(x * visible)`: a depthwise, zero-padded convolution along the samples of each
    ray (`x [R, S, C]`, channels contiguous, rows may be strided; `weight [K, C]`, K odd; `bias [C]`;
    `visible [R, S]` 0/1 or None), added to `residual [R, S, C]`. Returns a new `[R, S, C]` tensor."""
    visible = None if visible is None else visible.contiguous()
    x, residual = _channels_contiguous(x), _channels_contiguous(residual)
    return _SamplesConv.apply(x, weight.contiguous(), bias, visible, residual)
