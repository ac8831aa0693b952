"""Full-image rendering in ray chunks, without gradients: memory is bounded by the chunk size."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
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


class RenderCancelled(Exception):
    """`render_rays` stopped between two chunks because `cancelled()` turned true."""


@contextmanager
def chunk_threads(workers: int) -> Iterator[None]:
    """Torch operations inside run on the threads a render chunk has: one where `workers` chunks render
    at once, else the process's. For work a chunk would otherwise do on first use, done ahead of the
    render (a source image's prior part, `SourceViews.keep_prior_images`): a CPU convolution's order of
    sums follows its thread count, so the same threads give the same bits."""
    threads = torch.get_num_threads()
    if workers > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def _single_threaded_workers(workers: int) -> Iterator[ThreadPoolExecutor]:
    """A pool of `workers` threads whose torch operations each run on one thread (the process's thread
    count is restored afterwards). Threads started while the count is 1 take it as theirs."""
    with chunk_threads(workers), ThreadPoolExecutor(workers, thread_name_prefix="render") as pool:
        yield pool


@torch.inference_mode()
def render_rays(
    model: RenderNetwork,
    rays: Rays,
    sources: SourceViews,
    depth_range: tuple[float, float],
    sampler: DepthSampler,
    chunk_rays: int,
    workers: int = 1,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    peak_weights: list[Tensor] | None = None,
) -> tuple[Float[Tensor, "rays 3"], Float[Tensor, " rays"]]:
    """Colour `[rays, 3]` (clipped) and depth `[rays]` with deterministic samples, `chunk_rays` at a time.

    `workers` > 1 (on a CPU): that many chunks at once, each on one thread, instead of one chunk at a
    time on all of them: the network's many small operations share two threads badly (a 2-core CPU
    rendered 1.2-1.25x faster so, `render_workers`). Each chunk is computed as it would be alone, so the
    pixels do not depend on `workers`. `cancelled()` is asked before each chunk (RenderCancelled);
    `progress(rays done, rays in all)` is told after each chunk, in order. `peak_weights`, when given,
    gets each chunk's largest read-out weight per ray `[rays]` appended, in order (a confidence of the
    depth: `apps/export`)."""
    # The fast network's feature maps projected once, before the workers share them.
    projected = model.project(sources) if isinstance(model, FastRenderNetwork) else None
    starts = range(0, len(rays), chunk_rays)
    autocast = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")

    def render_chunk(start: int) -> tuple[Tensor, Tensor, Tensor]:
        # Inference mode and autocast are per thread: a worker takes the caller's.
        with torch.inference_mode(), torch.autocast("cpu", dtype=autocast[1], enabled=autocast[0]):
            chunk = rays[start : start + chunk_rays]
            depths = sampler(chunk, depth_range)
            if isinstance(model, FastRenderNetwork) and projected is not None:
                output = model(chunk, depths, projected)
            else:
                output = model(chunk, depths, sources)
            return output.rgb.float().clamp(0.0, 1.0), output.depth.float(), output.weights.float().amax(dim=-1)

    colours, depths = [], []

    def collect(start: int, result: tuple[Tensor, Tensor, Tensor]) -> None:
        colours.append(result[0])
        depths.append(result[1])
        if peak_weights is not None:
            peak_weights.append(result[2])
        if progress is not None:
            progress(min(start + chunk_rays, len(rays)), len(rays))

    def check_cancelled() -> None:
        if cancelled is not None and cancelled():
            raise RenderCancelled

    if workers <= 1 or len(starts) == 1 or rays.origins.device.type != "cpu":
        for start in starts:
            check_cancelled()
            collect(start, render_chunk(start))
    else:
        with _single_threaded_workers(workers) as pool:
            pending: deque[tuple[int, Future]] = deque()
            # Twice `workers` chunks submitted ahead, collected in order: a worker that finishes its chunk
            # takes the next at once instead of waiting while an earlier, slower chunk is collected (the
            # pool runs only `workers` at a time, so memory is still that of `workers` chunks).
            try:
                for start in starts:
                    check_cancelled()
                    pending.append((start, pool.submit(render_chunk, start)))
                    if len(pending) == 2 * workers:
                        first, future = pending.popleft()
                        collect(first, future.result())
                while pending:
                    first, future = pending.popleft()
                    collect(first, future.result())
            except BaseException:  # cancelled (or failed): chunks not started yet are dropped, not rendered
                for _, future in pending:
                    future.cancel()
                raise
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
    workers: int = 1,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    peak_weights: list[Tensor] | None = None,
) -> RenderedImage:
    """Render the camera (`c2w` `[4, 4]`, `intrinsics` `[3, 3]`) at every `stride`-th pixel, in square
    tiles of about `chunk_rays` pixels (`tile_order`; `workers`, `cancelled`, `progress`: `render_rays`).
    `peak_weights`, when given, gets the read-out's largest weight per pixel `[rows, cols]` appended
    (`render_rays(peak_weights=)`, back in row order)."""
    rows, cols = len(range(0, height, stride)), len(range(0, width, stride))
    order = tile_order(rows, cols, chunk_rays, device=c2w.device)
    pixels = pixel_grid(rows, cols, device=c2w.device)[order] * stride
    rays = pixel_rays(c2w, intrinsics, pixels)
    tiled_peaks: list[Tensor] | None = [] if peak_weights is not None else None
    tiled_rgb, tiled_depth = render_rays(
        model, rays, sources, depth_range, sampler, chunk_rays, workers, cancelled, progress, peak_weights=tiled_peaks
    )
    rgb, depth = torch.empty_like(tiled_rgb), torch.empty_like(tiled_depth)
    rgb[order], depth[order] = tiled_rgb, tiled_depth
    if peak_weights is not None and tiled_peaks is not None:
        peak = torch.empty_like(tiled_depth)
        peak[order] = torch.cat(tiled_peaks)
        peak_weights.append(peak.reshape(rows, cols))
    return RenderedImage(rgb=rgb.reshape(rows, cols, 3), depth=depth.reshape(rows, cols))


def tile_order(rows: int, cols: int, tile_pixels: int, device: torch.device | str | None = None) -> Tensor:
    """The row-major pixel indices of a `rows` x `cols` image in square tiles of about `tile_pixels`
    pixels (tile after tile, row-major within each and across them): a chunk of rays that is a square
    reads the source views where its samples project, around an epipolar band as wide as the square, and
    stays in the caches; a chunk of whole rows reads bands across every view's whole width. A ray's
    colour does not depend on the rays beside it, so the pixels are those of row order."""
    side = max(1, math.isqrt(max(tile_pixels, 1)))
    index = torch.arange(rows * cols, device=device).reshape(rows, cols)
    row_tiles = index.split(side, dim=0)
    return torch.cat([tile.reshape(-1) for band in row_tiles for tile in band.split(side, dim=1)])
