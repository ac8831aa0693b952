"""Fly-through paths (`geometry/camera_paths.py`) and `pola_gnt.render_video`: mp4 frames, size and fps,
agreement with a direct render, no broken file after an interruption, bad values as one error line."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import torch
from helpers import assert_one_error_line, compose_config, run_in_process, run_module, scene_and_data, system_of
from lightning_fabric import Fabric
from omegaconf import OmegaConf

from pola_gnt.apps.frames import frame_source_views
from pola_gnt.apps.trained_runs import load_trained_checkpoint
from pola_gnt.apps.video import (
    DEPTH_VIDEO,
    FRAMES_FOLDER,
    RGB_VIDEO,
    render_frames,
    scaled_intrinsics,
    video_camera_path,
    write_path_videos,
    write_videos,
)
from pola_gnt.core.errors import UserError
from pola_gnt.core.paths import demo_scene_dir
from pola_gnt.data.images import to_uint8
from pola_gnt.data.llff import load_llff_scene
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.evaluation.image_metrics import mse_to_psnr
from pola_gnt.geometry.camera_paths import focus_depth, interpolate_path, spiral_path
from pola_gnt.geometry.rays import pixel_grid, pixel_rays
from pola_gnt.model.render_memory import CPU_BUDGET_MB, CPU_PASS_MB, budget_chunk_rays, bytes_per_ray
from pola_gnt.model.renderer import RenderCancelled, RenderedImage, render_image
from pola_gnt.runs.checkpoints import read_checkpoint
from pola_gnt.runs.config.read import read_run_settings, read_video_settings
from pola_gnt.runs.config.stored import stored_run_config, trained_run_config

VIDEO_FACTOR = 64  # the demo scene at 63 x 47: fast, and odd sides exercise the even padding
VIDEO_FRAMES = 5
VIDEO_FPS = 12


@pytest.fixture(scope="module")
def scene():
    return load_scene(*scene_and_data(compose_config("data.factor=32")))


def assert_rotations(c2w: torch.Tensor) -> None:
    rotations = c2w[:, :3, :3].double()
    identity = torch.eye(3, dtype=torch.float64).expand_as(rotations)
    assert torch.allclose(rotations @ rotations.transpose(1, 2), identity, atol=1e-5)
    assert torch.allclose(torch.linalg.det(rotations), torch.ones(len(c2w), dtype=torch.float64), atol=1e-5)
    assert torch.equal(c2w[:, 3], torch.tensor([0.0, 0.0, 0.0, 1.0]).expand(len(c2w), 4))


# ---- camera paths -----------------------------------------------------------------------------


def test_spiral_follows_gnt(scene):
    c2w = scene.cameras.c2w
    path = spiral_path(c2w, scene.bounds, frames=30)
    assert path.shape == (30, 4, 4)
    assert_rotations(path)
    # The scene is recentred: the average camera is the identity, so the focus point is straight ahead.
    focus = torch.tensor([0.0, 0.0, focus_depth(scene.bounds)])
    close, far = 0.9 * float(scene.bounds.min()), 5.0 * float(scene.bounds.max())
    assert math.isclose(float(focus[2]), 1.0 / (0.25 / close + 0.75 / far), rel_tol=1e-6)
    to_focus = torch.nn.functional.normalize(focus - path[:, :3, 3], dim=-1)
    assert torch.allclose(path[:, :3, 2], to_focus, atol=1e-4)  # every frame looks at the focus point
    assert (path[:, 1, 1] > 0.95).all()  # image rows still point down (+y)
    radii = np.percentile(np.abs(c2w[:, :3, 3].numpy()), 90, axis=0)
    assert np.allclose(path[0, :3, 3].numpy(), [radii[0], 0.0, 0.0], atol=1e-4)  # angle 0: the x radius
    assert np.allclose(path[:, :3, 3].abs().amax(0).numpy(), radii, rtol=0.05)  # 2 turns at z-rate 0.5 reach all radii
    wider = spiral_path(c2w, scene.bounds, frames=30, radius_scale=2.0)
    assert torch.allclose(wider[:, :3, 3], 2.0 * path[:, :3, 3], atol=1e-5)


def test_interpolated_path_passes_through_the_training_cameras(scene):
    keyframes = scene.cameras.c2w[scene.train_ids]
    dense = interpolate_path(keyframes, frames=len(keyframes) * 40)
    assert dense.shape == (len(keyframes) * 40, 4, 4)
    assert_rotations(dense)
    assert torch.allclose(dense[0], keyframes[0], atol=1e-5) and torch.allclose(dense[-1], keyframes[-1], atol=1e-5)
    # Every camera is on the path: some frame is within one arc step of it, looking the same way.
    step = (dense[1:, :3, 3] - dense[:-1, :3, 3]).norm(dim=-1)
    distances = torch.cdist(keyframes[:, :3, 3], dense[:, :3, 3])  # [keys, frames]
    nearest = distances.argmin(dim=1)
    assert (distances.min(dim=1).values <= step.max() + 1e-5).all()
    cosines = (dense[nearest, :3, 2] * keyframes[:, :3, 2]).sum(-1)
    assert (cosines > 0.999).all()
    assert step.std() / step.mean() < 0.05  # constant speed along the path
    loop = interpolate_path(keyframes, frames=60, closed=True)
    assert torch.allclose(loop[0], keyframes[0], atol=1e-5)
    loop_steps = (loop[1:, :3, 3] - loop[:-1, :3, 3]).norm(dim=-1)
    closing = (loop[0, :3, 3] - loop[-1, :3, 3]).norm()
    assert closing < 1.2 * loop_steps.mean()  # the last frame is one step before the start
    with pytest.raises(ValueError):
        interpolate_path(keyframes[:1], frames=10)


@pytest.mark.parametrize(
    "key, value",
    [
        ("frames", 0),
        ("frames", 2.5),
        ("fps", 0),
        ("fps", -30),
        ("path", "orbit"),
        ("path", "path.txt"),
        ("save_path", "path.txt"),
        ("radius_scale", 0),
        ("crf", 60),
    ],
)
def test_bad_video_settings_name_their_key(key, value):
    video = OmegaConf.create(
        {
            "path": "spiral",
            "save_path": None,
            "frames": 120,
            "fps": 30,
            "rotations": 2,
            "z_rate": 0.5,
            "radius_scale": 1.0,
            "closed": False,
            "crf": 18,
            "scale": 1.0,
        }
    )
    assert read_video_settings(video).frames == 120
    video[key] = value
    with pytest.raises(UserError, match=f"video.{key}"):
        read_video_settings(video)


# ---- writing and rendering videos -------------------------------------------------------------


def read_video(path: Path) -> tuple[dict, np.ndarray]:
    """-> ffmpeg's metadata and the decoded frames uint8 `[frames, H, W, 3]`."""
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    width, height = meta["size"]
    frames = [np.frombuffer(frame, dtype=np.uint8).reshape(height, width, 3) for frame in reader]
    return meta, np.stack(frames)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of two arrays of 8-bit levels, any shape."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2) / 255.0**2
    return float(mse_to_psnr(torch.tensor(mse)))


def luma(image: np.ndarray) -> np.ndarray:
    """BT.601 luma `[H, W]` of uint8 RGB: the channel yuv420p keeps at full resolution."""
    return image.astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def pool2(image: np.ndarray) -> np.ndarray:
    """2 x 2 box average (even crop): the resolution at which yuv420p keeps colour."""
    height, width = image.shape[0] // 2 * 2, image.shape[1] // 2 * 2
    return image[:height, :width].astype(np.float64).reshape(height // 2, 2, width // 2, 2, -1).mean(axis=(1, 3))


def test_interrupted_render_leaves_no_video(tmp_path):
    def frames():
        for shade in (0.2, 0.6):
            yield RenderedImage(rgb=torch.full((16, 16, 3), shade), depth=torch.full((16, 16), 2.0))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_videos(frames(), tmp_path, fps=10, crf=18, depth_range=(1.0, 5.0))
    assert list(tmp_path.iterdir()) == []  # neither the final names nor the temporary files


def test_a_cancelled_path_video_keeps_its_frames_and_the_same_call_resumes(tiny_runs, tmp_path):
    """`write_path_videos(cancelled=)` (the viewer's video, stopped with the viewer): asked after each
    frame, it stops with the frames so far kept and no mp4; the same call renders the rest and encodes
    all of them, the kept frame untouched."""
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    overrides = [f"ckpt_path={checkpoint}", f"data.factor={VIDEO_FACTOR}", "video.frames=3"]
    trained = load_trained_checkpoint(trained_run_config(compose_config(*overrides), tmp_path, overrides))
    scene = load_scene(trained.settings.scene, trained.settings.data)
    path = video_camera_path(scene, trained.settings.video)
    fabric, out_dir = Fabric(accelerator="cpu", devices=1), tmp_path / "video"
    asked = []

    def cancelled() -> bool:
        asked.append(1)
        return True

    with pytest.raises(RenderCancelled):
        write_path_videos(trained, scene, path, out_dir, fabric, crf=18, chunk_rays=4096, cancelled=cancelled)
    first = sorted((out_dir / FRAMES_FOLDER / "rgb").iterdir())
    assert len(asked) == 1 and len(first) == 1
    assert not (out_dir / RGB_VIDEO).exists() and not (out_dir / DEPTH_VIDEO).exists()
    kept = first[0].stat().st_mtime_ns
    write_path_videos(trained, scene, path, out_dir, fabric, crf=18, chunk_rays=4096, cancelled=lambda: False)
    assert len(list((out_dir / FRAMES_FOLDER / "rgb").iterdir())) == 3 and first[0].stat().st_mtime_ns == kept
    assert len(read_video(out_dir / RGB_VIDEO)[1]) == 3


@pytest.fixture(scope="module")
def tiny_video(tiny_runs, tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("video")
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    result = run_module(
        "render_video",
        f"ckpt_path={checkpoint}",
        f"data.factor={VIDEO_FACTOR}",
        f"video.frames={VIDEO_FRAMES}",
        f"video.fps={VIDEO_FPS}",
        f"hydra.run.dir={out_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out_dir


def test_videos_have_the_requested_frames_size_and_fps(tiny_video):
    height, width = 3024 // VIDEO_FACTOR, 4032 // VIDEO_FACTOR  # 47 x 63, padded to even sides
    for name in (RGB_VIDEO, DEPTH_VIDEO):
        meta, frames = read_video(tiny_video / name)
        assert frames.shape == (VIDEO_FRAMES, height + 1, width + 1, 3), name
        assert meta["fps"] == VIDEO_FPS and meta["codec"] == "h264" and meta["pix_fmt"].startswith("yuv420p")
        # The camera moves: the frames are not one still image.
        changes = np.abs(np.diff(frames.astype(np.float64), axis=0)).mean(axis=(1, 2, 3))
        assert changes.max() > 1.0, (name, changes)
    assert sorted(p.name for p in tiny_video.iterdir() if p.suffix == ".mp4") == sorted([RGB_VIDEO, DEPTH_VIDEO])


def test_first_frame_matches_a_direct_render(tiny_runs, tiny_video):
    checkpoint_path = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    checkpoint = read_checkpoint(checkpoint_path)
    config = stored_run_config(checkpoint, checkpoint_path)
    system = system_of(config)
    system.load_state_dict(checkpoint["state_dict"])
    net = system.net.eval()
    scene = load_llff_scene(demo_scene_dir(), factor=VIDEO_FACTOR, llffhold=config.data.llffhold)
    pose = spiral_path(scene.cameras.c2w, scene.bounds, frames=VIDEO_FRAMES)[0]
    views = frame_source_views(scene, pose, config.data.num_source_views)
    sources = net.source_views(
        scene.images[views].permute(0, 3, 1, 2), scene.cameras.c2w[views], scene.cameras.intrinsics[views]
    )
    height, width = scene.resolution
    direct = render_image(
        net,
        pose,
        scene.cameras.intrinsics[0],
        height,
        width,
        sources,
        scene.depth_range,
        system.sampler,
        config.render.chunk_rays,
    )
    _, frames = read_video(tiny_video / RGB_VIDEO)
    expected, first = to_uint8(direct.rgb), frames[0, :height, :width]
    assert expected.std() > 2.0  # a real image, not a flat colour that any codec keeps
    # The barely trained model's colours change from pixel to pixel, and yuv420p keeps colour at half
    # resolution (even losslessly coded, RGB PSNR is about 18 dB here): compare the full-resolution
    # luma, and the colour at the 2 x 2 resolution it is stored at. The next frame scores ~15 dB.
    assert psnr(luma(first), luma(expected)) > 30.0
    assert psnr(pool2(first), pool2(expected)) > 27.0
    assert psnr(luma(frames[1, :height, :width]), luma(expected)) < 25.0


def test_preview_scale_renders_smaller_frames(tiny_runs, tmp_path):
    """`video.scale=0.5`: the same path at half the width and height (a CPU user's preview)."""
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    result = run_in_process(
        "render_video",
        f"ckpt_path={checkpoint}",
        f"data.factor={VIDEO_FACTOR}",
        "video.frames=2",
        "video.scale=0.5",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "frames at 32x24 (video.scale=0.5)" in result.stdout
    for name in (RGB_VIDEO, DEPTH_VIDEO):
        _, frames = read_video(tmp_path / name)
        assert frames.shape == (2, 24, 32, 3), name  # round(47 / 2) x round(63 / 2), even already


def test_bad_render_options_are_one_error_line(tmp_path):
    result = run_in_process("render_video", "ckpt_path=missing.ckpt", "video.frames=0", f"hydra.run.dir={tmp_path}")
    assert_one_error_line(result, "video.frames")
    assert not list(tmp_path.glob("*.mp4"))


# ---- frames kept as rendered, resume, encoder once, memory-budgeted chunks -------------------------


def test_a_stopped_render_resumes_with_the_same_frames(tiny_runs, tiny_video, tmp_path):
    """A run stopped after its first frames (here: the later frames and the mp4s removed, as a kill
    leaves them) and run again renders only the missing frames, and its mp4s decode to exactly the
    frames of the uninterrupted run."""
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    frames_dir = tiny_video / FRAMES_FOLDER
    assert sorted(p.name for p in (frames_dir / "rgb").iterdir()) == [f"{i:06d}.png" for i in range(VIDEO_FRAMES)]
    run_dir = tmp_path / "run"
    shutil.copytree(frames_dir, run_dir / FRAMES_FOLDER)
    for index in range(2, VIDEO_FRAMES):
        (run_dir / FRAMES_FOLDER / "depth" / f"{index:06d}.png").unlink()
    (run_dir / FRAMES_FOLDER / "rgb" / f"{VIDEO_FRAMES - 1:06d}.png").unlink()
    overrides = [f"ckpt_path={checkpoint}", f"data.factor={VIDEO_FACTOR}", f"video.frames={VIDEO_FRAMES}"]
    result = run_in_process("render_video", *overrides, f"video.fps={VIDEO_FPS}", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming    2 of {VIDEO_FRAMES} frames" in result.stdout
    for name in (RGB_VIDEO, DEPTH_VIDEO):
        assert np.array_equal(read_video(run_dir / name)[1], read_video(tiny_video / name)[1]), name
    # Frames of another render are refused, not mixed in (one error line).
    changed = run_in_process("render_video", *overrides, "video.rotations=3", f"hydra.run.dir={run_dir}")
    assert_one_error_line(changed, str(run_dir / FRAMES_FOLDER), "camera_path")


def test_each_training_view_is_encoded_once_per_video(tiny_runs, scene):
    checkpoint_path = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    checkpoint = read_checkpoint(checkpoint_path)
    config = stored_run_config(checkpoint, checkpoint_path)
    system = system_of(config)
    system.load_state_dict(checkpoint["state_dict"])
    net = system.net.eval()
    encoded: list[int] = []
    encode = net.encode
    net.encode = lambda images: (encoded.append(len(images)), encode(images))[1]  # type: ignore[method-assign]
    settings = read_run_settings(compose_config("data.factor=32", "video.frames=6", "video.scale=0.1")).video
    path = video_camera_path(scene, settings)
    fabric = Fabric(accelerator="cpu", devices=1)
    frames = list(render_frames(net, scene, path, 3, system.sampler, 4096, fabric))
    used = {view for c2w in path.c2w for view in frame_source_views(scene, c2w, 3)}
    assert [index for index, _ in frames] == list(range(6))
    assert sum(encoded) == len(used) < 6 * 3  # each view once, not once per frame


def test_render_chunks_fit_the_memory_budget():
    settings = read_run_settings(compose_config("render.chunk_rays=4096"))
    net, render = settings.model.net, settings.render
    per_ray = bytes_per_ray(net, render.n_samples, 10)
    cpu = torch.device("cpu")
    assert render.max_memory_mb is None  # the default: by device
    # On a CPU the cache's bound is the tighter: the default memory budget would take more rays.
    expected = min(4096, int(CPU_PASS_MB * 2**20 // per_ray))
    assert expected < min(4096, int(CPU_BUDGET_MB * 2**20 // per_ray))
    assert budget_chunk_rays(render, net, 10, cpu) == expected
    # Elsewhere only the memory budget bounds a pass (a meta device stands for a CUDA one's type).
    unbounded = read_run_settings(compose_config("render.chunk_rays=4096", "render.max_memory_mb=100000")).render
    assert budget_chunk_rays(unbounded, net, 10, torch.device("meta")) == 4096
    small = read_run_settings(compose_config("render.chunk_rays=4096", "render.max_memory_mb=1")).render
    assert budget_chunk_rays(small, net, 10, cpu) == max(1, int(2**20 // per_ray)) < 4096
    tiny = read_run_settings(compose_config("render.max_memory_mb=0.0001")).render
    assert budget_chunk_rays(tiny, net, 10, cpu) == 1
    with pytest.raises(UserError, match="render.max_memory_mb"):
        read_run_settings(compose_config("render.max_memory_mb=-5"))


def test_video_scale_renders_the_same_camera_at_a_fraction_of_the_size():
    video = compose_config("video.scale=0.5").video
    settings = read_video_settings(video)
    assert settings.scale == 0.5 and settings.resolution(94, 126) == (47, 63)
    intrinsics = torch.tensor([[100.0, 0.0, 63.0], [0.0, 100.0, 47.0], [0.0, 0.0, 1.0]])
    half = scaled_intrinsics(intrinsics, (94, 126), (47, 63))
    c2w = torch.eye(4)
    # Pixel (u, v) at half size looks along the ray of pixel (2u, 2v) at full size.
    pixels = pixel_grid(47, 63)
    torch.testing.assert_close(
        pixel_rays(c2w, half, pixels).directions, pixel_rays(c2w, intrinsics, 2 * pixels).directions
    )
    assert read_run_settings(compose_config()).video.scale == 1.0
