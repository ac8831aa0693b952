"""Projection of world points into source views, and GNT's relative viewing directions."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor


@dataclass
class Projection:
    pixels: Float[Tensor, "views *points 2"]  # (u, v) in pixel units of the source image
    depth: Float[Tensor, " views *points"]  # camera z-depth in the source view
    visible: Bool[Tensor, " views *points"]  # in front of the camera and inside the image


def project_points(
    points: Float[Tensor, "*points 3"],
    c2w: Float[Tensor, "views 4 4"],
    intrinsics: Float[Tensor, "views 3 3"],
    height: int,
    width: int,
    edge_margin: float = 0.5,
) -> Projection:
    """Project world `points` `[..., 3]` into each source view (`c2w` `[views, 4, 4]`,
    `intrinsics` `[views, 3, 3]`) with `K inv(c2w) x`.

    A point is inside the image when it lies at most `edge_margin` pixels beyond the outer pixel
    centres (which are integers): `-m <= u <= W - 1 + m`, `-m <= v <= H - 1 + m`. The default 0.5 is a
    pixel's area (sample with border padding); GNT's code uses 0, only between the pixel centres.
    """
    batch_shape = points.shape[:-1]
    flat = points.reshape(-1, 3)  # [points, 3]
    w2c = torch.linalg.inv(c2w)  # [views, 4, 4]
    cam = torch.einsum("vij,pj->vpi", w2c[:, :3, :3], flat) + w2c[:, None, :3, 3]  # [views, points, 3]
    image = torch.einsum("vij,vpj->vpi", intrinsics, cam)  # [views, points, 3]
    depth = cam[..., 2]
    safe_depth = torch.where(depth.abs() < 1e-8, torch.full_like(depth, 1e-8), depth)
    pixels = image[..., :2] / safe_depth[..., None]
    in_front = depth > 1e-6
    inside = (
        (pixels[..., 0] >= -edge_margin)
        & (pixels[..., 0] <= width - 1 + edge_margin)
        & (pixels[..., 1] >= -edge_margin)
        & (pixels[..., 1] <= height - 1 + edge_margin)
    )
    n_views = c2w.shape[0]
    return Projection(
        pixels=pixels.reshape(n_views, *batch_shape, 2),
        depth=depth.reshape(n_views, *batch_shape),
        visible=(in_front & inside).reshape(n_views, *batch_shape),
    )


def pixels_to_grid(pixels: Float[Tensor, "*batch 2"], height: int, width: int) -> Float[Tensor, "*batch 2"]:
    """Pixel coordinates -> `grid_sample` coordinates in [-1, 1] (`align_corners=True`)."""
    scale = torch.tensor([width - 1, height - 1], dtype=pixels.dtype, device=pixels.device)
    return 2.0 * pixels / scale - 1.0


def relative_directions(
    points: Float[Tensor, "rays samples 3"],
    target_center: Float[Tensor, " 3"] | Float[Tensor, "rays 1 3"],
    source_centers: Float[Tensor, "views 3"],
    gnt_epsilons: bool = False,
) -> Float[Tensor, "rays samples views 4"]:
    """GNT's 4-number relative direction per (point, source view): `[normalize(a - b), a . b]`.

    `a` is the unit vector from the point to the target camera, `b` to the source camera.
    points `[rays, samples, 3]`, target_center `[3]` or per ray `[rays, 1, 3]`, source_centers `[views, 3]`
    -> `[rays, samples, views, 4]`. `gnt_epsilons`: normalise as GNT's code does, `v / (|v| + 1e-6)` for
    `a` and `b` and `v / max(|v|, 1e-6)` for `a - b` (a relative change of about 1e-6, which the
    network carries to its colours), instead of plain unit vectors.
    """

    def unit(vectors: Tensor) -> Tensor:
        if gnt_epsilons:
            return vectors / (torch.linalg.vector_norm(vectors, dim=-1, keepdim=True) + 1e-6)
        return torch.nn.functional.normalize(vectors, dim=-1)

    to_target = unit(target_center - points)  # [rays, samples, 3]
    to_sources = unit(source_centers[None, None, :, :] - points[:, :, None, :])  # [rays, samples, views, 3]
    to_target = to_target[:, :, None, :].expand_as(to_sources)
    if gnt_epsilons:
        difference = to_target - to_sources
        difference = difference / torch.linalg.vector_norm(difference, dim=-1, keepdim=True).clamp(min=1e-6)
    else:
        difference = torch.nn.functional.normalize(to_target - to_sources, dim=-1)
    cosine = (to_target * to_sources).sum(dim=-1, keepdim=True)
    return torch.cat([difference, cosine], dim=-1)
