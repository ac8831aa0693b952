"""Source-view selection: the training cameras nearest to a target camera.

"Nearest" follows the rig, as GNT's (and IBRNet's) loaders do: for forward-facing captures (LLFF) the
nearest camera centres; for cameras around an object (DTU-like) the nearest viewing directions, since
there cameras at similar distances can see opposite sides. Both are distances between one point per
view (`selection_points`): the centres, or the unit optical axes, whose distance grows with the angle.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from pola_gnt.data.scene import Scene

RIGS = ("forward", "object")
# GNT's training pool: the min(n * k, 28) nearest views, k drawn from {1, 2, 3}.
MAX_POOL = 28


def selection_points(c2w: Tensor, rig: str) -> Tensor:
    """One point per camera (`c2w` `[..., 4, 4]` -> `[..., 3]`) whose distances rank the source views:
    the camera centre for a forward-facing rig, the unit viewing direction (+z axis) for an object-centric one."""
    if rig == "object":
        return torch.nn.functional.normalize(c2w[..., :3, 2], dim=-1)
    return c2w[..., :3, 3]


def scene_selection_points(scene: Scene) -> Tensor:
    """`selection_points` of every view of `scene` `[views, 3]`."""
    return selection_points(scene.cameras.c2w, scene.rig)


def nearest_views(
    target_center: Tensor, centers: Tensor, candidate_ids: list[int], count: int, exclude: int | None = None
) -> list[int]:
    """The `count` candidates nearest to `target_center` `[3]` (`centers` `[views, 3]`), nearest first.

    Deterministic: ties are broken by view index. `exclude` (the target itself) is never chosen.
    """
    candidates = [i for i in candidate_ids if i != exclude]
    distances = torch.linalg.norm(centers[candidates] - target_center, dim=-1).tolist()
    order = sorted(range(len(candidates)), key=lambda j: (distances[j], candidates[j]))
    return [candidates[j] for j in order[:count]]


def random_training_views(
    target_center: Tensor, centers: Tensor, candidate_ids: list[int], count: int, exclude: int, rng: np.random.Generator
) -> list[int]:
    """GNT's randomised source views for training: a pool of the `min(count * k, 28)` nearest views
    (k in {1, 2, 3}), from which `count - 2 .. count + 2` views are drawn (at least 1)."""
    available = len([i for i in candidate_ids if i != exclude])
    pool_size = min(count * int(rng.integers(1, 4)), MAX_POOL, available)
    pool = nearest_views(target_center, centers, candidate_ids, pool_size, exclude)
    drawn = int(np.clip(count + rng.integers(-2, 3), 1, len(pool)))
    chosen = rng.choice(len(pool), size=drawn, replace=False)
    return [pool[j] for j in sorted(chosen)]
