"""Full-image rendering in ray chunks, without gradients: memory is bounded by the chunk size."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from pola_gnt.geometry.rays import Rays, pixel_grid, pixel_rays
from pola_gnt.model.gnt import GNT, SourceViews
from pola_gnt.model.inference import FastRenderNetwork
from pola_gnt.model.sampler import DepthSampler

RenderNetwork = GNT | FastRenderNetwork  # model.inference.render_network: the GNT (fp32) or its bf16 copy


@dataclass
class RenderedImage:
    rgb: Float[Tensor, "height width 3"]  # clipped to [0, 1]
    depth: Float[Tensor, "height width"]  # expected camera z-depth


@torch.inference_mode()
def render_rays(
    model: RenderNetwork,
    rays: Rays,
    sources: SourceViews,
    depth_range: tuple[float, float],
    sampler: DepthSampler,
    chunk_rays: int,
) -> tuple[Float[Tensor, "rays 3"], Float[Tensor, " rays"]]:
    """Colour `[rays, 3]` (clipped) and depth `[rays]` with deterministic samples, `chunk_rays` at a time."""
    colours, depths = [], []
    for start in range(0, len(rays), chunk_rays):
        chunk = rays[start : start + chunk_rays]
        samples = sampler(chunk, depth_range)
        output = model(chunk, samples, sources)
        colours.append(output.rgb.float().clamp(0.0, 1.0))
        depths.append(output.depth.float())
    return torch.cat(colours), torch.cat(depths)


@torch.inference_mode()
def render_image(
    model: RenderNetwork,
    c2w: Float[Tensor, "4 4"],
    intrinsics: Float[Tensor, "3 3"],
    height: int,
    width: int,
    sources: SourceViews,
    depth_range: tuple[float, float],
    sampler: DepthSampler,
    chunk_rays: int,
    stride: int = 1,
) -> RenderedImage:
    """Render the camera (`c2w` `[4, 4]`, `intrinsics` `[3, 3]`) at every `stride`-th pixel."""
    rows, cols = len(range(0, height, stride)), len(range(0, width, stride))
    pixels = pixel_grid(rows, cols, device=c2w.device) * stride
    rays = pixel_rays(c2w, intrinsics, pixels)
    rgb, depth = render_rays(model, rays, sources, depth_range, sampler, chunk_rays)
    return RenderedImage(rgb=rgb.reshape(rows, cols, 3), depth=depth.reshape(rows, cols))
