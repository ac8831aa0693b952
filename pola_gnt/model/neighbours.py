"""Neighbouring rays agree: the consistency prior's spread aggregated over a window of rays on the same
depth plane (`model.net.readout_neighbour_windows`), the classic cost aggregation of stereo.

A plane sweep judges each pixel alone: on a textureless wall every depth looks alike and the choice
streaks, and a pixel whose colours alias across the views picks a wrong plane by chance. Averaging each
depth plane's spread over the rays around a pixel lets the neighbours vote. Rays of an image (or of a
training patch) share their depth planes: samples are uniform in inverse depth and a ray's depth is its
camera z-depth, so the samples of one index lie on one fronto-parallel plane (training jitters them
once per patch for that, `DepthSampler`).

The windows are square, `2 r + 1` rays a side, clipped at the grid's edges (the mean over the rays that
exist); their half-widths `r` are fractions of the image's longer side, so a window covers the same
part of the view at any resolution or stride. Several windows are averaged: the spread of the pixel
itself (a window of 0), a few rays and a wider patch, as a cost pyramid aggregates across scales
(measured: docs/results.md).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from pola_gnt.geometry.rays import RayGrid

PLANES_AT_ONCE = 8


def box_mean(
    values: Float[Tensor, "patches rows cols channels"], radius: int
) -> Float[Tensor, "patches rows cols channels"]:
    """The mean of `values` over the `2 radius + 1` square around each ray, clipped at the grid's edges:
    two passes of running sums (rows, then columns; a clipped square is a rectangle, so its mean
    separates), in fp64 so that long sums lose nothing, fp32 out."""
    if radius == 0:
        return values.float()
    out = values.double()
    for dim in (1, 2):
        count = out.shape[dim]
        sums = torch.cumsum(out, dim=dim)
        sums = torch.cat([torch.zeros_like(sums.narrow(dim, 0, 1)), sums], dim=dim)
        index = torch.arange(count, device=values.device)
        high, low = (index + radius + 1).clamp(max=count), (index - radius).clamp(min=0)
        shape = [1, 1, 1, 1]
        shape[dim] = count
        out = (sums.index_select(dim, high) - sums.index_select(dim, low)) / (high - low).view(shape).double()
    return out.float()


def aggregate_spread(
    spread: Float[Tensor, "rays samples"], grid: RayGrid, windows: tuple[float, ...]
) -> Float[Tensor, "rays samples"]:
    """Each ray's spread at each sample averaged over the `windows` (`box_mean` of each, then their mean)
    of its grid (`RayGrid`; its rays in order)."""
    if len(spread) != grid.rays:
        raise ValueError(f"aggregate_spread: {len(spread)} rays, but the grid holds {grid.rays}")
    planes = spread.float().reshape(grid.patches, grid.rows, grid.cols, -1)
    radii = grid.radii(windows)
    out = torch.empty_like(planes)
    # A few depth planes at a time: the running sums of a whole 1008 x 756 image at 32 planes are 200 MB each.
    for first in range(0, planes.shape[-1], PLANES_AT_ONCE):
        part = planes[..., first : first + PLANES_AT_ONCE]
        total = sum((box_mean(part, radius) for radius in radii), torch.zeros_like(part))
        out[..., first : first + PLANES_AT_ONCE] = total / len(radii)
    return out.reshape(spread.shape)
