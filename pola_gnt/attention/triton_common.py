"""What the three fused Triton kernels share (`linear.triton_form`, `ray.triton_form`,
`view.triton_form`): the input limits, the `expm1` of their feature maps, and their launch call, which
can record launches instead of running them (`recorded_launches`) so that they are compiled ahead of
time for a GPU that need not be there (`compile_launch`: the lookups' resource check, the AOT test).

On the CPU the kernels run in Triton's interpreter when `TRITON_INTERPRET=1` is set before triton is
first imported (Triton picks interpreter or compiler when `@triton.jit` runs, and `triton.language`'s
own helpers such as `tl.zeros` are jit functions decorated at its import). libdevice is unavailable
there, hence `expm1` here.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, no_type_check, runtime_checkable

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton import knobs
from triton.backends.compiler import GPUTarget

# Input dtypes of every kernel (they compute in fp32 themselves; fp64 stays on the PyTorch forms),
# and the widest head of the linear and ray kernels (the view kernel's own limit is lower).
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128

# Blocks are at least 16 wide: the smallest shape `tl.dot` accepts (padding lanes are masked).
MIN_BLOCK = 16


def interpreting() -> bool:
    """Whether the kernels run in Triton's CPU interpreter (`TRITON_INTERPRET=1`) rather than compiled."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def on_kernel_device(x: Tensor) -> bool:
    """Whether the kernels can run on `x`'s device: CUDA, or any device under `TRITON_INTERPRET=1`."""
    return x.is_cuda or interpreting()


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


@dataclass(frozen=True)
class Launch:
    """One kernel launch as `launch` was asked for it: the kernel, its grid, arguments and options."""

    kernel: Any  # a triton JITFunction
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    options: dict[str, Any]

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__


_recording = threading.local()  # `launches`: the list of this thread's `recorded_launches`, if any


def launch(kernel: Kernel, grid: tuple[int, ...], *args: Any, **options: Any) -> None:
    """`kernel[grid](*args, **options)`, or, inside `recorded_launches` (this thread), its record.
    Triton's launcher takes launch options (`num_warps`) besides the kernel's own parameters, which the
    type of its `__getitem__` (the kernel's) does not show."""
    launches = getattr(_recording, "launches", None)
    if launches is not None:
        launches.append(Launch(kernel, grid, args, options))
        return
    kernel[grid](*args, **options)


@contextmanager
def recorded_launches() -> Iterator[list[Launch]]:
    """Inside, `launch` records what it is asked to launch in the yielded list and runs nothing (this
    thread only). With the kernels' forms called on `meta` tensors (no memory, no device), this is
    every launch of a forward and backward, with the arguments' dtypes, strides and sizes, ready for
    `compile_launch` (the outputs are left unwritten)."""
    previous = getattr(_recording, "launches", None)
    _recording.launches = launches = []
    try:
        yield launches
    finally:
        _recording.launches = previous


def compile_launch(launch: Launch, target: GPUTarget) -> Any:
    """`launch`'s kernel compiled for `target` (e.g. `GPUTarget("cuda", 90, 32)`, an H100) as Triton's
    launcher would compile it there: the same specialisation of the arguments (dtypes, 16-byte
    alignment of pointers, integers equal to 1 or multiples of 16) and options, through Triton's
    cache; no GPU needed. Returns Triton's `CompiledKernel` (`metadata.shared`: bytes of shared
    memory; `asm["ptx"]`, `asm["cubin"]`). Uses the launcher's own binding (`triton.runtime.jit`,
    Triton 3.x), so a Triton that changes it fails here, in the AOT test, rather than on a GPU."""
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = launch.kernel
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    options = {
        **launch.options,
        "debug": launch.options.get("debug", kernel.debug) or knobs.runtime.debug,
        "instrumentation_mode": knobs.compilation.instrumentation_mode,
    }
    bound_args, specialization, parsed = binder(*launch.args, **options)
    parsed, signature, constexprs, attrs = kernel._pack_args(backend, options, bound_args, specialization, parsed)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=parsed.__dict__)
