"""Camera paths as files: nerfstudio's camera_path.json, read and written.

A path made in nerfstudio's viewer or in ours (`python -m pola_gnt.view`) renders with
`render_video video.path=FILE.json`, and the spiral and interpolated paths `render_video` generates
are saved in the same format (`video.save_path=FILE.json`).

The file's fields (nerfstudio's): `camera_path`, a list of cameras each with `camera_to_world` (a
flat row-major 4x4, OpenGL camera axes: x right, y up, looking down -z), `fov` (vertical, degrees)
and `aspect` (width / height); `render_height`, `render_width`, `fps`, `seconds`; `camera_type`
(only `perspective` renders here). Frame: the world frame of the file is the loaded scene's
normalised frame (translations scaled by `1 / (0.75 * min bound)`, recentred on the average
camera), the frame every pola_gnt pose is in; the file says so under `pola_gnt`
(`{"frame", "scene", "scale"}`, which nerfstudio ignores). A path made in nerfstudio's viewer is
in nerfstudio's own normalised frame and must be brought into this one first.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from pola_gnt.core.errors import UserError, is_number
from pola_gnt.core.files import write_atomic
from pola_gnt.geometry.camera_paths import flip_camera_axes

FRAME_NAME = "pola_gnt normalised scene frame (scale 1 / (0.75 min bound), recentred on the average camera)"
CAMERA_TYPE = "perspective"


@dataclass(frozen=True)
class CameraPath:
    """The frames of a video: where each camera is and how wide it sees, and the video's size and rate."""

    c2w: Float[Tensor, "frames 4 4"]  # OpenCV, the scene's normalised frame
    fov: Float[Tensor, " frames"]  # vertical field of view, degrees
    height: int
    width: int
    fps: float

    def __len__(self) -> int:
        return len(self.c2w)

    def scaled(self, scale: float) -> CameraPath:
        """The same cameras at `scale` times the width and height (at least 1 pixel per side); the
        field of view is an angle, so it is kept."""
        height, width = max(1, round(self.height * scale)), max(1, round(self.width * scale))
        return CameraPath(self.c2w, self.fov, height, width, self.fps)


def camera_path_document(path: CameraPath, scene_name: str, scene_scale: float) -> dict[str, Any]:
    """The camera_path.json document of `path` (nerfstudio's fields, and ours under `pola_gnt`)."""
    opengl = flip_camera_axes(path.c2w.double())
    aspect = path.width / path.height
    cameras = [
        {"camera_to_world": [float(v) for v in c2w.reshape(-1)], "fov": float(fov), "aspect": aspect}
        for c2w, fov in zip(opengl, path.fov.double())
    ]
    return {
        "camera_type": CAMERA_TYPE,
        "render_height": path.height,
        "render_width": path.width,
        "fps": path.fps,
        "seconds": len(path) / path.fps,
        "camera_path": cameras,
        "pola_gnt": {"frame": FRAME_NAME, "scene": scene_name, "scale": scene_scale},
    }


def write_camera_path(file: Path, path: CameraPath, scene_name: str, scene_scale: float) -> None:
    """Save `path` as camera_path.json (atomically)."""
    document = camera_path_document(path, scene_name, scene_scale)
    Path(file).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(file), (json.dumps(document, indent=1) + "\n").encode())


def _positive(document: dict, key: str, where: str, integer: bool = False) -> float:
    value = document.get(key)
    number = float(value) if is_number(value) and value is not None else math.nan  # a finite real, not a bool
    if not number > 0:
        raise UserError(f"{where}: `{key}` must be a positive number, got {value!r}")
    if integer and number != int(number):
        raise UserError(f"{where}: `{key}` must be a whole number of pixels, got {value!r}")
    return number


def read_camera_path(file: Path) -> CameraPath:
    """The cameras of a camera_path.json file (nerfstudio's format); a missing file, bad JSON or a
    bad field is one `UserError` naming the file and the field."""
    file = Path(file)
    try:
        document = json.loads(file.read_text())
    except FileNotFoundError:
        raise UserError(f"video.path: {file}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"video.path: {file}: not a readable JSON file ({err})") from None
    if not isinstance(document, dict):
        raise UserError(f"video.path: {file}: must hold a JSON object with a `camera_path` list")
    camera_type = document.get("camera_type", CAMERA_TYPE)
    if camera_type != CAMERA_TYPE:
        raise UserError(f"{file}: camera_type {camera_type!r}: only {CAMERA_TYPE!r} cameras render here")
    height = int(_positive(document, "render_height", str(file), integer=True))
    width = int(_positive(document, "render_width", str(file), integer=True))
    fps = _positive(document, "fps", str(file))
    cameras = document.get("camera_path")
    if not isinstance(cameras, list) or not cameras:
        raise UserError(f"{file}: `camera_path` must be a non-empty list of cameras")
    c2w, fov = [], []
    for index, camera in enumerate(cameras):
        where = f"{file}: camera_path[{index}]"
        matrix = camera.get("camera_to_world") if isinstance(camera, dict) else None
        if not (isinstance(matrix, list) and len(matrix) == 16 and all(is_number(v) for v in matrix)):
            raise UserError(f"{where}: `camera_to_world` must be 16 numbers (a row-major 4x4)")
        c2w.append(torch.tensor(matrix, dtype=torch.float64).reshape(4, 4))
        fov.append(_positive(camera, "fov", where))
        if fov[-1] >= 180.0:
            raise UserError(f"{where}: `fov` must be a vertical field of view in degrees below 180, got {fov[-1]}")
    poses = torch.stack(c2w)
    rotations = poses[:, :3, :3]
    identity = torch.eye(3, dtype=torch.float64).expand_as(rotations)
    bad = ((rotations @ rotations.transpose(1, 2) - identity).abs().amax(dim=(1, 2)) > 1e-3).nonzero()
    if len(bad):
        where = f"{file}: camera_path[{int(bad[0])}]"
        raise UserError(f"{where}: `camera_to_world` is not a rotation and a position (scaled or skewed axes)")
    # OpenCV camera axes; the bottom row set exactly (a file may round it).
    opencv = flip_camera_axes(poses)
    opencv[:, 3] = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    return CameraPath(c2w=opencv.float(), fov=torch.tensor(fov).float(), height=height, width=width, fps=fps)
