"""What the three fused Triton kernels share (`linear.triton_form`, `ray.triton_form`,
`view.triton_form`): the input limits, the `expm1` of their feature maps, and their launch call.

On the CPU the kernels run in Triton's interpreter when `TRITON_INTERPRET=1` is set before triton is
first imported (Triton picks interpreter or compiler when `@triton.jit` runs, and `triton.language`'s
own helpers such as `tl.zeros` are jit functions decorated at its import). libdevice is unavailable
there, hence `expm1` here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol, no_type_check, runtime_checkable

import torch
import triton
import triton.language as tl
from torch import Tensor

# Input dtypes of every kernel (they compute in fp32 themselves; fp64 stays on the PyTorch forms),
# and the widest head of the linear and ray kernels (the view kernel's own limit is lower).
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128

# Blocks are at least 16 wide: the smallest shape `tl.dot` accepts (padding lanes are masked).
MIN_BLOCK = 16


def on_kernel_device(x: Tensor) -> bool:
    """Whether the kernels can run on `x`'s device: CUDA, or any device under `TRITON_INTERPRET=1`."""
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
@no_type_check  # compiled by triton from its source; not a Python call to check
def expm1(z):
    """expm1 for z >= 0 (libdevice is unavailable in the interpreter): a degree-8 Taylor
    polynomial below 0.5 (truncation error < 1e-8 relative), where `exp(z) - 1` would lose digits."""
    taylor = 1.0 / 5040.0 + z * (1.0 / 40320.0)  # Horner, from the z^8 / 8! term down to z
    taylor = 1.0 / 720.0 + z * taylor
    taylor = 1.0 / 120.0 + z * taylor
    taylor = 1.0 / 24.0 + z * taylor
    taylor = 1.0 / 6.0 + z * taylor
    taylor = 0.5 + z * taylor
    taylor = z * (1.0 + z * taylor)
    return tl.where(z < 0.5, taylor, tl.exp(z) - 1.0)


@runtime_checkable
class Kernel(Protocol):
    """A `@triton.jit` kernel (compiled, or interpreted with `TRITON_INTERPRET=1`): `kernel[grid]` launches it."""

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., object]: ...


def launch(kernel: Kernel, grid: tuple[int, ...], *args: Any, **options: Any) -> None:
    """`kernel[grid](*args, **options)`. Triton's launcher takes launch options (`num_warps`) besides
    the kernel's own parameters, which the type of its `__getitem__` (the kernel's) does not show."""
    kernel[grid](*args, **options)
