"""LLFF scene loader: `poses_bounds.npy` + `images[_F]/` -> a normalised `Scene`.

Conventions (see docs/ARCHITECTURE.md): cameras are OpenCV camera-to-world (x right, y down,
z forward). After normalisation, translations and bounds are scaled by `1 / (0.75 * min bound)`
(GNT) and the world frame is the OpenCV frame of the average camera (GNT's recentring).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pola_gnt.core.errors import UserError, check_int
from pola_gnt.data.images import ensure_image_folder, list_images, read_images
from pola_gnt.data.scene import Scene, bounds_depth_range
from pola_gnt.data.source_views import resolve_rig
from pola_gnt.geometry.cameras import Cameras, llff_to_opencv, normalise_poses

ROTATION_TOLERANCE = 1e-2  # max |R^T R - I| of a pose rotation (COLMAP's are exact to ~1e-7 in float32)


def load_llff_scene(
    path: str | Path, factor: int = 8, llffhold: int = 8, name: str | None = None, rig: str = "forward"
) -> Scene:
    """Load and normalise an LLFF scene (`rig`: how its source views are chosen, `source_views.RIG_CHOICES`;
    auto: decided from the cameras). Bad input raises `UserError` naming the file."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: scene folder not found")
    check_int(factor, "data.factor")
    poses_llff, bounds = read_poses_bounds(path / "poses_bounds.npy")
    image_dir = ensure_image_folder(path, factor)
    image_files = list_images(image_dir)
    if len(image_files) != len(poses_llff):
        raise UserError(count_mismatch(path / "poses_bounds.npy", len(poses_llff), image_files, image_dir))
    images = read_images(image_files)
    height, width = images.shape[1:3]

    full_height, full_width, full_focal = poses_llff[0, :, 4]
    focal = full_focal * width / full_width  # = focal / factor for standard LLFF folders
    c2w = llff_to_opencv(poses_llff[:, :, :4])
    c2w, bounds, scale = normalise_poses(c2w, bounds)
    intrinsics = (
        torch.tensor([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]], dtype=torch.float32)
        .expand(len(c2w), 3, 3)
        .clone()
    )

    train_ids, test_ids = llffhold_split(len(image_files), llffhold)
    bounds_tensor = torch.from_numpy(bounds).float()
    c2w_tensor = torch.from_numpy(c2w).float()
    rig, rig_reason = resolve_rig(rig, c2w_tensor)
    return Scene(
        name=name or path.name,
        path=path,
        factor=factor,
        image_names=[f.name for f in image_files],
        images=torch.from_numpy(images).float() / 255.0,
        cameras=Cameras(c2w_tensor, intrinsics, int(height), int(width)),
        bounds=bounds_tensor,
        train_ids=train_ids,
        test_ids=test_ids,
        scale=scale,
        rig=rig,
        depth_range=bounds_depth_range(bounds_tensor),
        rig_reason=rig_reason,
    )


def llffhold_split(n_views: int, llffhold: int) -> tuple[list[int], list[int]]:
    """LLFF's split: every `llffhold`-th view (0, N, 2N, ...) is a test view (none when 0)."""
    ids = list(range(n_views))
    test_ids = ids[::llffhold] if llffhold > 0 else []
    return [i for i in ids if i not in test_ids], test_ids


def read_poses_bounds(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """-> LLFF pose matrices `[views, 3, 5]` ([R | t | hwf], columns [down, right, back]) and bounds `[views, 2]`."""
    if not file.is_file():
        raise UserError(f"{file}: not found")
    try:
        array = np.load(file, allow_pickle=False)
    except Exception as err:  # numpy raises several types for corrupt files
        raise UserError(f"{file}: cannot read ({err})") from None
    if array.ndim != 2 or array.shape[1] != 17 or array.shape[0] == 0:
        raise UserError(f"{file}: expected an N x 17 array, got shape {tuple(array.shape)}")
    if not np.all(np.isfinite(array)):
        raise UserError(f"{file}: contains non-finite values")
    array = array.astype(np.float64)
    poses = array[:, :15].reshape(-1, 3, 5)
    bounds = array[:, 15:]
    if np.any(bounds <= 0) or np.any(bounds[:, 0] >= bounds[:, 1]):
        raise UserError(f"{file}: near/far bounds must be positive with near < far")
    if np.any(poses[:, :, 4] <= 0):
        raise UserError(f"{file}: height, width and focal must be positive")
    rotations = poses[:, :, :3]
    error = np.abs(np.swapaxes(rotations, 1, 2) @ rotations - np.eye(3)).max(axis=(1, 2))
    bad = np.flatnonzero(error > ROTATION_TOLERANCE)
    if len(bad):
        views = ", ".join(str(i) for i in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise UserError(
            f"{file}: the rotation of view(s) {views} is not orthonormal "
            f"(max |R^T R - I| = {error[bad].max():.3g}); poses must be camera rotations"
        )
    return poses, bounds


def count_mismatch(poses_file: Path, n_poses: int, image_files: list[Path], image_dir: Path) -> str:
    """The message for a poses / images count mismatch, naming the files without a pose. LLFF pairs
    poses with the images in sorted name order, so the extra images are the last ones."""
    message = f"{poses_file}: {n_poses} poses but {len(image_files)} images in {image_dir}"
    if len(image_files) > n_poses:
        extra = [f.name for f in image_files[n_poses:]]
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        return f"{message}; without a pose (in sorted order): {shown}"
    return f"{message}; poses {len(image_files)}..{n_poses - 1} have no image"
