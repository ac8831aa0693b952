"""`transforms.json` captures (nerfstudio, instant-ngp) -> a normalised `Scene`, and the pieces NeRF's
Blender scenes (`data.blender`) share with them: OpenGL camera axes and the matrix checks.

What is read (nerfstudio's "data conventions"):
- `frames[i].file_path` (relative to the folder; without an extension, `.png` is tried), and
  `transform_matrix`: camera-to-world in OpenGL axes (x right, y up, z back), turned into the project's
  OpenCV axes by negating the y and z columns (`opengl_to_opencv`);
- intrinsics at the top level or per frame (a frame's own value wins): `fl_x`, `fl_y`, `cx`, `cy`, `w`,
  `h` (or instant-ngp's `camera_angle_x` / `camera_angle_y`), and `camera_model` with its distortion
  `k1..k4`, `p1`, `p2` (`CAMERA_MODELS`). Distorted images are resampled on load into the pinhole camera
  of the same `fl_x`, `fl_y`, `cx`, `cy`; another model is one `error:` line. The principal point is
  used as written, with rays through integer pixel coordinates, as the LLFF loader does;
- `applied_transform` (3x4, what nerfstudio applied to its reconstruction's world) is undone, so the
  cameras come back in the frame of the reconstruction (for `process_data`'s scenes: COLMAP's, the
  frame of `poses_bounds.npy`);
- bounds: per view, the 0.1 / 99.9 percentiles of the depths of the points of `ply_file_path` inside
  its image (LLFF's rule); without a point cloud, from the camera layout (`layout_bounds`), said in
  the scene summary.
`data.factor` F > 1 reads nerfstudio's `downscale_factor` folders (`images_F/` beside `images/`: the
frame's folder name + `_F`), or area-downsamples the full-size images in memory when they are missing.
The scene is then normalised as an LLFF scene (GNT's scale and recentring) and split by `data.llffhold`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from pola_gnt.core.errors import UserError
from pola_gnt.data.colmap import LLFF_PERCENTILES
from pola_gnt.data.images import read_image
from pola_gnt.data.llff import llffhold_split
from pola_gnt.data.ply import read_ply_vertices
from pola_gnt.data.scene import Scene, bounds_depth_range
from pola_gnt.data.source_views import detect_rig, resolve_rig
from pola_gnt.geometry.cameras import Cameras, normalise_poses

TRANSFORMS_FILE = "transforms.json"
ROTATION_TOLERANCE = 1e-3  # max |R^T R - I| of a camera rotation (written as float32 or better)
PINHOLE_MODELS = ("PINHOLE", "SIMPLE_PINHOLE")
CAMERA_MODELS = (*PINHOLE_MODELS, "OPENCV", "OPENCV_FISHEYE")  # nerfstudio's, less EQUIRECTANGULAR
DISTORTION_KEYS = ("k1", "k2", "k3", "k4", "p1", "p2")
MIN_POINTS_PER_VIEW = 10  # fewer points in a view's image: the point cloud cannot bound it
# `layout_bounds` of a forward-facing rig, in units of the rig's extent (largest distance between two camera
# centres). LLFF's own bounds span 0.36 .. 1.65 (near) and 3.1 .. 12.8 (far) extents over fern, fortress,
# room, ollie and DTU scan 24: a near below and a far above all of them.
FORWARD_NEAR_EXTENTS, FORWARD_FAR_EXTENTS = 0.3, 20.0
# ... of an object-centric rig, in units of each camera's distance to the point its optical axes converge
# on: NeRF's Blender cameras sit 4 units from the object with GNT's near / far 2 and 6.
OBJECT_NEAR, OBJECT_FAR = 0.5, 1.5


# ---- what transforms.json files and NeRF's Blender scenes share ------------------------------------------


def read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise UserError(f"{file}: not found")
    try:
        document = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{file}: cannot read as JSON ({err})") from None
    if not isinstance(document, dict):
        raise UserError(f"{file}: expected a JSON object with a `frames` list")
    frames = document.get("frames")
    if not isinstance(frames, list) or not frames or not all(isinstance(f, dict) for f in frames):
        raise UserError(f"{file}: `frames` must be a non-empty list of objects")
    return document


def frame_matrix(file: Path, frames: list[dict[str, Any]]) -> Float[np.ndarray, "views 4 4"]:
    """Every frame's `transform_matrix` (camera-to-world, as stored) `[views, 4, 4]`, checked: 4x4 (or
    3x4), finite, a rotation (orthonormal, determinant +1) and a bottom row 0 0 0 1."""
    matrices = []
    for i, frame in enumerate(frames):
        matrix = frame.get("transform_matrix")
        try:
            array = np.array(matrix, dtype=np.float64)
        except (TypeError, ValueError):
            array = np.zeros(0)
        if array.shape == (3, 4):
            array = np.concatenate([array, [[0.0, 0.0, 0.0, 1.0]]])
        if array.shape != (4, 4):
            raise UserError(f"{file}: frames[{i}].transform_matrix must be a 4x4 matrix, got {matrix!r}"[:300])
        check_rigid(array, f"{file}: frames[{i}].transform_matrix")
        matrices.append(array)
    return np.stack(matrices)


def check_rigid(matrix: np.ndarray, where: str) -> None:
    """A camera pose `[4, 4]` (or `[3, 4]`): finite, its rotation orthonormal with determinant +1."""
    if not np.all(np.isfinite(matrix)):
        raise UserError(f"{where}: contains non-finite values")
    rotation = matrix[:3, :3]
    error = float(np.abs(rotation.T @ rotation - np.eye(3)).max())
    if error > ROTATION_TOLERANCE or np.linalg.det(rotation) < 0:
        raise UserError(
            f"{where}: not a rigid camera pose (max |R^T R - I| = {error:.3g}, det {np.linalg.det(rotation):.3g}); "
            f"the rotation must be orthonormal without scale or mirroring"
        )
    if matrix.shape[0] == 4 and not np.allclose(matrix[3], [0.0, 0.0, 0.0, 1.0]):
        raise UserError(f"{where}: the last row must be 0 0 0 1, got {matrix[3].tolist()}")


def opengl_to_opencv(c2w: Float[np.ndarray, "*views 4 4"]) -> Float[np.ndarray, "*views 4 4"]:
    """OpenGL / Blender / nerfstudio camera axes (x right, y up, z back) <-> OpenCV's (x right, y down,
    z forward): the y and z columns negated (its own inverse)."""
    return c2w @ np.diag([1.0, -1.0, -1.0, 1.0])


def frame_file(folder: Path, file_path: object, where: str) -> Path:
    """A frame's image: `file_path` relative to `folder` (NeRF's and instant-ngp's may lack `.png`)."""
    if not isinstance(file_path, str) or not file_path:
        raise UserError(f"{where}.file_path: must be an image path, got {file_path!r}")
    file = folder / file_path
    if not file.suffix and not file.is_file():
        file = file.with_suffix(".png")
    return file


def area_downsample(images: Float[Tensor, "views height width 3"], factor: int) -> Float[Tensor, "views h w 3"]:
    """Area filter by an integer factor (the mean of each factor x factor block; a remainder cut off)."""
    if factor == 1:
        return images
    small = F.avg_pool2d(images.permute(0, 3, 1, 2), factor)
    return small.permute(0, 2, 3, 1).contiguous()


# ---- transforms.json ---------------------------------------------------------------------------------------


@dataclass
class TransformsCameras:
    """The cameras of a transforms.json file, as read (before normalisation), in the reconstruction's
    frame (its `applied_transform` undone), OpenCV axes, at the full size `width` x `height`."""

    files: list[Path]
    c2w: Float[np.ndarray, "views 4 4"]  # OpenCV axes
    intrinsics: Float[np.ndarray, "views 3 3"]  # fx, fy, cx, cy as written
    distortion: list[tuple[str, dict[str, float]]]  # per frame: camera model and its coefficients
    height: int
    width: int
    points: Float[np.ndarray, "points 3"] | None  # the point cloud in the same frame, if any


def read_transforms(folder: Path) -> TransformsCameras:
    """`folder/transforms.json` -> its cameras, checked (one `UserError` naming the file and frame)."""
    file = folder / TRANSFORMS_FILE
    document = read_json(file)
    frames = document["frames"]
    files = [frame_file(folder, frame.get("file_path"), f"{file}: frames[{i}]") for i, frame in enumerate(frames)]
    c2w_file = frame_matrix(file, frames)
    applied = applied_transform(file, document)
    intrinsics, distortion, sizes = [], [], set()
    for i, frame in enumerate(frames):
        camera, model, coefficients, size = frame_intrinsics(file, document, frame, i)
        intrinsics.append(camera)
        distortion.append((model, coefficients))
        sizes.add(size)
    if len(sizes) > 1:
        raise UserError(f"{file}: frames of different image sizes {sorted(sizes)}; one size per scene is supported")
    width, height = sizes.pop()
    points = read_points(folder, document, file)
    # The file's world is applied_transform x the reconstruction's: undo it for cameras and points alike.
    inverse = np.linalg.inv(applied)
    c2w = opengl_to_opencv(inverse[None] @ c2w_file)
    if points is not None:
        points = points @ inverse[:3, :3].T + inverse[:3, 3]
    return TransformsCameras(files, c2w, np.stack(intrinsics), distortion, height, width, points)


def applied_transform(file: Path, document: dict[str, Any]) -> Float[np.ndarray, "4 4"]:
    value = document.get("applied_transform")
    if value is None:
        return np.eye(4)
    try:
        matrix = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        matrix = np.zeros(0)
    if matrix.shape == (3, 4):
        matrix = np.concatenate([matrix, [[0.0, 0.0, 0.0, 1.0]]])
    if matrix.shape != (4, 4):
        raise UserError(f"{file}: applied_transform must be a 3x4 matrix, got {value!r}"[:300])
    check_rigid(matrix, f"{file}: applied_transform")
    return matrix


def frame_intrinsics(
    file: Path, document: dict[str, Any], frame: dict[str, Any], index: int
) -> tuple[np.ndarray, str, dict[str, float], tuple[int, int]]:
    """Frame `index`'s `K` `[3, 3]`, camera model, distortion coefficients and (w, h): its own keys
    first, then the file's."""
    where = f"{file}: frames[{index}]"

    def value(key: str, default: object = None) -> Any:
        return frame.get(key, document.get(key, default))

    def number(key: str, positive: bool = True) -> float:
        raw = value(key)
        if (
            isinstance(raw, bool)
            or not isinstance(raw, (int, float))
            or not math.isfinite(raw)
            or (positive and raw <= 0)
        ):
            kind = "a positive number" if positive else "a number"
            raise UserError(f"{where}: {key} must be {kind}, got {raw!r} (set at the top level or per frame)")
        return float(raw)

    model = value("camera_model", "OPENCV")
    if model not in CAMERA_MODELS:
        raise UserError(f"{where}: camera_model {model!r} is not supported; expected one of {', '.join(CAMERA_MODELS)}")
    width, height = number("w"), number("h")
    if not (width.is_integer() and height.is_integer()):
        raise UserError(f"{where}: w and h must be whole pixels, got {width} x {height}")
    if value("fl_x") is None and value("camera_angle_x") is not None:  # instant-ngp: fields of view
        fx = 0.5 * width / math.tan(0.5 * number("camera_angle_x"))
        fy = 0.5 * height / math.tan(0.5 * number("camera_angle_y")) if value("camera_angle_y") is not None else fx
    else:
        fx = number("fl_x")
        fy = number("fl_y") if value("fl_y") is not None else fx
    cx = number("cx", positive=False) if value("cx") is not None else width / 2
    cy = number("cy", positive=False) if value("cy") is not None else height / 2
    coefficients = {key: number(key, positive=False) for key in DISTORTION_KEYS if value(key) is not None}
    if model in PINHOLE_MODELS and any(coefficients.values()):
        raise UserError(f"{where}: camera_model {model} has no distortion, but {coefficients} are given")
    camera = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
    return camera, model, coefficients, (int(width), int(height))


def read_points(folder: Path, document: dict[str, Any], file: Path) -> np.ndarray | None:
    name = document.get("ply_file_path")
    if name is None:
        return None
    if not isinstance(name, str) or not (folder / name).is_file():
        raise UserError(f"{file}: ply_file_path {name!r} not found in {folder}")
    return read_ply_points(folder / name)


def read_ply_points(file: Path) -> Float[np.ndarray, "points 3"]:
    """The `x y z` of a PLY file's vertices (ASCII or binary; the vertex element first, no list properties)."""
    columns = read_ply_vertices(file)
    points = np.stack([columns[axis].astype(np.float64) for axis in "xyz"], axis=-1)
    if len(points) == 0:
        raise UserError(f"{file}: no vertices with x, y, z")
    return points[np.all(np.isfinite(points), axis=-1)]


def write_ply_points(file: Path, points: np.ndarray, colours: np.ndarray | None = None) -> None:
    """Points `[n, 3]` (and uint8 colours `[n, 3]`) as a binary PLY, as nerfstudio's `sparse_pc.ply`."""
    fields = [("x", "<f4"), ("y", "<f4"), ("z", "<f4")]
    if colours is not None:
        fields += [("red", "u1"), ("green", "u1"), ("blue", "u1")]
    vertices = np.empty(len(points), dtype=np.dtype(fields))
    for i, axis in enumerate("xyz"):
        vertices[axis] = points[:, i]
    lines = ["ply", "format binary_little_endian 1.0", f"element vertex {len(points)}"]
    lines += [f"property float {axis}" for axis in "xyz"]
    if colours is not None:
        for i, channel in enumerate(("red", "green", "blue")):
            vertices[channel] = colours[:, i]
            lines.append(f"property uchar {channel}")
    file.write_bytes(("\n".join([*lines, "end_header"]) + "\n").encode() + vertices.tobytes())


def point_bounds(
    c2w: Float[np.ndarray, "views 4 4"],
    intrinsics: Float[np.ndarray, "views 3 3"],
    points: np.ndarray,
    size: tuple[int, int],
) -> np.ndarray | None:
    """Per view, the LLFF percentiles of the depths of the points inside its image `[views, 2]`; None
    when a view sees fewer than `MIN_POINTS_PER_VIEW`."""
    width, height = size
    bounds = []
    for camera, K in zip(c2w, intrinsics):
        local = (points - camera[:3, 3]) @ camera[:3, :3]  # world -> camera (OpenCV)
        depth = local[:, 2]
        front = depth > 0
        pixels = local[front, :2] / depth[front, None] * K[[0, 1], [0, 1]] + K[:2, 2]
        inside = (pixels[:, 0] >= 0) & (pixels[:, 0] < width) & (pixels[:, 1] >= 0) & (pixels[:, 1] < height)
        seen = depth[front][inside]
        if len(seen) < MIN_POINTS_PER_VIEW:
            return None
        bounds.append(np.percentile(seen, LLFF_PERCENTILES))
    return np.array(bounds)


def convergence_point(c2w: Float[np.ndarray, "views 4 4"]) -> np.ndarray:
    """The point nearest (least squares) to every camera's optical axis."""
    axes = c2w[:, :3, 2] / np.linalg.norm(c2w[:, :3, 2], axis=-1, keepdims=True)
    projectors = np.eye(3)[None] - axes[:, :, None] * axes[:, None, :]  # onto each axis' normal plane
    return np.linalg.lstsq(projectors.sum(0), np.einsum("vij,vj->i", projectors, c2w[:, :3, 3]), rcond=None)[0]


def layout_bounds(c2w: Float[np.ndarray, "views 4 4"], rig: str) -> tuple[np.ndarray, str]:
    """Near / far per view `[views, 2]` from the camera layout alone, and how (for the summary). An
    object rig: `OBJECT_NEAR`, `OBJECT_FAR` times each camera's depth of the point its optical axes
    converge on; a forward-facing one: `FORWARD_NEAR_EXTENTS`, `FORWARD_FAR_EXTENTS` times the rig's extent."""
    centres = c2w[:, :3, 3]
    if rig == "object":
        depth = ((convergence_point(c2w) - centres) * c2w[:, :3, 2]).sum(-1)
        if np.all(depth > 0):
            how = (
                f"the camera layout (no point cloud): {OBJECT_NEAR:g} .. {OBJECT_FAR:g} x each camera's distance "
                f"to the point its optical axes converge on"
            )
            return np.stack([OBJECT_NEAR * depth, OBJECT_FAR * depth], axis=-1), how
    extent = max(float(np.linalg.norm(centres[:, None] - centres[None], axis=-1).max()), 1e-6)
    how = (
        f"the camera layout (no point cloud): {FORWARD_NEAR_EXTENTS:g} .. {FORWARD_FAR_EXTENTS:g} x the rig's "
        f"extent ({extent:.3g}, the largest distance between two cameras)"
    )
    return np.tile([FORWARD_NEAR_EXTENTS * extent, FORWARD_FAR_EXTENTS * extent], (len(c2w), 1)), how


def load_transforms_scene(
    path: str | Path, factor: int = 1, llffhold: int = 8, name: str | None = None, rig: str = "auto"
) -> Scene:
    """A nerfstudio / instant-ngp capture (`path/transforms.json`) -> a normalised `Scene`."""
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"{folder}: scene folder not found")
    cameras = read_transforms(folder)
    images, intrinsics = read_frames(cameras, factor)
    c2w = cameras.c2w
    rig, rig_reason = resolve_rig(rig, torch.from_numpy(c2w).float())
    bounds, bounds_reason = None, ""
    if cameras.points is not None:
        bounds = point_bounds(c2w, cameras.intrinsics, cameras.points, (cameras.width, cameras.height))
        bounds_reason = "the point cloud" if bounds is not None else ""
    if bounds is None:
        layout_rig = detect_rig(torch.from_numpy(c2w).float())[0] if rig == "auto" else rig
        bounds, bounds_reason = layout_bounds(c2w, layout_rig)
        if cameras.points is not None:
            bounds_reason += f"; a view sees fewer than {MIN_POINTS_PER_VIEW} points of the point cloud"
    normalised, bounds, scale = normalise_poses(c2w, bounds)
    height, width = images.shape[1:3]
    train_ids, test_ids = llffhold_split(len(images), llffhold)
    bounds_tensor = torch.from_numpy(bounds).float()
    return Scene(
        name=name or folder.name,
        path=folder,
        factor=factor,
        image_names=[file.name for file in cameras.files],
        images=images,
        cameras=Cameras(torch.from_numpy(normalised).float(), intrinsics, int(height), int(width)),
        bounds=bounds_tensor,
        train_ids=train_ids,
        test_ids=test_ids,
        scale=scale,
        rig=rig,
        depth_range=bounds_depth_range(bounds_tensor),
        rig_reason=rig_reason,
        bounds_reason=bounds_reason,
    )


def downscaled_file(file: Path, factor: int) -> Path:
    """nerfstudio's `downscale_factor` copy of a frame: `images/x.jpg` -> `images_F/x.jpg`, or
    `images_F/x.png` as `process_data` (and the LLFF loader) write them."""
    folder = file.parent.with_name(f"{file.parent.name}_{factor}")
    same = folder / file.name
    return same if same.is_file() or not (folder / f"{file.stem}.png").is_file() else folder / f"{file.stem}.png"


def read_frames(
    cameras: TransformsCameras, factor: int
) -> tuple[Float[Tensor, "views height width 3"], Float[Tensor, "views 3 3"]]:
    """Every frame at 1 / `factor` of the full size, undistorted; -> images in [0, 1] and their `K`."""
    full = cameras.width, cameras.height
    expected = (round(cameras.width / factor), round(cameras.height / factor))
    prebuilt = factor > 1 and all(downscaled_file(f, factor).is_file() for f in cameras.files)
    images = []
    for file, camera, (model, coefficients) in zip(cameras.files, cameras.intrinsics, cameras.distortion, strict=True):
        source = downscaled_file(file, factor) if prebuilt else file
        if not source.is_file():
            raise UserError(f"{source}: frame image not found (file_path of {TRANSFORMS_FILE})")
        image = torch.from_numpy(read_image(source)).float() / 255.0
        size = (image.shape[1], image.shape[0])
        wanted = expected if prebuilt else full
        if abs(size[0] - wanted[0]) > 1 or abs(size[1] - wanted[1]) > 1:
            raise UserError(
                f"{source}: {size[0]}x{size[1]} pixels, but {TRANSFORMS_FILE} gives w x h = {full[0]}x{full[1]}"
                + (f" (/{factor}: {wanted[0]}x{wanted[1]})" if prebuilt else "")
            )
        scaled = camera.copy()
        scaled[0] *= size[0] / full[0]  # x by the width's ratio, y by the height's
        scaled[1] *= size[1] / full[1]
        if model not in PINHOLE_MODELS and any(coefficients.values()):
            image = undistort(image, scaled, model, coefficients)
        images.append(image)
    stacked = torch.stack(images)
    intrinsics = torch.from_numpy(cameras.intrinsics.copy()).float()
    if prebuilt:  # resized to about w / F x h / F: each axis by its own ratio
        intrinsics[:, 0] *= stacked.shape[2] / cameras.width
        intrinsics[:, 1] *= stacked.shape[1] / cameras.height
    else:  # F x F blocks from the top-left corner: exactly 1 / F
        stacked = area_downsample(stacked, factor)
        intrinsics[:, :2] /= factor
    return stacked, intrinsics


def distort(
    x: Float[np.ndarray, "*points"], y: Float[np.ndarray, "*points"], model: str, k: dict[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    """Normalised pinhole coordinates -> distorted ones, nerfstudio's models: OPENCV (radial k1..k4 as
    a polynomial in r^2, tangential p1, p2) and OPENCV_FISHEYE (equidistant, k1..k4)."""
    k1, k2, k3, k4 = (k.get(name, 0.0) for name in ("k1", "k2", "k3", "k4"))
    if model == "OPENCV_FISHEYE":
        r = np.sqrt(x * x + y * y)
        theta = np.arctan(r)
        t2 = theta * theta
        theta_d = theta * (1 + t2 * (k1 + t2 * (k2 + t2 * (k3 + t2 * k4))))
        ratio = np.where(r > 1e-12, theta_d / np.maximum(r, 1e-12), 1.0)
        return x * ratio, y * ratio
    p1, p2 = k.get("p1", 0.0), k.get("p2", 0.0)
    r2 = x * x + y * y
    radial = 1 + r2 * (k1 + r2 * (k2 + r2 * (k3 + r2 * k4)))
    return (
        x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x),
        y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y,
    )


def undistort(
    image: Float[Tensor, "height width 3"], camera: np.ndarray, model: str, coefficients: dict[str, float]
) -> Float[Tensor, "height width 3"]:
    """The distorted photo seen through the pinhole camera of the same `K` (size kept): each pixel's
    centre (+0.5, nerfstudio's convention) is distorted and read there, bicubic, edges repeated."""
    height, width = image.shape[:2]
    fx, fy, cx, cy = camera[0, 0], camera[1, 1], camera[0, 2], camera[1, 2]
    u, v = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    xd, yd = distort((u - cx) / fx, (v - cy) / fy, model, coefficients)
    grid = np.stack([2 * (xd * fx + cx) / width - 1, 2 * (yd * fy + cy) / height - 1], axis=-1)
    sampled = F.grid_sample(
        image.permute(2, 0, 1)[None],
        torch.from_numpy(grid).float()[None],
        mode="bicubic",
        padding_mode="border",
        align_corners=False,
    )
    return sampled[0].permute(1, 2, 0).clamp(0, 1).contiguous()


def transforms_document(
    files: list[str], c2w: Float[np.ndarray, "views 4 4"], focal: float, width: int, height: int, ply: str | None
) -> dict[str, Any]:
    """A nerfstudio `transforms.json` for pinhole images (OpenCV `c2w` in, OpenGL axes written), the
    principal point at the centre, no `applied_transform` (identity): `process_data`'s scenes."""
    document: dict[str, Any] = {
        "camera_model": "PINHOLE",
        "fl_x": focal,
        "fl_y": focal,
        "cx": width / 2,
        "cy": height / 2,
        "w": width,
        "h": height,
        "frames": [
            {"file_path": name, "transform_matrix": opengl_to_opencv(matrix).tolist()}
            for name, matrix in zip(files, c2w, strict=True)
        ],
        "applied_transform": np.eye(4)[:3].tolist(),
    }
    if ply is not None:
        document["ply_file_path"] = ply
    return document
