"""Fly-through camera paths for `render_video` and the viewer: GNT's spiral around the average pose,
a smooth path through any keyframes (the training cameras, or cameras a user placed), and the
conversions to nerfstudio's camera_path.json conventions (OpenGL camera axes, vertical field of view).

All poses are OpenCV camera-to-world matrices `[4, 4]` (x right, y down, z forward) in the scene's
normalised world frame; paths are computed in float64 and returned as float32 `[frames, 4, 4]`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float
from scipy.spatial.transform import Rotation
from torch import Tensor

from pola_gnt.geometry.cameras import average_pose, look_at

PATH_KINDS = ("spiral", "interpolate")
# OpenCV <-> OpenGL camera axes (x right, y down, z forward <-> x right, y up, z backward): the same
# matrix both ways, applied to the rotation's columns.
_FLIP_YZ = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
RADIUS_PERCENTILE = 90.0  # GNT / NeRF: spiral radii from the 90th percentile of camera offsets


def focus_depth(bounds: Float[Tensor, "views 2"]) -> float:
    """GNT's spiral focus depth from the normalised near/far bounds `[views, 2]`: the harmonic
    blend `1 / (0.25 / close + 0.75 / inf)` of `close = 0.9 * min` and `inf = 5 * max`."""
    close, infinity = 0.9 * float(bounds.min()), 5.0 * float(bounds.max())
    return 1.0 / (0.25 / close + 0.75 / infinity)


def spiral_path(
    c2w: Float[Tensor, "views 4 4"],
    bounds: Float[Tensor, "views 2"],
    frames: int = 120,
    rotations: float = 2.0,
    z_rate: float = 0.5,
    radius_scale: float = 1.0,
) -> Float[Tensor, "frames 4 4"]:
    """GNT's (NeRF's) spiral around the average of the cameras `c2w` `[views, 4, 4]`.

    In the average camera's frame the centre of frame `i` is `radii * [cos t, sin t, sin(z_rate t)]`
    for `t = 2 pi rotations i / frames`; every frame looks at the focus point `[0, 0, focus_depth]`
    straight ahead of the average camera, with the cameras' mean down direction. `radii` `[3]` are
    the 90th percentile of the absolute camera offsets per axis, times `radius_scale`.
    (NeRF writes the same in OpenGL axes as `[cos t, -sin t, -sin(z_rate t)]`.)
    """
    c2w = c2w.double()
    average = torch.from_numpy(average_pose(c2w.numpy()))  # [4, 4]
    local = torch.linalg.inv(average) @ c2w  # cameras in the average camera's frame
    radii = torch.quantile(local[:, :3, 3].abs(), RADIUS_PERCENTILE / 100.0, dim=0) * radius_scale  # [3]
    angles = torch.linspace(0.0, 2.0 * math.pi * rotations, frames + 1, dtype=torch.float64)[:-1]
    centers = radii * torch.stack([angles.cos(), angles.sin(), (angles * z_rate).sin()], dim=-1)  # [frames, 3]
    focus = torch.tensor([0.0, 0.0, focus_depth(bounds)], dtype=torch.float64)
    mean_down = F.normalize(local[:, :3, 1].sum(0), dim=0)
    return (average @ look_at(centers, focus, mean_down)).float()


def _catmull_rom(controls: Float[Tensor, "controls 3"], u: Float[Tensor, " n"]) -> Float[Tensor, "n 3"]:
    """Uniform Catmull-Rom spline through `controls[1:-1]` `[keys + 2, 3]` at curve parameters `u`
    `[n]` in `[0, keys - 1]` (segment `i` joins `controls[i + 1]` and `controls[i + 2]`) -> `[n, 3]`."""
    segment = u.floor().long().clamp(0, len(controls) - 4)
    t = (u - segment)[:, None]
    p0, p1, p2, p3 = (controls[segment + k] for k in range(4))
    return 0.5 * (
        2.0 * p1 + (p2 - p0) * t + (2.0 * p0 - 5.0 * p1 + 4.0 * p2 - p3) * t**2 + (3.0 * (p1 - p2) + p3 - p0) * t**3
    )


def _interp(x: Float[Tensor, " n"], xp: Float[Tensor, " m"], fp: Float[Tensor, " m"]) -> Float[Tensor, " n"]:
    """Piecewise-linear `fp(x)` for increasing `xp` (numpy's `interp`) `[n]`."""
    index = torch.searchsorted(xp, x).clamp(1, len(xp) - 1)
    x0, x1 = xp[index - 1], xp[index]
    weight = ((x - x0) / (x1 - x0).clamp(min=1e-12)).clamp(0.0, 1.0)
    return fp[index - 1] + weight * (fp[index] - fp[index - 1])


def interpolate_path(
    keyframes: Float[Tensor, "keys 4 4"], frames: int, closed: bool = False, table_steps: int = 256
) -> Float[Tensor, "frames 4 4"]:
    """A smooth path through the cameras `keyframes` `[keys, 4, 4]`, in their order.

    Positions follow a Catmull-Rom spline through the camera centres, travelled at constant speed
    (frames equally spaced in arc length, from a table of `table_steps` points per segment);
    orientations are slerped between consecutive keyframes. An open path starts at the first
    keyframe and ends at the last; a `closed` one returns to the first (which it does not repeat).
    """
    keys = len(keyframes)
    if keys < 2:
        raise ValueError(f"interpolate_path: needs at least 2 keyframes, got {keys}")
    keyframes = keyframes.double()
    centers = keyframes[:, :3, 3]
    if closed:
        controls = centers[torch.arange(-1, keys + 2) % keys]  # wrap around: keys + 3 points
        segments = keys
    else:
        # Reflect the end points so the spline starts and ends heading towards its neighbours.
        controls = torch.cat([2 * centers[:1] - centers[1:2], centers, 2 * centers[-1:] - centers[-2:-1]])
        segments = keys - 1

    table_u = torch.linspace(0.0, segments, segments * table_steps + 1, dtype=torch.float64)
    table = _catmull_rom(controls, table_u)
    arc = torch.cat([table.new_zeros(1), (table[1:] - table[:-1]).norm(dim=-1).cumsum(0)])
    stops = torch.linspace(0.0, 1.0, frames + 1 if closed else frames, dtype=torch.float64)
    stops = stops[:-1] if closed else stops
    if arc[-1] > 1e-9:
        u = _interp(stops * arc[-1], arc, table_u)
    else:  # every camera at one place (a tripod capture): spread the frames over the keyframes' turns
        u = stops * segments

    segment = u.floor().long().clamp(max=segments - 1)
    fraction = (u - segment).numpy()
    rotations = Rotation.from_matrix(keyframes[:, :3, :3].numpy())
    start = Rotation.concatenate([rotations[index] for index in segment.tolist()])
    end = Rotation.concatenate([rotations[index] for index in ((segment + 1) % keys).tolist()])
    turn = (start.inv() * end).as_rotvec()  # shortest rotation from one keyframe to the next
    slerped = start * Rotation.from_rotvec(fraction[:, None] * turn)

    c2w = torch.eye(4, dtype=torch.float64).repeat(len(u), 1, 1)
    c2w[:, :3, :3] = torch.from_numpy(slerped.as_matrix())
    c2w[:, :3, 3] = _catmull_rom(controls, u)
    return c2w.float()


def flip_camera_axes(c2w: Float[Tensor, "*frames 4 4"]) -> Float[Tensor, "*frames 4 4"]:
    """OpenCV c2w <-> OpenGL c2w (nerfstudio, three.js): the y and z camera axes negated, the centre kept."""
    return c2w * _FLIP_YZ.to(c2w)


def focal_from_fov(fov_degrees: Float[Tensor, "*frames"], height: int) -> Float[Tensor, "*frames"]:
    """Focal length in pixels of a vertical field of view (degrees) over `height` pixels."""
    return 0.5 * height / torch.tan(torch.deg2rad(fov_degrees.double()) / 2.0)


def fov_from_focal(focal: Float[Tensor, "*frames"], height: int) -> Float[Tensor, "*frames"]:
    """Vertical field of view (degrees) of a focal length in pixels over `height` pixels."""
    return torch.rad2deg(2.0 * torch.atan(0.5 * height / focal.double()))


def fov_intrinsics(fov_degrees: Float[Tensor, " frames"], height: int, width: int) -> Float[Tensor, "frames 3 3"]:
    """Pinhole intrinsics `[frames, 3, 3]` of square pixels and a centred principal point (the
    project's convention and nerfstudio's) from vertical fields of view in degrees."""
    focal = focal_from_fov(fov_degrees, height)
    intrinsics = torch.zeros(len(focal), 3, 3, dtype=torch.float64)
    intrinsics[:, 0, 0] = intrinsics[:, 1, 1] = focal
    intrinsics[:, 0, 2], intrinsics[:, 1, 2], intrinsics[:, 2, 2] = width / 2.0, height / 2.0, 1.0
    return intrinsics.float()
