"""Fly-through videos of a trained run: the camera path, every frame rendered from its nearest
training cameras (their features encoded once per view), and the two mp4s (`video_rgb.mp4`,
`video_depth.mp4`, H.264 yuv420p) written whole or not at all. The library behind
`python -m pola_gnt.render_video`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import imageio_ffmpeg
import numpy as np
import torch
from lightning_fabric import Fabric
from torch import Tensor
from tqdm import tqdm

from pola_gnt.core.errors import UserError
from pola_gnt.core.files import staged_file
from pola_gnt.data.images import to_uint8
from pola_gnt.data.scene import Scene
from pola_gnt.data.scenes import load_scene
from pola_gnt.data.source_views import nearest_views, scene_selection_points, selection_points
from pola_gnt.evaluation.scoring import colorize_depth
from pola_gnt.geometry.camera_paths import interpolate_path, spiral_path
from pola_gnt.model.gnt import GNT, SourceViews
from pola_gnt.model.renderer import RenderedImage, render_image
from pola_gnt.model.sampler import DepthSampler
from pola_gnt.runs.config.stored import TrainedRunConfig
from pola_gnt.runs.settings import VideoSettings
from pola_gnt.runs.trained_runs import load_trained_checkpoint

RGB_VIDEO = "video_rgb.mp4"
DEPTH_VIDEO = "video_depth.mp4"

FrameWriter = Generator[None, np.ndarray | None, None]
# imageio-ffmpeg has no annotations (a checker infers an int `fps` and `quality` from the defaults);
# its documented contract: `fps` any positive number, `quality=None` to leave the rate to `-crf`.
_write_frames: Callable[..., FrameWriter] = imageio_ffmpeg.write_frames


def scene_camera_path(scene: Scene, settings: VideoSettings) -> Tensor:
    """The video's cameras c2w `[frames, 4, 4]` (OpenCV) for the scene."""
    if settings.path == "spiral":
        return spiral_path(
            scene.cameras.c2w, scene.bounds, settings.frames, settings.rotations, settings.z_rate, settings.radius_scale
        )
    if len(scene.train_ids) < 2:
        raise UserError(f"video.path=interpolate: {scene.name} has {len(scene.train_ids)} training camera(s), needs 2")
    # Training cameras in capture order (image order), as the photographer moved.
    return interpolate_path(scene.cameras.c2w[scene.train_ids], settings.frames, settings.closed)


class EncodedViews:
    """Source views with their encoder features, computed once per training view and kept: a fly-through
    keeps most of its nearest cameras from one frame to the next."""

    def __init__(self, net: GNT, scene: Scene, device: torch.device):
        self.net, self.scene, self.device = net, scene, device
        self.images: dict[int, Tensor] = {}  # view -> [3, H, W]
        self.features: dict[int, Tensor] = {}  # view -> [C, h, w]

    @torch.no_grad()
    def _encode(self, view: int) -> None:
        image = self.scene.images[view].permute(2, 0, 1).to(self.device)  # [3, H, W]
        self.images[view] = image
        self.features[view] = self.net.encode(image[None])[0].float()

    def __call__(self, views: list[int]) -> SourceViews:
        for view in views:
            if view not in self.features:
                self._encode(view)
        cameras = self.scene.cameras
        return SourceViews(
            images=torch.stack([self.images[v] for v in views]),
            features=torch.stack([self.features[v] for v in views]),
            c2w=cameras.c2w[views].to(self.device),
            intrinsics=cameras.intrinsics[views].to(self.device),
        )


def frame_source_views(scene: Scene, c2w: Tensor, count: int) -> list[int]:
    """The `count` training cameras nearest to a video camera `c2w` `[4, 4]` (nearest first)."""
    return nearest_views(selection_points(c2w, scene.rig), scene_selection_points(scene), scene.train_ids, count)


def scaled_intrinsics(intrinsics: Tensor, size: tuple[int, int], scaled_size: tuple[int, int]) -> Tensor:
    """Intrinsics `[3, 3]` of a camera of image size (H, W) `size` rendered at `scaled_size`: focal
    lengths and principal point scaled per axis (as the loader's downsampling factors do)."""
    scaled = intrinsics.clone()
    scaled[0] *= scaled_size[1] / size[1]
    scaled[1] *= scaled_size[0] / size[0]
    return scaled


def render_frames(
    net: GNT,
    scene: Scene,
    poses: Tensor,
    num_source_views: int,
    sampler: DepthSampler,
    chunk_rays: int,
    fabric: Fabric,
    resolution: tuple[int, int] | None = None,
) -> Iterator[RenderedImage]:
    """Render each camera of `poses` `[frames, 4, 4]` at `resolution` (H, W; default the scene's),
    colour and depth."""
    height, width = resolution or scene.resolution
    # Every LLFF view shares the intrinsics.
    intrinsics = scaled_intrinsics(scene.cameras.intrinsics[0], scene.resolution, (height, width)).to(fabric.device)
    encoded = EncodedViews(net, scene, fabric.device)
    for c2w in poses:
        with fabric.autocast():
            sources = encoded(frame_source_views(scene, c2w, num_source_views))
            rendered = render_image(
                net, c2w.to(fabric.device), intrinsics, height, width, sources, scene.depth_range, sampler, chunk_rays
            )
        yield rendered


def pad_to_even(frame: np.ndarray) -> np.ndarray:
    """H.264 in yuv420p needs even sides: repeat the last row / column where one is odd."""
    height, width = frame.shape[:2]
    return np.pad(frame, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")


class Mp4Writer:
    """Frames -> an H.264 / yuv420p mp4 file, started by the first frame (its size)."""

    def __init__(self, path: Path, fps: float, crf: int):
        self.path = path
        self.fps, self.crf = fps, crf
        self.encoder: FrameWriter | None = None  # imageio-ffmpeg's frame generator

    def append(self, frame: np.ndarray) -> None:
        """Add one uint8 RGB frame `[H, W, 3]`."""
        frame = np.ascontiguousarray(pad_to_even(frame))
        if self.encoder is None:
            height, width = frame.shape[:2]
            self.encoder = _write_frames(
                str(self.path),
                (width, height),
                fps=self.fps,
                codec="libx264",
                pix_fmt_out="yuv420p",
                quality=None,
                macro_block_size=2,  # sides are even already: never rescale
                output_params=["-crf", str(self.crf), "-movflags", "+faststart"],
                ffmpeg_log_level="error",
            )
            self.encoder.send(None)  # start the generator
        self.encoder.send(frame)

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.close()
            self.encoder = None


def write_videos(
    frames: Iterator[RenderedImage], out_dir: Path, fps: float, crf: int, depth_range: tuple[float, float]
) -> tuple[Path, Path]:
    """Encode rendered frames into `video_rgb.mp4` and `video_depth.mp4` (depth colour-mapped with
    `depth_range` = (near, far)); both appear only once every frame is written (`staged_file`: an
    interrupted render never leaves a broken file under the final name)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rgb_path, depth_path = out_dir / RGB_VIDEO, out_dir / DEPTH_VIDEO
    with (
        staged_file(rgb_path, suffix=".mp4") as rgb_temporary,
        staged_file(depth_path, suffix=".mp4") as depth_temporary,
    ):
        rgb_video, depth_video = Mp4Writer(rgb_temporary, fps, crf), Mp4Writer(depth_temporary, fps, crf)
        try:
            for frame in frames:
                rgb_video.append(to_uint8(frame.rgb.float().cpu()))
                depth_video.append(colorize_depth(frame.depth.float().cpu(), *depth_range))
            if rgb_video.encoder is None:
                raise ValueError("write_videos: no frames")
        except BaseException:
            for video in (rgb_video, depth_video):
                with contextlib.suppress(Exception):
                    video.close()
            raise
        rgb_video.close()
        depth_video.close()
    return rgb_path, depth_path


def render_video(run: TrainedRunConfig, run_dir: Path) -> tuple[Path, Path]:
    """Render the configured fly-through (`video`, the command line's) of the checkpoint; return the
    two mp4 paths."""
    trained = load_trained_checkpoint(run)
    config = trained.settings
    settings = config.video
    scene = load_scene(config.scene, config.data)
    poses = scene_camera_path(scene, settings)
    # Accelerator and precision as the Trainer would use them (the command line's trainer section).
    precision: Any = config.trainer.precision  # Lightning's precision names, as the Trainer takes them
    fabric = Fabric(accelerator=config.trainer.accelerator, devices=1, precision=precision)
    net = trained.system.net.to(fabric.device).eval()
    height, width = settings.resolution(*scene.resolution)
    print(f"checkpoint  {trained.path} ({config.model.name}, step {trained.system.checkpoint_step})", flush=True)
    print(
        f"video       {settings.path} path, {settings.frames} frames at {width}x{height}"
        f"{f' (video.scale={settings.scale:g})' if settings.scale != 1 else ''}, {settings.fps:g} fps, "
        f"{config.data.num_source_views} source views, {config.render.n_samples} samples per ray",
        flush=True,
    )
    frames = render_frames(
        net,
        scene,
        poses,
        config.data.num_source_views,
        trained.system.sampler,
        config.render.chunk_rays,
        fabric,
        (height, width),
    )
    progress = tqdm(frames, total=len(poses), desc="rendering", unit="frame", dynamic_ncols=True)
    # Depth colours span the scene's near/far bounds (normalised), near bright.
    depth_range = float(scene.bounds.min()), float(scene.bounds.max())
    # An iterator, read once (a checker never peeks into it, as it may into a sized iterable: the progress bar).
    paths = write_videos(iter(progress), run_dir, settings.fps, settings.crf, depth_range)
    print(f"wrote {paths[0]} and {paths[1].name}", flush=True)
    return paths
