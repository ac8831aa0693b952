"""The files an export writes besides the PLYs: depth maps and the scene's cameras for other tools.

Frame and units: everything is in the loaded scene's normalised frame, the frame of every pola_gnt pose
and of `camera_path.json` (translations scaled by `scale` = 1 / (0.75 min bound), recentred on the
average camera): the point cloud, the mesh, the cameras and the depth fit together as written. A depth
in the scene's own files' units (COLMAP's, the demo scene's) is the written depth divided by `scale`,
which `depth.json` and `transforms.json` give.

- `depth/NAME.npy`: float32 `[H, W]` camera z-depth (0: none); `depth/NAME.png`: the same as 16-bit
  levels, depth = level x `png_depth_scale` (`depth.json`); `depth/NAME.confidence.npy` (float32) and
  `.confidence.png` (8-bit, 255 = 1): `export.confidence`; `depth/NAME.rgb.png`: the rendered colour;
  `depth/depth.json`: the frame, units, scales and each view's camera (OpenCV c2w, intrinsics, size).
- `cameras/transforms.json` (nerfstudio; OpenGL axes, as nerfstudio writes them) with the scene's images as
  pola_gnt saw them (`cameras/images/`, PNG) and the scene's train / test split; `cameras/colmap/`
  `cameras.txt`, `images.txt` (world-to-camera, OpenCV axes) and an empty `points3D.txt`, COLMAP's text
  model. Pixel convention: pola_gnt's rays go through integer pixel coordinates with the principal point
  at (W / 2, H / 2) (GNT, LLFF); the files give that principal point as is, as `process_data` writes its
  own transforms.json, so `scene=transforms` reads back exactly these cameras; a tool that puts pixel
  centres at +0.5 (COLMAP, nerfstudio) sees them half a pixel off.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pola_gnt.apps.camera_path_file import FRAME_NAME
from pola_gnt.apps.export.views import RenderedView, view_stem
from pola_gnt.apps.video import png_bytes
from pola_gnt.core.files import write_atomic
from pola_gnt.data.images import to_uint8
from pola_gnt.data.scene import Scene
from pola_gnt.data.transforms_json import TRANSFORMS_FILE, opengl_to_opencv

DEPTH_FOLDER = "depth"
CAMERAS_FOLDER = "cameras"
COLMAP_FOLDER = "colmap"
IMAGES_FOLDER = "images"
PNG_LEVELS = 65535


def json_bytes(document: Any) -> bytes:
    return (json.dumps(document, indent=1) + "\n").encode()


def frame_record(scene: Scene) -> dict[str, Any]:
    return {"frame": FRAME_NAME, "scene": scene.name, "scale": scene.scale}


def png16_bytes(levels: np.ndarray) -> bytes:
    import imageio.v3 as iio

    return iio.imwrite("<bytes>", levels.astype(np.uint16), extension=".png")


def write_depth_files(out_dir: Path, rendered: list[RenderedView], scene: Scene, confidence: str) -> Path:
    """The depth, confidence and colour of every rendered view, and `depth.json`; returns the folder."""
    folder = out_dir / DEPTH_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    deepest = max(float(view.depth.max()) for view in rendered)
    png_scale = deepest / PNG_LEVELS if deepest > 0 else 1.0
    views = []
    for view in rendered:
        name, depth = view.view.name, view.depth.numpy().astype(np.float32)
        write_atomic(folder / f"{name}.npy", npy_bytes(depth))
        write_atomic(folder / f"{name}.png", png16_bytes(np.clip(np.rint(depth / png_scale), 0, PNG_LEVELS)))
        write_atomic(folder / f"{name}.confidence.npy", npy_bytes(view.confidence.numpy().astype(np.float32)))
        grey = np.repeat(to_uint8(view.confidence)[..., None], 3, axis=-1)
        write_atomic(folder / f"{name}.confidence.png", png_bytes(grey))
        write_atomic(folder / f"{name}.rgb.png", png_bytes(to_uint8(view.rgb)))
        views.append(
            {
                "name": name,
                "c2w": view.view.c2w.double().tolist(),
                "intrinsics": view.view.intrinsics.double().tolist(),
                "width": view.view.width,
                "height": view.view.height,
                "source_views": [scene.image_names[i] for i in view.sources],
            }
        )
    document = {
        "pola_gnt": frame_record(scene),
        "depth": "camera z-depth (along the optical axis) in the frame's units; 0: no depth",
        "to_scene_units": 1.0 / scene.scale,
        "png_depth_scale": png_scale,
        "confidence": confidence,
        "camera_convention": "OpenCV c2w (x right, y down, z forward); rays through integer pixel coordinates",
        "views": views,
    }
    write_atomic(folder / "depth.json", json_bytes(document))
    return folder


def npy_bytes(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def image_file_names(scene: Scene) -> list[str]:
    """The scene's images as written under `cameras/images/` (PNG, the stem kept)."""
    return [f"{view_stem(name)}.png" for name in scene.image_names]


def transforms_document(scene: Scene, point_cloud: str | None) -> dict[str, Any]:
    """nerfstudio's transforms.json of the scene's cameras (one pinhole camera: LLFF's, shared)."""
    height, width = scene.resolution
    intrinsics = scene.cameras.intrinsics[0].double()
    names = [f"{IMAGES_FOLDER}/{name}" for name in image_file_names(scene)]
    frames = []
    for name, c2w, K in zip(names, scene.cameras.c2w.double().numpy(), scene.cameras.intrinsics.double()):
        frames.append(
            {
                "file_path": name,
                "transform_matrix": opengl_to_opencv(c2w).tolist(),  # the axis flip is its own inverse
                "fl_x": float(K[0, 0]),
                "fl_y": float(K[1, 1]),
                "cx": float(K[0, 2]),
                "cy": float(K[1, 2]),
            }
        )
    document: dict[str, Any] = {
        "camera_model": "PINHOLE",
        "fl_x": float(intrinsics[0, 0]),
        "fl_y": float(intrinsics[1, 1]),
        "cx": float(intrinsics[0, 2]),
        "cy": float(intrinsics[1, 2]),
        "w": width,
        "h": height,
        "frames": frames,
        "applied_transform": np.eye(4)[:3].tolist(),
        "train_filenames": [names[i] for i in scene.train_ids],
        "test_filenames": [names[i] for i in scene.test_ids],
        "pola_gnt": frame_record(scene),
    }
    if point_cloud is not None:
        document["ply_file_path"] = point_cloud
    return document


def rotation_quaternion(rotation: np.ndarray) -> np.ndarray:
    """A rotation matrix `[3, 3]` as COLMAP's unit quaternion (w, x, y, z), w >= 0."""
    m = rotation
    trace = float(np.trace(m))
    if trace > 0:
        s = 2.0 * np.sqrt(trace + 1.0)
        q = np.array([0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s])
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = np.array([(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s])
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = np.array([(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s])
    else:
        s = 2.0 * np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = np.array([(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s])
    q /= np.linalg.norm(q)
    return q if q[0] >= 0 else -q


def colmap_text(scene: Scene) -> dict[str, str]:
    """COLMAP's text model of the scene's cameras: `cameras.txt`, `images.txt`, `points3D.txt` (empty)."""
    height, width = scene.resolution
    intrinsics = scene.cameras.intrinsics.double().numpy()
    cameras: dict[tuple[float, ...], int] = {}
    camera_lines, image_lines = [], []
    for index, (name, c2w) in enumerate(zip(image_file_names(scene), scene.cameras.c2w.double().numpy())):
        K = intrinsics[index]
        params = (float(K[0, 0]), float(K[1, 1]), float(K[0, 2]), float(K[1, 2]))
        if params not in cameras:
            cameras[params] = len(cameras) + 1
            camera_lines.append(f"{cameras[params]} PINHOLE {width} {height} " + " ".join(f"{p:.10g}" for p in params))
        w2c = np.linalg.inv(c2w)
        qw, qx, qy, qz = rotation_quaternion(w2c[:3, :3])
        tx, ty, tz = w2c[:3, 3]
        pose = " ".join(f"{value:.12g}" for value in (qw, qx, qy, qz, tx, ty, tz))
        image_lines.append(f"{index + 1} {pose} {cameras[params]} {name}")
        image_lines.append("")  # no 2D points
    header = "# written by pola_gnt export: the scene's cameras in its normalised frame\n"
    return {
        "cameras.txt": header + "# CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n" + "\n".join(camera_lines) + "\n",
        "images.txt": header
        + "# IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n# POINTS2D[] as (X, Y, POINT3D_ID)\n"
        + "\n".join(image_lines)
        + "\n",
        "points3D.txt": header + "# POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] (none here: see pointcloud.ply)\n",
    }


def write_camera_files(out_dir: Path, scene: Scene, point_cloud: str | None) -> Path:
    """`cameras/transforms.json`, `cameras/images/` and `cameras/colmap/*.txt`; returns the folder."""
    folder = out_dir / CAMERAS_FOLDER
    (folder / IMAGES_FOLDER).mkdir(parents=True, exist_ok=True)
    (folder / COLMAP_FOLDER).mkdir(parents=True, exist_ok=True)
    for name, image in zip(image_file_names(scene), scene.images):
        write_atomic(folder / IMAGES_FOLDER / name, png_bytes(to_uint8(image)))
    for name, text in colmap_text(scene).items():
        write_atomic(folder / COLMAP_FOLDER / name, text.encode())
    write_atomic(folder / TRANSFORMS_FILE, json_bytes(transforms_document(scene, point_cloud)))
    return folder
