"""`python -m pola_gnt.view`'s library: a web viewer of a checkpoint's scene on viser.

Each browser tab (a viser client) has a render loop in a thread of its own: a camera move cancels
the render in progress (checked between ray chunks), renders a preview of at most
`view.preview_rays` rays (about a second on a CPU), sharper ones, then the full-resolution image
while the camera stays still (`refinement_levels`). A tab's opening camera is rendered as soon as it
connects, with no move needed; the page shows how far the full-resolution image has got (per ray
chunk) and, when done, how long it took. Frames are rendered exactly as `render_video`
renders them (the nearest training views, each encoded once; the same rays and chunks), in colour
or as depth with the video's colour map, or nothing (the geometry alone, no render). The page also
shows the training cameras as frusta and lists the current camera's nearest source views; a point
cloud toggled in the page: the exported one (`view.point_cloud=FILE.ply`, e.g. `export`'s
`pointcloud.ply`) or the live one, the points of the full-size images this tab has rendered; it
records keyframes into a camera path (duration, fps, field of view) that it saves as
camera_path.json and renders to mp4s. A render error is logged and shown in the page; the server
goes on.

viser alone, not nerfview: nerfview adapts one render function to viser (its own progressive
resolution, no cancellation inside a frame) and calls `os._exit` when that function raises; the
preview / refine / cancel loop here is a few dozen lines, and errors stay ours to catch.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import viser
import viser.transforms as vtf
from jaxtyping import Float
from lightning_fabric import Fabric
from torch import Tensor

from pola_gnt.apps.camera_path_file import CameraPath, camera_path_document, write_camera_path
from pola_gnt.apps.export.ply import PointCloud, read_point_cloud
from pola_gnt.apps.frames import EncodedViews, frame_images, frame_source_views, scene_fov
from pola_gnt.apps.trained_runs import TrainedCheckpoint, load_trained_checkpoint
from pola_gnt.apps.video import write_path_videos
from pola_gnt.core.errors import UserError
from pola_gnt.data.images import to_uint8
from pola_gnt.data.scene import Scene
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.geometry.camera_paths import focus_depth, fov_intrinsics, interpolate_path
from pola_gnt.geometry.rays import pixel_grid, pixel_rays
from pola_gnt.model.render_memory import budget_chunk_rays, render_workers
from pola_gnt.model.renderer import RenderCancelled, RenderedImage, RenderNetwork, render_image
from pola_gnt.model.sampler import DepthSampler
from pola_gnt.runs.config.stored import TrainedRunConfig
from pola_gnt.runs.settings import ViewSettings

log = logging.getLogger(__name__)
MODES = ("RGB", "Depth", "Nothing")  # Nothing: no image is rendered, the geometry alone is shown
NO_IMAGE = "Nothing"
EXPORTED, LIVE = "exported", "live"  # the point clouds a tab shows
LIVE_POINTS_PER_IMAGE = 20_000  # a full-size image adds at most this many points to the live cloud
LIVE_POINTS_MAX = 500_000  # the live cloud keeps the newest points up to this many
SHOWN_POINTS_MAX = 1_000_000  # an exported cloud larger than this is shown as a random subset (the browser's memory)
PATH_FILE = "camera_path.json"
# The full image's progress is sent to the page at most this often (it shows whole seconds): each update
# redraws the page, which cost a software-WebGL browser on the same 2 CPU cores 13 s of CPU during a
# 37 s full image when sent every 0.1 s (per chunk), against 5 s without progress.
PROGRESS_INTERVAL_S = 1.0
# `stop` waits this long for a render to stop: a view's is cancelled before its next chunk, a video's after its frame.
STOP_TIMEOUT_S = 60.0
# How long a tab's camera reports are taken for ones sent before the browser applied the opening
# camera the server set (it answers within a fraction of a second): a stale report would restart the
# opening render at viser's default camera.
OPENING_ECHO_WAIT_S = 5.0
# Frustum lines 1.5 px wide on screen: viser's default, 0.02 scene units, is wider than a frustum in a
# normalised LLFF scene and, seen from a training camera, its neighbours' lines cover the image.
FRUSTUM_LINES: dict[str, Any] = {"thickness": 1.5, "thickness_units": "screen"}


@dataclass(frozen=True)
class ViewCamera:
    """What the viewer renders: an OpenCV camera (viser's convention too) with a vertical field of
    view, at a size."""

    c2w: Float[Tensor, "4 4"]
    fov: float  # vertical, degrees
    height: int
    width: int

    def at_most(self, rays: int) -> ViewCamera:
        """The same camera at the largest size of its aspect with at most `rays` pixels."""
        if self.height * self.width <= rays:
            return self
        scale = math.sqrt(rays / (self.height * self.width))
        return ViewCamera(self.c2w, self.fov, max(1, int(self.height * scale)), max(1, int(self.width * scale)))

    def same_pose(self, other: ViewCamera) -> bool:
        """The same pose and field of view: a browser echoes the camera the server set after float32
        look-at arithmetic of its own (1e-7 to 1e-5 here); 1e-4 moves a pixel of a 1000-px focal
        length by a tenth of a pixel."""
        return abs(self.fov - other.fov) < 1e-3 and torch.allclose(self.c2w, other.c2w, atol=1e-4)

    def same_view(self, other: ViewCamera) -> bool:
        """The same image."""
        return (self.height, self.width) == (other.height, other.width) and self.same_pose(other)


class ViewRenderer:
    """Renders any camera of the scene as `render_video` renders a frame, cancellable between chunks."""

    def __init__(
        self,
        net: RenderNetwork,
        scene: Scene,
        sampler: DepthSampler,
        num_source_views: int,
        chunk_rays: int,
        fabric: Fabric,
        workers: int = 1,
    ):
        self.net, self.scene, self.sampler, self.fabric = net, scene, sampler, fabric
        self.num_source_views, self.chunk_rays, self.workers = num_source_views, chunk_rays, workers
        self.encoded = EncodedViews(net, scene, fabric.device, workers)
        self.lock = threading.Lock()  # one render at a time: the tabs share the CPU and the encoded views
        # Depth colours as in the videos: the scene's normalised near/far bounds.
        self.depth_range = float(scene.bounds.min()), float(scene.bounds.max())

    def nearest_views(self, c2w: Tensor) -> list[int]:
        return frame_source_views(self.scene, c2w, self.num_source_views)

    def render(
        self,
        camera: ViewCamera,
        cancelled: Callable[[], bool] = lambda: False,
        progress: Callable[[int, int], None] | None = None,
    ) -> RenderedImage | None:
        """The camera's colour and depth; None when `cancelled()` turns true between two chunks.
        `progress(rays done, rays in all)` is called after each chunk."""
        device = self.fabric.device
        c2w = camera.c2w.to(device)
        intrinsics = fov_intrinsics(torch.tensor([camera.fov]), camera.height, camera.width)[0].to(device)
        with self.lock, self.fabric.autocast():
            sources = self.encoded(self.nearest_views(camera.c2w))
            try:  # a chance to stop between two chunks
                frame = render_image(
                    self.net,
                    c2w,
                    intrinsics,
                    camera.height,
                    camera.width,
                    sources,
                    self.scene.depth_range,
                    self.sampler,
                    self.chunk_rays,
                    workers=self.workers,
                    cancelled=cancelled,
                    progress=progress,
                )
            except RenderCancelled:
                return None
        return RenderedImage(rgb=frame.rgb.cpu(), depth=frame.depth.cpu())

    def points(self, frame: RenderedImage, camera: ViewCamera, count: int) -> PointCloud:
        """At most `count` of the frame's pixels with a depth, as points (an even random subset)."""
        intrinsics = fov_intrinsics(torch.tensor([camera.fov]), camera.height, camera.width)[0]
        rays = pixel_rays(camera.c2w.double(), intrinsics.double(), pixel_grid(camera.height, camera.width).double())
        depth = frame.depth.reshape(-1).double()
        valid = torch.nonzero(torch.isfinite(depth) & (depth > 0))[:, 0]
        if len(valid) > count:
            valid = valid[torch.randperm(len(valid), generator=torch.Generator().manual_seed(len(valid)))[:count]]
        points = rays.origins[valid] + depth[valid, None] * rays.directions[valid]
        return PointCloud(points.float().numpy(), to_uint8(frame.rgb.reshape(-1, 3)[valid].float()))

    def image(self, frame: RenderedImage, mode: str) -> np.ndarray:
        """The uint8 image `[H, W, 3]` the page shows: colour, or depth in the videos' colour map."""
        rgb, depth = frame_images(frame, self.depth_range)
        return depth if mode == "Depth" else rgb


def refinement_levels(camera: ViewCamera, preview_rays: int) -> list[tuple[str, ViewCamera]]:
    """The images rendered after a move: a preview of at most `preview_rays` rays (about a second on
    a CPU), "refine" images of 16x the rays of the one before while they are at most a quarter of the
    full size, then the full size. On a 2-core CPU a full 567x378 image (214k rays) takes 60-90 s;
    the refine steps add at most a third of that (567x378 after 2048 rays: 32k rays, 15%)."""
    levels = [("preview", camera.at_most(preview_rays))]
    rays = preview_rays * 16
    while 4 * rays <= camera.height * camera.width:
        levels.append(("refine", camera.at_most(rays)))
        rays *= 16
    if levels[0][1] != camera:
        levels.append(("full", camera))
    return levels


def orbit_depth(scene: Scene, c2w: Tensor) -> float:
    """How far in front of camera `c2w` `[4, 4]` the viewer's orbit pivots (a drag turns the camera
    about that point): where the training cameras look. Object rigs: the depth along this camera's
    axis of the point nearest to all their optical axes; forward rigs (near-parallel axes): GNT's
    spiral focus depth."""
    if scene.rig == "object":
        cameras = scene.cameras.c2w[scene.train_ids].double()
        centres, axes = cameras[:, :3, 3], cameras[:, :3, 2]
        # Least squares over the axes: sum_i (I - a_i a_i^T) (p - c_i) = 0.
        projectors = torch.eye(3, dtype=torch.float64) - axes[:, :, None] * axes[:, None, :]
        point = torch.linalg.solve(projectors.sum(0), (projectors @ centres[:, :, None]).sum(0))[:, 0]
        depth = float((point - c2w[:3, 3].double()) @ c2w[:3, 2].double())
        if depth > 0:
            return depth
    return focus_depth(scene.bounds)


def c2w_of(wxyz: np.ndarray, position: np.ndarray) -> Tensor:
    """A viser pose (quaternion w, x, y, z and position; OpenCV camera axes) as c2w `[4, 4]`."""
    c2w = torch.eye(4, dtype=torch.float64)
    c2w[:3, :3] = torch.from_numpy(vtf.SO3(np.asarray(wxyz, dtype=np.float64)).as_matrix())
    c2w[:3, 3] = torch.from_numpy(np.asarray(position, dtype=np.float64))
    return c2w.float()


def pose_of(c2w: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """c2w `[4, 4]` as viser's (wxyz, position)."""
    matrix = c2w.double().numpy()
    return vtf.SO3.from_matrix(matrix[:3, :3]).wxyz, matrix[:3, 3]


class ClientView:
    """One browser tab: its camera, the render loop (preview, then full size; a move cancels), its
    controls and recorded keyframes."""

    def __init__(self, app: ViewerApp, client: Any):
        self.app, self.client = app, client
        self.changed = threading.Condition()
        self.generation = 0  # bumped by every camera move or mode change
        self.camera: ViewCamera | None = None
        self.last: RenderedImage | None = None
        self.closed = False
        self.images_shown = 0
        self.last_shown: tuple[int, str] | None = None  # (generation, level) of the image on the page
        self.timings: dict[str, float] = {}  # level (refinement_levels) -> seconds from the move to its image
        self.connected_at = time.perf_counter()
        self.first_image_s: float | None = None  # seconds from the connection to the first image shown
        self.progress_shown_at = 0.0  # when the full image's progress was last sent to the page
        self.opening: tuple[ViewCamera, float] | None = None  # (camera, when) the server set, until echoed
        self.check_again: threading.Timer | None = None  # a report ignored while waiting for the echo
        self.errors: list[str] = []
        self.keyframes: list[tuple[Tensor, float]] = []  # (c2w, fov degrees)
        self._build_controls()
        self.thread = threading.Thread(target=self._loop, name=f"render-{client.client_id}", daemon=True)
        self.thread.start()

    # ---- controls ---------------------------------------------------------------------------
    def _build_controls(self) -> None:
        gui = self.client.gui
        self.mode = gui.add_dropdown("Show", MODES, initial_value="RGB")
        self.mode.on_update(lambda _: self.mode_changed())
        self.status = gui.add_markdown("Rendering the opening view.")
        self.progress = gui.add_markdown("full image: waiting for the camera")
        self.progress_bar = gui.add_progress_bar(0.0)
        self.sources = gui.add_markdown("")
        with gui.add_folder("Camera path"):
            self.duration = gui.add_number("Duration (s)", initial_value=4.0, min=0.1, max=600.0, step=0.1)
            self.fps = gui.add_number("FPS", initial_value=30, min=1, max=120, step=1)
            self.fov = gui.add_number(
                "FOV (deg)", initial_value=round(scene_fov(self.app.renderer.scene), 2), min=5.0, max=170.0, step=0.5
            )
            self.keyframe_count = gui.add_markdown("0 keyframes")
            gui.add_button("Add keyframe").on_click(lambda _: self.add_keyframe())
            gui.add_button("Clear keyframes").on_click(lambda _: self.clear_keyframes())
            self.path_file = gui.add_text("Save as", initial_value=str(self.app.run_dir / PATH_FILE))
            gui.add_button("Save path").on_click(lambda _: self.report(self.save_path))
            gui.add_button("Render video").on_click(lambda _: self.report(self.render_video))
        with gui.add_folder("Geometry"):
            clouds = [EXPORTED, LIVE] if self.app.exported is not None else [LIVE]
            self.cloud = gui.add_dropdown("Point cloud", clouds, initial_value=clouds[0])
            self.cloud_shown = gui.add_checkbox("Show points", initial_value=self.app.exported is not None)
            size = self.app.point_size
            self.point_size = gui.add_slider(
                "Point size", min=size / 10, max=size * 5, step=size / 10, initial_value=size
            )
            self.cloud_status = gui.add_markdown("")
            gui.add_button("Clear live points").on_click(lambda _: self.clear_live_points())
            for control in (self.cloud, self.cloud_shown, self.point_size):
                control.on_update(lambda _: self.show_points())
        self.live: list[PointCloud] = []  # the live cloud: the points of each full-size image, oldest first
        self.show_points()

    def shown_cloud(self) -> PointCloud | None:
        if self.cloud.value == EXPORTED:
            return self.app.exported
        if not self.live:
            return None
        points = np.concatenate([cloud.points for cloud in self.live])
        return PointCloud(points, np.concatenate([cloud.colours for cloud in self.live]))

    def show_points(self) -> None:
        """The chosen point cloud in the page, or none when it is switched off or empty."""
        cloud = self.shown_cloud()
        if not self.cloud_shown.value or cloud is None or not len(cloud):
            self.client.scene.remove_by_name("/geometry/points")
            empty = cloud is None or not len(cloud)
            self.cloud_status.content = "no live points yet: they come with each full-size image" if empty else ""
            return
        size = float(self.point_size.value)
        self.client.scene.add_point_cloud("/geometry/points", cloud.points, cloud.colours, point_size=size)
        self.cloud_status.content = f"{len(cloud)} points ({self.cloud.value})"

    def add_live_points(self, frame: RenderedImage, camera: ViewCamera) -> None:
        self.live.append(self.app.renderer.points(frame, camera, LIVE_POINTS_PER_IMAGE))
        while sum(len(cloud) for cloud in self.live) > LIVE_POINTS_MAX:
            self.live.pop(0)
        if self.cloud.value == LIVE:
            self.show_points()

    def clear_live_points(self) -> None:
        self.live.clear()
        self.show_points()

    def mode_changed(self) -> None:
        """Nothing: the rendered image leaves the page and no more are rendered; back to an image: the
        current camera renders again (the camera may have moved meanwhile)."""
        if self.mode.value == NO_IMAGE:
            self.client.scene.set_background_image(None)
            self.status.content = "Nothing rendered: the geometry alone"
            with self.changed:
                self.generation += 1  # the render in progress stops at its next chunk
            return
        if self.camera is not None:
            self.camera_moved(self.current_camera())

    def add_keyframe(self) -> None:
        camera = self.current_camera()
        self.keyframes.append((camera.c2w, float(self.fov.value)))
        wxyz, position = pose_of(camera.c2w)
        aspect = camera.width / camera.height
        self.client.scene.add_camera_frustum(
            f"/keyframes/{len(self.keyframes)}",
            fov=math.radians(float(self.fov.value)),
            aspect=aspect,
            scale=self.app.frustum_scale,
            color=(230, 120, 20),
            **FRUSTUM_LINES,
            wxyz=wxyz,
            position=position,
        )
        self.keyframe_count.content = f"{len(self.keyframes)} keyframes"

    def clear_keyframes(self) -> None:
        for index in range(1, len(self.keyframes) + 1):
            self.client.scene.remove_by_name(f"/keyframes/{index}")
        self.keyframes.clear()
        self.keyframe_count.content = "0 keyframes"

    def recorded_path(self) -> CameraPath:
        """The keyframes' smooth path (`interpolate_path`), `duration x fps` frames; the field of view
        moves linearly from keyframe to keyframe."""
        if len(self.keyframes) < 2:
            raise UserError("a camera path needs at least 2 keyframes: move the camera and press Add keyframe")
        frames = max(2, round(float(self.duration.value) * float(self.fps.value)))
        poses = interpolate_path(torch.stack([c2w for c2w, _ in self.keyframes]), frames)
        fovs = torch.tensor([fov for _, fov in self.keyframes])
        # Each frame's keyframe segment by the nearest keyframe along the path (interpolated fov).
        stops = torch.linspace(0, len(self.keyframes) - 1, frames)
        fov = torch.from_numpy(np.interp(stops.numpy(), np.arange(len(fovs)), fovs.numpy())).float()
        height, width = self.app.full_size(self.client.camera.aspect)
        return CameraPath(poses, fov, height, width, float(self.fps.value))

    def save_path(self) -> str:
        path = self.recorded_path()
        file = Path(str(self.path_file.value))
        scene = self.app.renderer.scene
        write_camera_path(file, path, scene.name, scene.scale)
        document = camera_path_document(path, scene.name, scene.scale)
        self.client.send_file_download(file.name, json.dumps(document, indent=1).encode())
        command = f"python -m pola_gnt.render_video ckpt_path={self.app.ckpt_path} video.path={file}"
        return f"saved {len(path)} cameras to {file}; render it with `{command}`"

    def render_video(self) -> str:
        path = self.recorded_path()
        out_dir = self.app.run_dir / "videos" / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        self.save_path()
        thread = threading.Thread(target=self._render_video, args=(path, out_dir), daemon=True)
        self.app.video_threads.append(thread)
        thread.start()
        return f"rendering {len(path)} frames to {out_dir} (progress in the terminal)"

    def _render_video(self, path: CameraPath, out_dir: Path) -> None:
        try:
            paths = write_path_videos(
                self.app.trained,
                self.app.renderer.scene,
                path,
                out_dir,
                self.app.fabric,
                crf=18,
                chunk_rays=self.app.renderer.chunk_rays,
                cancelled=lambda: self.app.stopping,
            )
            self.status.content = f"video written: {paths[0]}"
        except RenderCancelled:  # the viewer is stopping
            log.warning("video stopped with the viewer; its frames are kept in %s", out_dir)
        except Exception as err:  # the server goes on
            self._error(err)

    def report(self, action: Callable[[], str]) -> None:
        """Run a button's action; its message, or its error, in the page."""
        try:
            self.status.content = action()
        except UserError as err:
            self.status.content = f"**{err}**"
        except Exception as err:
            self._error(err)

    # ---- rendering ----------------------------------------------------------------------------
    def current_camera(self) -> ViewCamera:
        camera = self.client.camera
        height, width = self.app.full_size(float(camera.aspect))
        return ViewCamera(c2w_of(camera.wxyz, camera.position), math.degrees(float(camera.fov)), height, width)

    def open_at(self, camera: ViewCamera) -> None:
        """Render the opening camera the server has just set in the browser, without waiting for the
        browser to report it."""
        with self.changed:
            self.opening = (camera, time.perf_counter())
        self.camera_moved(camera)

    def client_camera_changed(self) -> None:
        """The browser sent its camera: render it, unless it is the camera being rendered (the echo
        of the opening camera, which would cancel and restart its render) or one sent before the
        browser applied the opening camera."""
        camera = self.current_camera()
        with self.changed:
            if self.opening is not None:
                opening, set_at = self.opening
                waited = time.perf_counter() - set_at
                if not opening.same_pose(camera) and waited < OPENING_ECHO_WAIT_S:
                    # Perhaps a real move (a user quicker than the echo): taken when the wait is over,
                    # since no other report may follow it.
                    self._check_again_in(OPENING_ECHO_WAIT_S - waited)
                    return
                self.opening = None
            if self.camera is not None and self.camera.same_view(camera):
                return
        self.camera_moved(camera)

    def _check_again_in(self, seconds: float) -> None:
        """Take the browser's camera again after `seconds` (one pending check at a time)."""
        if self.check_again is None:
            self.check_again = threading.Timer(seconds + 0.01, self._check_again)
            self.check_again.daemon = True
            self.check_again.start()

    def _check_again(self) -> None:
        with self.changed:
            self.check_again = None
            if self.closed:
                return
        self.client_camera_changed()

    def camera_moved(self, camera: ViewCamera | None = None) -> None:
        """A new camera (default: the client's): cancel the render in progress and start again."""
        with self.changed:
            self.camera = camera or self.current_camera()
            self.moved_at = time.perf_counter()
            self.generation += 1
            self.changed.notify()

    def show_last(self) -> None:
        if self.last is not None and self.mode.value != NO_IMAGE:
            self.client.scene.set_background_image(
                self.app.renderer.image(self.last, str(self.mode.value)), format="jpeg", jpeg_quality=92
            )

    def close(self) -> None:
        with self.changed:
            self.closed = True
            if self.check_again is not None:
                self.check_again.cancel()
            self.changed.notify()

    def _loop(self) -> None:
        self.done = 0  # the generation last started
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self.closed or self.generation != self.done)
                if self.closed:
                    return
                generation, camera, moved_at = self.generation, self.camera, self.moved_at
            self.done = generation
            if camera is None or self.mode.value == NO_IMAGE:
                continue
            try:
                self._render(camera, generation, moved_at)
            except Exception as err:  # shown and logged; the loop and the server go on
                self._error(err)

    def _render(self, camera: ViewCamera, generation: int, moved_at: float) -> None:
        names = self.app.renderer.scene.image_names
        nearest = self.app.renderer.nearest_views(camera.c2w)
        self.sources.content = "Nearest source views: " + ", ".join(names[v] for v in nearest)
        levels = refinement_levels(camera, self.app.settings.preview_rays)
        full = f"full image {camera.width}x{camera.height}"
        self._show_progress(f"{full}: 0%", 0.0)

        def full_progress(done: int, total: int) -> None:  # per chunk of the full-size image
            if done < total and time.perf_counter() - self.progress_shown_at >= PROGRESS_INTERVAL_S:
                seconds = time.perf_counter() - moved_at
                self._show_progress(f"{full}: {100 * done / total:.0f}% ({seconds:.0f} s)", 100 * done / total)

        for step, (level, sized) in enumerate(levels):
            frame = self.app.renderer.render(
                sized,
                cancelled=lambda: self.closed or self.generation != generation,
                progress=full_progress if step == len(levels) - 1 else None,
            )
            if frame is None:
                return
            self.last = frame
            self.timings[level] = time.perf_counter() - moved_at
            self.show_last()
            if self.first_image_s is None:
                self.first_image_s = time.perf_counter() - self.connected_at
            self.status.content = (
                f"{level} {sized.width}x{sized.height} in {self.timings[level]:.1f} s after the move"
                + ("; refining" if step < len(levels) - 1 else "")
            )
            if step == len(levels) - 1:
                self._show_progress(f"{full}: done in {self.timings[level]:.1f} s", 100.0)
                self.add_live_points(frame, sized)
            # Last: the counts tell a watcher (tests, viewer_screenshots.py) the image and its lines are out.
            self.images_shown += 1
            self.last_shown = (generation, level)
            self.app.images_shown += 1

    def _show_progress(self, text: str, percent: float) -> None:
        self.progress.content = text
        self.progress_bar.value = percent
        self.progress_shown_at = time.perf_counter()

    def _error(self, err: BaseException) -> None:
        message = f"{type(err).__name__}: {err}"
        self.errors.append(message)
        log.error("render error: %s\n%s", message, "".join(traceback.format_exception(err)))
        self.status.content = f"**render error** (logged; the viewer goes on): {message}"


class ViewerApp:
    """The viewer: a viser server, the scene's training cameras as frusta, a `ClientView` per tab."""

    def __init__(
        self,
        trained: TrainedCheckpoint,
        scene: Scene,
        fabric: Fabric,
        settings: ViewSettings,
        run_dir: Path,
        ckpt_path: str,
    ):
        self.trained, self.fabric, self.settings, self.run_dir, self.ckpt_path = (
            trained,
            fabric,
            settings,
            run_dir,
            ckpt_path,
        )
        config = trained.settings
        trained.system.net.to(fabric.device).eval()
        net = trained.system.rendering_network(fabric.device)
        views = config.data.num_source_views
        chunk_rays = budget_chunk_rays(config.render, config.model.net, views, fabric.device)
        workers = render_workers(config.render, config.model.net, views, chunk_rays, fabric.device)
        self.renderer = ViewRenderer(net, scene, trained.system.sampler, views, chunk_rays, fabric, workers)
        # A 2x2 render of the opening camera before the page can connect: a process's first render
        # builds the fused CPU kernels where this checkout has no build yet (30 s here; the page's first
        # image waited for it) and encodes the opening camera's source views.
        opening = scene.cameras.c2w[scene.train_ids[0]]
        self.renderer.render(ViewCamera(opening, scene_fov(scene), 2, 2))
        self.clients: dict[int, ClientView] = {}
        # Videos rendering (a tab's button); `stop` ends them after their current frame, frames kept.
        self.video_threads: list[threading.Thread] = []
        self.stopping = False
        self.connections = self.images_shown = 0  # tabs that connected, images sent (all tabs)
        self.exported = shown_subset(read_point_cloud(Path(settings.point_cloud))) if settings.point_cloud else None
        centres = scene.cameras.c2w[:, :3, 3]
        self.frustum_scale = 0.1 * float((centres - centres.mean(0)).norm(dim=-1).max().clamp(min=1e-3))
        # Points a full-size pixel wide at the depth the training cameras look at (viser draws them about
        # twice their size: an export at half the scene's size then leaves no gaps).
        focal = float(scene.cameras.intrinsics[scene.train_ids[0], 1, 1])
        self.point_size = orbit_depth(scene, scene.cameras.c2w[scene.train_ids[0]]) / focal
        port = settings.port or free_port(settings.host)
        self.server = viser.ViserServer(host=settings.host, port=port, verbose=False)
        self.port = self.server.get_port()
        self.server.scene.set_up_direction("-y")  # OpenCV cameras: image rows point down
        self._add_training_cameras(scene)
        self.server.on_client_connect(self._connect)
        self.server.on_client_disconnect(self._disconnect)

    def full_size(self, aspect: float) -> tuple[int, int]:
        """The full-resolution image of a camera of this aspect: `view.height` (default the scene's) high."""
        height = self.settings.height or self.renderer.scene.resolution[0]
        return height, max(1, round(height * aspect))

    def _add_training_cameras(self, scene: Scene) -> None:
        height, width = scene.resolution
        fov = math.radians(scene_fov(scene))
        for view in scene.train_ids:
            wxyz, position = pose_of(scene.cameras.c2w[view])
            self.server.scene.add_camera_frustum(
                f"/training/{scene.image_names[view]}",
                fov=fov,
                aspect=width / height,
                scale=self.frustum_scale,
                color=(40, 90, 200),
                **FRUSTUM_LINES,
                wxyz=wxyz,
                position=position,
            )

    def _connect(self, client: Any) -> None:
        view = ClientView(self, client)
        self.clients[client.client_id] = view
        self.connections += 1
        client.camera.on_update(lambda _: view.client_camera_changed())
        if not has_camera(client):
            return  # the first camera the browser sends is rendered (client_camera_changed), no move needed
        # Start at the first training camera, looking the way it looked, the orbit pivoting where
        # the training cameras look (viser's default pivot, the origin, turns the camera away).
        scene = self.renderer.scene
        c2w = scene.cameras.c2w[scene.train_ids[0]].double()
        with client.atomic():
            client.camera.fov = math.radians(scene_fov(scene))
            client.camera.position = c2w[:3, 3].numpy()
            client.camera.up_direction = (-c2w[:3, 1]).numpy()  # OpenCV: image rows point down
            client.camera.look_at = (c2w[:3, 3] + orbit_depth(scene, c2w) * c2w[:3, 2]).numpy()
        # Rendered now: the browser's echo of this camera is no move (client_camera_changed).
        view.open_at(view.current_camera())

    def _disconnect(self, client: Any) -> None:
        view = self.clients.pop(client.client_id, None)
        if view is not None:
            view.close()

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def stop(self) -> None:
        """Close every view, wait for their renders to stop (a render in progress is cancelled before its
        next chunk, a video after its current frame), then stop the server: a render left running would
        outlive the interpreter's shutdown."""
        self.stopping = True
        views = list(self.clients.values())
        for view in views:
            view.close()
        for thread in [view.thread for view in views] + self.video_threads:
            thread.join(timeout=STOP_TIMEOUT_S)
        self.server.stop()


def shown_subset(cloud: PointCloud) -> PointCloud:
    """At most `SHOWN_POINTS_MAX` of the cloud's points (a seeded random subset)."""
    if len(cloud) <= SHOWN_POINTS_MAX:
        return cloud
    chosen = np.sort(np.random.default_rng(0).choice(len(cloud), SHOWN_POINTS_MAX, replace=False))
    return PointCloud(cloud.points[chosen], cloud.colours[chosen])


def has_camera(client: Any) -> bool:
    """Whether viser has had a camera from this client yet (its camera's properties assert one)."""
    try:
        return bool(client.camera.update_timestamp)
    except AssertionError:
        return False


def free_port(host: str) -> int:
    """A port nothing listens on now (`view.port=0`)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def start_viewer(run: TrainedRunConfig, run_dir: Path, ckpt_path: str) -> ViewerApp:
    """Load the checkpoint and its scene, and serve the viewer (returns once it is listening)."""
    trained = load_trained_checkpoint(run)
    config = trained.settings
    scene = load_scene(config.scene, config.data)
    precision: Any = config.trainer.precision  # Lightning's precision names
    fabric = Fabric(accelerator=config.trainer.accelerator, devices=1, precision=precision)
    return ViewerApp(trained, scene, fabric, config.view, run_dir, ckpt_path)
