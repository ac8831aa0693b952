"""`Scene`: a loaded, normalised scene (images, OpenCV cameras, bounds, train / test split), the type
every loader returns and everything above the data layer reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jaxtyping import Float
from torch import Tensor

from pola_gnt.geometry.cameras import Cameras


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

    @property
    def depth_range(self) -> tuple[float, float]:
        """Sampling range `[0.9 * near, 1.6 * far]` from the scene-wide bounds (GNT)."""
        return 0.9 * float(self.bounds.min()), 1.6 * float(self.bounds.max())

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
                f"split       train {len(self.train_ids)}, test {len(self.test_ids)} {self.test_ids} ({self.rig} rig)",
                f"focal       {float(self.cameras.intrinsics[0, 0, 0]):.3f} px",
                f"bounds      {float(self.bounds.min()):.3f} .. {float(self.bounds.max()):.3f} "
                f"(normalised, scale {self.scale:.4f}); sampling {near:.3f} .. {far:.3f}",
            ]
        )
