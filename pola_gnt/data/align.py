"""Compare two sets of cameras up to a similarity transform (Umeyama), e.g. COLMAP's cameras
against a scene's published poses. Cameras are OpenCV camera-to-world `[views, 4, 4]`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Similarity:
    scale: float
    rotation: np.ndarray  # [3, 3]
    translation: np.ndarray  # [3]

    def apply(self, points: np.ndarray) -> np.ndarray:  # [n, 3] -> [n, 3]
        return self.scale * points @ self.rotation.T + self.translation


def umeyama(source: np.ndarray, target: np.ndarray) -> Similarity:
    """The similarity `x -> s R x + t` minimising `sum |target - (s R source + t)|^2` (`[n, 3]` each)."""
    mean_source, mean_target = source.mean(0), target.mean(0)
    centred_source, centred_target = source - mean_source, target - mean_target
    covariance = centred_target.T @ centred_source / len(source)
    u, singular, vt = np.linalg.svd(covariance)
    sign = np.eye(3)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[2, 2] = -1.0
    rotation = u @ sign @ vt
    scale = float(np.trace(np.diag(singular) @ sign) / centred_source.var(0).sum())
    return Similarity(scale, rotation, mean_target - scale * rotation @ mean_source)


@dataclass
class CameraErrors:
    centre_error: float  # largest camera-centre distance after the fit, relative to the spread
    rotation_error_deg: float  # largest rotation difference after the fit
    spread: float  # largest distance between two target camera centres
    scale: float  # the fitted scale (source units -> target units)
    bounds_error: float | None  # largest relative near/far difference after scaling (if given)


def camera_errors(
    source_c2w: np.ndarray,
    target_c2w: np.ndarray,
    source_bounds: np.ndarray | None = None,
    target_bounds: np.ndarray | None = None,
) -> CameraErrors:
    """Fit `source` cameras to `target` (centres, Umeyama), then measure what is left."""
    fit = umeyama(source_c2w[:, :3, 3], target_c2w[:, :3, 3])
    centres = fit.apply(source_c2w[:, :3, 3])
    target_centres = target_c2w[:, :3, 3]
    spread = float(np.max(np.linalg.norm(target_centres[:, None] - target_centres[None], axis=-1)))
    centre_error = float(np.max(np.linalg.norm(centres - target_centres, axis=-1))) / spread
    rotations = fit.rotation[None] @ source_c2w[:, :3, :3]
    relative = np.swapaxes(rotations, 1, 2) @ target_c2w[:, :3, :3]
    cosine = np.clip((np.trace(relative, axis1=1, axis2=2) - 1.0) / 2.0, -1.0, 1.0)
    rotation_error = float(np.degrees(np.arccos(cosine)).max())
    bounds_error = None
    if source_bounds is not None and target_bounds is not None:
        bounds_error = float(np.max(np.abs(fit.scale * source_bounds - target_bounds) / target_bounds))
    return CameraErrors(centre_error, rotation_error, spread, fit.scale, bounds_error)
