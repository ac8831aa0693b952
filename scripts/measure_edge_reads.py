"""How many source reads fall in the half-pixel strip beyond the outer pixel centres, and what they read.

A point projecting up to half a pixel outside the outer pixel centres is inside its source image
(it lies on an edge pixel's area), so the model reads it. The honest value there is the edge pixel's
own colour (the read at the coordinates clamped to the pixel centres). This script renders the rays
of every view of a scene as the model would gather them (its deterministic samples, the nearest
training views as sources, the model's own `gather_source_samples`) and counts:

- `strip_reads`: visible (ray, sample, source view) reads in the strip, as a fraction of all visible reads;
- `strip_samples`: (ray, sample) pairs with at least one such read, as a fraction of the seen samples;
- `wrong_reads`: strip reads whose colour differs from the edge pixel's (by more than 1e-4);
- `colour_ratio`: mean over the strip reads of (colour read) / (edge pixel colour), summed over RGB
  (1.0 when the edge is read correctly; zero padding gives about 0.75).

    python scripts/measure_edge_reads.py scene=fern [experiment=quick] [--stride 2] [--out FILE.json]

`--stride S` renders every S-th pixel in both directions (S^2 times faster; the full set of 20 fern
views at 504x378 takes about 10 CPU-minutes).

Key=value arguments are config overrides (the scene, factor, source views and samples of a run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from pola_gnt.core.errors import exit_on_user_error
from pola_gnt.data.datamodule import eval_source_ids
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.geometry.rays import pixel_grid, pixel_rays, points_along_rays
from pola_gnt.model.gnt import SourceViews, gather_source_samples
from pola_gnt.model.sampler import DepthSampler
from pola_gnt.runs.config.app import compose_config
from pola_gnt.runs.config.read import read_run_settings

CHUNK_RAYS = 2048


def edge_reference(images: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
    """Bilinear colour `[views, points, 3]` at `pixels` `[views, points, 2]` clamped to the pixel centres."""
    height, width = images.shape[-2:]
    clamped = torch.stack([pixels[..., 0].clamp(0, width - 1), pixels[..., 1].clamp(0, height - 1)], dim=-1)
    scale = torch.tensor([width - 1, height - 1], dtype=pixels.dtype)
    grid = 2.0 * clamped / scale - 1.0
    values = torch.nn.functional.grid_sample(images, grid[:, :, None, :], mode="bilinear", align_corners=True)
    return values[..., 0].transpose(1, 2)


def measure(overrides: list[str], stride: int = 1) -> dict:
    settings = read_run_settings(compose_config(*overrides))
    scene = load_scene(settings.scene, settings.data)
    height, width = scene.resolution
    n_samples, n_sources = settings.render.n_samples, settings.data.num_source_views
    sampler = DepthSampler(n_samples)
    totals = dict.fromkeys(("visible_reads", "strip_reads", "wrong_reads", "seen_samples", "strip_samples"), 0)
    ratio_sum = 0.0
    rows, cols = len(range(0, height, stride)), len(range(0, width, stride))
    pixels = pixel_grid(rows, cols) * stride
    images = scene.images.permute(0, 3, 1, 2)  # [views, 3, H, W]
    for view in range(len(scene.image_names)):
        print(f"view {view + 1}/{len(scene.image_names)}", file=sys.stderr, flush=True)
        ids = eval_source_ids(scene, view, n_sources)
        sources = SourceViews(images[ids], images[ids], scene.cameras.c2w[ids], scene.cameras.intrinsics[ids])
        rays = pixel_rays(scene.cameras.c2w[view], scene.cameras.intrinsics[view], pixels)
        for start in range(0, len(rays), CHUNK_RAYS):
            chunk = rays[start : start + CHUNK_RAYS]
            depths = sampler(chunk, scene.depth_range)
            points = points_along_rays(chunk, depths)  # [rays, samples, 3]
            gathered = gather_source_samples(points, chunk.origins, sources)
            visible = gathered.visible  # [rays, samples, views]
            # The same projection as the model, for the pixel coordinates of each read.
            w2c = torch.linalg.inv(sources.c2w)
            cam = torch.einsum("vij,rsj->rsvi", w2c[:, :3, :3], points) + w2c[:, :3, 3]
            image = torch.einsum("vij,rsvj->rsvi", sources.intrinsics, cam)
            uv = image[..., :2] / image[..., 2:3]  # [rays, samples, views, 2]
            in_strip = visible & (
                (uv[..., 0] < 0) | (uv[..., 0] > width - 1) | (uv[..., 1] < 0) | (uv[..., 1] > height - 1)
            )
            read = gathered.values[..., :3]
            reference = edge_reference(sources.images, uv.permute(2, 0, 1, 3).flatten(1, 2))
            reference = reference.unflatten(1, uv.shape[:2]).permute(1, 2, 0, 3)  # [rays, samples, views, 3]
            wrong = in_strip & ((read - reference).abs().amax(dim=-1) > 1e-4)
            totals["visible_reads"] += int(visible.sum())
            totals["strip_reads"] += int(in_strip.sum())
            totals["wrong_reads"] += int(wrong.sum())
            totals["seen_samples"] += int(visible.any(dim=-1).sum())
            totals["strip_samples"] += int(in_strip.any(dim=-1).sum())
            ratio_sum += float((read.sum(-1) / reference.sum(-1).clamp(min=1e-6))[in_strip].sum())
    return {
        "scene": settings.scene.name,
        "factor": settings.data.factor,
        "resolution": [height, width],
        "num_source_views": n_sources,
        "n_samples": n_samples,
        "views": len(scene.image_names),
        "pixel_stride": stride,
        **totals,
        "strip_read_fraction": totals["strip_reads"] / max(totals["visible_reads"], 1),
        "strip_sample_fraction": totals["strip_samples"] / max(totals["seen_samples"], 1),
        "wrong_read_fraction": totals["wrong_reads"] / max(totals["visible_reads"], 1),
        "colour_ratio": ratio_sum / max(totals["strip_reads"], 1),
    }


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. scene=fern")
    parser.add_argument("--stride", type=int, default=1, help="every S-th pixel in both directions")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    started = time.perf_counter()
    result = measure(args.overrides, args.stride)
    result["seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
