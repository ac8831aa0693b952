"""Structure from motion with pycolmap (COLMAP's bindings) and the conversion of its model to LLFF.

SIFT features -> exhaustive or sequential matching -> incremental mapping, the largest model kept.
Forward-facing captures have small baselines: COLMAP's default initialisation (a pair seen at a
16 degree triangulation angle or more) can fail to start a model, or a model starts and the focal
length runs away. When COLMAP's defaults leave images out, two more attempts follow: a relaxed
initialisation, then mapping with the focal length held at COLMAP's initial guess and a final
bundle adjustment that refines it. The attempt that registers the most images wins.

Repeatable: images numbered in name order, RANSAC seeded (`seed`), mapping on one thread
(`deterministic`; COLMAP's multi-threaded mapping gives a slightly different model every run).
Not always byte for byte: COLMAP's vectorised floating-point sums may round differently from run
to run, and bundle adjustment carries that into every value (about 0.05% of a camera's position).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pola_gnt.core.errors import UserError
from pola_gnt.data.settings import ProcessDataSettings

EXHAUSTIVE_MAX_IMAGES = 200  # "auto" matching: exhaustive up to this many photos, else sequential
LLFF_PERCENTILES = (0.1, 99.9)  # near / far: percentiles of the depths of the points a view sees (LLFF)
INSTALL_HINT = "pip install -e '.[capture]' (or: pip install pycolmap)"


def import_pycolmap():
    try:
        import pycolmap
    except ImportError:
        raise UserError(f"process_data needs pycolmap, which is not installed: {INSTALL_HINT}") from None
    # COLMAP's own log: fatal errors only. Its errors ("Failed to create any sparse model") are
    # what process_data reports in its own one error line, with what to try.
    pycolmap.logging.minloglevel = 3
    return pycolmap


@dataclass
class Attempt:
    name: str
    registered: int
    points: int


@dataclass
class SfmResult:
    reconstruction: Any  # pycolmap.Reconstruction, the largest model, or None (pycolmap is imported on use only)
    attempts: list[Attempt] = field(default_factory=list)


def mapper_attempts(pycolmap, options: ProcessDataSettings) -> list[tuple[str, Any, bool]]:
    """(name, IncrementalPipelineOptions, refine the focal length afterwards) in the order tried."""

    def base():
        pipeline = pycolmap.IncrementalPipelineOptions()
        pipeline.num_threads = 1 if options.deterministic else options.threads
        pipeline.random_seed = options.seed
        return pipeline

    default = base()
    relaxed = base()
    relaxed.mapper.init_min_tri_angle = 4.0  # COLMAP: 16 degrees, rare with forward-facing captures
    relaxed.mapper.init_min_num_inliers = 50  # COLMAP: 100
    relaxed.min_num_matches = 10
    fixed_focal = base()
    fixed_focal.mapper.init_min_tri_angle = 4.0
    fixed_focal.mapper.init_min_num_inliers = 50
    fixed_focal.min_num_matches = 10
    fixed_focal.ba_refine_focal_length = False  # small baselines: a free focal length can run away
    return [
        ("COLMAP defaults", default, False),
        ("relaxed initialisation", relaxed, False),
        ("focal length held, then refined", fixed_focal, True),
    ]


def run_sfm(
    image_dir: Path, work_dir: Path, n_images: int, options: ProcessDataSettings, say: Callable[[str], None], progress
) -> SfmResult:
    """Features, matching and incremental mapping of every image in `image_dir` (`options.matching`
    resolved: exhaustive or sequential)."""
    pycolmap = import_pycolmap()
    database = work_dir / "database.db"
    device = pycolmap.Device.cpu
    reader = pycolmap.ImageReaderOptions()
    reader.camera_model = options.camera_model
    mode = pycolmap.CameraMode.SINGLE if options.camera == "single" else pycolmap.CameraMode.PER_IMAGE
    # The images enter the database first, in name order: the extraction threads would otherwise
    # number them in the order they finish, and the model would differ from run to run.
    pycolmap.Database.open(database).close()
    pycolmap.import_images(database, image_dir, camera_mode=mode, options=reader)
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.num_threads = options.threads
    extraction.max_image_size = options.max_image_size
    extraction.sift.max_num_features = options.max_features
    say(
        f"features: SIFT on {n_images} images, at most {options.max_features} each "
        f"({options.camera} camera, {options.camera_model})"
    )
    pycolmap.extract_features(
        database, image_dir, camera_mode=mode, reader_options=reader, extraction_options=extraction, device=device
    )
    matching = pycolmap.FeatureMatchingOptions()
    matching.num_threads = options.threads
    verification = pycolmap.TwoViewGeometryOptions()
    verification.ransac.random_seed = options.seed  # COLMAP's default (-1) draws a new seed every run
    say(f"matching: {options.matching}")
    match = pycolmap.match_sequential if options.matching == "sequential" else pycolmap.match_exhaustive
    match(database, matching_options=matching, verification_options=verification, device=device)

    best, attempts = None, []
    for i, (name, pipeline, refine_focal) in enumerate(mapper_attempts(pycolmap, options)):
        say(f"mapping: {name}")
        model_dir = work_dir / f"sparse_{i}"
        model_dir.mkdir()
        bar = progress(total=n_images, desc="registered", unit="image")
        models = pycolmap.incremental_mapping(
            database, image_dir, model_dir, options=pipeline, next_image_callback=bar.update
        )
        bar.close()
        model = max(models.values(), key=_model_size, default=None)
        if model is not None and refine_focal:
            adjustment = pycolmap.BundleAdjustmentOptions()
            adjustment.refine_focal_length = True
            adjustment.refine_extra_params = True
            adjustment.print_summary = False
            if options.deterministic:
                adjustment.ceres.solver_options.num_threads = 1
            pycolmap.bundle_adjustment(model, adjustment)
        registered, points = _model_size(model) if model is not None else (0, 0)
        attempts.append(Attempt(name, registered, points))
        say(f"mapping: {name}: {registered} of {n_images} images registered, {points} points")
        if model is not None and (best is None or _model_size(model) > _model_size(best)):
            best = model
        if registered == n_images:
            break
    return SfmResult(best, attempts)


def _model_size(model) -> tuple[int, int]:
    return model.num_reg_images(), model.num_points3D()


def registered_images(reconstruction) -> dict[str, Any]:
    """Image name -> pycolmap.Image of every registered image."""
    return {image.name: image for image in reconstruction.images.values() if image.has_pose}


def camera_to_world(image) -> np.ndarray:
    """OpenCV camera-to-world `[4, 4]` of a registered pycolmap image."""
    c2w = np.eye(4)
    c2w[:3, :4] = image.cam_from_world().inverse().matrix()
    return c2w


RELIABLE_ERROR_PX = 1.0  # points for the bounds: reprojected within 1 px on average,
RELIABLE_DEPTH_ERROR = 0.015  # and located in depth to 1.5% (`relative_depth_error`);
RELIABLE_MIN_POINTS = 20  # a view that sees fewer such points uses all of its points


def relative_depth_error(error_px: float, focal_px: float, angle_rad: float, track_length: int) -> float:
    """How well a triangulated point is located in depth, relative to its depth: a ray's angular error
    (`error_px / focal_px`) over the widest angle between its rays, shrinking with the square root of
    the independent observations beyond the first. A distant point triangulated at a small angle is
    well located when many views see it sharply; a near point seen twice at a wide angle is too."""
    return error_px / focal_px / max(angle_rad, 1e-9) / np.sqrt(max(track_length - 1, 1))


def reliable_points(reconstruction) -> set[int]:
    """Ids of the points well located in depth. With a few hundred points per view, LLFF's 0.1 / 99.9
    percentiles are a view's extreme points, and badly located ones would set them. Not a minimum
    triangulation angle: the distant background is triangulated at small angles, and dropping it
    would set the far bound before it (a 34-photo capture got 0.76x its true far bound that way).
    Measured on fortress and room (images_8, against LLFF's published bounds, scene-wide near / far):
    0.99 / 1.13 and 1.15 / 0.98 (a 2-degree minimum angle: 0.99 / 1.36 and 1.34 / 1.17)."""
    images = registered_images_by_id(reconstruction)
    centres = {image_id: camera_to_world(image)[:3, 3] for image_id, image in images.items()}
    focals = {
        image_id: reconstruction.cameras[image.camera_id].mean_focal_length() for image_id, image in images.items()
    }
    reliable = set()
    for point_id, point in reconstruction.points3D.items():
        views = [element.image_id for element in point.track.elements]
        if point.error > RELIABLE_ERROR_PX:
            continue
        rays = point.xyz[None] - np.stack([centres[view] for view in views])
        rays /= np.linalg.norm(rays, axis=1, keepdims=True)
        angle = float(np.arccos(np.clip((rays @ rays.T).min(), -1.0, 1.0)))
        focal = float(np.mean([focals[view] for view in views]))
        if relative_depth_error(point.error, focal, angle, len(views)) <= RELIABLE_DEPTH_ERROR:
            reliable.add(point_id)
    return reliable


def registered_images_by_id(reconstruction) -> dict[int, Any]:
    return {image_id: image for image_id, image in reconstruction.images.items() if image.has_pose}


def bound_observations(image, reliable: set[int]) -> list:
    """The observations (pycolmap.Point2D) whose points set a view's near / far: its reliable
    points, or all of its points when it sees fewer than `RELIABLE_MIN_POINTS` reliable ones."""
    seen = [point for point in image.points2D if point.has_point3D()]
    kept = [point for point in seen if point.point3D_id in reliable]
    return kept if len(kept) >= RELIABLE_MIN_POINTS else seen


def view_bounds(reconstruction, image, reliable: set[int]) -> tuple[float, float]:
    """LLFF's near / far of a view: percentiles of the camera z-depths of the (reliable) points it sees."""
    w2c = np.linalg.inv(camera_to_world(image))
    seen = [point.point3D_id for point in bound_observations(image, reliable)]
    if not seen:
        raise UserError(f"{image.name}: registered but sees no 3D point; cannot bound its depth")
    points = np.array([reconstruction.points3D[point].xyz for point in seen])
    depths = points @ w2c[:3, :3].T[:, 2] + w2c[2, 3]
    near, far = np.percentile(depths[depths > 0], LLFF_PERCENTILES)
    return float(near), float(far)


def undistorted_camera(camera) -> tuple[float, float, float, float, int, int]:
    """COLMAP's pinhole camera for a (distorted) camera, (fx, fy, cx, cy, width, height): the
    largest image with no blank pixels (COLMAP's default undistortion options)."""
    pycolmap = import_pycolmap()
    pinhole = pycolmap.undistort_camera(pycolmap.UndistortCameraOptions(), camera)
    return (
        float(pinhole.focal_length_x),
        float(pinhole.focal_length_y),
        float(pinhole.principal_point_x),
        float(pinhole.principal_point_y),
        int(pinhole.width),
        int(pinhole.height),
    )


def common_pinhole(cameras: list[tuple[float, float, float, float, int, int]]) -> tuple[float, int, int]:
    """Focal and size (f, width, height) of one centred pinhole camera that every view can fill:
    the median focal length, the largest centred window every image covers at that focal."""
    focal = float(np.median([camera[0] for camera in cameras]))
    width = min(2 * min(cx, w - cx) * focal / fx for fx, _, cx, _, w, _ in cameras)
    height = min(2 * min(cy, h - cy) * focal / fy for _, fy, _, cy, _, h in cameras)
    return focal, int(math.floor(width + 1e-6)), int(math.floor(height + 1e-6))
