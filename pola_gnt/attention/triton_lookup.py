"""Whether an op's fused Triton kernel runs on CUDA, for the ops' lookups (`linear.op`, `view.op`, `ray.op`).

Three kernels: `view.triton_form` (GNT's view attention), `ray.triton_form` (the ray attention over up
to 1024 samples) and `linear.triton_form` (the linear form of longer sequences). A kernel is used when
triton imports, `POLA_GNT_TRITON_KERNELS` is not `0`, and, once per (kernel, device, dtype, head dim):
1. it fits the GPU (`launch_refusal`): the launches of that small forward and backward, recorded on
   `meta` tensors and compiled for the GPU's target, need no more shared memory per block than it
   has (an A100 has 163 KB, an H100 227 KB); else one warning gives the reason, and no check runs;
2. it passes its first-use check: a small forward and backward with a key mask against the fp64
   reference (`reference`), which each op writes with `random_leaves` and `compare`.
The kernels are tested in Triton's CPU interpreter wherever the tests run and compiled ahead of time
for A100 and H100 (`tests/test_triton_aot.py`), but a GPU, driver or Triton version they have not met
can still fail to compile them or compute something else; then one warning says so and the PyTorch
forms, which compute the same function, take over.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from triton.backends.compiler import GPUTarget

DISABLE_VARIABLE = "POLA_GNT_TRITON_KERNELS"

# First-use check results by (kernel, device, dtype, head dim).
_checked: dict[tuple[str, str, torch.dtype, int], bool] = {}

# Error allowed in the check, relative to each result's largest magnitude: fp32 kernels agree with
# the reference to ~1e-6; half-precision inputs carry 3 digits (bf16) or 4 (fp16).
_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def triton_form(op: str) -> ModuleType | None:
    """The op's Triton form, `pola_gnt.attention.<op>.triton_form`, or None where triton does not
    import or `POLA_GNT_TRITON_KERNELS=0` switches the kernels off."""
    if os.environ.get(DISABLE_VARIABLE) == "0":
        return None
    try:
        return importlib.import_module(f"pola_gnt.attention.{op}.triton_form")
    except ImportError:  # triton is optional
        return None


def passes_check(kernel: str, q: Tensor, head_dim: int, check: Callable[..., None], *args: Any) -> bool:
    """Whether `kernel` fits `q`'s GPU and passed `check(device, dtype, head_dim, *args)` for `q`'s
    device and dtype (both once per key). `check` also runs on `meta` tensors: there it only records
    the launches (`launch_refusal`)."""
    key = (kernel, str(q.device), q.dtype, head_dim)
    if key not in _checked:
        # Whatever the caller's mode (rendering runs under inference mode and autocast), the check
        # needs gradients and the inputs' own dtype.
        with torch.inference_mode(False), torch.enable_grad(), torch.autocast(q.device.type, enabled=False):
            try:
                limits = device_limits(q.device)
                refusal = None
                if limits is not None:
                    refusal = launch_refusal(lambda device: check(device, q.dtype, head_dim, *args), *limits)
                if refusal is not None:
                    warnings.warn(
                        f"pola_gnt: the Triton {kernel} attention kernel cannot run on {q.device} ({q.dtype}, "
                        f"head dim {head_dim}): {refusal}; using the PyTorch form (same function, slower).",
                        RuntimeWarning,
                        stacklevel=4,
                    )
                    _checked[key] = False
                else:
                    check(q.device, q.dtype, head_dim, *args)
                    _checked[key] = True
            except Exception as error:  # a compilation error, or results that differ from the reference
                first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
                warnings.warn(
                    f"pola_gnt: the Triton {kernel} attention kernel failed its first-use check on "
                    f"{q.device} ({q.dtype}, head dim {head_dim}: {first_line}); using the PyTorch form "
                    f"(same function, slower). Set {DISABLE_VARIABLE}=0 to skip the kernels.",
                    RuntimeWarning,
                    stacklevel=4,
                )
                _checked[key] = False
    return _checked[key]


def device_limits(device: torch.device) -> tuple[GPUTarget, int] | None:
    """A CUDA device's compile target and shared memory per block (bytes, opt-in); None elsewhere (the
    interpreter has no such limit)."""
    if device.type != "cuda":
        return None
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    with torch.cuda.device(device):
        target = driver.active.get_current_target()
    assert isinstance(target, GPUTarget), target
    return target, torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def launch_refusal(record: Callable[[torch.device], None], target: GPUTarget, shared_limit: int) -> str | None:
    """Why the kernels that `record(device)` launches cannot run on a GPU of `target` with
    `shared_limit` bytes of shared memory per block, or None where they can: `record` runs on the
    `meta` device (nothing computed), its launches are compiled for `target` (`triton_common.
    compile_launch`, through Triton's cache: the launch compiles them anyway) and each kernel's
    shared memory is held to the limit. Registers need no such test: ptxas spills what does not fit."""
    from pola_gnt.attention.triton_common import compile_launch, recorded_launches

    with recorded_launches() as launches:
        record(torch.device("meta"))
    for launch in launches:
        shared = compile_launch(launch, target).metadata.shared
        if shared > shared_limit:
            return (
                f"its kernel {launch.name} needs {shared / 1024:.0f} KB of shared memory per block, "
                f"the GPU has {shared_limit / 1024:.0f} KB"
            )
    return None


def random_leaves(shapes: dict[str, tuple[int, ...]], device: torch.device, dtype: torch.dtype):
    """Random leaves `q, k, v` (at scale 3: some features far from linear) and temperatures, in fp64
    on the CPU (for the reference) and as the kernel's inputs."""
    generator = torch.Generator().manual_seed(0)
    exact = {
        name: torch.rand(*shape, generator=generator, dtype=torch.float64) * 0.9 + 0.1  # temperatures in (0.1, 1)
        if name.startswith("temp")
        else 3.0 * torch.randn(*shape, generator=generator, dtype=torch.float64)
        for name, shape in shapes.items()
    }
    exact = {name: x.requires_grad_() for name, x in exact.items()}
    kernel = {
        name: x.detach().to(device=device, dtype=torch.float32 if name.startswith("temp") else dtype).requires_grad_()
        for name, x in exact.items()
    }
    return exact, kernel


def check_mask(*shape: int) -> Tensor:
    """The checks' key mask: bool `shape`, about 70% True (a fixed draw)."""
    return torch.rand(*shape, generator=torch.Generator().manual_seed(2)) > 0.3


def compare(kernel_out: Tensor, kernel_leaves: dict[str, Tensor], exact_out: Tensor, exact_leaves: dict[str, Tensor]):
    """Values and the gradients of every leaf for one random output gradient, relative to scale."""
    grad = torch.randn(exact_out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    names = list(exact_leaves)
    exact_grads = torch.autograd.grad(exact_out, [exact_leaves[n] for n in names], grad)
    kernel_grads = torch.autograd.grad(
        kernel_out, [kernel_leaves[n] for n in names], grad.to(kernel_out.device, kernel_out.dtype)
    )
    if kernel_out.is_meta:  # `launch_refusal`'s run: the forward and backward launches are recorded
        return
    tolerance = _TOLERANCE[kernel_out.dtype]
    for name, got, expected in [("output", kernel_out, exact_out), *zip(names, kernel_grads, exact_grads)]:
        error = (got.detach().double().cpu() - expected.detach()).abs().max().item()
        scale = expected.detach().abs().max().item()
        if not error <= tolerance * scale + 1e-6:
            raise RuntimeError(f"{name} differs from the reference by {error:.3g} (scale {scale:.3g})")
