"""The view attention's C++ form (`cpu_extension`, `csrc/polarity_cpu.cpp`): `view.pytorch_form`'s
function computed one point at a time, all of it in registers, forward and backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pola_gnt.attention.cpu_extension import ops


class _ViewAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, temp_same, temp_opp, visible):
        ctx.save_for_backward(q, k, v, temp_same, temp_opp, visible)
        return ops().view_forward(q, k, v, temp_same, temp_opp, visible)

    @staticmethod
    def backward(ctx, *grad_outputs: Tensor):
        (grad_out,) = grad_outputs
        q, k, v, temp_same, temp_opp, visible = ctx.saved_tensors
        grad_q, grad_k, grad_v, grad_same, grad_opp = ops().view_backward(
            grad_out.to(q.dtype), q, k, v, temp_same, temp_opp, visible
        )
        # Per-block partial sums, added in block order (deterministic whatever the thread count).
        return grad_q, grad_k, grad_v, grad_same.sum(dim=0), grad_opp.sum(dim=0), None


def _heads_packed(x: Tensor) -> bool:
    """Whether each token's `[heads, d]` block of `x` `[..., heads, d]` is contiguous."""
    return x.stride(-1) == 1 and x.stride(-2) == x.shape[-1]


def polarity_view_attention_cpu(
    q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor, visible: Tensor | None
) -> Tensor:
    """`q [P, heads, d]`, `k, v [P, views, heads, d]`, temperatures `[heads, 2d]`, `visible [P, views]`
    (0/1, dtype of q) or None; all in one compute dtype. The point and view axes may be strided (chunks
    of one projection are read in place). Returns `[P, heads, d]`."""
    q, k, v = (x if _heads_packed(x) else x.contiguous() for x in (q, k, v))
    visible = None if visible is None else visible.contiguous()
    return _ViewAttention.apply(q, k, v, temp_same.contiguous(), temp_opp.contiguous(), visible)
