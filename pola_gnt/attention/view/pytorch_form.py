"""The view attention's PyTorch form: polarity attention of one query over a few keys per point
(GNT's view attention), channel-wise.

The same function as `polarity_attention(q[..., None, :], k, v, ...)` with one query per point, but
computed without `[..., 2d]` feature tensors. Per channel `c` exactly one polarity part of `q` and of
`k` is non-zero, so with `|x|` and the sign of `x`:

    Fs_c = expm1(min(ts_c |q_c|, B))   ts_c = temp_same[c] if q_c > 0 else temp_same[d + c]
    Fo_c = expm1(min(to_c |q_c|, B))   to_c = temp_opp[d + c] if q_c > 0 else temp_opp[c]
    K_jc = expm1(min(|k_jc|, B))       0 for masked keys
    w_same_j = sum_c [sign q_c == sign k_jc] Fs_c K_jc        (q+ meets k+, q- meets k-)
    w_opp_j  = sum_c [sign q_c != sign k_jc] Fo_c K_jc        (q+ meets k-, q- meets k+)
    out = [sum_j w_same_j v_j[:d/2], sum_j w_opp_j v_j[d/2:]] / ([sum_j w_same_j, sum_j w_opp_j] + eps)

One d-wide key feature map serves both streams. A zero channel has a zero feature (expm1(0) = 0),
so which side of the sign test it falls on does not matter. Layout: heads stay in place,
`q [..., heads, d]`, `k, v [..., keys, heads, d]`, so the module's projections need no transposes.

Memory: the custom autograd keeps its inputs, the weights and the output, and recomputes the
features in backward (GNT's subtraction attention keeps several `[points, views, width]` tensors for
its backward).
Numerics as in `features`: fp32 (or fp64) with autocast off, exponent inputs clamped at
`EXPONENT_CLAMP`, `EPSILON` on each stream's denominator. The query terms: `features.PointQueryTerms`.
The fused kernels of the same function, `view.triton_form` on CUDA and `view.cpu_form` on the CPU,
take over where they can (`view.op`); this form runs elsewhere. Inputs come in the compute dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP, PointQueryTerms, expm1_, sign_parts

# Layout. Heads stay in place: `q [P, heads, d]`, `k, v [P, views, heads, d]` (`dim = heads * d`). Both
# streams' per-point query terms are `[P, 2 (stream), heads, d]`. Per-point products that mix views with
# streams and heads are batched matmuls against block-diagonal `[P, 2 * heads, dim]` matrices: on the
# CPU they beat broadcasting over the short head axes, and bool masks (`where`, `masked_fill`) are
# avoided on view-sized tensors for the same reason (PyTorch's CPU kernels for them are not vectorised).


def _block_diagonal(x: Tensor) -> Tensor:
    """`[P, 2, heads, d]` -> `[P, 2 * heads, heads * d]`.

    Row (stream, h) holds `x[:, stream, h]` in head h's columns.
    """
    points, streams, heads, d = x.shape
    blocks = x.new_zeros(points, streams, heads, heads, d)
    blocks.diagonal(dim1=2, dim2=3).copy_(x.transpose(-1, -2))
    return blocks.view(points, streams * heads, heads * d)


def _value_blocks(x: Tensor) -> Tensor:
    """`[P, 2 * heads, heads * d]` (rows (stream, h)) -> `[P, heads, d]`: head h's columns of row
    (stream, h), and of those the value half of that stream."""
    points, rows, dim = x.shape
    heads = rows // 2
    diagonal = x.view(points, 2, heads, heads, 2, -1).diagonal(dim1=2, dim2=3)  # [P, 2, 2, d/2, heads]
    return diagonal.diagonal(dim1=1, dim2=2).permute(0, 2, 3, 1).reshape(points, heads, -1)


def _value_block_diagonal(x: Tensor) -> Tensor:
    """Adjoint of `_value_blocks`: `[P, heads, d]` -> `[P, 2 * heads, heads * d]`."""
    points, heads, d = x.shape
    blocks = x.new_zeros(points, 2, heads, heads, 2, d // 2)
    blocks.diagonal(dim1=2, dim2=3).diagonal(dim1=1, dim2=2).copy_(x.view(points, heads, 2, -1).permute(0, 3, 1, 2))
    return blocks.view(points, 2 * heads, heads * d)


def _key_parts(k: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`K = expm1(min(|k|, B))` split into its `k+` and `k-` parts (`[P, views, heads, d]` each), and `sign(k)`."""
    sign = torch.sign(k)
    keys = expm1_(k.abs().clamp_(max=EXPONENT_CLAMP))
    plus = keys * sign.clamp(min=0.0)
    return plus, keys.sub_(plus), sign


def _weights(keys_plus: Tensor, keys_minus: Tensor, terms: PointQueryTerms) -> Tensor:
    """Unnormalised weights `[P, views, 2 * heads]` (stream-major) of every view: per point,
    `K+ @ blocks(plus)^T + K- @ blocks(minus)^T` sums each head's channels."""
    points, views, heads, d = keys_plus.shape
    weights = torch.bmm(keys_plus.view(points, views, heads * d), _block_diagonal(terms.plus).transpose(1, 2))
    return weights.baddbmm_(keys_minus.view(points, views, heads * d), _block_diagonal(terms.minus).transpose(1, 2))


def _sum_over_views(grad_weights_t: Tensor, keys: Tensor) -> Tensor:
    """`sum_j grad_weights[:, j, stream, h] keys[:, j, h, :]` -> `[P, 2, heads, d]`, from the transposed
    weights `[P, 2 * heads, views]` and `keys` `[P, views, heads, d]` (one batched matmul, then the
    diagonal head blocks)."""
    points, views, heads, d = keys.shape
    products = torch.bmm(grad_weights_t, keys.view(points, views, heads * d))  # [P, 2 * heads, heads * d]
    return products.view(points, 2, heads, heads, d).diagonal(dim1=2, dim2=3).transpose(-1, -2)


class _PolarityViewAttention(torch.autograd.Function):
    """Keeps the inputs, the small weights `[P, views, 2 * heads]` and the output for backward."""

    @staticmethod
    def forward(ctx, q, k, v, temp_same, temp_opp, visible):
        points, views, heads, d = k.shape
        keys_plus, keys_minus, _ = _key_parts(k)
        weights = _weights(keys_plus, keys_minus, PointQueryTerms(q, temp_same, temp_opp))
        if visible is not None:
            weights = weights.mul_(visible)  # [P, views, 1]
        attention = weights / (weights.sum(dim=1, keepdim=True) + EPSILON)
        out = _value_blocks(torch.bmm(attention.transpose(1, 2), v.view(points, views, heads * d)))
        # The key features are recomputed in backward rather than kept: two view-sized tensors per
        # block would put Pola-GNT's training memory above GNT's.
        ctx.save_for_backward(q, k, v, temp_same, temp_opp, visible, weights, out)
        return out

    @staticmethod
    def backward(ctx, *grad_outputs: Tensor):
        (grad_out,) = grad_outputs
        q, k, v, temp_same, temp_opp, visible, weights, out = ctx.saved_tensors
        points, views, heads, d = k.shape
        with torch.autocast(device_type=q.device.type, enabled=False):
            grad_out = grad_out.to(q.dtype)
            denominators = weights.sum(dim=1, keepdim=True) + EPSILON  # [P, 1, 2 * heads]
            attention = weights / denominators

            grad_v = torch.bmm(attention, _value_block_diagonal(grad_out)).view_as(v)

            # out = sum_j w_j v_j / (sum_j w_j + eps): d w_j = (g . v_j - g . out) / (sum_j w_j + eps)
            def per_stream_head(x: Tensor) -> Tensor:  # [..., heads, 2, d/2] summed over d/2 -> [..., 2 * heads]
                return x.sum(dim=-1).transpose(-1, -2).flatten(-2)

            flat_v = v.view(points, views, heads * d)
            grad_attention = per_stream_head((flat_v * grad_out.view(points, 1, -1)).view(points, views, heads, 2, -1))
            grad_dot_out = per_stream_head((grad_out * out).view(points, heads, 2, -1)).unsqueeze(1)
            grad_weights = (grad_attention - grad_dot_out) / denominators  # [P, views, 2 * heads]
            if visible is not None:
                grad_weights = grad_weights.mul_(visible)

            # w = sum_c (K+ plus + K- minus) per (stream, head); K+ = K [k > 0], K- = K [k < 0].
            terms = PointQueryTerms(q, temp_same, temp_opp)
            keys_plus, keys_minus, sign_k = _key_parts(k)
            grad_plus = torch.bmm(grad_weights, _block_diagonal(terms.plus)).view_as(k)
            grad_minus = torch.bmm(grad_weights, _block_diagonal(terms.minus)).view_as(k)
            grad_keys = grad_plus.mul_(sign_k.clamp(min=0.0)).addcmul_(grad_minus, (-sign_k).clamp_(min=0.0))
            # d|k| = d K exp(|k|) below the clamp (masked keys have zero d w, so `K + 1` never matters there).
            unclamped_k = (k.abs() <= EXPONENT_CLAMP).to(k.dtype)
            grad_k = grad_keys.mul_(keys_plus + keys_minus + 1).mul_(unclamped_k).mul_(sign_k)

            grad_weights_t = grad_weights.transpose(1, 2).contiguous()  # [P, 2 * heads, views]
            grad_features = _sum_over_views(grad_weights_t, keys_plus) * terms.meets_plus
            grad_features.addcmul_(_sum_over_views(grad_weights_t, keys_minus), terms.meets_minus)  # [P, 2, heads, d]
            grad_exponents = grad_features.mul_(terms.features + 1).mul_(terms.unclamped)
            grad_q = (grad_exponents * terms.temperatures).sum(dim=1) * terms.sign

            # Temperatures: d t = d z |q|, summed into the slot of q's polarity.
            grad_temp_same = grad_temp_opp = None
            if ctx.needs_input_grad[3] or ctx.needs_input_grad[4]:
                slopes = grad_exponents * terms.magnitude.unsqueeze(1)  # [P, 2, heads, d]
                positive, _ = sign_parts(terms.sign)
                on_positive = (slopes * positive.unsqueeze(1)).sum(dim=0)  # [2, heads, d]
                on_negative = slopes.sum(dim=0) - on_positive
                grad_temp_same = torch.cat([on_positive[0], on_negative[0]], dim=-1).sum_to_size(temp_same.shape)
                grad_temp_opp = torch.cat([on_negative[1], on_positive[1]], dim=-1).sum_to_size(temp_opp.shape)
        return grad_q, grad_k, grad_v, grad_temp_same, grad_temp_opp, None


def polarity_view_attention_pytorch(
    q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor, visible: Tensor | None
) -> Tensor:
    """`q [P, heads, d]`, `k, v [P, views, heads, d]`, temperatures broadcastable to `[P, heads, 2d]`,
    `visible [P, views, 1]` (0/1, dtype of q) or None; all in one compute dtype. Returns `[P, heads, d]`."""
    return _PolarityViewAttention.apply(q, k, v, temp_same, temp_opp, visible)
