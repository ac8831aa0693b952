"""A trained scene seen from a camera of its own choosing, as `render_video` and the viewer render it:
the scene's field of view, a camera's nearest training views (its source views), those views'
encoder features computed once per view and kept (`EncodedViews`), and a rendered frame as the two
uint8 images of the videos and the viewer (colour, colour-mapped depth). Both applications render
the same frame for the same camera because they share these."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from pola_gnt.data.images import to_uint8
from pola_gnt.data.scene import Scene
from pola_gnt.data.source_views import nearest_views, scene_selection_points, selection_points
from pola_gnt.evaluation.scoring import colorize_depth
from pola_gnt.geometry.camera_paths import fov_from_focal
from pola_gnt.model.consistency_prior import PriorImageCache
from pola_gnt.model.gnt import SourceViews
from pola_gnt.model.renderer import RenderedImage, RenderNetwork, chunk_threads


def scene_fov(scene: Scene) -> float:
    """The scene's vertical field of view in degrees (every LLFF view shares the intrinsics)."""
    return float(fov_from_focal(scene.cameras.intrinsics[0, 1, 1], scene.resolution[0]))


def frame_source_views(scene: Scene, c2w: Tensor, count: int) -> list[int]:
    """The `count` training cameras nearest to a video camera `c2w` `[4, 4]` (nearest first)."""
    return nearest_views(selection_points(c2w, scene.rig), scene_selection_points(scene), scene.train_ids, count)


class EncodedViews:
    """Source views with their encoder features and the read-out prior's per-image part (`PriorImage`),
    computed once per training view and kept: a fly-through keeps most of its nearest cameras from one
    frame to the next. `workers`: the renders' (`render_rays`), whose chunk's threads the prior's part
    is computed on (`chunk_threads`: the bits a chunk computing it would get)."""

    def __init__(self, net: RenderNetwork, scene: Scene, device: torch.device, workers: int = 1):
        self.net, self.scene, self.device, self.workers = net, scene, device, workers
        self.images: dict[int, Tensor] = {}  # view -> [3, H, W]
        self.features: dict[int, Tensor] = {}  # view -> [C, h, w]
        self.prior = PriorImageCache()  # view -> PriorImage

    @torch.no_grad()
    def _encode(self, view: int) -> None:
        image = self.scene.images[view].permute(2, 0, 1).to(self.device)  # [3, H, W]
        self.images[view] = image
        self.features[view] = self.net.encode(image[None])[0].float()

    @torch.no_grad()
    def __call__(self, views: list[int]) -> SourceViews:
        for view in views:
            if view not in self.features:
                self._encode(view)
        cameras = self.scene.cameras
        sources = SourceViews(
            images=torch.stack([self.images[v] for v in views]),
            features=torch.stack([self.features[v] for v in views]),
            c2w=cameras.c2w[views].to(self.device),
            intrinsics=cameras.intrinsics[views].to(self.device),
        )
        with chunk_threads(self.workers):
            prior = [self.prior.get(v, lambda v=v: self.net.prior_image(self.images[v][None])) for v in views]
        sources.keep_prior_images(self.net, prior)
        return sources


def frame_images(frame: RenderedImage, depth_range: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """A rendered frame as the two uint8 images `[H, W, 3]` the videos hold: colour, and depth
    colour-mapped over `depth_range` = (near, far)."""
    return to_uint8(frame.rgb.float().cpu()), colorize_depth(frame.depth.float().cpu(), *depth_range)
