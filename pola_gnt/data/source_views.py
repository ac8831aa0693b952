"""Source-view selection: the training cameras nearest to a target camera.

"Nearest" follows the rig, as GNT's (and IBRNet's) loaders do: for forward-facing captures (LLFF) the
nearest camera centres; for cameras around an object (DTU-like) the nearest viewing directions, since
there cameras at similar distances can see opposite sides. Both are distances between one point per
view (`selection_points`): the centres, or the unit optical axes, whose distance grows with the angle.

`scene.rig=auto` decides the rig from the camera layout (`detect_rig`): how far the optical axes spread.
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from pola_gnt.data.scene import Scene

RIGS = ("forward", "object")
RIG_CHOICES = ("auto", *RIGS)  # scene.rig: auto decides from the camera layout
# `detect_rig`: mean angle of the optical axes from their mean direction above which a rig is
# object-centric. Measured: LLFF fern 5.6, fortress 4.0, room 4.4, the captures canclip 4.5 and
# ollie 8.3 degrees; DTU scan 24 32.5, NeRF's lego 52 (train) degrees.
OBJECT_RIG_SPREAD_DEG = 20.0
# GNT's training pool: the min(n * k, 28) nearest views, k drawn from {1, 2, 3}.
MAX_POOL = 28
POOL_FACTORS = (1, 2, 3)


def selection_points(c2w: Tensor, rig: str) -> Tensor:
    """One point per camera (`c2w` `[..., 4, 4]` -> `[..., 3]`) whose distances rank the source views:
    the camera centre for a forward-facing rig, the unit viewing direction (+z axis) for an object-centric one."""
    if rig == "object":
        return torch.nn.functional.normalize(c2w[..., :3, 2], dim=-1)
    return c2w[..., :3, 3]


def axis_spread_deg(c2w: Float[Tensor, "views 4 4"]) -> float:
    """The mean angle (degrees) between each camera's optical axis (+z) and the axes' mean direction."""
    axes = torch.nn.functional.normalize(c2w[:, :3, 2].double(), dim=-1)
    mean = torch.nn.functional.normalize(axes.mean(0), dim=0)
    return float(torch.rad2deg(torch.arccos((axes @ mean).clamp(-1.0, 1.0))).mean())


def detect_rig(c2w: Float[Tensor, "views 4 4"]) -> tuple[str, str]:
    """`(rig, reason)` from the camera layout: `object` when the optical axes spread by more than
    `OBJECT_RIG_SPREAD_DEG` on average around their mean direction (cameras around an object, where
    nearby centres can see opposite sides), else `forward` (nearly parallel axes, LLFF-like)."""
    spread = axis_spread_deg(c2w)
    rig = "object" if spread > OBJECT_RIG_SPREAD_DEG else "forward"
    relation = ">" if rig == "object" else "<="
    return rig, (
        f"auto: optical axes {spread:.1f} deg from their mean on average, {relation} {OBJECT_RIG_SPREAD_DEG:g}; "
        f"override with scene.rig=forward|object"
    )


def resolve_rig(rig: str, c2w: Float[Tensor, "views 4 4"]) -> tuple[str, str]:
    """`scene.rig` (`RIG_CHOICES`) -> `(rig, reason)`: auto decided by `detect_rig`, else as given."""
    return detect_rig(c2w) if rig == "auto" else (rig, "given")


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
    target_center: Tensor,
    centers: Tensor,
    candidate_ids: list[int],
    count: int,
    exclude: int,
    rng: np.random.Generator,
    pool_weights: tuple[float, ...] | None = None,
    target_rate: float = 0.0,
) -> list[int]:
    """GNT's randomised source views for training: a pool of the `min(count * k, 28)` nearest views
    (k in `POOL_FACTORS`, uniform or drawn with `pool_weights`; GNT's llff_test.py: 0.2, 0.45, 0.35),
    from which `count - 2 .. count + 2` views are drawn (at least 1). With probability `target_rate`
    (GNT: 0.005) the target `exclude` itself then replaces one of them, so the network also learns
    to copy a view it is given. The draws of a zero rate and of uniform factors are skipped, not
    made: the random stream of such a step is the same as before these options existed."""
    available = len([i for i in candidate_ids if i != exclude])
    if pool_weights is None:
        factor = int(rng.integers(1, len(POOL_FACTORS) + 1))
    else:
        factor = POOL_FACTORS[int(rng.choice(len(POOL_FACTORS), p=np.asarray(pool_weights) / sum(pool_weights)))]
    pool_size = min(count * factor, MAX_POOL, available)
    pool = nearest_views(target_center, centers, candidate_ids, pool_size, exclude)
    drawn = int(np.clip(count + rng.integers(-2, 3), 1, len(pool)))
    chosen = [pool[j] for j in sorted(rng.choice(len(pool), size=drawn, replace=False))]
    if target_rate > 0 and rng.random() < target_rate:
        chosen[int(rng.integers(len(chosen)))] = exclude
    return chosen
