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

from pola_gnt.geometry.rays import RayGrid, Rays, pixel_grid, pixel_rays
from pola_gnt.model.gnt import GNT, SampleAgreement, SourceViews
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


@dataclass(frozen=True)
class ImageRays:
    """The rays of a render are an image's pixels: ray i is pixel `order[i]` of a `rows` x `cols` grid in
    row-major order (`order` None: the rays are in row-major order), neighbouring pixels a ray apart. The
    prior's neighbours (`model.neighbours`) aggregate over the whole image through it."""

    rows: int
    cols: int
    order: Tensor | None = None

    @property
    def grid(self) -> RayGrid:
        return RayGrid(1, self.rows, self.cols, max(self.rows, self.cols))


def _in_chunks(
    work: Callable[[int], tuple[Tensor, ...]],
    starts: range,
    chunk_rays: int,
    total: int,
    workers: int,
    on_cpu: bool,
    cancelled: Callable[[], bool] | None,
    progress: Callable[[int], None],
) -> list[tuple[Tensor, ...]]:
    """`work(start)` of every chunk, in order: one chunk at a time on every thread, or `workers` chunks at
    once, each on one thread (`render_rays`). `cancelled()` is asked before each chunk (RenderCancelled);
    `progress(rays done)` is told after each, in order."""
    results: list[tuple[Tensor, ...]] = []

    def collect(start: int, result: tuple[Tensor, ...]) -> None:
        results.append(result)
        progress(min(start + chunk_rays, total))

    def check_cancelled() -> None:
        if cancelled is not None and cancelled():
            raise RenderCancelled

    if workers <= 1 or len(starts) == 1 or not on_cpu:
        for start in starts:
            check_cancelled()
            collect(start, work(start))
        return results
    with _single_threaded_workers(workers) as pool:
        pending: deque[tuple[int, Future]] = deque()
        # Twice `workers` chunks submitted ahead, collected in order: a worker that finishes its chunk
        # takes the next at once instead of waiting while an earlier, slower chunk is collected (the
        # pool runs only `workers` at a time, so memory is still that of `workers` chunks).
        try:
            for start in starts:
                check_cancelled()
                pending.append((start, pool.submit(work, start)))
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
    return results


def _image_agreement(model: RenderNetwork, image: ImageRays, chunks: list[tuple[Tensor, ...]]) -> SampleAgreement:
    """The prior's statistics of every ray (chunk results in ray order), their spread aggregated over the
    image's neighbours (`RenderNetwork.aggregate`), back in ray order."""
    mean, spread = torch.cat([c[0] for c in chunks]), torch.cat([c[1] for c in chunks])
    if image.order is None:
        return model.aggregate((mean, spread), image.grid)
    row_major = torch.empty_like(spread)
    row_major[image.order] = spread
    return mean, model.aggregate((mean, row_major), image.grid)[1][image.order]


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
    image: ImageRays | None = None,
) -> tuple[Float[Tensor, "rays 3"], Float[Tensor, " rays"]]:
    """Colour `[rays, 3]` (clipped) and depth `[rays]` with deterministic samples, `chunk_rays` at a time.

    `workers` > 1 (on a CPU): that many chunks at once, each on one thread, instead of one chunk at a
    time on all of them: the network's many small operations share two threads badly (a 2-core CPU
    rendered 1.2-1.25x faster so, `render_workers`). Each chunk is computed as it would be alone, so the
    pixels do not depend on `workers`. `cancelled()` is asked before each chunk (RenderCancelled);
    `progress(rays done, rays in all)` is told after each chunk, in order. `peak_weights`, when given,
    gets each chunk's largest read-out weight per ray `[rays]` appended, in order (a confidence of the
    depth: `apps/export`).

    `image`: the rays are an image's pixels (`ImageRays`). A network whose prior aggregates over
    neighbouring rays (`model.net.readout_neighbour_windows`) then renders in two passes: the prior's
    statistics of every ray first (chunk by chunk), aggregated over the whole image, then the network on
    each chunk with its share of them; the pixels are those of one pass over the whole image, whatever
    the chunks. Progress counts both passes (`2 x rays` in all). Without `image` every ray is its own."""
    # The fast network's feature maps projected once, before the workers share them.
    projected = model.project(sources) if isinstance(model, FastRenderNetwork) else None
    views = projected if projected is not None else sources
    starts = range(0, len(rays), chunk_rays)
    autocast = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    on_cpu = rays.origins.device.type == "cpu"
    two_passes = image is not None and model.settings.uses_neighbours and model.settings.readout_consistency_prior > 0
    total = 2 * len(rays) if two_passes else len(rays)

    def told(offset: int) -> Callable[[int], None]:
        return lambda done: progress(offset + done, total) if progress is not None else None

    agreement: SampleAgreement | None = None
    if two_passes and image is not None:

        def agree_chunk(start: int) -> tuple[Tensor, ...]:
            with torch.inference_mode(), torch.autocast("cpu", dtype=autocast[1], enabled=autocast[0]):
                chunk = rays[start : start + chunk_rays]
                return model.sample_agreement(chunk, sampler(chunk, depth_range), views)  # type: ignore[arg-type]

        parts = _in_chunks(agree_chunk, starts, chunk_rays, len(rays), workers, on_cpu, cancelled, told(0))
        agreement = _image_agreement(model, image, parts)

    def render_chunk(start: int) -> tuple[Tensor, ...]:
        # Inference mode and autocast are per thread: a worker takes the caller's.
        with torch.inference_mode(), torch.autocast("cpu", dtype=autocast[1], enabled=autocast[0]):
            chunk = rays[start : start + chunk_rays]
            depths = sampler(chunk, depth_range)
            shared = None
            if agreement is not None:
                shared = (agreement[0][start : start + chunk_rays], agreement[1][start : start + chunk_rays])
            output = model(chunk, depths, views, agreement=shared)  # type: ignore[arg-type]
            return output.rgb.float().clamp(0.0, 1.0), output.depth.float(), output.weights.float().amax(dim=-1)

    offset = len(rays) if two_passes else 0
    results = _in_chunks(render_chunk, starts, chunk_rays, len(rays), workers, on_cpu, cancelled, told(offset))
    if peak_weights is not None:
        peak_weights.extend(result[2] for result in results)
    return torch.cat([r[0] for r in results]), torch.cat([r[1] for r in results])


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
    tiles of about `chunk_rays` pixels (`tile_order`; `workers`, `cancelled`, `progress`: `render_rays`,
    the rendered pixels an `ImageRays`). `peak_weights`, when given, gets the read-out's largest weight per
    pixel `[rows, cols]` appended (`render_rays(peak_weights=)`, back in row order)."""
    rows, cols = len(range(0, height, stride)), len(range(0, width, stride))
    order = tile_order(rows, cols, chunk_rays, device=c2w.device)
    pixels = pixel_grid(rows, cols, device=c2w.device)[order] * stride
    rays = pixel_rays(c2w, intrinsics, pixels)
    tiled_peaks: list[Tensor] | None = [] if peak_weights is not None else None
    tiled_rgb, tiled_depth = render_rays(
        model,
        rays,
        sources,
        depth_range,
        sampler,
        chunk_rays,
        workers,
        cancelled,
        progress,
        peak_weights=tiled_peaks,
        image=ImageRays(rows, cols, order),
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
