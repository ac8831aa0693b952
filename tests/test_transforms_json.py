"""Scenes beyond LLFF: NeRF's Blender scenes (`data.blender`), nerfstudio / instant-ngp `transforms.json`
captures (`data.transforms_json`) and the rig decided from the camera layout (`source_views.detect_rig`).

Tiny scenes are written into `tmp_path`; the real lego, fern, fortress, room and dtu_scan24 copies
of `../shared` are read where the test is about them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from helpers import TINY_OVERRIDES, assert_one_error_line, compose_config, run_in_process, train_in_process

from pola_gnt.core.errors import UserError
from pola_gnt.data.blender import load_blender_scene
from pola_gnt.data.llff import load_llff_scene, read_poses_bounds
from pola_gnt.data.scene import evenly_spaced
from pola_gnt.data.source_views import detect_rig
from pola_gnt.data.transforms_json import (
    distort,
    layout_bounds,
    load_transforms_scene,
    opengl_to_opencv,
    read_ply_points,
    read_transforms,
    undistort,
    write_ply_points,
)
from pola_gnt.geometry.cameras import llff_to_opencv, look_at

ANGLE_X = 0.6911112  # NeRF's lego


def _orbit_c2w_gl(count: int, radius: float = 4.0) -> np.ndarray:
    """Blender-style cameras (OpenGL axes) on a ring above the origin, looking at it."""
    angles = torch.linspace(0, 2 * math.pi, count + 1)[:-1].double()
    centres = torch.stack([radius * angles.cos(), radius * angles.sin(), torch.full_like(angles, 2.0)], -1)
    c2w = look_at(centres, torch.zeros(3, dtype=torch.float64), torch.tensor([0.0, 0.0, -1.0], dtype=torch.float64))
    return opengl_to_opencv(c2w.numpy())  # the same negation turns OpenCV into OpenGL


def _write_blender(folder: Path, size: int = 16, train: int = 6, test: int = 5) -> None:
    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("test", test), ("val", 1)):
        (folder / split).mkdir(parents=True)
        frames = []
        for i, matrix in enumerate(_orbit_c2w_gl(count)):
            image = rng.integers(0, 256, (size, size, 4), dtype=np.uint8)
            image[0, 0, 3] = 0  # transparent: white after compositing
            image[0, 1] = [0, 0, 0, 255]  # opaque black
            iio.imwrite(folder / split / f"r_{i}.png", image)
            frames.append({"file_path": f"./{split}/r_{i}", "rotation": 0.0, "transform_matrix": matrix.tolist()})
        (folder / f"transforms_{split}.json").write_text(json.dumps({"camera_angle_x": ANGLE_X, "frames": frames}))


# ---- NeRF's Blender scenes -------------------------------------------------------------------------------


def test_blender_scene_reads_as_nerf_and_gnt_do(tmp_path):
    _write_blender(tmp_path / "toy")
    scene = load_blender_scene(tmp_path / "toy", factor=50, test_views=None)  # 800 / 50 = the stored 16 px
    assert scene.resolution == (16, 16) and len(scene.train_ids) == 6 and len(scene.test_ids) == 5
    assert scene.image_names[6] == "test/r_0.png" and scene.depth_range == (2.0, 6.0) and scene.scale == 1.0
    focal = 0.5 * 16 / math.tan(0.5 * ANGLE_X)
    assert torch.allclose(scene.cameras.intrinsics[:, 0, 0], torch.tensor(focal))
    assert float(scene.cameras.intrinsics[0, 0, 2]) == 8.0
    raw = iio.imread(tmp_path / "toy" / "train" / "r_1.png").astype(np.float32) / 255
    expected = raw[..., :3] * raw[..., 3:] + 1 - raw[..., 3:]
    assert torch.allclose(scene.images[1], torch.from_numpy(expected))
    assert torch.equal(scene.images[1, 0, 0], torch.ones(3)) and torch.equal(scene.images[1, 0, 1], torch.zeros(3))
    # OpenCV axes: every camera looks at the origin along +z, 4.47 units away.
    c2w = scene.cameras.c2w.double()
    to_origin = torch.nn.functional.normalize(-c2w[:, :3, 3], dim=-1)
    assert torch.allclose((to_origin * c2w[:, :3, 2]).sum(-1), torch.ones(len(c2w), dtype=torch.float64), atol=1e-5)
    half = load_blender_scene(tmp_path / "toy", factor=100, test_views=2)  # 8 px: area-downsampled, focal halved
    assert half.resolution == (8, 8) and abs(float(half.cameras.intrinsics[0, 0, 0]) - focal / 2) < 1e-4
    assert [half.image_names[i] for i in half.test_ids] == ["test/r_0.png", "test/r_2.png"]


def test_evenly_spaced_test_views_match_gnts_testskip():
    assert evenly_spaced(list(range(200)), 25) == list(range(0, 200, 8))
    assert evenly_spaced([0, 8, 16], 8) == [0, 8, 16] and evenly_spaced([1, 2, 3], None) == [1, 2, 3]


def test_blender_scene_size_is_checked(tmp_path):
    _write_blender(tmp_path / "toy")
    with pytest.raises(UserError, match="synthetic_factor: 25 asks for 800/25 = 32 px frames"):
        load_blender_scene(tmp_path / "toy", factor=25)
    (tmp_path / "toy" / "test" / "r_3.png").unlink()
    with pytest.raises(UserError, match=r"r_3.png: not found \(frames\[3\]"):
        load_blender_scene(tmp_path / "toy", factor=50)


def test_lego_quick_scene(shared_dir):
    folder = shared_dir / "data" / "nerf_synthetic" / "lego"
    scene = load_blender_scene(folder, factor=4, test_views=8, name="lego")
    assert scene.resolution == (200, 200) and len(scene.train_ids) == 100 and len(scene.test_ids) == 8
    assert abs(float(scene.cameras.intrinsics[0, 0, 0]) - 0.5 * 800 / math.tan(0.5 * 0.6911112) / 4) < 1e-3
    assert scene.rig == "object" and detect_rig(scene.cameras.c2w)[0] == "object"
    assert torch.equal(scene.images[:, 0, 0], torch.ones(len(scene.images), 3))  # the background is white


# ---- the rig from the camera layout ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("folder", "rig"),
    [
        ("nerf_llff_data/fern", "forward"),
        ("nerf_llff_data/fortress", "forward"),
        ("nerf_llff_data/room", "forward"),
        ("captures/dtu_scan24", "object"),
    ],
)
def test_rig_auto_follows_the_camera_layout(shared_dir, folder, rig):
    poses, _ = read_poses_bounds(shared_dir / "data" / folder / "poses_bounds.npy")
    decided, reason = detect_rig(torch.from_numpy(llff_to_opencv(poses[:, :, :4])).float())
    assert decided == rig and reason.startswith("auto: optical axes") and "scene.rig=" in reason


def test_rig_auto_is_printed_and_given_rigs_win(fern_dir):
    result = run_in_process("check_scene", "scene=fern", "data.factor=8")
    assert result.returncode == 0 and "rig         forward (auto: optical axes 5.6 deg" in result.stdout
    assert load_llff_scene(fern_dir, factor=8, rig="object").rig_reason == "given"


# ---- transforms.json -------------------------------------------------------------------------------------


def _write_capture(folder: Path, fern_dir: Path, views: int = 8, **top) -> dict:
    """fern's first `views` images_8 photos and cameras as a nerfstudio capture (OpenGL axes, the
    images in images/, a transform applied to the world as nerfstudio does); -> the document."""
    poses, bounds = read_poses_bounds(fern_dir / "poses_bounds.npy")
    c2w = llff_to_opencv(poses[:views, :, :4])
    applied = np.eye(4)
    applied[:3, :3] = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])  # nerfstudio's COLMAP turn
    applied[:3, 3] = [0.5, -1.0, 2.0]
    (folder / "images").mkdir(parents=True)
    frames = []
    for i, photo in enumerate(sorted((fern_dir / "images_8").iterdir())[:views]):
        iio.imwrite(folder / "images" / f"frame_{i:05d}.png", iio.imread(photo))
        matrix = applied @ opengl_to_opencv(c2w[i])
        frames.append({"file_path": f"images/frame_{i:05d}.png", "transform_matrix": matrix.tolist()})
    height, width, focal = poses[0, :, 4] / 8
    document = {
        "camera_model": "OPENCV",
        "fl_x": focal,
        "fl_y": focal,
        "cx": width / 2,
        "cy": height / 2,
        "w": int(width),
        "h": int(height),
        "k1": 0.0,
        "k2": 0.0,
        "p1": 0.0,
        "p2": 0.0,
        "applied_transform": applied[:3].tolist(),
        "frames": frames,
        **top,
    }
    (folder / "transforms.json").write_text(json.dumps(document))
    return document


def test_transforms_cameras_come_back_in_the_reconstructions_frame(tmp_path, fern_dir):
    _write_capture(tmp_path / "cap", fern_dir)
    cameras = read_transforms(tmp_path / "cap")
    poses, _ = read_poses_bounds(fern_dir / "poses_bounds.npy")
    assert np.abs(cameras.c2w - llff_to_opencv(poses[:8, :, :4])).max() < 1e-9
    assert (cameras.width, cameras.height) == (504, 378)
    scene = load_transforms_scene(tmp_path / "cap", factor=2, llffhold=4)
    assert scene.resolution == (189, 252) and scene.test_ids == [0, 4] and scene.rig == "forward"
    assert "camera layout" in scene.bounds_reason and "extent" in scene.bounds_reason
    reference = load_llff_scene(fern_dir, factor=8)
    assert abs(float(scene.cameras.intrinsics[0, 0, 0]) * 2 - float(reference.cameras.intrinsics[0, 0, 0])) < 1e-3


def test_point_cloud_bounds_and_downscale_folders(tmp_path, fern_dir):
    _write_capture(tmp_path / "cap", fern_dir, ply_file_path="sparse_pc.ply")
    # Points 10 .. 40 units in front of the first camera (the world is the file's, before applied_transform).
    raw = json.loads((tmp_path / "cap" / "transforms.json").read_text())
    first = np.array(raw["frames"][0]["transform_matrix"])
    rng = np.random.default_rng(1)
    local = np.stack([rng.uniform(-2, 2, 400), rng.uniform(-1.5, 1.5, 400), -rng.uniform(10, 40, 400)], -1)
    write_ply_points(tmp_path / "cap" / "sparse_pc.ply", local @ first[:3, :3].T + first[:3, 3])
    assert np.allclose(
        read_ply_points(tmp_path / "cap" / "sparse_pc.ply"), local @ first[:3, :3].T + first[:3, 3], atol=1e-4
    )
    (tmp_path / "cap" / "images_2").mkdir()
    for file in (tmp_path / "cap" / "images").iterdir():  # nerfstudio's downscale folder, marked black
        iio.imwrite(tmp_path / "cap" / "images_2" / file.name, np.zeros((189, 252, 3), np.uint8))
    scene = load_transforms_scene(tmp_path / "cap", factor=2)
    assert scene.bounds_reason == "the point cloud" and float(scene.images.max()) == 0.0
    near, far = (scene.bounds[0] / scene.scale).tolist()
    assert 9.9 < near < 11 and 38 < far < 40.1


def test_distortion_is_undone_on_load():
    image = torch.rand(12, 16, 3)
    camera = np.array([[20.0, 0, 8], [0, 20.0, 6], [0, 0, 1]])
    same = undistort(image, camera, "OPENCV", {"k1": 0.0})
    assert torch.allclose(same, image, atol=1e-5)
    x, y = distort(np.array([0.1]), np.array([0.2]), "OPENCV", {"k1": 0.1, "p1": 0.01, "p2": 0.02})
    r2 = 0.05
    assert np.allclose(x, 0.1 * (1 + 0.1 * r2) + 2 * 0.01 * 0.02 + 0.02 * (r2 + 0.02))
    assert np.allclose(y, 0.2 * (1 + 0.1 * r2) + 0.01 * (r2 + 0.08) + 2 * 0.02 * 0.02)
    fx, _ = distort(np.array([1.0]), np.array([0.0]), "OPENCV_FISHEYE", {})
    assert np.allclose(fx, math.pi / 4)  # equidistant: the angle itself


def test_a_distorted_nerfstudio_capture_reads_and_trains(tmp_path, fern_dir):
    _write_capture(tmp_path / "cap", fern_dir, views=10, k1=-0.05, k2=0.01, p1=0.001)
    scene = load_transforms_scene(tmp_path / "cap", factor=4, llffhold=5)
    plain = iio.imread(tmp_path / "cap" / "images" / "frame_00000.png")
    assert scene.resolution == (94, 126) and not np.allclose(scene.images[0, 0, 0].numpy(), plain[0, 0] / 255)
    cfg = compose_config(
        "scene=transforms",
        f"scene.path={tmp_path / 'cap'}",
        *TINY_OVERRIDES,
        "data.factor=4",
        "data.llffhold=5",
        "trainer.fast_dev_run=1",
    )
    document = train_in_process(cfg, tmp_path / "run")
    assert document is not None and document["scene"] == "cap" and math.isfinite(document["mean"]["psnr"])


def _bad(folder: Path, change) -> Path:
    document = json.loads((folder / "transforms.json").read_text())
    change(document)
    (folder / "transforms.json").write_text(json.dumps(document))
    return folder


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        (lambda d: d["frames"][2].update(file_path="images/missing.png"), ["missing.png", "not found"]),
        (lambda d: d["frames"][1]["transform_matrix"][0].__setitem__(3, float("nan")), ["frames[1]", "non-finite"]),
        (lambda d: d["frames"][3]["transform_matrix"][0].__setitem__(0, 2.0), ["frames[3]", "not a rigid"]),
        (lambda d: d.update(camera_model="EQUIRECTANGULAR"), ["EQUIRECTANGULAR", "not supported"]),
        (lambda d: d.update(w=600), ["504x378 pixels", "600x378"]),
        (lambda d: d.update(camera_model="PINHOLE", k1=0.1), ["PINHOLE has no distortion"]),
    ],
    ids=["missing-frame", "non-finite", "non-rigid", "camera-model", "image-size", "pinhole-with-distortion"],
)
def test_bad_transforms_files_are_one_error_line(tmp_path, fern_dir, change, fragments):
    _write_capture(tmp_path / "cap", fern_dir, views=4)
    folder = _bad(tmp_path / "cap", change)
    result = run_in_process("check_scene", "scene=transforms", f"scene.path={folder}", "data.factor=1")
    assert_one_error_line(result, "transforms.json" if "missing" not in fragments[0] else "missing.png", *fragments)


def test_layout_bounds_of_an_orbit_are_gnts_blender_range():
    c2w = _orbit_c2w_gl(12)
    bounds, how = layout_bounds(opengl_to_opencv(c2w), "object")
    depth = math.sqrt(4.0**2 + 2.0**2)
    assert np.allclose(bounds, [[0.5 * depth, 1.5 * depth]] * 12) and "converge" in how
