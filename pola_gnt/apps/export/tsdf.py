"""A mesh from the kept depth pixels (`fusion.kept_pixels`): TSDF fusion on a voxel grid in torch, then
scikit-image's marching cubes (`pip install -e ".[export]"`).

Why not Open3D's `ScalableTSDFVolume`: open3d 0.20 is a 382 MiB wheel that brings 45 more packages
(dash, plotly, ipython, jupyter widgets: 413 MiB of wheels, 1.1 GiB installed) and does not import
without the system's libusb-1.0; scikit-image is 13 MiB with its 2 new dependencies (35 MiB installed).
The integration is a few tensor operations per view; marching cubes is the library's.

The grid spans the kept points' box (0.5 / 99.5 percentiles per axis, widened by the truncation distance)
with `export.mesh_resolution` voxels along its longest side. Each view's depth is integrated as a
projective signed distance `depth(pixel) - z`, truncated to `export.mesh_truncation` voxels and averaged
over the views (voxels further than that behind the surface are left unseen); the zero level set of the
seen voxels is the mesh, its faces wound to face the cameras' side (positive distances), coloured by the
averaged colour of the nearest voxel."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from pola_gnt.apps.export.ply import Mesh
from pola_gnt.apps.export.views import RenderedView
from pola_gnt.core.errors import UserError
from pola_gnt.data.images import to_uint8

EXTRA_HINT = 'pip install -e ".[export]"'
VOXELS_PER_PASS = 1 << 21  # voxel centres projected at once (memory: a few hundred bytes each)


def import_marching_cubes() -> Callable:
    """scikit-image's marching cubes, or one line naming the optional extra to install."""
    try:
        from skimage.measure import marching_cubes
    except ImportError:
        raise UserError(
            f"export.outputs: mesh needs scikit-image, which is not installed; {EXTRA_HINT} (or pip install "
            f"scikit-image)"
        ) from None
    return marching_cubes


def volume_box(points: Tensor, truncation: float, resolution: int) -> tuple[Tensor, float, tuple[int, int, int]]:
    """The grid's lowest corner `[3]`, voxel side and size for the points `[n, 3]`."""
    low = torch.quantile(points.double(), 0.005, dim=0)
    high = torch.quantile(points.double(), 0.995, dim=0)
    extent = float((high - low).max())
    if not extent > 0:
        raise UserError("export.outputs: mesh: the kept points span no volume (one point or a line)")
    voxel = extent / resolution
    pad = (truncation + 1.0) * voxel
    low, high = low - pad, high + pad
    size = tuple(int(math.ceil(float(side) / voxel)) + 1 for side in (high - low))
    return low.float(), voxel, (size[0], size[1], size[2])


def integrate(
    rendered: list[RenderedView],
    masks: list[Tensor],
    origin: Tensor,
    voxel: float,
    size: tuple[int, int, int],
    truncation: float,
    progress: Callable[[], object] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The averaged truncated distance `[X, Y, Z]` (in truncation units, in [-1, 1]), its weight (views
    that saw the voxel) and the averaged colour `[X, Y, Z, 3]`."""
    count = size[0] * size[1] * size[2]
    tsdf = torch.zeros(count)
    weight = torch.zeros(count)
    colour = torch.zeros(count, 3)
    distance = truncation * voxel
    for view, mask in zip(rendered, masks):
        camera = view.view
        w2c = torch.linalg.inv(camera.c2w.double()).float()
        depth = torch.where(mask, view.depth, torch.zeros_like(view.depth))
        for start in range(0, count, VOXELS_PER_PASS):
            index = torch.arange(start, min(start + VOXELS_PER_PASS, count))
            cell = torch.stack(
                [index // (size[1] * size[2]), (index // size[2]) % size[1], index % size[2]], dim=-1
            ).float()
            centres = origin + cell * voxel  # [n, 3]
            local = centres @ w2c[:3, :3].T + w2c[:3, 3]
            z = local[:, 2]
            safe_z = torch.where(z > 1e-6, z, torch.ones_like(z))
            u = torch.round(camera.intrinsics[0, 0] * local[:, 0] / safe_z + camera.intrinsics[0, 2]).long()
            v = torch.round(camera.intrinsics[1, 1] * local[:, 1] / safe_z + camera.intrinsics[1, 2]).long()
            inside = (z > 1e-6) & (u >= 0) & (u < camera.width) & (v >= 0) & (v < camera.height)
            seen = depth[v.clamp(0, camera.height - 1), u.clamp(0, camera.width - 1)]
            signed = seen - z
            update = inside & (seen > 0) & (signed >= -distance)
            chosen = index[update]
            observed = (signed[update] / distance).clamp(max=1.0)
            old = weight[chosen]
            tsdf[chosen] = (tsdf[chosen] * old + observed) / (old + 1)
            colour[chosen] = (colour[chosen] * old[:, None] + view.rgb[v[update], u[update]]) / (old[:, None] + 1)
            weight[chosen] = old + 1
        if progress is not None:
            progress()
    return tsdf.reshape(size), weight.reshape(size), colour.reshape(*size, 3)


def extract_mesh(tsdf: Tensor, weight: Tensor, colour: Tensor, origin: Tensor, voxel: float) -> Mesh:
    """The zero level set of the seen voxels (scikit-image's marching cubes), in world coordinates."""
    marching_cubes = import_marching_cubes()
    seen = (weight > 0).numpy()
    values = tsdf.numpy()
    if not seen.any() or not (values[seen].min() < 0 < values[seen].max()):
        raise UserError(
            "export.outputs: mesh: no surface in the fused depth (no seen voxel on both sides of it); "
            "raise export.mesh_truncation or lower export.mesh_resolution"
        )
    # The distance grows towards the cameras: with "descent" (the inside is above the level) the faces are
    # wound counter-clockwise seen from the cameras (tests/test_export.py).
    vertices, faces, _, _ = marching_cubes(values, level=0.0, mask=seen, gradient_direction="descent")
    # A vertex lies on a grid edge; one whose edge ends in an unseen voxel (its 0 is no distance) would put
    # a surface along every border of the seen space: the faces touching such a vertex are dropped.
    low, high = np.floor(vertices).astype(np.int64), np.ceil(vertices).astype(np.int64)
    on_seen = seen[low[:, 0], low[:, 1], low[:, 2]] & seen[high[:, 0], high[:, 1], high[:, 2]]
    faces = faces[on_seen[faces].all(axis=1)]
    used = np.unique(faces)
    renumbered = np.full(len(vertices), -1, dtype=np.int64)
    renumbered[used] = np.arange(len(used))
    vertices, faces = vertices[used], renumbered[faces]
    if not len(faces):
        raise UserError(
            "export.outputs: mesh: no surface in the fused depth (no seen voxels on both sides of it); "
            "raise export.mesh_truncation or lower export.mesh_resolution"
        )
    nearest = np.clip(np.rint(vertices).astype(np.int64), 0, np.array(values.shape) - 1)
    vertex_colours = colour[nearest[:, 0], nearest[:, 1], nearest[:, 2]]
    world = origin.numpy()[None] + vertices.astype(np.float64) * voxel
    return Mesh(vertices=world.astype(np.float32), faces=faces.astype(np.int64), colours=to_uint8(vertex_colours))


def tsdf_mesh(
    rendered: list[RenderedView],
    masks: list[Tensor],
    points: Tensor,
    resolution: int,
    truncation_voxels: float,
    progress: Callable[[], object] | None = None,
) -> tuple[Mesh, dict[str, float | list[int]]]:
    """The mesh of the kept pixels (`masks`) of `rendered`, on a grid around `points` `[n, 3]`; and the
    grid's record (voxel side, size)."""
    import_marching_cubes()  # before the integration: a missing extra is one line at once
    origin, voxel, size = volume_box(points, truncation_voxels, resolution)
    tsdf, weight, colour = integrate(rendered, masks, origin, voxel, size, truncation_voxels, progress)
    mesh = extract_mesh(tsdf, weight, colour, origin, voxel)
    return mesh, {"voxel_size": voxel, "grid": list(size)}
