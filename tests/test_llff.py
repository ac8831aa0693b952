"""LLFF loader: the real fern scene, conventions, factor folders, source views, and bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from helpers import assert_one_error_line, run_in_process

from pola_gnt.core.errors import UserError
from pola_gnt.data.llff import load_llff_scene
from pola_gnt.data.source_views import nearest_views, random_training_views
from pola_gnt.geometry.cameras import llff_to_opencv
from pola_gnt.geometry.projection import project_points
from pola_gnt.geometry.rays import pixel_rays, points_along_rays


@pytest.fixture(scope="module")
def fern(fern_dir):
    return load_llff_scene(fern_dir, factor=8)


def test_fern_factor8(fern, fern_dir):
    assert len(fern.image_names) == 20
    assert fern.images.shape == (20, 378, 504, 3)
    assert fern.resolution == (378, 504)
    assert fern.test_ids == [0, 8, 16]
    assert len(fern.train_ids) == 17 and not set(fern.train_ids) & set(fern.test_ids)
    full_focal = np.load(fern_dir / "poses_bounds.npy")[0, 14]
    assert fern.cameras.intrinsics[0, 0, 0].item() == pytest.approx(full_focal / 8, rel=1e-6)
    assert fern.cameras.intrinsics[0, :2, 2].tolist() == [252.0, 189.0]
    rotations = fern.cameras.c2w[:, :3, :3].double()
    identity = torch.eye(3, dtype=torch.float64).expand_as(rotations)
    assert torch.allclose(rotations.transpose(1, 2) @ rotations, identity, atol=1e-5)
    assert torch.allclose(torch.linalg.det(rotations), torch.ones(20, dtype=torch.float64), atol=1e-5)
    assert fern.cameras.centers.mean(0).abs().max() < 1e-4
    # Scaled so that the nearest bound is 1 / 0.75.
    assert fern.bounds.min().item() == pytest.approx(1 / 0.75, rel=1e-5)
    near, far = fern.depth_range
    assert near == pytest.approx(0.9 / 0.75, rel=1e-5) and far > near
    assert 0.0 <= fern.images.min() and fern.images.max() <= 1.0


def test_cameras_look_forward_along_z(fern):
    """After recentring the average camera is the identity: every camera looks roughly along +z."""
    forward = fern.cameras.c2w[:, :3, 2]
    assert (forward[:, 2] > 0.95).all()


def test_llff_rotation_convention():
    """LLFF columns [down, right, back] -> OpenCV [right, down, forward] = [c1, c0, -c2]."""
    down, right, back = np.array([0, 1.0, 0]), np.array([1.0, 0, 0]), np.array([0, 0, -1.0])
    llff = np.stack([down, right, back, np.array([1.0, 2.0, 3.0])], axis=1)[None]
    c2w = llff_to_opencv(llff)[0]
    assert np.allclose(c2w[:3, :3], np.eye(3)) and np.allclose(c2w[:3, 3], [1, 2, 3])


def test_ray_point_projects_back_to_its_pixel(fern):
    cam = fern.cameras[3]
    pixels = torch.tensor([[0.0, 0.0], [252.0, 189.0], [503.0, 377.0], [17.0, 300.0]])
    rays = pixel_rays(cam.c2w, cam.intrinsics, pixels)
    depths = torch.tensor([1.5, 3.0, 9.0]).expand(4, 3)
    points = points_along_rays(rays, depths)
    projection = project_points(points, cam.c2w[None], cam.intrinsics[None], cam.height, cam.width)
    assert torch.allclose(projection.pixels[0], pixels[:, None, :].expand(4, 3, 2), atol=1e-3)
    assert torch.allclose(projection.depth[0], depths, rtol=1e-5)
    assert projection.visible.all()


def test_source_views_nearest_and_random(fern):
    centers = fern.cameras.centers
    chosen = nearest_views(centers[5], centers, fern.train_ids, 10, exclude=5)
    assert len(chosen) == 10 and 5 not in chosen and set(chosen) <= set(fern.train_ids)
    distances = torch.linalg.norm(centers[chosen] - centers[5], dim=-1)
    assert (distances[1:] >= distances[:-1]).all()
    others = [i for i in fern.train_ids if i not in chosen and i != 5]
    assert torch.linalg.norm(centers[others] - centers[5], dim=-1).min() >= distances.max()
    # For a test view, the nearest training views (deterministic).
    assert nearest_views(centers[0], centers, fern.train_ids, 4) == nearest_views(
        centers[0], centers, fern.train_ids, 4
    )
    rng = np.random.default_rng(0)
    draws = [random_training_views(centers[5], centers, fern.train_ids, 6, 5, rng) for _ in range(50)]
    assert all(4 <= len(d) <= 8 and 5 not in d and len(set(d)) == len(d) for d in draws)
    assert len({tuple(d) for d in draws}) > 10


def _copy_scene(fern_dir: Path, target: Path, folder: str = "images_8") -> Path:
    target.mkdir()
    shutil.copy(fern_dir / "poses_bounds.npy", target)
    shutil.copytree(fern_dir / folder, target / folder)
    return target


def test_missing_factor_folder_is_built_from_full_resolution(fern_dir, tmp_path):
    """images_16/ is made from images/ with an area filter and cached."""
    scene = tmp_path / "scene"
    scene.mkdir()
    shutil.copy(fern_dir / "poses_bounds.npy", scene)
    shutil.copytree(fern_dir / "images_8", scene / "images")  # stands in for full resolution
    loaded = load_llff_scene(scene, factor=2)
    assert (scene / "images_2").is_dir() and loaded.resolution == (189, 252)
    original = iio.imread(scene / "images" / "image003.png").astype(np.float64)
    area = original.reshape(189, 2, 252, 2, 3).mean(axis=(1, 3))
    assert np.abs(loaded.images[3].numpy() * 255 - area).max() <= 0.5 + 1e-3
    # poses_bounds hwf is for 4032x3024; the focal follows the actual image width.
    full_focal = np.load(fern_dir / "poses_bounds.npy")[0, 14]
    assert loaded.cameras.intrinsics[0, 0, 0].item() == pytest.approx(full_focal * 252 / 4032, rel=1e-6)
    assert not [p for p in scene.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_jpg_and_any_names(fern_dir, tmp_path):
    scene = tmp_path / "jpg"
    (scene / "images_8").mkdir(parents=True)
    shutil.copy(fern_dir / "poses_bounds.npy", scene)
    for i, file in enumerate(sorted((fern_dir / "images_8").iterdir())):
        iio.imwrite(scene / "images_8" / f"DSC_{i:04d}.JPG", iio.imread(file), quality=95)
    loaded = load_llff_scene(scene, factor=8)
    assert loaded.image_names[0] == "DSC_0000.JPG" and loaded.images.shape == (20, 378, 504, 3)


# ---- bad input: one `error:` line naming the file, exit code 2 ------------------------------------


def _corrupt_poses_shape(scene: Path) -> str:
    np.save(scene / "poses_bounds.npy", np.zeros((20, 15)))
    return "N x 17"


def _corrupt_poses_nan(scene: Path) -> str:
    array = np.load(scene / "poses_bounds.npy")
    array[3, 4] = np.nan
    np.save(scene / "poses_bounds.npy", array)
    return "non-finite"


def _corrupt_poses_garbage(scene: Path) -> str:
    (scene / "poses_bounds.npy").write_bytes(b"not a numpy file")
    return "cannot read"


def _missing_poses(scene: Path) -> str:
    (scene / "poses_bounds.npy").unlink()
    return "not found"


def _count_mismatch(scene: Path) -> str:
    array = np.load(scene / "poses_bounds.npy")
    np.save(scene / "poses_bounds.npy", array[:19])
    return "19 poses but 20 images"


def _truncated_image(scene: Path) -> str:
    file = scene / "images_8" / "image004.png"
    file.write_bytes(file.read_bytes()[:2000])
    return "image004.png: cannot read image"


def _odd_size_image(scene: Path) -> str:
    iio.imwrite(scene / "images_8" / "image007.png", np.zeros((100, 120, 3), np.uint8))
    return "image007.png: size 120x100 differs"


def _no_factor_folder(scene: Path) -> str:
    shutil.rmtree(scene / "images_8")
    return "images_8: not found, and no images/"


BAD_INPUTS = [
    _corrupt_poses_shape,
    _corrupt_poses_nan,
    _corrupt_poses_garbage,
    _missing_poses,
    _count_mismatch,
    _truncated_image,
    _odd_size_image,
    _no_factor_folder,
]


@pytest.mark.parametrize("corrupt", BAD_INPUTS, ids=lambda f: f.__name__.strip("_"))
def test_bad_input_raises_user_error(corrupt, fern_dir, tmp_path):
    scene = _copy_scene(fern_dir, tmp_path / "scene")
    expected = corrupt(scene)
    with pytest.raises(UserError, match=expected):
        load_llff_scene(scene, factor=8)


def _run_data_check(*overrides: str):
    """`python -m pola_gnt.check_scene overrides...` (in this process: only its output is checked)."""
    return run_in_process("check_scene", *overrides)


@pytest.mark.parametrize(
    "corrupt", [_count_mismatch, _truncated_image, _corrupt_poses_nan], ids=lambda f: f.__name__.strip("_")
)
def test_bad_input_cli_one_error_line(corrupt, fern_dir, tmp_path):
    scene = _copy_scene(fern_dir, tmp_path / "myscene")
    corrupt(scene)
    result = _run_data_check("scene=llff", "scene.name=myscene", f"data.root={tmp_path}", "data.factor=8")
    assert_one_error_line(result, "myscene")


def test_missing_scene_folder_cli(tmp_path):
    assert_one_error_line(_run_data_check("scene=fern", f"data.root={tmp_path}"), str(tmp_path / "fern"))


def test_data_check_cli_on_fern(llff_root, monkeypatch):
    monkeypatch.setenv("POLA_GNT_DATA", str(llff_root.parent))
    result = _run_data_check("scene=fern", "data.factor=8")
    assert result.returncode == 0, result.stderr
    assert "20 at 504x378" in result.stdout and "[0, 8, 16]" in result.stdout
