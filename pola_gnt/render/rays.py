"""Ray geometry: pixel rays, depth samples, projection of points into source views.

Cameras follow the OpenCV convention (x right, y down, z forward); `c2w` is camera-to-world
`[4, 4]` and `K` the `[3, 3]` pinhole intrinsics. Ray directions are `R K^-1 [u, v, 1]`, not
normalised, so the depth `t` of a point `o + t d` is its camera z-depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Rays:
    origins: Tensor  # [rays, 3]
    directions: Tensor  # [rays, 3], camera z-component 1 (not unit length)

    def __len__(self) -> int:
        return self.origins.shape[0]

    def __getitem__(self, index) -> Rays:
        return Rays(self.origins[index], self.directions[index])

    def to(self, device) -> Rays:
        return Rays(self.origins.to(device), self.directions.to(device))


def pixel_coordinates(indices: Tensor, width: int) -> Tensor:
    """Integer pixel coordinates `(u, v)` = (column, row) of row-major pixel `indices` `[n]`: `[n, 2]`."""
    return torch.stack([indices % width, torch.div(indices, width, rounding_mode="floor")], dim=-1).float()


def pixel_grid(height: int, width: int, device=None) -> Tensor:
    """Integer pixel coordinates `(u, v)` of every pixel, row-major: `[H * W, 2]`."""
    return pixel_coordinates(torch.arange(height * width, device=device), width)


def pixel_rays(c2w: Tensor, intrinsics: Tensor, pixels: Tensor) -> Rays:
    """Rays through `pixels` `[rays, 2]` (u, v) of one camera (`c2w` `[4, 4]`, `intrinsics` `[3, 3]`)."""
    homogeneous = torch.cat([pixels, torch.ones_like(pixels[:, :1])], dim=-1)  # [rays, 3]
    camera_dirs = homogeneous @ torch.linalg.inv(intrinsics).T  # [rays, 3], z = 1
    directions = camera_dirs @ c2w[:3, :3].T
    origins = c2w[:3, 3].expand_as(directions)
    return Rays(origins.contiguous(), directions)


def sample_depths(
    near: float | Tensor,
    far: float | Tensor,
    n_rays: int,
    n_samples: int,
    jitter: bool,
    generator: torch.Generator | None = None,
    device=None,
) -> Tensor:
    """Depths `[rays, samples]` uniform in inverse depth between `near` and `far`.

    With `jitter`, each sample is drawn uniformly inside its disparity bin (training); without,
    samples sit at the bin edges including both ends (deterministic evaluation, as GNT).
    """
    near_disp = 1.0 / torch.as_tensor(near, dtype=torch.float32, device=device)
    far_disp = 1.0 / torch.as_tensor(far, dtype=torch.float32, device=device)
    fractions = torch.linspace(0.0, 1.0, n_samples, device=device).expand(n_rays, n_samples)
    if jitter:
        # Move each sample uniformly within the bin around it (midpoints as bin edges).
        mids = 0.5 * (fractions[:, 1:] + fractions[:, :-1])
        upper = torch.cat([mids, fractions[:, -1:]], dim=-1)
        lower = torch.cat([fractions[:, :1], mids], dim=-1)
        uniform = torch.rand(
            (n_rays, n_samples), generator=generator, device=generator.device if generator else device
        ).to(fractions.device)
        fractions = lower + (upper - lower) * uniform
    disparity = near_disp * (1.0 - fractions) + far_disp * fractions
    return 1.0 / disparity


def points_along_rays(rays: Rays, depths: Tensor) -> Tensor:
    """3D points `[rays, samples, 3]` at `depths` `[rays, samples]`."""
    return rays.origins[:, None, :] + depths[..., None] * rays.directions[:, None, :]


@dataclass
class Projection:
    pixels: Tensor  # [views, ..., 2] (u, v) in pixel units of the source image
    depth: Tensor  # [views, ...] camera z-depth in the source view
    visible: Tensor  # [views, ...] bool: in front of the camera and inside the image


def project_points(points: Tensor, c2w: Tensor, intrinsics: Tensor, height: int, width: int) -> Projection:
    """Project world `points` `[..., 3]` into each source view (`c2w` `[views, 4, 4]`,
    `intrinsics` `[views, 3, 3]`) with `K inv(c2w) x`.

    A point is inside the image when it falls on a pixel's area: `-0.5 <= u <= W - 0.5` and
    `-0.5 <= v <= H - 0.5` (pixel centres are integers; sample with border padding).
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
        (pixels[..., 0] >= -0.5)
        & (pixels[..., 0] <= width - 0.5)
        & (pixels[..., 1] >= -0.5)
        & (pixels[..., 1] <= height - 0.5)
    )
    n_views = c2w.shape[0]
    return Projection(
        pixels=pixels.reshape(n_views, *batch_shape, 2),
        depth=depth.reshape(n_views, *batch_shape),
        visible=(in_front & inside).reshape(n_views, *batch_shape),
    )


def pixels_to_grid(pixels: Tensor, height: int, width: int) -> Tensor:
    """Pixel coordinates -> `grid_sample` coordinates in [-1, 1] (`align_corners=True`)."""
    scale = torch.tensor([width - 1, height - 1], dtype=pixels.dtype, device=pixels.device)
    return 2.0 * pixels / scale - 1.0


def relative_directions(points: Tensor, target_center: Tensor, source_centers: Tensor) -> Tensor:
    """GNT's 4-number relative direction per (point, source view): `[normalize(a - b), a . b]`.

    `a` is the unit vector from the point to the target camera, `b` to the source camera.
    points `[rays, samples, 3]`, target_center `[3]` or per ray `[rays, 1, 3]`, source_centers `[views, 3]`
    -> `[rays, samples, views, 4]`.
    """
    to_target = torch.nn.functional.normalize(target_center - points, dim=-1)  # [rays, samples, 3]
    to_sources = torch.nn.functional.normalize(
        source_centers[None, None, :, :] - points[:, :, None, :], dim=-1
    )  # [rays, samples, views, 3]
    to_target = to_target[:, :, None, :].expand_as(to_sources)
    difference = torch.nn.functional.normalize(to_target - to_sources, dim=-1)
    cosine = (to_target * to_sources).sum(dim=-1, keepdim=True)
    return torch.cat([difference, cosine], dim=-1)
