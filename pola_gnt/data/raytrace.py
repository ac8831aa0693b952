"""Analytic ray tracing shared by the synthetic scenes (`demo_scene`, `procedural`): surfaces with
exact ray intersection, normals and albedo, the nearest hit of a bundle of rays, and the tracer that
renders a view (`render_view`: 2x2 supersampled colour, depth at the pixel centres) and finds each
view's near / far bounds (`view_bounds`) from what a scene says a ray sees.

World frame is OpenCV-like (x right, y down, z forward). Rays are `o + t d` with the directions of
`geometry.rays.pixel_rays` (camera z-component 1), so the ray parameter `t` of a hit is the exact
camera z-depth. Everything is float64: the depth is the ground truth that other code is tested
against. Intersections return `inf` on a miss; surfaces are textured by a `Texture` of 2D surface
coordinates, so a surface point has the same albedo from every view.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pola_gnt.geometry.rays import Rays, pixel_grid, pixel_rays

Texture = Callable[[Tensor, Tensor], Tensor]  # surface coordinates a, b [rays] -> albedo [rays, 3]
# What a scene computes for the rays of one camera: colour `[rays, 3]` or depth `[rays]`.
RayFunction = Callable[[Rays], Tensor]
MIN_DEPTH = 1e-6  # hits closer than this along the ray are the ray's own origin, not a surface

SUPERSAMPLE_OFFSETS = (-0.25, 0.25)  # sub-pixel offsets of the 2x2 supersampling grid
CHUNK_RAYS = 1 << 18  # rays traced at once, bounds memory at any resolution
BOUNDS_PADDING = 0.02  # relative padding of near/far (LLFF's bounds are percentiles, also loose)


def dot(x: Tensor, y: Tensor) -> Tensor:
    """Row-wise dot product `[rays, 3] x [rays, 3] -> [rays]` (einsum: several times faster than
    `(x * y).sum(-1)` on CPU for a last dimension of 3)."""
    return torch.einsum("ri,ri->r", x, y)


@dataclass
class Plane:
    """Infinite plane through `point` with unit `normal` (facing the cameras); `axis_a`/`axis_b`
    span it and give the texture coordinates. With `half_extent`, a rectangle centred on `point`."""

    point: Tensor  # [3]
    normal: Tensor  # [3]
    axis_a: Tensor  # [3]
    axis_b: Tensor  # [3]
    texture: Texture
    half_extent: tuple[float, float] | None = None

    def intersect(self, origins: Tensor, directions: Tensor) -> Tensor:
        """Ray parameter `[rays]` of the hit (the camera z-depth for camera rays), inf on a miss."""
        facing = directions @ self.normal  # [rays]
        safe = torch.where(facing.abs() < 1e-12, torch.full_like(facing, 1e-12), facing)
        depth = ((self.point - origins) @ self.normal) / safe
        hit = (facing.abs() >= 1e-12) & (depth > MIN_DEPTH)
        if self.half_extent is not None:
            local = origins + depth[:, None] * directions - self.point
            hit &= ((local @ self.axis_a).abs() <= self.half_extent[0]) & (
                (local @ self.axis_b).abs() <= self.half_extent[1]
            )
        return torch.where(hit, depth, torch.full_like(depth, math.inf))

    def normals(self, points: Tensor) -> Tensor:
        return self.normal.expand_as(points)

    def albedo(self, points: Tensor) -> Tensor:
        local = points - self.point
        return self.texture(local @ self.axis_a, local @ self.axis_b)


@dataclass
class Sphere:
    center: Tensor  # [3]
    radius: float
    texture: Texture  # on (longitude, latitude) in radians

    def intersect(self, origins: Tensor, directions: Tensor) -> Tensor:
        """Nearest positive root of `|o + t d - c|^2 = r^2` `[rays]`, inf on a miss."""
        offset = origins - self.center
        a = dot(directions, directions)
        half_b = dot(offset, directions)
        c = dot(offset, offset) - self.radius**2
        discriminant = half_b * half_b - a * c
        root = torch.sqrt(discriminant.clamp(min=0.0))
        near = (-half_b - root) / a
        far = (-half_b + root) / a
        depth = torch.where(near > MIN_DEPTH, near, far)  # from inside, the far root is the visible one
        hit = (discriminant >= 0) & (depth > MIN_DEPTH)
        return torch.where(hit, depth, torch.full_like(depth, math.inf))

    def normals(self, points: Tensor) -> Tensor:
        return (points - self.center) / self.radius

    def albedo(self, points: Tensor) -> Tensor:
        n = self.normals(points)
        longitude = torch.atan2(n[:, 0], -n[:, 2])  # 0 facing the cameras
        latitude = torch.asin(n[:, 1].clamp(-1.0, 1.0))
        return self.texture(longitude, latitude)


@dataclass
class Box:
    """A box of half sizes `half_size` `[3]` centred on `center`, its edges along the columns of
    `rotation` `[3, 3]` (identity: axis-aligned). Each face is textured in its own two local
    coordinates, shifted by `face_shift` per face so that the six faces show different parts of the
    texture."""

    center: Tensor  # [3]
    rotation: Tensor  # [3, 3], columns: the box's axes in the world
    half_size: Tensor  # [3]
    texture: Texture
    face_shift: float = 0.0

    def _local(self, points: Tensor) -> Tensor:
        return (points - self.center) @ self.rotation  # [rays, 3] in the box's frame

    def intersect(self, origins: Tensor, directions: Tensor) -> Tensor:
        """Slab test: the ray's parameter interval inside each pair of parallel faces, intersected;
        the entry point, or the exit point from inside. inf on a miss."""
        local_origins = self._local(origins)
        local_directions = directions @ self.rotation
        safe = torch.where(
            local_directions.abs() < 1e-12, torch.full_like(local_directions, 1e-12), local_directions
        )  # a ray parallel to a slab: a huge finite parameter keeps inf - inf out
        first = (-self.half_size - local_origins) / safe
        second = (self.half_size - local_origins) / safe
        entry = torch.minimum(first, second).amax(-1)
        exit_ = torch.maximum(first, second).amin(-1)
        depth = torch.where(entry > MIN_DEPTH, entry, exit_)
        hit = (exit_ >= entry) & (depth > MIN_DEPTH)
        return torch.where(hit, depth, torch.full_like(depth, math.inf))

    def _faces(self, local: Tensor) -> Tensor:
        """Axis `[rays]` (0, 1, 2) of the face each surface point `local` `[rays, 3]` lies on."""
        return (local.abs() / self.half_size).argmax(-1)

    def normals(self, points: Tensor) -> Tensor:
        local = self._local(points)
        axis = self._faces(local)
        one_hot = torch.nn.functional.one_hot(axis, 3).to(points.dtype)
        return (one_hot * torch.sign(local)) @ self.rotation.T

    def albedo(self, points: Tensor) -> Tensor:
        local = self._local(points)
        axis = self._faces(local)
        x, y, z = local.unbind(-1)
        # (a, b) of a face: the two local coordinates along it; the face's index (axis and sign)
        # shifts them so that opposite faces are not mirror images of each other.
        a = torch.where(axis == 0, z, x)
        b = torch.where(axis == 1, z, y)
        face = 2 * axis + (local.gather(1, axis[:, None])[:, 0] > 0).long()
        shift = self.face_shift * face.to(points.dtype)
        return self.texture(a + shift, b - 0.5 * shift)


def nearest_hit(surfaces: list, origins: Tensor, directions: Tensor) -> tuple[Tensor, Tensor]:
    """-> depth `[rays]` (inf on a miss) and index of the surface hit `[rays]` (-1 on a miss)."""
    depth = torch.full(origins.shape[:1], math.inf, dtype=origins.dtype)
    index = torch.full(origins.shape[:1], -1, dtype=torch.long)
    for i, surface in enumerate(surfaces):
        candidate = surface.intersect(origins, directions)
        closer = candidate < depth
        depth = torch.where(closer, candidate, depth)
        index = torch.where(closer, torch.full_like(index, i), index)
    return depth, index


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Trace on one thread: the work is memory-bound elementwise arithmetic that gains little from
    threads, and on a busy machine (more runnable threads than cores) torch's OpenMP threads spin
    and make it tens of times slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# --------------------------------------------------------------------------------------------
# Tracer: a scene's colour and depth functions over the pixels of a camera
# --------------------------------------------------------------------------------------------


def trace(function: RayFunction, c2w: Tensor, intrinsics: Tensor, pixels: Tensor) -> Tensor:
    """`function` of the rays through `pixels` `[N, 2]` of one camera (`c2w` `[4, 4]`, `intrinsics`
    `[3, 3]`, float64), `CHUNK_RAYS` rays at a time, concatenated: `[N, ...]`."""
    chunks = []
    with single_thread():
        for start in range(0, len(pixels), CHUNK_RAYS):
            chunks.append(function(pixel_rays(c2w, intrinsics, pixels[start : start + CHUNK_RAYS])))
    return torch.cat(chunks)


def render_view(
    colour: RayFunction, depth: RayFunction, c2w: Tensor, intrinsics: Tensor, height: int, width: int
) -> tuple[Tensor, Tensor]:
    """One camera's image -> colour `[H, W, 3]` float64 (the mean of a 2x2 supersampling of each pixel,
    `SUPERSAMPLE_OFFSETS`) and depth `[H, W]` float64 at the pixel centres."""
    pixels = pixel_grid(height, width).double()  # [H * W, 2]
    offsets = [(du, dv) for dv in SUPERSAMPLE_OFFSETS for du in SUPERSAMPLE_OFFSETS]
    samples = torch.cat([pixels + torch.tensor(offset, dtype=torch.float64) for offset in offsets])
    colours = trace(colour, c2w, intrinsics, samples)
    depths = trace(depth, c2w, intrinsics, pixels)
    rgb = colours.reshape(len(offsets), height * width, 3).mean(0)
    return rgb.reshape(height, width, 3), depths.reshape(height, width)


def view_bounds(depth: RayFunction, poses: np.ndarray, intrinsics: Tensor, height: float, width: float) -> np.ndarray:
    """Near / far `[views, 2]` of the cameras `poses` `[views, 4, 4]`, valid at every resolution: the
    depth traced on a grid covering the image plane of `height` x `width` pixels (`intrinsics`' size,
    the full resolution divided by a factor) plus a pixel of margin, a superset of the pixel centres of
    any factor; the extremes padded by `BOUNDS_PADDING`."""
    rows, cols = torch.meshgrid(
        torch.linspace(-1.0, height + 1.0, int(height) + 3, dtype=torch.float64),
        torch.linspace(-1.0, width + 1.0, int(width) + 3, dtype=torch.float64),
        indexing="ij",
    )
    pixels = torch.stack([cols.reshape(-1), rows.reshape(-1)], dim=-1)
    bounds = []
    for pose in poses:
        depths = trace(depth, torch.from_numpy(pose), intrinsics, pixels)
        bounds.append([(1 - BOUNDS_PADDING) * float(depths.min()), (1 + BOUNDS_PADDING) * float(depths.max())])
    return np.array(bounds)
