"""`Scene`: a loaded, normalised scene (images, OpenCV cameras, bounds, sampling range, train / test
split, rig), the type every loader returns and everything above the data layer reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jaxtyping import Float
from torch import Tensor

from pola_gnt.geometry.cameras import Cameras


def bounds_depth_range(bounds: Float[Tensor, "views 2"]) -> tuple[float, float]:
    """GNT's LLFF sampling range `[0.9 * near, 1.6 * far]` from the scene-wide bounds."""
    return 0.9 * float(bounds.min()), 1.6 * float(bounds.max())


def evenly_spaced(ids: list[int], count: int | None) -> list[int]:
    """`count` of `ids` evenly spaced from the first (`ids[floor(i * n / count)]`; all when None or
    `count >= n`): `data.test_views`. GNT's `testskip` 8 over NeRF's 200 test frames is count 25."""
    if count is None or count >= len(ids):
        return list(ids)
    return [ids[i * len(ids) // count] for i in range(count)]


@dataclass
class Scene:
    name: str
    path: Path
    factor: int
    image_names: list[str]
    images: Float[Tensor, "views height width 3"]  # float32 in [0, 1]
    cameras: Cameras
    bounds: Float[Tensor, "views 2"]  # near/far per view, normalised
    train_ids: list[int]
    test_ids: list[int]
    scale: float  # the normalisation scale applied to translations and bounds
    rig: str  # forward | object (data.source_views.RIGS): how source views are chosen
    # The near / far of the depth samples, set by the loader: GNT's LLFF rule `bounds_depth_range`, or
    # a dataset's fixed range (NeRF's Blender scenes: 2, 6).
    depth_range: tuple[float, float]
    rig_reason: str = "given"  # how `rig` was decided: "given" (scene.rig), or the camera layout's figures
    bounds_reason: str = ""  # where the bounds come from when the files give none (transforms.json)

    @property
    def resolution(self) -> tuple[int, int]:  # (H, W)
        return self.cameras.height, self.cameras.width

    def summary(self) -> str:
        near, far = self.depth_range
        height, width = self.resolution
        return "\n".join(
            [
                f"scene       {self.name} ({self.path})",
                f"images      {len(self.image_names)} at {width}x{height} (factor {self.factor})",
                f"split       train {len(self.train_ids)}, test {len(self.test_ids)} {_ids(self.test_ids)}",
                f"rig         {self.rig} ({self.rig_reason})",
                f"focal       {float(self.cameras.intrinsics[0, 0, 0]):.3f} px",
                f"bounds      {float(self.bounds.min()):.3f} .. {float(self.bounds.max()):.3f} "
                f"(normalised, scale {self.scale:.4f}); sampling {near:.3f} .. {far:.3f}",
                *([f"bounds from {self.bounds_reason}"] if self.bounds_reason else []),
            ]
        )


def _ids(ids: list[int], shown: int = 12) -> str:
    return str(ids) if len(ids) <= shown else f"[{', '.join(map(str, ids[:shown]))}, ...]"
