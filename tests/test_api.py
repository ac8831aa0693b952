"""`pola_gnt.api`, the Python API: `Model.render` and `Model.evaluate` give the pixels and numbers of the
`eval` command (the same scene keys, the same checkpoint), `render_path` the frames of `render_video`,
`export_points` the point cloud of `export`; bad input is the commands' one-line `UserError`; and
`fine_tune` writes a training run's folder and returns its model.

The default suite renders the demo scene at factor 32 (126 x 94) with the shipped checkpoint at 8
samples per ray and 3 source views (both keys any checkpoint renders under); the same on fern at
factor 8 with the checkpoint's own samples and views is `slow`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from helpers import assert_one_error_line, read_metrics, run_in_process

import pola_gnt
from pola_gnt.apps.camera_path_file import CameraPath, write_camera_path
from pola_gnt.apps.frames import frame_source_views, scene_fov
from pola_gnt.apps.video import FRAMES_FOLDER
from pola_gnt.data.images import to_uint8
from pola_gnt.data.ply import read_ply_vertices

# Keys any checkpoint renders under (no weight depends on them): a small, fast render.
SMALL = ("render.n_samples=8", "data.num_source_views=3")
DEMO = ("scene=demo", "data.factor=32", "data.test_views=1")


@pytest.fixture(scope="module")
def model() -> pola_gnt.Model:
    return pola_gnt.load_model("pretrained:pola_gnt", device="cpu", overrides=SMALL)


@pytest.fixture(scope="module")
def demo() -> pola_gnt.Scene:
    return pola_gnt.load_scene("demo", factor=32, test_views=1)


def test_import_is_cheap_and_exports_the_api():
    """`import pola_gnt` loads neither torch nor Lightning (a child process); the names resolve lazily."""
    import subprocess
    import sys

    code = "import sys, pola_gnt; print(sorted(m for m in ('torch', 'pytorch_lightning') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
    assert pola_gnt.load_model is pola_gnt.api.load_model and pola_gnt.UserError is pola_gnt.api.UserError
    assert set(pola_gnt.API_NAMES) <= set(dir(pola_gnt))
    # The package's list and the api's agree: each name is the api's, and the api exports those and no other.
    assert all(getattr(pola_gnt, name) is getattr(pola_gnt.api, name) for name in pola_gnt.API_NAMES)
    public = {name for name in vars(pola_gnt.api) if not name.startswith("_") and name != "core"}
    assert public == set(pola_gnt.api.__all__) == set(pola_gnt.API_NAMES)


def _same_as_eval(model, scene, eval_keys, tmp_path: Path, protocols=("standard",)) -> None:
    """`model.render` of every test view and `model.evaluate` by each protocol equal `eval`'s saved
    PNGs and metrics.json for the same keys."""
    for protocol in protocols:
        out = tmp_path / f"eval_{protocol}"
        result = run_in_process("eval", *eval_keys, f"metrics.protocol={protocol}", f"hydra.run.dir={out}")
        assert result.returncode == 0, result.stderr[-3000:]
        command = read_metrics(out)
        ours = model.evaluate(scene, protocol=protocol, out_dir=tmp_path / f"api_{protocol}")
        keys = ("scene", "protocol", "lpips_net", "resolution", "metric_settings", "n_samples", "mean", "per_image")
        for key in keys:
            assert ours.document[key] == command[key], key
        assert ours.mean == command["mean"] and ours.per_image == command["per_image"]
        if protocol == "standard":  # every pixel: the rendered images are eval's
            for index, view in enumerate(scene.test_ids):
                rendering = model.render(scene, index)
                stem = Path(scene.data.image_names[view]).stem
                colour, depth = rendering.images()
                assert np.array_equal(colour, iio.imread(out / "test_views" / f"{stem}_pred.png"))
                assert np.array_equal(depth, iio.imread(out / "test_views" / f"{stem}_depth.png"))
                assert np.array_equal(colour, to_uint8(rendering.rgb))


def test_render_and_evaluate_give_evals_pixels_and_numbers(model, demo, tmp_path):
    eval_keys = ("ckpt_path=pretrained:pola_gnt", "trainer=cpu", *DEMO, *SMALL)
    _same_as_eval(model, demo, eval_keys, tmp_path, protocols=("standard", "gnt"))


@pytest.mark.slow
def test_render_and_evaluate_give_evals_pixels_and_numbers_on_fern(llff_root, lpips_alex_weights, tmp_path):
    """The shipped checkpoint zero-shot on fern's test view at factor 8 (fewer samples and views than its
    own, as the demo test: a 504 x 378 render with its own takes minutes on a 2-core CPU)."""
    weights = f"metrics.lpips_weights={lpips_alex_weights}"
    fern_model = pola_gnt.load_model("pretrained:pola_gnt", device="cpu", overrides=[weights, *SMALL])
    fern = pola_gnt.load_scene(llff_root / "fern", factor=8, test_views=1)
    eval_keys = (
        "ckpt_path=pretrained:pola_gnt",
        "trainer=cpu",
        "scene=fern",
        f"data.root={llff_root}",
        weights,
        *SMALL,
    )
    _same_as_eval(fern_model, fern, (*eval_keys, "data.factor=8", "data.test_views=1"), tmp_path)


def test_bad_input_is_the_commands_error_line(demo, tmp_path):
    """A missing scene, another model's checkpoint, a file that is no checkpoint, an unknown shipped
    name: `UserError` with the very line the commands print; a camera of the wrong shape: one line too."""
    missing = tmp_path / "no_scene"
    with pytest.raises(pola_gnt.UserError) as error:
        pola_gnt.load_scene(missing, kind="llff")
    line = assert_one_error_line(
        run_in_process("check_scene", "scene=llff", f"scene.path={missing}", f"hydra.run.dir={tmp_path / 'c'}")
    )
    assert line == f"error: {error.value}"
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"PK\x03\x04 not a checkpoint" * 10)
    for checkpoint, keys in (("pretrained:pola_gnt", {"model": "gnt"}), (str(corrupt), {}), ("pretrained:no", {})):
        with pytest.raises(pola_gnt.UserError) as error:
            pola_gnt.load_model(checkpoint, device="cpu", **keys)
        command = [f"model={keys['model']}"] if keys else []
        result = run_in_process("eval", *command, f"ckpt_path={checkpoint}", f"hydra.run.dir={tmp_path / 'e'}")
        assert assert_one_error_line(result) == f"error: {error.value}"
    camera = pola_gnt.Camera.of(torch.eye(4)[:3], torch.eye(3), (4, 4))
    assert camera.c2w.shape == (4, 4) and camera.view is None
    bad = [
        ((np.eye(3), np.eye(3), (4, 4)), "camera: c2w must be a 3x4 or 4x4 matrix, got shape (3, 3)"),
        ((np.eye(4), np.eye(4), (4, 4)), "camera: intrinsics must be a 3x3 matrix, got shape (4, 4)"),
        ((np.eye(4) * 2, np.eye(3), (4, 4)), "camera: c2w is not a rotation and a position"),
        ((np.eye(4), np.eye(3), (0, 4)), "camera: size (height): must be a positive integer, got 0"),
    ]
    for arguments, message in bad:
        with pytest.raises(pola_gnt.UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            pola_gnt.Camera.of(*arguments)
    with pytest.raises(pola_gnt.UserError, match="out of range"):
        demo.test_camera(5)
    with pytest.raises(pola_gnt.UserError, match="kind: unknown value 'nerf'"):
        pola_gnt.load_scene("fern", kind="nerf")


def test_render_of_any_camera_with_progress_and_cancel(model, demo):
    """A c2w of its own (3x4 or 4x4) with intrinsics and a size: rendered as a video frame, from the
    nearest training views (`frame_source_views`); progress is told each chunk, False cancels."""
    view = demo.train_ids[1]
    c2w = demo.cameras.c2w[view].clone()
    c2w[:3, 3] += torch.tensor([0.05, 0.0, 0.0])
    intrinsics = demo.cameras.intrinsics[view].clone()
    intrinsics[:2] /= 4
    told: list[tuple[int, int]] = []
    rendering = model.render(demo, c2w[:3].numpy(), intrinsics.tolist(), (24, 32), progress=lambda *a: told.append(a))
    assert rendering.rgb.shape == (24, 32, 3) and rendering.depth.shape == rendering.confidence.shape == (24, 32)
    passes = 2 if model.settings.model.net.uses_neighbours else 1  # the prior's neighbours: two passes
    assert told[-1] == (passes * 24 * 32, passes * 24 * 32) and len(told) > 1
    assert rendering.sources == frame_source_views(demo.data, c2w, 3)
    rgb, depth, confidence = rendering.numpy()
    assert rgb.min() >= 0 and rgb.max() <= 1 and np.isfinite(depth).all()
    assert 0 < confidence.min() and confidence.max() <= 1
    same = model.render(demo, pola_gnt.Camera(c2w, intrinsics, 24, 32))
    assert torch.equal(same.rgb, rendering.rgb) and torch.equal(same.depth, rendering.depth)
    with pytest.raises(pola_gnt.RenderCancelled):
        model.render(demo, c2w, intrinsics, (64, 64), progress=lambda done, total: False)
    with pytest.raises(pola_gnt.UserError, match="intrinsics="):
        model.render(demo, c2w)


def test_render_path_gives_render_videos_frames(model, demo, tmp_path):
    """A camera_path.json renders, frame by frame, the pixels `render_video video.path=FILE` writes."""
    poses = demo.cameras.c2w[demo.train_ids[:2]].clone()
    path = CameraPath(poses, torch.tensor([scene_fov(demo.data)] * 2), 20, 28, 24.0)
    file = tmp_path / "camera_path.json"
    write_camera_path(file, path, demo.name, demo.data.scale)
    frames = model.render_path(demo, file)
    assert [frame.rgb.shape for frame in frames] == [(20, 28, 3)] * 2
    out = tmp_path / "video"
    result = run_in_process(
        "render_video", "ckpt_path=pretrained:pola_gnt", "trainer=cpu", *DEMO, *SMALL, f"video.path={file}",
        f"hydra.run.dir={out}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for index, frame in enumerate(frames):
        colour, depth = frame.images()
        assert np.array_equal(colour, iio.imread(out / FRAMES_FOLDER / "rgb" / f"{index:06d}.png"))
    spiral = model.render_path(demo, "spiral", frames=2, scale=0.25)
    assert len(spiral) == 2 and spiral[0].rgb.shape == (24, 32, 3)
    with pytest.raises(pola_gnt.UserError, match="no such file"):
        model.render_path(demo, tmp_path / "missing.json")


def test_export_points_is_exports_point_cloud(model, demo, tmp_path):
    keys = ("export.cameras=train", "export.views=2", "export.scale=0.5", "export.consistent_views=0")
    cloud = model.export_points(demo, views=2, scale=0.5, overrides=["export.consistent_views=0"])
    assert cloud.points.dtype == np.float32 and cloud.points.shape[1] == 3 and len(cloud) > 100
    assert cloud.colours.dtype == np.uint8 and cloud.colours.shape == cloud.points.shape
    out = tmp_path / "export"
    result = run_in_process(
        "export", "ckpt_path=pretrained:pola_gnt", "trainer=cpu", *DEMO, *SMALL, *keys, "export.outputs=[pointcloud]",
        f"hydra.run.dir={out}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    vertices = read_ply_vertices(out / "pointcloud.ply")
    assert np.array_equal(np.stack([vertices[k] for k in "xyz"], axis=1).astype(np.float32), cloud.points)


def test_fine_tune_writes_a_training_run_and_returns_its_model(model, demo, tmp_path):
    """Two steps of `train experiment=finetune init_from=pretrained:pola_gnt` on the demo scene."""
    started = time.perf_counter()
    run_dir = tmp_path / "run"
    tuned = pola_gnt.fine_tune(
        model, demo, minutes=1, steps=2, run_dir=run_dir,
        overrides=[*SMALL, "data.rays_per_step=32", "data.ray_patch_size=4", "trainer.val_check_interval=2",
                   "trainer.log_every_n_steps=1"],
    )  # fmt: skip
    assert tuned.path == run_dir / "checkpoints" / "last.ckpt" and tuned.step == 2 and tuned.name == "pola_gnt"
    metrics = read_metrics(run_dir)
    assert metrics["mode"] == "fine-tuned" and metrics["init_from"]["path"] == "pretrained:pola_gnt"
    assert metrics["scene"] == "demo" and metrics["global_step"] == 2
    overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "experiment=finetune" in overrides and (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "metrics.csv").is_file() and any((run_dir / "test_views").iterdir())
    assert json.loads((run_dir / "metrics.json").read_text())["training"]["steps"] == 2
    assert tuned.render(demo, 0).rgb.shape == (*demo.resolution, 3)
    print(f"fine_tune: {time.perf_counter() - started:.1f} s")
