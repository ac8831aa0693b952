"""Which form computes a fused attention op: the Triton kernel on CUDA, else the C++ kernel on the
CPU, else the PyTorch form. The forms compute the same function (the tests hold each to the fp64
reference); `dispatch` keeps their order and the conditions they share, and each op
(`linear.op.polarity_attention`, `ray.op.polarity_ray_attention`, `ray.op.add_lepe`,
`view.op.polarity_view_attention`) names its forms and what its fused kernels need:

    Triton   CUDA inputs, `fused`, and the op's `triton_kernel` lookup returns a kernel (dtype, head
             dim and length limits in the op's `triton_form`; the switch and the first-use check in
             `triton_lookup`)
    C++      CPU inputs, `fused`, and `cpu_extension.usable` takes the first input, in the compute
             precision of `features.compute_precision` (fp64 stays fp64, the rest becomes fp32) unless
             `cast_for_cpu` is False, with the op's head dim and number of views; bf16 inputs without
             autograd go in as they are (`render.precision: bf16`: the kernels compute in float32)
    PyTorch  everything else
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from pola_gnt.attention import cpu_extension
from pola_gnt.attention.features import compute_precision

Kernel = Callable[..., Tensor]


def dispatch(
    inputs: Sequence[Tensor],
    *,
    pytorch: Callable[[], Tensor],
    triton: Callable[[Kernel], Tensor] | None = None,
    triton_lookup: Callable[[], Kernel | None] | None = None,
    cpu: Callable[..., Tensor] | None = None,
    head_dim: int | None = None,
    views: int = 1,
    fused: bool = True,
    cast_for_cpu: bool = True,
) -> Tensor:
    """The result of the first form that takes `inputs` (the op's tensors, queries or values first):

    1. `triton(kernel)` for CUDA inputs, where `triton_lookup()` finds a kernel (the op's `triton_kernel`);
    2. `cpu(*inputs)` for CPU inputs the C++ kernels take (`cpu_extension.usable` with `head_dim`, None
       for the LePE, and `views`); with `cast_for_cpu` the inputs come in the compute precision with
       autocast off, and the result goes back to the first input's dtype;
    3. `pytorch()`.

    `fused=False` (inputs that no fused kernel of the op takes, such as per-point temperatures) skips
    1 and 2. The lookups run only where their form is next in line: they compile and check kernels.
    """
    first = inputs[0]
    if fused and triton is not None and triton_lookup is not None and first.is_cuda:
        kernel = triton_lookup()
        if kernel is not None:
            return triton(kernel)
    # The device test first: the casts below are wasted on tensors the C++ kernels never take.
    if fused and cpu is not None and first.device.type == "cpu":
        if not cast_for_cpu:
            if cpu_extension.usable(first, head_dim, views):
                return cpu(*inputs)
        elif first.dtype == torch.bfloat16 and not torch.is_grad_enabled():
            # bf16 inference: the kernels read the bf16 activations as they are (no cast, half the
            # memory traffic), compute in float32 and write bf16; parameters (temperatures) in float32.
            if cpu_extension.usable(first, head_dim, views):
                return cpu(*(x if x.dtype == torch.bfloat16 else x.float() for x in inputs))
        else:
            with compute_precision(*inputs) as cast:
                if cpu_extension.usable(cast[0], head_dim, views):
                    return cpu(*cast).to(first.dtype)
    return pytorch()
