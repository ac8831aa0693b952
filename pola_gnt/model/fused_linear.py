"""Linear layers for rendering whose epilogue (the bias, a ReLU, a residual add) runs inside the matmul.

At the quick size (width 32) a render pass on the CPU spends more time in passes over memory than in
matmuls: `F.linear` with a bias copies the bias into every row of its output before the matmul adds
to it, and a following ReLU or residual add reads and writes the whole output again. oneDNN's
`mkldnn._linear_pointwise` (PyTorch's CPU inference path for linear layers, as Inductor uses it) applies
the bias, the ReLU or the add to each tile of the output while the tile is in registers, and rounds
once: a bf16 result differs from `F.linear`'s by that rounding only (fp32: the same values).
No autograd: rendering only (`FastRenderNetwork`), which holds its own copies of the weights.
Elsewhere (CUDA, a PyTorch without oneDNN) the same function is computed by `F.linear` and in-place ops.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn


@functools.cache
def _onednn_linear_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def _onednn_bf16_available() -> bool:
    """oneDNN builds bf16 matmuls only for CPUs with AVX-512 (or AMX): on an AVX2 CPU (AMD EPYC Milan) its
    bf16 primitive cannot be created at all, and `F.linear` computes them instead (slowly, which is why
    `render.precision=auto` renders fp32 there)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


def _onednn(x: Tensor, weight: Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.bfloat16)
        and x.dtype == weight.dtype
        and _onednn_linear_available()
        and (x.dtype == torch.float32 or _onednn_bf16_available())
    )


def fused_linear(
    x: Float[Tensor, "*batch in_dim"],
    weight: Float[Tensor, "out_dim in_dim"],
    bias: Float[Tensor, " out_dim"] | None = None,
    relu: bool = False,
    residual: Float[Tensor, "*batch out_dim"] | None = None,
) -> Float[Tensor, "*batch out_dim"]:
    """`relu(x W^T + b)` or `x W^T + b + residual` (not both), in the dtype of `x` and `weight`."""
    if relu and residual is not None:
        raise ValueError("fused_linear: a ReLU or a residual add, not both")
    if _onednn(x, weight):
        rows = x.reshape(-1, x.shape[-1])  # oneDNN runs 2-D inputs faster (a view where x is contiguous)
        if residual is not None:
            other = residual.reshape(-1, residual.shape[-1]).contiguous()
            out = torch.ops.mkldnn._linear_pointwise.binary(rows, other, weight, bias, "add")
        else:
            out = torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "relu" if relu else "none", [], "")
        return out.view(*x.shape[:-1], weight.shape[0])
    out = F.linear(x, weight, bias)
    if residual is not None:
        return out.add_(residual)
    return torch.relu_(out) if relu else out


class FusedLinear(nn.Linear):
    """An `nn.Linear` (the same parameters, so module code that reads `.weight` keeps working) whose
    forward is `fused_linear`, followed by a ReLU when `relu`."""

    def __init__(self, linear: nn.Linear, relu: bool = False):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None)
        self.weight, self.bias, self.relu = linear.weight, linear.bias, relu

    def forward(self, input: Tensor, residual: Tensor | None = None) -> Tensor:  # noqa: A002 (nn.Linear's name)
        return fused_linear(input, self.weight, self.bias, self.relu, residual)


def fuse_linear_layers(module: nn.Module) -> nn.Module:
    """`module` with every `nn.Linear` replaced in place by a `FusedLinear`, and every `Linear, ReLU` pair
    of an `nn.Sequential` by `FusedLinear(relu=True), Identity` (the same function)."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and not isinstance(child, FusedLinear):
            setattr(module, name, FusedLinear(child))
        else:
            fuse_linear_layers(child)
    if isinstance(module, nn.Sequential):
        layers = list(module)
        for index, (layer, following) in enumerate(zip(layers, layers[1:])):
            if isinstance(layer, FusedLinear) and isinstance(following, nn.ReLU):
                layer.relu = True
                module[index + 1] = nn.Identity()
    return module
