"""Fly-through videos of a trained run: the camera path (generated, or a camera_path.json file),
every frame rendered from its nearest training cameras (their features encoded once per view and
video), each frame kept as PNGs in the run folder as it is rendered (a stopped render resumes
there), and the two mp4s (`video_rgb.mp4`, `video_depth.mp4`, H.264 yuv420p) encoded from them at
the end, whole or not at all. The library behind `python -m pola_gnt.render_video`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

import imageio.v3 as iio
import imageio_ffmpeg
import numpy as np
import torch
from lightning_fabric import Fabric
from torch import Tensor
from tqdm import tqdm

from pola_gnt.apps.camera_path_file import CameraPath, camera_path_document, read_camera_path, write_camera_path
from pola_gnt.apps.frames import EncodedViews, frame_images, frame_source_views, scene_fov
from pola_gnt.apps.trained_runs import TrainedCheckpoint, load_trained_checkpoint
from pola_gnt.core.errors import UserError
from pola_gnt.core.files import staged_file, write_atomic
from pola_gnt.data.scene import Scene
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.geometry.camera_paths import fov_intrinsics, interpolate_path, spiral_path
from pola_gnt.model.inference import FastRenderNetwork
from pola_gnt.model.render_memory import budget_chunk_rays, render_workers
from pola_gnt.model.renderer import RenderCancelled, RenderedImage, RenderNetwork, render_image
from pola_gnt.model.sampler import DepthSampler
from pola_gnt.runs.config.stored import TrainedRunConfig
from pola_gnt.runs.settings import RunSettings, VideoSettings

RGB_VIDEO = "video_rgb.mp4"
DEPTH_VIDEO = "video_depth.mp4"
FRAMES_FOLDER = "frames"  # the frames as rendered, PNG: a stopped render resumes from them

FrameWriter = Generator[None, np.ndarray | None, None]
# imageio-ffmpeg has no annotations (a checker infers an int `fps` and `quality` from the defaults);
# its documented contract: `fps` any positive number, `quality=None` to leave the rate to `-crf`.
_write_frames: Callable[..., FrameWriter] = imageio_ffmpeg.write_frames


def scene_camera_path(scene: Scene, settings: VideoSettings) -> Tensor:
    """The generated path's cameras c2w `[frames, 4, 4]` (OpenCV): the spiral or the interpolation."""
    if settings.path == "spiral":
        return spiral_path(
            scene.cameras.c2w, scene.bounds, settings.frames, settings.rotations, settings.z_rate, settings.radius_scale
        )
    if len(scene.train_ids) < 2:
        raise UserError(f"video.path=interpolate: {scene.name} has {len(scene.train_ids)} training camera(s), needs 2")
    # Training cameras in capture order (image order), as the photographer moved.
    return interpolate_path(scene.cameras.c2w[scene.train_ids], settings.frames, settings.closed)


def video_camera_path(scene: Scene, settings: VideoSettings) -> CameraPath:
    """The video's frames: a camera_path.json file's (`video.path=FILE.json`: its cameras, size and
    rate), or the generated path at the scene's size, field of view and `video.fps`; then at
    `video.scale` of that size."""
    if settings.path.endswith(".json"):
        path = read_camera_path(Path(settings.path))
    else:
        poses = scene_camera_path(scene, settings)
        height, width = scene.resolution
        path = CameraPath(poses, torch.full((len(poses),), scene_fov(scene)), height, width, settings.fps)
    return path.scaled(settings.scale)


def scaled_intrinsics(intrinsics: Tensor, size: tuple[int, int], scaled_size: tuple[int, int]) -> Tensor:
    """Intrinsics `[3, 3]` of a camera of image size (H, W) `size` rendered at `scaled_size`: focal
    lengths and principal point scaled per axis (as the loader's downsampling factors do)."""
    scaled = intrinsics.clone()
    scaled[0] *= scaled_size[1] / size[1]
    scaled[1] *= scaled_size[0] / size[0]
    return scaled


def render_frame(
    net: RenderNetwork,
    scene: Scene,
    encoded: EncodedViews,
    c2w: Tensor,
    intrinsics: Tensor,
    height: int,
    width: int,
    num_source_views: int,
    sampler: DepthSampler,
    chunk_rays: int,
    fabric: Fabric,
    workers: int = 1,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    peak_weights: list[Tensor] | None = None,
) -> RenderedImage:
    """One frame of a camera of its own (`c2w` `[4, 4]`, `intrinsics` `[3, 3]`, `height` x `width`)
    from its `num_source_views` nearest training cameras (`frame_source_views`), their features from
    `encoded`; `cancelled`, `progress`, `peak_weights`: `render_image`'s. Videos, the viewer's camera
    paths and `pola_gnt.api` render a camera so."""
    with fabric.autocast():
        sources = encoded(frame_source_views(scene, c2w, num_source_views))
        return render_image(
            net,
            c2w.to(fabric.device),
            intrinsics.to(fabric.device),
            height,
            width,
            sources,
            scene.depth_range,
            sampler,
            chunk_rays,
            workers=workers,
            cancelled=cancelled,
            progress=progress,
            peak_weights=peak_weights,
        )


def render_frames(
    net: RenderNetwork,
    scene: Scene,
    path: CameraPath,
    num_source_views: int,
    sampler: DepthSampler,
    chunk_rays: int,
    fabric: Fabric,
    frames: Iterable[int] | None = None,
    workers: int = 1,
    peak_weights: list[Tensor] | None = None,
) -> Iterator[tuple[int, RenderedImage]]:
    """Render the frames `frames` (default: all) of `path`, colour and depth, each from its
    `num_source_views` nearest training cameras; yields (frame index, image). A frame's pixels
    depend on its camera alone (same chunks, same order), so any subset renders as in a whole run.
    `workers`: chunks rendered at once (`render_rays`; the same pixels); `peak_weights`: each frame's
    `[H, W]` appended (`render_image`)."""
    intrinsics = fov_intrinsics(path.fov, path.height, path.width).to(fabric.device)  # [frames, 3, 3]
    encoded = EncodedViews(net, scene, fabric.device, workers)  # each training view encoded once per video
    for index in range(len(path)) if frames is None else frames:
        rendered = render_frame(
            net,
            scene,
            encoded,
            path.c2w[index],
            intrinsics[index],
            path.height,
            path.width,
            num_source_views,
            sampler,
            chunk_rays,
            fabric,
            workers,
            peak_weights=peak_weights,
        )
        yield index, rendered


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


def encode_videos(
    frames: Iterable[tuple[np.ndarray, np.ndarray]], out_dir: Path, fps: float, crf: int
) -> tuple[Path, Path]:
    """Encode (colour, colour-mapped depth) uint8 frame pairs `[H, W, 3]` into `video_rgb.mp4` and
    `video_depth.mp4`; both appear only once every frame is written (`staged_file`: an interrupted
    encode never leaves a broken file under the final name)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rgb_path, depth_path = out_dir / RGB_VIDEO, out_dir / DEPTH_VIDEO
    with (
        staged_file(rgb_path, suffix=".mp4") as rgb_temporary,
        staged_file(depth_path, suffix=".mp4") as depth_temporary,
    ):
        rgb_video, depth_video = Mp4Writer(rgb_temporary, fps, crf), Mp4Writer(depth_temporary, fps, crf)
        try:
            for rgb, depth in frames:
                rgb_video.append(rgb)
                depth_video.append(depth)
            if rgb_video.encoder is None:
                raise ValueError("encode_videos: no frames")
        except BaseException:
            for video in (rgb_video, depth_video):
                with contextlib.suppress(Exception):
                    video.close()
            raise
        rgb_video.close()
        depth_video.close()
    return rgb_path, depth_path


def write_videos(
    frames: Iterable[RenderedImage], out_dir: Path, fps: float, crf: int, depth_range: tuple[float, float]
) -> tuple[Path, Path]:
    """Encode rendered frames into `video_rgb.mp4` and `video_depth.mp4` (`encode_videos`)."""
    return encode_videos((frame_images(frame, depth_range) for frame in frames), out_dir, fps, crf)


class FrameFolder:
    """The frames of one video as they are rendered (`frames/rgb/NNNNNN.png`, `frames/depth/...`,
    each written atomically), and what they were rendered with (`frames/render.json`: the camera
    path and the render settings). A re-run into the same run folder skips the frames already there;
    one rendered with another path or other settings is refused rather than mixed in."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.rgb, self.depth = folder / "rgb", folder / "depth"
        self.record = folder / "render.json"

    def name(self, index: int) -> str:
        return f"{index:06d}.png"

    def start(self, record: dict) -> None:
        """Check the folder's record against `record` (this render's), or start a new folder."""
        if self.record.exists():
            try:
                previous = json.loads(self.record.read_text())
            except (OSError, json.JSONDecodeError):
                previous = None
            if previous != record:
                changed = sorted(
                    key for key in set(record) | set(previous or {}) if (previous or {}).get(key) != record.get(key)
                )
                raise UserError(
                    f"{self.folder}: holds frames of another render ({', '.join(changed)} differ); "
                    f"use another hydra.run.dir or delete {self.folder}"
                )
        elif self.rgb.exists() and any(self.rgb.iterdir()):
            raise UserError(f"{self.folder}: holds frames but no render.json; delete it or use another hydra.run.dir")
        self.rgb.mkdir(parents=True, exist_ok=True)
        self.depth.mkdir(parents=True, exist_ok=True)
        write_atomic(self.record, (json.dumps(record, indent=1) + "\n").encode())

    def done(self, index: int) -> bool:
        """Both images of frame `index` written (the depth is written last)."""
        return (self.depth / self.name(index)).exists() and (self.rgb / self.name(index)).exists()

    def write(self, index: int, rgb: np.ndarray, depth: np.ndarray) -> None:
        write_atomic(self.rgb / self.name(index), png_bytes(rgb))
        write_atomic(self.depth / self.name(index), png_bytes(depth))

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return iio.imread(self.rgb / self.name(index)), iio.imread(self.depth / self.name(index))


def png_bytes(image: np.ndarray) -> bytes:
    """A uint8 image `[H, W, 3]` as PNG (lossless: a resumed video's frames are the same bytes)."""
    return iio.imwrite("<bytes>", image, extension=".png")


def render_record(trained: TrainedCheckpoint, path_document: dict, chunk_rays: int) -> dict:
    """What a video's frames depend on: resumed frames must come from the same render."""
    config = trained.settings
    return {
        "camera_path": path_document,
        "checkpoint": str(trained.path),
        "step": trained.system.checkpoint_step,
        "model": config.model.name,
        "scene": config.scene.name,
        "factor": config.data.factor,
        "n_samples": config.render.n_samples,
        "num_source_views": config.data.num_source_views,
        "chunk_rays": chunk_rays,
        "accelerator": config.trainer.accelerator,
        "precision": config.trainer.precision,
    }


def _workers(config: RunSettings, chunk_rays: int, fabric: Fabric) -> int:
    """Chunks rendered at once (`render_memory.render_workers`) for this run's settings."""
    return render_workers(config.render, config.model.net, config.data.num_source_views, chunk_rays, fabric.device)


def write_path_videos(
    trained: TrainedCheckpoint,
    scene: Scene,
    path: CameraPath,
    out_dir: Path,
    fabric: Fabric,
    crf: int,
    chunk_rays: int,
    cancelled: Callable[[], bool] | None = None,
) -> tuple[Path, Path]:
    """Render the frames of `path` not yet in `<out_dir>/frames/` (each kept there as it is
    rendered), then encode the two mp4s from all of them. `cancelled()` is asked after each frame:
    true stops with `RenderCancelled`, the frames so far kept (the same call resumes after them)."""
    config = trained.settings
    trained.system.net.to(fabric.device).eval()
    net = trained.system.rendering_network(fabric.device)
    frames = FrameFolder(out_dir / FRAMES_FOLDER)
    record = render_record(trained, camera_path_document(path, scene.name, scene.scale), chunk_rays)
    frames.start({**record, "render_precision": "bf16" if isinstance(net, FastRenderNetwork) else "fp32"})
    todo = [index for index in range(len(path)) if not frames.done(index)]
    if len(todo) < len(path):
        print(f"resuming    {len(path) - len(todo)} of {len(path)} frames already in {frames.folder}", flush=True)
    print(f"frames      {frames.folder} (stopped? the same command with hydra.run.dir={out_dir} resumes)", flush=True)
    # Depth colours span the scene's near/far bounds (normalised), near bright.
    depth_range = float(scene.bounds.min()), float(scene.bounds.max())
    workers = _workers(config, chunk_rays, fabric)
    rendered = render_frames(
        net, scene, path, config.data.num_source_views, trained.system.sampler, chunk_rays, fabric, todo, workers
    )
    # tqdm shows frames done, seconds per frame and the time left.
    with tqdm(
        total=len(path), initial=len(path) - len(todo), desc="rendering", unit="frame", dynamic_ncols=True
    ) as progress:
        for index, frame in rendered:
            frames.write(index, *frame_images(frame, depth_range))
            progress.update()
            if cancelled is not None and cancelled():
                raise RenderCancelled
    return encode_videos((frames.read(index) for index in range(len(path))), out_dir, path.fps, crf)


def render_video(run: TrainedRunConfig, run_dir: Path) -> tuple[Path, Path]:
    """Render the configured fly-through (`video`, the command line's) of the checkpoint; return the
    two mp4 paths. Frames are kept in `<run_dir>/frames/` as they are rendered: a re-run with the
    same `hydra.run.dir` continues after the last finished frame, and the mp4s are encoded from
    the frames at the end."""
    trained = load_trained_checkpoint(run)
    config = trained.settings
    settings = config.video
    scene = load_scene(config.scene, config.data)
    path = video_camera_path(scene, settings)
    if settings.save_path is not None:
        write_camera_path(Path(settings.save_path), path, scene.name, scene.scale)
        print(f"camera path {settings.save_path} ({len(path)} cameras, camera_path.json)", flush=True)
    # Accelerator and precision as the Trainer would use them (the command line's trainer section).
    precision: Any = config.trainer.precision  # Lightning's precision names, as the Trainer takes them
    fabric = Fabric(accelerator=config.trainer.accelerator, devices=1, precision=precision)
    chunk_rays = budget_chunk_rays(config.render, config.model.net, config.data.num_source_views, fabric.device)
    print(f"checkpoint  {trained.path} ({config.model.name}, step {trained.system.checkpoint_step})", flush=True)
    source = settings.path if settings.path.endswith(".json") else f"{settings.path} path"
    print(
        f"video       {source}, {len(path)} frames at {path.width}x{path.height}"
        f"{f' (video.scale={settings.scale:g})' if settings.scale != 1 else ''}, {path.fps:g} fps, "
        f"{config.data.num_source_views} source views, {config.render.n_samples} samples per ray, "
        f"{chunk_rays} rays per pass, "
        f"{_workers(config, chunk_rays, fabric)} at once",
        flush=True,
    )
    paths = write_path_videos(trained, scene, path, run_dir, fabric, settings.crf, chunk_rays)
    print(f"wrote {paths[0]} and {paths[1].name}", flush=True)
    return paths
