"""Camera paths as files (`apps/camera_path_file.py`, nerfstudio's camera_path.json): the axis and
field-of-view conversions, a saved path read back, bad files as one error line, and a hand-made
nerfstudio-format file rendering the frames its cameras describe."""

from __future__ import annotations

import json
import math

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from helpers import assert_one_error_line, compose_config, run_in_process, scene_and_data, system_of

from pola_gnt.apps.camera_path_file import CameraPath, camera_path_document, read_camera_path, write_camera_path
from pola_gnt.apps.frames import frame_source_views, scene_fov
from pola_gnt.apps.video import FRAMES_FOLDER, video_camera_path
from pola_gnt.core.errors import UserError
from pola_gnt.core.paths import demo_scene_dir
from pola_gnt.data.images import to_uint8
from pola_gnt.data.llff import load_llff_scene
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.geometry.camera_paths import flip_camera_axes, focal_from_fov, fov_from_focal, fov_intrinsics
from pola_gnt.model.renderer import render_image
from pola_gnt.runs.checkpoints import read_checkpoint
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import stored_run_config

FACTOR = 64  # the demo scene at 63 x 47


@pytest.fixture(scope="module")
def scene():
    return load_scene(*scene_and_data(compose_config("data.factor=32")))


def test_axes_flip_both_ways_and_fov_matches_the_focal_length():
    c2w = torch.eye(4).repeat(2, 1, 1)
    c2w[1, :3, 3] = torch.tensor([1.0, 2.0, 3.0])
    opengl = flip_camera_axes(c2w)
    # OpenGL: y up, looking down -z; the centre stays.
    assert torch.equal(opengl[0, :3, :3], torch.diag(torch.tensor([1.0, -1.0, -1.0])))
    assert torch.equal(opengl[:, :3, 3], c2w[:, :3, 3]) and torch.equal(flip_camera_axes(opengl), c2w)
    fov = torch.tensor([90.0, 40.0])
    assert math.isclose(float(focal_from_fov(fov, 100)[0]), 50.0, rel_tol=1e-12)
    assert torch.allclose(fov_from_focal(focal_from_fov(fov, 378), 378).float(), fov)
    intrinsics = fov_intrinsics(fov, 100, 200)
    assert torch.allclose(intrinsics[0], torch.tensor([[50.0, 0.0, 100.0], [0.0, 50.0, 50.0], [0.0, 0.0, 1.0]]))


def test_a_saved_path_reads_back_the_same_cameras(scene, tmp_path):
    settings = read_run_settings(compose_config("data.factor=32", "video.frames=7")).video
    path = video_camera_path(scene, settings)
    assert math.isclose(
        float(focal_from_fov(path.fov[:1], scene.resolution[0])), float(scene.cameras.intrinsics[0, 1, 1]), rel_tol=1e-6
    )
    file = tmp_path / "sub" / "camera_path.json"
    write_camera_path(file, path, scene.name, scene.scale)
    document = json.loads(file.read_text())
    assert (document["render_height"], document["render_width"]) == scene.resolution
    assert document["fps"] == 30 and math.isclose(document["seconds"], 7 / 30)
    assert len(document["camera_path"]) == 7 and document["camera_type"] == "perspective"
    first = document["camera_path"][0]
    assert len(first["camera_to_world"]) == 16 and math.isclose(
        first["aspect"], scene.resolution[1] / scene.resolution[0]
    )
    # Stored with OpenGL axes: the camera's third column points backwards (-forward).
    stored = np.array(first["camera_to_world"]).reshape(4, 4)
    assert np.allclose(stored[:3, 2], -path.c2w[0, :3, 2].numpy(), atol=1e-6)
    assert "frame" in document["pola_gnt"] and document["pola_gnt"]["scene"] == scene.name
    again = read_camera_path(file)
    assert (again.height, again.width, again.fps) == (path.height, path.width, path.fps)
    assert torch.allclose(again.c2w, path.c2w, atol=1e-6) and torch.allclose(again.fov, path.fov, atol=1e-6)
    scaled = again.scaled(0.5)
    assert (scaled.height, scaled.width) == (round(path.height / 2), round(path.width / 2))


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"camera_path": []}, "camera_path"),
        ({"render_height": 0}, "render_height"),
        ({"render_width": 10.5}, "render_width"),
        ({"fps": "fast"}, "fps"),
        ({"camera_type": "fisheye"}, "camera_type"),
        ({"camera_path": [{"camera_to_world": [1, 0, 0], "fov": 50}]}, "camera_path[0]: `camera_to_world`"),
        (
            {"camera_path": [{"camera_to_world": [2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1], "fov": 50}]},
            "rotation",
        ),
        ({"camera_path": [{"camera_to_world": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1], "fov": 200}]}, "fov"),
    ],
)
def test_a_bad_file_names_its_field(tmp_path, change, fragment):
    path = CameraPath(torch.eye(4)[None], torch.tensor([50.0]), 30, 40, 24.0)
    document = {**camera_path_document(path, "demo", 1.0), **change}
    file = tmp_path / "path.json"
    file.write_text(json.dumps(document))
    with pytest.raises(UserError, match=str(file)) as raised:
        read_camera_path(file)
    assert fragment in str(raised.value)


def test_a_missing_or_broken_file_is_one_error_line(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    for file, fragment in ((tmp_path / "missing.json", "no such file"), (broken, "not a readable JSON file")):
        result = run_in_process(
            "render_video", "ckpt_path=pretrained:pola_gnt", f"video.path={file}", f"hydra.run.dir={tmp_path}"
        )
        assert_one_error_line(result, "video.path", str(file), fragment)
    result = run_in_process(
        "render_video", "ckpt_path=pretrained:pola_gnt", "video.path=orbit", f"hydra.run.dir={tmp_path}"
    )
    assert_one_error_line(result, "video.path", "FILE.json")


def test_a_nerfstudio_file_renders_the_cameras_it_describes(tiny_runs, tmp_path):
    """A hand-made camera_path.json of 3 cameras (OpenGL axes, vertical fov in degrees, a size of its
    own) renders the frames its cameras describe: each frame equals a direct render of that camera."""
    checkpoint_path = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    checkpoint = read_checkpoint(checkpoint_path)
    config = stored_run_config(checkpoint, checkpoint_path)
    # The cameras (the same at every factor) from the images the training used.
    scene = load_llff_scene(demo_scene_dir(), factor=32, llffhold=config.data.llffhold)
    height, width, fovs = 20, 30, [scene_fov(scene), 40.0, 60.0]
    cameras = []
    for view, fov in zip(scene.train_ids[:3], fovs):
        c2w = scene.cameras.c2w[view].double().clone()
        opengl = c2w.clone()
        opengl[:3, 1], opengl[:3, 2] = -c2w[:3, 1], -c2w[:3, 2]  # x right as OpenCV's; y up, looking down -z
        cameras.append({"camera_to_world": opengl.reshape(-1).tolist(), "fov": fov, "aspect": width / height})
    file = tmp_path / "camera_path.json"
    document = {"render_height": height, "render_width": width, "fps": 10, "seconds": 0.3, "camera_path": cameras}
    file.write_text(json.dumps(document))
    out_dir = tmp_path / "run"
    result = run_in_process(
        "render_video",
        f"ckpt_path={checkpoint_path}",
        f"data.factor={FACTOR}",
        f"video.path={file}",
        f"hydra.run.dir={out_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"3 frames at {width}x{height}" in result.stdout

    scene = load_llff_scene(demo_scene_dir(), factor=FACTOR, llffhold=config.data.llffhold)  # built by the command
    system = system_of(config)
    system.load_state_dict(checkpoint["state_dict"])
    net = system.net.eval()
    for index, (view, fov) in enumerate(zip(scene.train_ids[:3], fovs)):
        pose = scene.cameras.c2w[view]
        focal = 0.5 * height / math.tan(math.radians(fov) / 2)
        intrinsics = torch.tensor([[focal, 0.0, width / 2], [0.0, focal, height / 2], [0.0, 0.0, 1.0]])
        views = frame_source_views(scene, pose, config.data.num_source_views)
        sources = net.source_views(
            scene.images[views].permute(0, 3, 1, 2), scene.cameras.c2w[views], scene.cameras.intrinsics[views]
        )
        direct = render_image(
            net, pose, intrinsics, height, width, sources, scene.depth_range, system.sampler, config.render.chunk_rays
        )
        frame = iio.imread(out_dir / FRAMES_FOLDER / "rgb" / f"{index:06d}.png")
        expected = to_uint8(direct.rgb)
        assert expected.std() > 2.0
        assert np.abs(frame.astype(int) - expected.astype(int)).max() <= 1, index  # PNG frames are lossless


def test_the_generated_path_is_saved_in_the_same_format(tiny_runs, tmp_path):
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    saved = tmp_path / "spiral.json"
    result = run_in_process(
        "render_video",
        f"ckpt_path={checkpoint}",
        f"data.factor={FACTOR}",
        "video.frames=2",
        "video.scale=0.25",
        f"video.save_path={saved}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    path = read_camera_path(saved)
    scene = load_llff_scene(demo_scene_dir(), factor=FACTOR, llffhold=8)
    assert len(path) == 2 and (path.height, path.width) == (12, 16)
    settings = read_run_settings(compose_config(f"data.factor={FACTOR}", "video.frames=2", "video.scale=0.25")).video
    assert torch.allclose(path.c2w, video_camera_path(scene, settings).c2w, atol=1e-6)
