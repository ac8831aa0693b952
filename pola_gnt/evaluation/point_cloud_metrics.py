"""A point cloud against a reference surface (points sampled on it): accuracy and completeness, as the
DTU MVS benchmark scores them.

- accuracy: the mean distance from each cloud point to its nearest reference point;
- completeness: the mean distance from each reference point to its nearest cloud point;
- chamfer: their mean;
- precision / recall: the fraction of cloud points within `threshold` of the reference, and of
  reference points within `threshold` of the cloud (`threshold` = `fraction` of the reference's extent,
  the diagonal of its bounding box); F-score their harmonic mean.

The reference should be sampled more densely than the threshold: a nearest reference point is then at
most half a sample spacing further than the surface itself."""

from __future__ import annotations

import numpy as np
from scipy.spatial import KDTree


def extent(points: np.ndarray) -> float:
    """The diagonal of the points' axis-aligned bounding box."""
    return float(np.linalg.norm(points.max(axis=0) - points.min(axis=0)))


def point_cloud_scores(cloud: np.ndarray, reference: np.ndarray, fraction: float = 0.01) -> dict[str, float]:
    """Accuracy, completeness, chamfer, precision, recall and F-score of `cloud` `[n, 3]` against
    `reference` `[m, 3]` (module docstring), with the threshold and extent they used."""
    if len(cloud) == 0 or len(reference) == 0:
        raise ValueError("point_cloud_scores: an empty point set")
    to_reference, _ = KDTree(reference).query(cloud, workers=-1)
    to_cloud, _ = KDTree(cloud).query(reference, workers=-1)
    size = extent(reference)
    threshold = fraction * size
    precision = float(np.mean(to_reference <= threshold))
    recall = float(np.mean(to_cloud <= threshold))
    return {
        "accuracy": float(np.mean(to_reference)),
        "completeness": float(np.mean(to_cloud)),
        "chamfer": float(0.5 * (np.mean(to_reference) + np.mean(to_cloud))),
        "precision": precision,
        "recall": recall,
        "f_score": 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall),
        "threshold": threshold,
        "extent": size,
        "points": len(cloud),
        "reference_points": len(reference),
    }
