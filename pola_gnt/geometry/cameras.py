"""Cameras and poses: the `Cameras` of a scene, `look_at`, the LLFF <-> OpenCV pose conversions and
GNT's pose normalisation.

Convention (docs/ARCHITECTURE.md): `c2w` is an OpenCV camera-to-world matrix `[4, 4]` whose rotation
columns are x right, y down, z forward; `K` the `[3, 3]` pinhole intrinsics. LLFF stores the rotation
columns as `[down, right, back]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor


@dataclass
class Cameras:
    """Pinhole cameras of one image size: `[views, ...]`, or one camera (`cameras[i]`) without the axis."""

    c2w: Float[Tensor, "*views 4 4"]  # OpenCV camera-to-world
    intrinsics: Float[Tensor, "*views 3 3"]
    height: int
    width: int

    @property
    def centers(self) -> Float[Tensor, "*views 3"]:
        return self.c2w[:, :3, 3]

    def __len__(self) -> int:
        return self.c2w.shape[0]

    def __getitem__(self, index: int | slice | list[int] | Tensor) -> Cameras:
        return Cameras(self.c2w[index], self.intrinsics[index], self.height, self.width)


def cross(a: Float[Tensor, "*batch 3"], b: Float[Tensor, "*batch 3"]) -> Float[Tensor, "*batch 3"]:
    """`a x b` over the last axis, each component rounded as two products and a difference (as
    numpy's `cross`; `torch.linalg.cross` fuses them and can differ in the last bit)."""
    a0, a1, a2 = a.unbind(-1)
    b0, b1, b2 = b.unbind(-1)
    return torch.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], dim=-1)


def look_at(
    centers: Float[Tensor, "cameras 3"],
    target: Float[Tensor, "*cameras 3"],
    down: Float[Tensor, " 3"],
    roll: Float[Tensor, " cameras"] | None = None,
) -> Float[Tensor, "cameras 4 4"]:
    """Cameras at `centers` looking at `target` (one point `[3]` or one per camera), image rows along
    `down` as far as possible (OpenCV: right = down x forward), then turned by `roll` radians about
    the viewing axis -> c2w `[cameras, 4, 4]` in the dtype of `centers`."""
    forward = F.normalize(target - centers, dim=-1)
    right = F.normalize(cross(down.expand_as(forward), forward), dim=-1)
    down_axis = cross(forward, right)
    if roll is not None:  # hand-held captures are never perfectly level
        cos, sin = roll.cos()[:, None], roll.sin()[:, None]
        right, down_axis = cos * right + sin * down_axis, -sin * right + cos * down_axis
    c2w = torch.eye(4, dtype=centers.dtype).repeat(len(centers), 1, 1)
    c2w[:, :3, :3] = torch.stack([right, down_axis, forward], dim=-1)
    c2w[:, :3, 3] = centers
    return c2w


def llff_to_opencv(poses: Float[np.ndarray, "views 3 4"]) -> Float[np.ndarray, "views 4 4"]:
    """LLFF `[views, 3, 4]` with rotation columns [down, right, back] -> OpenCV c2w `[views, 4, 4]`."""
    down, right, back, translation = (poses[:, :, i] for i in range(4))
    c2w = np.zeros((len(poses), 4, 4))
    c2w[:, :3, 0] = right
    c2w[:, :3, 1] = down
    c2w[:, :3, 2] = -back
    c2w[:, :3, 3] = translation
    c2w[:, 3, 3] = 1.0
    return c2w


def opencv_to_llff(c2w: Float[np.ndarray, "views 4 4"]) -> Float[np.ndarray, "views 3 4"]:
    """`[views, 4, 4]` OpenCV c2w -> `[views, 3, 4]` LLFF `[down, right, back | t]` = `[c1, c0, -c2 | t]`."""
    rotation = c2w[:, :3, :3]
    llff_rotation = np.stack([rotation[:, :, 1], rotation[:, :, 0], -rotation[:, :, 2]], axis=-1)
    return np.concatenate([llff_rotation, c2w[:, :3, 3:4]], axis=-1)


def average_pose(c2w: Float[np.ndarray, "views 4 4"]) -> Float[np.ndarray, "4 4"]:
    """Mean camera `[4, 4]` (OpenCV axes): mean centre, mean forward and down axes re-orthonormalised."""
    center = c2w[:, :3, 3].mean(0)
    forward = _normalize(c2w[:, :3, 2].sum(0))
    down = c2w[:, :3, 1].sum(0)
    right = _normalize(np.cross(down, forward))
    down = np.cross(forward, right)
    pose = np.eye(4)
    pose[:3, :4] = np.stack([right, down, forward, center], axis=1)
    return pose


def normalise_poses(
    c2w: Float[np.ndarray, "views 4 4"], bounds: Float[np.ndarray, "views 2"]
) -> tuple[Float[np.ndarray, "views 4 4"], Float[np.ndarray, "views 2"], float]:
    """GNT's normalisation: scale by `1 / (0.75 * min bound)`, then recentre on the average pose."""
    scale = 1.0 / (0.75 * bounds.min())
    c2w = c2w.copy()
    c2w[:, :3, 3] *= scale
    c2w = np.linalg.inv(average_pose(c2w))[None] @ c2w
    return c2w, bounds * scale, float(scale)


def _normalize(vector: Float[np.ndarray, " 3"]) -> Float[np.ndarray, " 3"]:
    return vector / np.linalg.norm(vector)
