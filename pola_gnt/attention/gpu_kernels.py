"""The fused Triton kernels on CUDA, for the dispatchers in `functional` and `view_functional`.

Three kernels: `triton_view` (GNT's view attention), `triton_ray` (the ray attention over up to 1024
samples) and `triton_kernel` (the linear form of longer sequences). A kernel is used when triton
imports, `POLA_GNT_TRITON_KERNELS` is not `0`, and it passes its first-use check: once per (kernel,
device, dtype, head dim), a small forward and backward with a key mask against the fp64 reference
(`reference`). The kernels are tested in Triton's CPU interpreter wherever the tests run, but a GPU,
driver or Triton version they have not met can still fail to compile them or compute something
else; then one warning says so and the PyTorch forms, which compute the same function, take over.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from pola_gnt.attention.reference import polarity_attention_reference

DISABLE_VARIABLE = "POLA_GNT_TRITON_KERNELS"

# First-use check results by (kernel, device, dtype, head dim).
_checked: dict[tuple[str, str, torch.dtype, int], bool] = {}

# Error allowed in the check, relative to each result's largest magnitude: fp32 kernels agree with
# the reference to ~1e-6; half-precision inputs carry 3 digits (bf16) or 4 (fp16).
_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _module(name: str) -> ModuleType | None:
    if os.environ.get(DISABLE_VARIABLE) == "0":
        return None
    try:
        return importlib.import_module(f"pola_gnt.attention.{name}")
    except ImportError:  # triton is optional
        return None


def view_attention(q: Tensor) -> Callable[..., Tensor] | None:
    """`triton_view.polarity_view_attention_triton` for queries `q` `[..., heads, d]`, or None."""
    kernels = _module("triton_view")
    if kernels is None or not kernels.view_triton_supported(q):
        return None
    return kernels.polarity_view_attention_triton if _passes_check("view", q, q.shape[-1], _check_view) else None


def ray_attention(q: Tensor, heads: int) -> Callable[..., Tensor] | None:
    """`triton_ray.polarity_ray_attention_triton` for `q` `[rays, samples, heads d]`, or None."""
    kernels = _module("triton_ray")
    head_dim = q.shape[-1] // heads
    if kernels is None or not kernels.ray_triton_supported(q, head_dim, q.shape[-2]):
        return None
    return kernels.polarity_ray_attention_triton if _passes_check("ray", q, head_dim, _check_ray, heads) else None


def linear_attention(q: Tensor) -> Callable[..., Tensor] | None:
    """`triton_kernel.polarity_attention_triton` for queries `q` `[..., Nq, d]`, or None."""
    kernels = _module("triton_kernel")
    if kernels is None or not kernels.triton_supported(q):
        return None
    return kernels.polarity_attention_triton if _passes_check("linear", q, q.shape[-1], _check_linear) else None


def _passes_check(kernel: str, q: Tensor, head_dim: int, check: Callable[..., None], *args: Any) -> bool:
    """Whether `kernel` passed `check(device, dtype, head_dim, *args)` for `q`'s device and dtype (run once)."""
    key = (kernel, str(q.device), q.dtype, head_dim)
    if key not in _checked:
        # Whatever the caller's mode (rendering runs under inference mode and autocast), the check
        # needs gradients and the inputs' own dtype.
        with torch.inference_mode(False), torch.enable_grad(), torch.autocast(q.device.type, enabled=False):
            try:
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


def _inputs(shapes: dict[str, tuple[int, ...]], device: torch.device, dtype: torch.dtype):
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


def _compare(kernel_out: Tensor, kernel_leaves: dict[str, Tensor], exact_out: Tensor, exact_leaves: dict[str, Tensor]):
    """Values and the gradients of every leaf for one random output gradient, relative to scale."""
    grad = torch.randn(exact_out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    names = list(exact_leaves)
    exact_grads = torch.autograd.grad(exact_out, [exact_leaves[n] for n in names], grad)
    kernel_grads = torch.autograd.grad(
        kernel_out, [kernel_leaves[n] for n in names], grad.to(kernel_out.device, kernel_out.dtype)
    )
    tolerance = _TOLERANCE[kernel_out.dtype]
    for name, got, expected in [("output", kernel_out, exact_out), *zip(names, kernel_grads, exact_grads)]:
        error = (got.detach().double().cpu() - expected.detach()).abs().max().item()
        scale = expected.detach().abs().max().item()
        if not error <= tolerance * scale + 1e-6:
            raise RuntimeError(f"{name} differs from the reference by {error:.3g} (scale {scale:.3g})")


def _check_view(device: torch.device, dtype: torch.dtype, head_dim: int) -> None:
    points, views, heads = 37, 5, 2
    shapes = {"q": (points, heads, head_dim), "k": (points, views, heads, head_dim)}
    shapes |= {"v": shapes["k"], "temp_same": (heads, 2 * head_dim), "temp_opp": (heads, 2 * head_dim)}
    exact, leaves = _inputs(shapes, device, dtype)
    mask = torch.rand(points, views, generator=torch.Generator().manual_seed(2)) > 0.3
    kernel = _module("triton_view")
    assert kernel is not None
    out = kernel.polarity_view_attention_triton(*leaves.values(), mask.to(device, torch.float32))
    expected = polarity_attention_reference(
        exact["q"].unsqueeze(-2),
        exact["k"].transpose(1, 2),
        exact["v"].transpose(1, 2),
        exact["temp_same"].unsqueeze(-2),
        exact["temp_opp"].unsqueeze(-2),
        mask.unsqueeze(1).expand(points, heads, views),
    ).squeeze(-2)
    _compare(out, leaves, expected, exact)


def _check_ray(device: torch.device, dtype: torch.dtype, head_dim: int, heads: int) -> None:
    rays, samples = 3, 45
    shapes = {name: (rays, samples, heads * head_dim) for name in ("q", "k", "v")}
    shapes |= {"temp_same": (heads, 2 * head_dim), "temp_opp": (heads, 2 * head_dim)}
    exact, leaves = _inputs(shapes, device, dtype)
    mask = torch.rand(rays, samples, generator=torch.Generator().manual_seed(2)) > 0.3
    kernel = _module("triton_ray")
    assert kernel is not None
    out = kernel.polarity_ray_attention_triton(*leaves.values(), mask.to(device, torch.float32), heads)

    def split(x: Tensor) -> Tensor:
        return x.unflatten(-1, (heads, head_dim)).transpose(1, 2)

    expected = polarity_attention_reference(
        split(exact["q"]),
        split(exact["k"]),
        split(exact["v"]),
        exact["temp_same"].unsqueeze(-2),
        exact["temp_opp"].unsqueeze(-2),
        mask.unsqueeze(1).expand(rays, heads, samples),
    )
    _compare(out, leaves, expected.transpose(1, 2).flatten(-2), exact)


def _check_linear(device: torch.device, dtype: torch.dtype, head_dim: int) -> None:
    heads, length = 2, 70
    shapes = {name: (1, heads, length, head_dim) for name in ("q", "k", "v")}
    shapes |= {"temp_same": (heads, 2 * head_dim), "temp_opp": (heads, 2 * head_dim)}
    exact, leaves = _inputs(shapes, device, dtype)
    mask = torch.rand(1, heads, length, generator=torch.Generator().manual_seed(2)) > 0.3
    kernel = _module("triton_kernel")
    assert kernel is not None
    out = kernel.polarity_attention_triton(
        leaves["q"], leaves["k"], leaves["v"], leaves["temp_same"].unsqueeze(-2), leaves["temp_opp"].unsqueeze(-2),
        mask.to(device),
    )  # fmt: skip
    expected = polarity_attention_reference(
        exact["q"], exact["k"], exact["v"], exact["temp_same"].unsqueeze(-2), exact["temp_opp"].unsqueeze(-2), mask
    )
    _compare(out, leaves, expected, exact)
