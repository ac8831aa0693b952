"""Rendered depth maps -> one coloured point cloud: each pixel unprojected at its depth, kept where its
confidence reaches `export.min_confidence` and at least `export.consistent_views` other rendered views
see the same depth there (within `export.consistency_tolerance` of it), then thinned to one point per
voxel of `export.voxel_size` (their mean) and to at most `export.max_points` (a seeded random subset).
The same kept pixels are what the mesh fuses (`tsdf`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pola_gnt.apps.export.ply import PointCloud
from pola_gnt.apps.export.views import RenderedView, unproject
from pola_gnt.core.errors import UserError
from pola_gnt.data.images import to_uint8
from pola_gnt.geometry.projection import project_points
from pola_gnt.runs.settings import ExportSettings


@dataclass
class KeptPixels:
    """Per rendered view, which pixels each filter keeps (`[H, W]` each), and how many views agree."""

    masks: list[Tensor]  # bool: depth, confidence and consistency all passed
    confident: list[Tensor]  # bool: depth and confidence passed
    agreeing_views: list[Tensor]  # int: other rendered views that see the same depth
    counts: dict[str, int]  # pixels left after each filter, in order


def agreeing_view_counts(rendered: list[RenderedView], tolerance: float) -> list[Tensor]:
    """For each view's pixels, how many other rendered views see its point at their own rendered depth
    (nearest pixel), within `tolerance` times the point's depth in that view."""
    counts = []
    for i, view in enumerate(rendered):
        points = unproject(view.view, view.depth)  # [pixels, 3]
        count = torch.zeros(len(points), dtype=torch.int32)
        for j, other in enumerate(rendered):
            if j == i:
                continue
            camera = other.view
            projection = project_points(points, camera.c2w[None], camera.intrinsics[None], camera.height, camera.width)
            pixels = projection.pixels[0].round().long()
            u = pixels[:, 0].clamp(0, camera.width - 1)
            v = pixels[:, 1].clamp(0, camera.height - 1)
            seen_depth = other.depth[v, u]
            depth = projection.depth[0]
            agree = projection.visible[0] & (seen_depth > 0) & ((depth - seen_depth).abs() <= tolerance * depth)
            count += agree.int()
        counts.append(count.reshape(view.depth.shape))
    return counts


def kept_pixels(rendered: list[RenderedView], settings: ExportSettings) -> KeptPixels:
    """The pixels every filter keeps, with the count left after each filter."""
    with_depth = [view.has_depth for view in rendered]
    confident = [mask & (view.confidence >= settings.min_confidence) for mask, view in zip(with_depth, rendered)]
    if settings.consistent_views > 0:
        agreeing = agreeing_view_counts(rendered, settings.consistency_tolerance)
    else:
        agreeing = [torch.zeros(view.depth.shape, dtype=torch.int32) for view in rendered]
    consistent = [mask & (count >= settings.consistent_views) for mask, count in zip(confident, agreeing)]
    counts = {
        "pixels": sum(mask.numel() for mask in with_depth),
        "with_depth": sum(int(mask.sum()) for mask in with_depth),
        "confident": sum(int(mask.sum()) for mask in confident),
        "consistent": sum(int(mask.sum()) for mask in consistent),
    }
    return KeptPixels(masks=consistent, confident=confident, agreeing_views=agreeing, counts=counts)


def check_not_empty(kept: KeptPixels, rendered: list[RenderedView], settings: ExportSettings) -> None:
    """One line naming the threshold that left no point, and what to set instead."""
    counts = kept.counts
    if counts["with_depth"] and not counts["confident"]:
        best = max(float(view.confidence[view.has_depth].max()) for view in rendered if bool(view.has_depth.any()))
        raise UserError(
            f"export.min_confidence={settings.min_confidence:g}: keeps none of {counts['with_depth']} depth pixels "
            f"(the highest {settings.confidence} confidence is {best:.3f}); lower it"
        )
    if counts["confident"] and not counts["consistent"]:
        best = max(int(count[mask].max()) for count, mask in zip(kept.agreeing_views, kept.confident) if mask.any())
        raise UserError(
            f"export.consistent_views={settings.consistent_views}: no point of {counts['confident']} is seen at "
            f"the same depth by that many other views (at most {best}, within "
            f"export.consistency_tolerance={settings.consistency_tolerance:g}); lower it, raise the tolerance "
            f"or render more views (export.views)"
        )


def voxel_means(points: Tensor, colours: Tensor, confidence: Tensor, voxel: float) -> tuple[Tensor, Tensor, Tensor]:
    """One point per occupied voxel of side `voxel`: the mean position, colour and confidence of its points."""
    keys = torch.floor(points.double() / voxel).long()
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    occupied = int(inverse.max()) + 1
    ones = torch.ones(len(points), dtype=torch.float64)
    counts = torch.zeros(occupied, dtype=torch.float64).index_add_(0, inverse, ones)

    def mean(values: Tensor) -> Tensor:
        total = torch.zeros(occupied, values.shape[1], dtype=torch.float64).index_add_(0, inverse, values.double())
        return (total / counts[:, None]).float()

    return mean(points), mean(colours), mean(confidence[:, None])[:, 0]


def fuse_point_cloud(
    rendered: list[RenderedView], kept: KeptPixels, settings: ExportSettings, seed: int
) -> tuple[PointCloud, dict[str, int]]:
    """The kept pixels of every view as one cloud, thinned by voxel and cap; and the counts."""
    points, colours, confidence = [], [], []
    for view, mask in zip(rendered, kept.masks):
        flat = mask.reshape(-1)
        points.append(unproject(view.view, view.depth)[flat])
        colours.append(view.rgb.reshape(-1, 3)[flat])
        confidence.append(view.confidence.reshape(-1)[flat])
    cloud_points, cloud_colours, cloud_confidence = torch.cat(points), torch.cat(colours), torch.cat(confidence)
    counts = dict(kept.counts)
    if settings.voxel_size is not None and len(cloud_points):
        cloud_points, cloud_colours, cloud_confidence = voxel_means(
            cloud_points, cloud_colours, cloud_confidence, settings.voxel_size
        )
    counts["voxels"] = len(cloud_points)
    if len(cloud_points) > settings.max_points:
        generator = torch.Generator().manual_seed(seed)
        chosen = torch.randperm(len(cloud_points), generator=generator)[: settings.max_points].sort().values
        cloud_points, cloud_colours = cloud_points[chosen], cloud_colours[chosen]
        cloud_confidence = cloud_confidence[chosen]
    counts["points"] = len(cloud_points)
    cloud = PointCloud(
        points=cloud_points.numpy().astype(np.float32),
        colours=to_uint8(cloud_colours),
        confidence=cloud_confidence.numpy().astype(np.float32),
    )
    return cloud, counts
