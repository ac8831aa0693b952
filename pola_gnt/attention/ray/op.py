"""The ray attention ops: `polarity_ray_attention`, polarity self-attention over the samples of each
ray with the heads in place, and `add_lepe`, the LePE's convolution along the samples.

`polarity_ray_attention`'s forms compute the same function: the fused Triton kernel on CUDA
(`triton_form`), the fused C++ kernel on the CPU (`cpu_form`), else `polarity_attention` on the
heads-split tensors (`linear.op`, whose linear form over short sequences is `pytorch_form`);
`dispatch` picks one. The LePE has a C++ form and a PyTorch form (`pytorch_form`), no Triton form.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn

from pola_gnt.attention import triton_lookup
from pola_gnt.attention.dispatch import Kernel, dispatch
from pola_gnt.attention.linear.op import polarity_attention
from pola_gnt.attention.ray.cpu_form import polarity_ray_attention_cpu, samples_conv_cpu
from pola_gnt.attention.ray.pytorch_form import depthwise_conv_along_samples
from pola_gnt.attention.reference import polarity_attention_reference


def polarity_ray_attention(
    q: Float[Tensor, "rays samples dim"],
    k: Float[Tensor, "rays samples dim"],
    v: Float[Tensor, "rays samples dim"],
    temp_same: Float[Tensor, "heads d2"],
    temp_opp: Float[Tensor, "heads d2"],
    sample_mask: Bool[Tensor, "rays samples"] | None,
    heads: int,
) -> Float[Tensor, "rays samples dim"]:
    """Polarity self-attention over the samples of each ray with the heads in place: `q, k, v`
    `[rays, samples, heads * d]` (channels contiguous, rows may be strided, as the chunks of one
    projection are), temperatures `[heads, 2d]`. The same function as `polarity_attention` on the
    heads-split tensors; on the CPU the fused kernel (`cpu_form`) computes it in one pass, on CUDA
    the fused Triton kernel (`triton_form`, rays of up to `MAX_SAMPLES` samples; it reads the input
    dtype and computes in fp32 itself)."""

    def triton(kernel: Kernel) -> Tensor:  # reads every input dtype, computes in fp32 itself
        visible = None if sample_mask is None else sample_mask.to(torch.float32)
        return kernel(q, k, v, temp_same, temp_opp, visible, heads)

    def cpu(q_: Tensor, k_: Tensor, v_: Tensor, temp_same_: Tensor, temp_opp_: Tensor) -> Tensor:
        visible = None if sample_mask is None else sample_mask.to(q_.dtype)
        return polarity_ray_attention_cpu(q_, k_, v_, temp_same_, temp_opp_, visible, heads)

    def pytorch() -> Tensor:  # the heads-split form
        q_heads, k_heads, v_heads = (x.unflatten(-1, (heads, -1)).transpose(-2, -3) for x in (q, k, v))
        mask = None if sample_mask is None else sample_mask.unsqueeze(-2).expand(*k_heads.shape[:-1])
        out = polarity_attention(q_heads, k_heads, v_heads, temp_same.unsqueeze(-2), temp_opp.unsqueeze(-2), mask)
        return out.transpose(-2, -3).flatten(-2)

    return dispatch(
        (q, k, v, temp_same, temp_opp),
        triton=triton,
        triton_lookup=lambda: triton_kernel(q, heads),
        cpu=cpu,
        head_dim=q.shape[-1] // heads,
        pytorch=pytorch,
    )


def add_lepe(
    attended: Float[Tensor, "rays samples dim"],
    v: Float[Tensor, "rays samples dim"],
    sample_mask: Bool[Tensor, "rays samples"] | None,
    lepe: nn.Conv1d,
) -> Float[Tensor, "rays samples dim"]:
    """`attended + lepe(v)` with masked samples' values zeroed: `lepe` a depthwise, zero-padded,
    odd-sized convolution along the samples of each ray (`PolaRayAttention`'s LePE)."""

    def cpu(v: Tensor, attended: Tensor) -> Tensor:
        visible = None if sample_mask is None else sample_mask.to(v.dtype)
        weight = lepe.weight[:, 0, :].t()  # [kernel, dim]
        bias = lepe.bias
        if v.dtype == torch.bfloat16:  # bf16 rendering: the kernel sums in fp32 with fp32 weights
            weight, bias = weight.float(), None if bias is None else bias.float()
        return samples_conv_cpu(v, weight, bias, visible, attended)

    def pytorch() -> Tensor:
        masked = v if sample_mask is None else v * sample_mask.unsqueeze(-1).to(v.dtype)
        return attended + depthwise_conv_along_samples(masked, lepe)

    # The C++ kernel writes `attended + conv(v)` in one dtype and takes fp32/fp64 `v` as it is
    # (no compute-precision cast: half-precision `v` stays on the PyTorch form). No Triton form.
    return dispatch((v, attended), cpu=cpu, pytorch=pytorch, fused=v.dtype == attended.dtype, cast_for_cpu=False)


def triton_kernel(q: Tensor, heads: int) -> Kernel | None:
    """`triton_form.polarity_ray_attention_triton` for `q` `[rays, samples, heads d]` where it runs
    (`triton_lookup`), or None."""
    kernels = triton_lookup.triton_form("ray")
    head_dim = q.shape[-1] // heads
    if kernels is None or not kernels.ray_triton_supported(q, head_dim, q.shape[-2]):
        return None
    passed = triton_lookup.passes_check("ray", q, head_dim, _check_triton, heads)
    return kernels.polarity_ray_attention_triton if passed else None


def _check_triton(device: torch.device, dtype: torch.dtype, head_dim: int, heads: int) -> None:
    """The Triton kernel's first-use check: against the fp64 reference, with a sample mask."""
    rays, samples = 3, 45
    shapes = {name: (rays, samples, heads * head_dim) for name in ("q", "k", "v")}
    shapes |= {"temp_same": (heads, 2 * head_dim), "temp_opp": (heads, 2 * head_dim)}
    exact, leaves = triton_lookup.random_leaves(shapes, device, dtype)
    mask = triton_lookup.check_mask(rays, samples)
    kernel = triton_lookup.triton_form("ray")
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
    triton_lookup.compare(out, leaves, expected.transpose(1, 2).flatten(-2), exact)
