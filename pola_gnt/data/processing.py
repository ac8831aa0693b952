"""A capture -> a scene folder: the library behind `python -m pola_gnt.process_data`.

Turns a capture (a folder of photos or a video) into a scene in the LLFF layout with COLMAP
(pycolmap), ready for `python -m pola_gnt.train scene=llff scene.path=SCENE_DIR`:

- `images/` (undistorted to a pinhole camera, principal point at the centre, full size; one
  bicubic resampling of each photo),
  `images_4/`, `images_8/` (area filter, as the loader builds them),
- `poses_bounds.npy` (N x 17: LLFF's `[down, right, back | t | h w f]` and near/far per view from
  the 0.1 / 99.9 percentiles of the depths of the points the view sees), registered views only,
- `transforms.json` (the same cameras for nerfstudio and `scene=transforms`: OpenGL axes, COLMAP's
  world frame, a pinhole camera) and `sparse_pc.ply` (the well-triangulated points, its `ply_file_path`),
- `colmap/sparse/0/` (COLMAP's model, before undistortion), `process_data.json` (summary).

Everything is written into a hidden temporary folder next to `out` and renamed into place at the
end, so a failure or Ctrl-C never leaves half a scene. Options: conf/process_data.yaml.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from pola_gnt.core.errors import UserError
from pola_gnt.core.files import staged_folder
from pola_gnt.data.capture import is_video, prepare_capture
from pola_gnt.data.colmap import (
    EXHAUSTIVE_MAX_IMAGES,
    camera_to_world,
    common_pinhole,
    import_pycolmap,
    registered_images,
    reliable_points,
    run_sfm,
    undistorted_camera,
    view_bounds,
)
from pola_gnt.data.images import downsample_folder, image_folder_name, read_image
from pola_gnt.data.settings import ProcessDataSettings
from pola_gnt.data.transforms_json import TRANSFORMS_FILE, transforms_document, write_ply_points
from pola_gnt.geometry.cameras import opencv_to_llff

MIN_IMAGES = 3
DOWNSAMPLED_FACTORS = (4, 8)
SUMMARY_FILE = "process_data.json"
QUICK_FACTOR, QUICK_WIDTH = 8, 504  # conf/experiment/quick.yaml reads images_8/ of LLFF's 4032 px photos


def process_data(settings: ProcessDataSettings) -> dict:
    """Capture -> LLFF scene folder `out`; -> the summary written to `process_data.json`."""
    started = time.time()
    source, out = Path(settings.input).expanduser(), Path(settings.out).expanduser()
    frames, min_registered, overwrite, progress = (
        settings.frames,
        settings.min_registered,
        settings.overwrite,
        settings.progress,
    )
    if out.exists() and not (out.is_dir() and not any(out.iterdir())) and not overwrite:
        raise UserError(f"out: {out} already exists; choose a new folder or add overwrite=true")
    if not source.exists():
        raise UserError(f"input: {source} not found")
    import_pycolmap()  # fail before any work when it is missing

    def say(message: str) -> None:
        if progress:
            print(f"[{time.time() - started:6.1f} s] {message}", flush=True)

    def bar(iterable=None, **kwargs):
        return tqdm(iterable, disable=not progress, leave=False, dynamic_ncols=True, **kwargs)

    out.parent.mkdir(parents=True, exist_ok=True)
    with staged_folder(out, replace=True) as staging:  # renamed to `out` (replacing it) only when complete
        work = staging / "work"
        timings = {}
        stage = time.time()
        video = is_video(source)
        say(f"input: {'frames of the video' if video else 'photos in'} {source}")
        names = prepare_capture(source, work / "input", frames, bar)
        timings["input_s"] = time.time() - stage
        if len(names) < MIN_IMAGES:
            raise UserError(
                f"input: {source} gives {len(names)} image(s); structure from motion needs at "
                f"least {MIN_IMAGES} overlapping views (LLFF captures have 20-60)"
            )
        matching = settings.matching
        if matching == "auto":
            matching = "sequential" if video or len(names) > EXHAUSTIVE_MAX_IMAGES else "exhaustive"
        options = replace(settings, matching=matching)
        stage = time.time()
        result = run_sfm(work / "input", work, len(names), options, say, bar)
        timings["sfm_s"] = time.time() - stage
        model = result.reconstruction
        registered = registered_images(model) if model is not None else {}
        needed = max(MIN_IMAGES, math.ceil(min_registered * len(names)))
        if model is None or len(registered) < needed:
            raise UserError(_too_few_message(len(registered), len(names), needed, options))
        kept = sorted(registered)
        left_out = [name for name in names if name not in registered]
        if left_out:
            say(f"not registered, left out ({len(left_out)}): {', '.join(left_out)}")

        stage = time.time()
        say("writing: colmap/sparse/0 and undistorted images/")
        model_dir = staging / "colmap" / "sparse" / "0"
        model_dir.mkdir(parents=True)
        model.write(str(model_dir))
        cameras = {name: model.cameras[registered[name].camera_id] for name in kept}
        focal, width, height = _write_undistorted(cameras, work / "input", staging / "images", bar)
        for factor in DOWNSAMPLED_FACTORS:
            say(f"writing: {image_folder_name(factor)}/")
            downsample_folder(staging / "images", staging / image_folder_name(factor), factor)
        c2w = np.stack([camera_to_world(registered[name]) for name in kept])
        reliable = reliable_points(model)
        bounds = np.array([view_bounds(model, registered[name], reliable) for name in kept])
        np.save(staging / "poses_bounds.npy", poses_bounds_array(c2w, bounds, height, width, focal))
        write_transforms(staging, model, reliable, [f"images/{name}" for name in kept], c2w, focal, width, height)
        timings["write_s"] = time.time() - stage

        camera_info = model.cameras[registered[kept[0]].camera_id]
        summary = {
            "input": str(source),
            "input_kind": "video" if video else "photos",
            "images_given": len(names),
            "images_registered": len(kept),
            "not_registered": left_out,
            "points": int(model.num_points3D()),
            "mean_reprojection_error_px": float(model.compute_mean_reprojection_error()),
            "mean_track_length": float(model.compute_mean_track_length()),
            "mean_observations_per_image": float(model.compute_mean_observations_per_reg_image()),
            "camera": settings.camera,
            "camera_model": settings.camera_model,
            "camera_params": [float(p) for p in camera_info.params],
            "matching": matching,
            "max_features": settings.max_features,
            "deterministic": settings.deterministic,
            "mapping_attempts": [asdict(attempt) for attempt in result.attempts],
            "resolution": [height, width],
            "focal_px": focal,
            "near_far": [float(bounds[:, 0].min()), float(bounds[:, 1].max())],
            "time_s": {**{k: round(v, 2) for k, v in timings.items()}, "total_s": round(time.time() - started, 2)},
        }
        (staging / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        shutil.rmtree(work)
    say(
        f"done: {len(kept)} of {len(names)} images registered, {summary['points']} points, "
        f"{summary['mean_reprojection_error_px']:.2f} px mean reprojection error -> {out}"
    )
    command = f"python -m pola_gnt.train scene=llff scene.path={out}"
    factor = training_factor(width)
    if factor == QUICK_FACTOR:
        say(f"train on it: {command}")
    else:  # the preset's factor 8 is for ~4000 px photos; smaller input would train on thumbnails
        say(
            f"train on it: {command} data.factor={factor}  ({image_folder_name(factor)}/ at "
            f"{width // factor}x{height // factor}; the CPU preset trains at about {QUICK_WIDTH} px wide)"
        )
    return summary


POINT_CLOUD_FILE = "sparse_pc.ply"  # nerfstudio's name


def write_transforms(
    folder: Path, model, reliable: set[int], files: list[str], c2w: np.ndarray, focal: float, width: int, height: int
) -> None:
    """`transforms.json` (nerfstudio's format) beside `poses_bounds.npy`: the same OpenCV cameras in
    OpenGL axes, and the reliable points (all when none is) as `sparse_pc.ply` for its bounds."""
    ids = sorted(reliable) or sorted(model.points3D)
    points = np.array([model.points3D[i].xyz for i in ids], dtype=np.float64).reshape(-1, 3)
    colours = np.array([model.points3D[i].color for i in ids], dtype=np.uint8).reshape(-1, 3)
    write_ply_points(folder / POINT_CLOUD_FILE, points, colours)
    document = transforms_document(files, c2w, focal, width, height, POINT_CLOUD_FILE)
    (folder / TRANSFORMS_FILE).write_text(json.dumps(document, indent=2) + "\n")


def training_factor(width: int, target: int = QUICK_WIDTH) -> int:
    """The downsampling factor that brings `width` closest to `target` (the quick preset's 504 px:
    LLFF's 4032 px photos at its factor 8); at least 1."""
    return max(1, round(width / target))


def poses_bounds_array(c2w: np.ndarray, bounds: np.ndarray, height: int, width: int, focal: float) -> np.ndarray:
    """OpenCV c2w `[views, 4, 4]` + near/far `[views, 2]` -> LLFF's `poses_bounds.npy` rows `[views, 17]`."""
    poses = opencv_to_llff(c2w)  # [views, 3, 4]
    hwf = np.tile(np.array([height, width, focal], dtype=np.float64)[None, :, None], (len(c2w), 1, 1))
    return np.concatenate([np.concatenate([poses, hwf], axis=-1).reshape(len(c2w), 15), bounds], axis=-1)


def _write_undistorted(cameras: dict, source_dir: Path, images_dir: Path, bar) -> tuple[float, int, int]:
    """Every registered image (name -> its pycolmap camera) resampled once, straight from the
    photo, into one pinhole camera with the principal point at the image centre (what the LLFF
    loader assumes); -> focal, width, height of `images/`."""
    focal, width, height = common_pinhole([undistorted_camera(camera) for camera in cameras.values()])
    images_dir.mkdir()
    for name, camera in bar(cameras.items(), desc="undistorted", unit="image"):
        image = undistort_to_pinhole(read_image(source_dir / name), camera.img_from_cam, focal, width, height)
        if name.endswith(".jpg"):
            iio.imwrite(images_dir / name, image, quality=95)
        else:
            iio.imwrite(images_dir / name, image)
    return focal, width, height


def undistort_to_pinhole(
    image: np.ndarray,
    project: Callable[[np.ndarray], np.ndarray],
    focal: float,
    width: int,
    height: int,
    rows_per_band: int = 512,
) -> np.ndarray:
    """The photo `image` `[h, w, 3]` uint8 seen through the centred pinhole camera (`focal`,
    `width`, `height`): each pixel's ray is projected into the photo by `project` (camera-frame
    points `[n, 3]` -> pixel coordinates `[n, 2]`, COLMAP's: pixel centres at +0.5, distortion
    included) and read there, bicubic.

    Bicubic, not COLMAP's bilinear undistortion: the rays land between pixels (fern: 0.3 px from a
    centre on average), where bilinear averages neighbours: fern's undistorted images kept 0.34x
    the photos' Laplacian variance (fine detail) with COLMAP's, 0.65x with this. Bands of rows
    bound the memory of 12-megapixel photos."""
    h, w = image.shape[:2]
    source = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].float()
    xs = (np.arange(width) + 0.5 - width / 2) / focal
    bands = []
    for top in range(0, height, rows_per_band):
        ys = (np.arange(top, min(top + rows_per_band, height)) + 0.5 - height / 2) / focal
        x, y = np.meshgrid(xs, ys)
        rays = np.stack([x.ravel(), y.ravel(), np.ones(x.size)], axis=-1)
        pixels = np.asarray(project(rays), dtype=np.float64).reshape(len(ys), width, 2)
        grid = torch.from_numpy(2 * pixels / np.array([w, h]) - 1).float()[None]  # align_corners=False
        band = F.grid_sample(source, grid, mode="bicubic", padding_mode="border", align_corners=False)
        bands.append(band[0].permute(1, 2, 0))
    return torch.cat(bands).round().clamp(0, 255).to(torch.uint8).numpy()


def _too_few_message(registered: int, given: int, needed: int, options: ProcessDataSettings) -> str:
    tips = [
        "more overlap between neighbouring shots (LLFF-style: step sideways, keep the scene in view)",
        "sharper images",
    ]
    if options.matching != "sequential":
        tips.append("matching=sequential for a video-like order")
    if options.camera != "per_image":
        tips.append("camera=per_image if the photos come from different cameras or zoom levels")
    return (
        f"only {registered} of {given} images registered, at least {needed} needed "
        f"(see min_registered); try {'; '.join(tips)}"
    )
