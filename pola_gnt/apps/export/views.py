"""The views an export renders, and what each gives: colour, depth and a confidence per pixel.

A camera set is the scene's training cameras, its test cameras, or the video's spiral (`export.cameras`),
at most `export.views` of them evenly spaced, at `export.scale` of the scene's size. Each view is
rendered from its nearest training cameras as `render_video` renders a frame, but never from itself: a
training camera rendered with its own photo among its sources would copy it, and its depth would be
the copy's, not the views' agreement.

Confidence (`export.confidence`), both in [0, 1]:
- `peak`: the read-out's largest weight over the ray's samples (`RayOutput.weights`, returned by
  `render_rays(peak_weights=)`): near 1 where the read-out pools one sample, near 1 / samples where it
  cannot tell the surface's depth;
- `agreement`: the share of the source views that see the point at the rendered depth and whose colour
  there is within `export.agreement_tolerance` (max over RGB) of the views' median colour; 0 where fewer
  than two source views see it;
- `both`: their product.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float
from lightning_fabric import Fabric
from torch import Tensor

from pola_gnt.apps.frames import EncodedViews, scene_fov
from pola_gnt.apps.video import scaled_intrinsics
from pola_gnt.core.errors import UserError
from pola_gnt.data.scene import Scene, evenly_spaced
from pola_gnt.data.source_views import nearest_views, scene_selection_points, selection_points
from pola_gnt.geometry.camera_paths import fov_intrinsics, spiral_path
from pola_gnt.geometry.projection import pixels_to_grid, project_points
from pola_gnt.geometry.rays import pixel_grid, pixel_rays
from pola_gnt.model.gnt import SourceViews
from pola_gnt.model.renderer import ImageRays, RenderNetwork, render_rays
from pola_gnt.model.sampler import DepthSampler
from pola_gnt.runs.settings import ExportSettings, VideoSettings


@dataclass(frozen=True)
class ExportView:
    name: str
    c2w: Float[Tensor, "4 4"]  # OpenCV, the scene's normalised frame
    intrinsics: Float[Tensor, "3 3"]  # at the rendered size
    height: int
    width: int
    scene_view: int | None  # the scene's view index (train / test cameras); None for a generated camera


@dataclass
class RenderedView:
    view: ExportView
    sources: list[int]  # the training views it was rendered from
    rgb: Float[Tensor, "height width 3"]
    depth: Float[Tensor, "height width"]  # camera z-depth; 0 where the read-out has none
    peak: Float[Tensor, "height width"]  # the read-out's largest sample weight
    agreement: Float[Tensor, "height width"]  # the share of source views agreeing at the depth
    confidence: Float[Tensor, "height width"]  # export.confidence of the two

    @property
    def has_depth(self) -> Tensor:
        return torch.isfinite(self.depth) & (self.depth > 0)


def export_size(scene: Scene, scale: float) -> tuple[int, int]:
    height, width = scene.resolution
    return max(1, round(height * scale)), max(1, round(width * scale))


def view_stem(name: str) -> str:
    """A scene image's file name without its extension (the name of the files written for it)."""
    return name.rsplit(".", 1)[0] if "." in name else name


def export_views(scene: Scene, settings: ExportSettings, video: VideoSettings) -> list[ExportView]:
    """The camera set `export.cameras` of `scene`, at most `export.views` of it, at `export.scale`."""
    height, width = export_size(scene, settings.scale)
    if settings.cameras == "spiral":
        frames = settings.views or video.frames
        poses = spiral_path(
            scene.cameras.c2w, scene.bounds, frames, video.rotations, video.z_rate, video.radius_scale
        ).float()
        intrinsics = fov_intrinsics(torch.tensor([scene_fov(scene)]), height, width)[0]
        return [ExportView(f"spiral_{i:04d}", c2w, intrinsics, height, width, None) for i, c2w in enumerate(poses)]
    ids = scene.train_ids if settings.cameras == "train" else scene.test_ids
    if not ids:
        raise UserError(f"export.cameras={settings.cameras}: {scene.name} has no {settings.cameras} cameras")
    views = []
    for index in evenly_spaced(ids, settings.views):
        intrinsics = scaled_intrinsics(scene.cameras.intrinsics[index], scene.resolution, (height, width))
        name = view_stem(scene.image_names[index])
        views.append(ExportView(name, scene.cameras.c2w[index].float(), intrinsics.float(), height, width, index))
    return views


def source_views_of(scene: Scene, view: ExportView, count: int) -> list[int]:
    """The `count` training cameras nearest to `view`, never the view itself."""
    target = selection_points(view.c2w, scene.rig)
    return nearest_views(target, scene_selection_points(scene), scene.train_ids, count, exclude=view.scene_view)


def view_agreement(points: Float[Tensor, "rays 3"], sources: SourceViews, tolerance: float) -> Float[Tensor, " rays"]:
    """The share of the source views seeing each point whose colour there is within `tolerance`
    (max over RGB) of the seeing views' median colour; 0 where fewer than two views see it."""
    height, width = sources.images.shape[-2:]
    projection = project_points(points, sources.c2w, sources.intrinsics, height, width)
    grid = pixels_to_grid(projection.pixels, height, width)  # [views, rays, 2]
    colours = F.grid_sample(
        sources.images.float(), grid[:, :, None, :].float(), mode="bilinear", padding_mode="border", align_corners=True
    )[..., 0].permute(2, 0, 1)  # [rays, views, 3]
    visible = projection.visible.T  # [rays, views]
    # The median over the seeing views: the others are set to NaN and nanmedian skips them.
    seen = torch.where(visible[..., None], colours, torch.full_like(colours, float("nan")))
    median = seen.nanmedian(dim=1).values  # [rays, 3]
    close = ((colours - median[:, None]).abs().amax(dim=-1) <= tolerance) & visible
    count = visible.sum(dim=1)
    share = close.sum(dim=1).float() / count.clamp(min=1).float()
    return torch.where(count >= 2, share, torch.zeros_like(share))


def combined_confidence(peak: Tensor, agreement: Tensor, kind: str) -> Tensor:
    if kind == "peak":
        return peak
    if kind == "agreement":
        return agreement
    return peak * agreement


def render_export_view(
    net: RenderNetwork,
    scene: Scene,
    view: ExportView,
    encoded: EncodedViews,
    sampler: DepthSampler,
    chunk_rays: int,
    workers: int,
    num_source_views: int,
    settings: ExportSettings,
    fabric: Fabric,
    progress: Callable[[int, int], None] | None = None,
) -> RenderedView:
    """Colour, depth and confidence of one view (`progress(rays done, rays)` after each chunk)."""
    device = fabric.device
    source_ids = source_views_of(scene, view, num_source_views)
    c2w, intrinsics = view.c2w.to(device), view.intrinsics.to(device)
    rays = pixel_rays(c2w, intrinsics, pixel_grid(view.height, view.width, device=device))
    peaks: list[Tensor] = []
    with fabric.autocast():
        sources = encoded(source_ids)
        rgb, depth = render_rays(
            net,
            rays,
            sources,
            scene.depth_range,
            sampler,
            chunk_rays,
            workers,
            progress=progress,
            peak_weights=peaks,
            image=ImageRays(view.height, view.width),
        )
    peak = torch.cat(peaks).float()
    with torch.inference_mode():
        points = rays.origins + depth[:, None] * rays.directions
        agreement = view_agreement(points.float(), sources, settings.agreement_tolerance)
    depth = torch.where(torch.isfinite(depth) & (depth > 0), depth, torch.zeros_like(depth))
    shape = (view.height, view.width)
    peak, agreement = peak.reshape(shape).cpu(), agreement.reshape(shape).cpu()
    return RenderedView(
        view=view,
        sources=source_ids,
        rgb=rgb.reshape(*shape, 3).float().cpu(),
        depth=depth.reshape(shape).float().cpu(),
        peak=peak,
        agreement=agreement,
        confidence=combined_confidence(peak, agreement, settings.confidence),
    )


def unproject(view: ExportView, depth: Float[Tensor, "height width"]) -> Float[Tensor, "pixels 3"]:
    """The world points of a depth map (camera z-depth) `[H * W, 3]`, pixel rows first."""
    rays = pixel_rays(view.c2w.double(), view.intrinsics.double(), pixel_grid(view.height, view.width).double())
    return (rays.origins + depth.reshape(-1, 1).double() * rays.directions).float()


def check_depth(rendered: list[RenderedView], checkpoint: str) -> None:
    """One line when no view has any depth: the checkpoint's read-out gives none for these cameras."""
    if not any(bool(view.has_depth.any()) for view in rendered):
        cameras = ", ".join(view.view.name for view in rendered[:3]) + (", ..." if len(rendered) > 3 else "")
        raise UserError(
            f"{checkpoint}: its read-out gives no depth for these cameras ({cameras}): no finite, positive "
            f"depth at any pixel (no sample seen by a source view, or the read-out's weights not finite)"
        )
