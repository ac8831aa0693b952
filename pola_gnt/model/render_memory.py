"""Rays per rendering pass under a memory budget (`render.max_memory_mb`), for the test phase,
`render_video` and the viewer: `render.chunk_rays` is the most rays per pass, and fewer when that many
would not fit, or on a CPU would not stay in its caches (`CPU_PASS_MB`); and how many passes run at
once on a CPU (`render.workers`, `model.renderer.render_rays`) within the same budget. Neither changes a
pixel (a ray's result does not depend on the rays beside it: tests/test_render_kernels.py).

The estimate: the largest activations of a pass are the view transformer's per (ray, sample, view)
tensors of the network's width (queries, keys, values, gates, the FFN's hidden layer and the residual
stream live together) next to the gathered source features and colours, all float32. It is an upper
estimate, not a measurement: `ACTIVATIONS_PER_POINT` such tensors at once.
"""

from __future__ import annotations

import torch

from pola_gnt.model.backbone import ALEXNET_CONVS
from pola_gnt.model.settings import NetSettings, RenderSettings

ACTIVATIONS_PER_POINT = 8  # width-sized float32 tensors per (ray, sample, view) alive at once, at most
CPU_BUDGET_MB = 1024.0  # the default budget on a CPU: a laptop's share
CUDA_FREE_FRACTION = 0.5  # the default budget on a CUDA device: this much of its free memory
# Beyond about this estimate a pass's activations leave a CPU's caches between the network's steps, each of
# which reads the last one's output: the quick preset's 4 source views (165 KB a ray at 32 samples) rendered
# fastest at 1024 rays a pass, the shipped models' 8 views (330 KB) at 512, 1.15x the speed of 1024
# (docs/benchmarks.md), both about this size.
CPU_PASS_MB = 176.0
_BYTES = 4  # float32


def bytes_per_ray(net: NetSettings, n_samples: int, num_source_views: int) -> int:
    """Estimated peak activation bytes of one ray in a rendering pass."""
    per_point = ACTIVATIONS_PER_POINT * net.width + net.encoder.feature_channels + 3
    if net.readout_consistency_features:  # the feature consistency's reads, and their deviations from the mean
        channels = ALEXNET_CONVS[net.readout_consistency_feature_layer - 1][2]
        per_point += 2 * (min(net.readout_consistency_feature_dims, channels) or channels)
    return _BYTES * n_samples * num_source_views * per_point


def default_budget_mb(device: torch.device) -> float:
    """The budget when `render.max_memory_mb` is null: `CPU_BUDGET_MB` on a CPU, half the free
    memory of a CUDA device."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return CUDA_FREE_FRACTION * free / 2**20
    return CPU_BUDGET_MB


def budget_mb_of(render: RenderSettings, device: torch.device) -> float:
    """`render.max_memory_mb`, or the device's default (`default_budget_mb`) where it is null."""
    return render.max_memory_mb if render.max_memory_mb is not None else default_budget_mb(device)


def budget_chunk_rays(render: RenderSettings, net: NetSettings, num_source_views: int, device: torch.device) -> int:
    """Rays per pass: `render.chunk_rays`, or fewer so that a pass fits `render.max_memory_mb` and, on a
    CPU, `CPU_PASS_MB` (at least one ray)."""
    budget_mb = budget_mb_of(render, device)
    if device.type == "cpu":
        budget_mb = min(budget_mb, CPU_PASS_MB)
    fitting = int(budget_mb * 2**20 // bytes_per_ray(net, render.n_samples, num_source_views))
    return max(1, min(render.chunk_rays, fitting))


def render_workers(
    render: RenderSettings, net: NetSettings, num_source_views: int, chunk_rays: int, device: torch.device
) -> int:
    """Chunks rendered at once: 1 on a CUDA device; on a CPU `render.workers`, or (null) one per thread
    torch uses, as many of `chunk_rays` rays as fit `render.max_memory_mb` together (at least one)."""
    if device.type != "cpu":
        return 1
    if render.workers is not None:
        return render.workers
    budget_mb = budget_mb_of(render, device)
    fitting = int(budget_mb * 2**20 // (chunk_rays * bytes_per_ray(net, render.n_samples, num_source_views)))
    return max(1, min(torch.get_num_threads(), fitting))
