"""The synthetic demo scene: LLFF layout, determinism, pose convention, geometric consistency."""

from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from pola_gnt.core.errors import UserError
from pola_gnt.data import demo_scene
from pola_gnt.data.demo_scene import FULL_FOCAL, N_VIEWS, demo_cameras, demo_depths, ensure_demo_scene, render_demo_view
from pola_gnt.geometry.projection import project_points
from pola_gnt.geometry.rays import pixel_grid, pixel_rays

SMALL = 32  # 126 x 94 images: fast


def _llff_to_opencv(poses_bounds: np.ndarray) -> np.ndarray:
    """Read `poses_bounds.npy` back with the LLFF convention -> OpenCV c2w `[views, 4, 4]`."""
    matrices = poses_bounds[:, :15].reshape(-1, 3, 5)
    c2w = np.tile(np.eye(4), (len(matrices), 1, 1))
    c2w[:, :3, 0] = matrices[:, :, 1]  # right = LLFF column 1
    c2w[:, :3, 1] = matrices[:, :, 0]  # down = LLFF column 0
    c2w[:, :3, 2] = -matrices[:, :, 2]  # forward = -(LLFF back)
    c2w[:, :3, 3] = matrices[:, :, 3]
    return c2w


def _folder_bytes(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def small_scene(tmp_path_factory) -> Path:
    return ensure_demo_scene(tmp_path_factory.mktemp("demo"), factor=SMALL)


def test_writes_llff_layout(small_scene: Path):
    names = sorted(p.name for p in (small_scene / f"images_{SMALL}").iterdir())
    assert names == [f"image{i:03d}.png" for i in range(N_VIEWS)]
    image = iio.imread(small_scene / f"images_{SMALL}" / "image000.png")
    assert image.shape == (3024 // SMALL, 4032 // SMALL, 3) and image.dtype == np.uint8
    assert image.std() > 20  # textured, not a blank frame

    poses_bounds = np.load(small_scene / "poses_bounds.npy")
    assert poses_bounds.shape == (N_VIEWS, 17)
    hwf = poses_bounds[:, :15].reshape(-1, 3, 5)[:, :, 4]
    np.testing.assert_array_equal(hwf, np.tile([3024.0, 4032.0, FULL_FOCAL], (N_VIEWS, 1)))
    # The loader's intrinsics (focal * W / full W, centre principal point) are the rendering ones.
    _, K, height, width = demo_cameras(SMALL)
    assert K[0, 0] == pytest.approx(hwf[0, 2] * image.shape[1] / hwf[0, 1])
    assert K[1, 1] == K[0, 0] and (K[0, 2], K[1, 2]) == (width / 2, height / 2)
    assert (height, width) == image.shape[:2]


def test_second_call_is_a_no_op(small_scene: Path, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("regenerated an existing demo scene")

    monkeypatch.setattr(demo_scene, "render_demo_view", fail)
    monkeypatch.setattr(demo_scene, "demo_poses_bounds", fail)
    before = _folder_bytes(small_scene / f"images_{SMALL}")
    assert ensure_demo_scene(small_scene, factor=SMALL) == small_scene
    assert _folder_bytes(small_scene / f"images_{SMALL}") == before


def test_generation_is_deterministic(small_scene: Path, tmp_path: Path):
    again = ensure_demo_scene(tmp_path / "again", factor=SMALL)
    assert _folder_bytes(again / f"images_{SMALL}") == _folder_bytes(small_scene / f"images_{SMALL}")
    assert (again / "poses_bounds.npy").read_bytes() == (small_scene / "poses_bounds.npy").read_bytes()


def test_interrupted_generation_leaves_no_folder(tmp_path: Path, monkeypatch):
    real_render = demo_scene.render_demo_view
    calls = []

    def render_then_crash(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_render(*args, **kwargs)

    monkeypatch.setattr(demo_scene, "render_demo_view", render_then_crash)
    with pytest.raises(KeyboardInterrupt):
        ensure_demo_scene(tmp_path, factor=SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["poses_bounds.npy"]  # no partial folder

    monkeypatch.setattr(demo_scene, "render_demo_view", real_render)
    ensure_demo_scene(tmp_path, factor=SMALL)
    assert len(list((tmp_path / f"images_{SMALL}").iterdir())) == N_VIEWS


def test_written_images_are_the_rendered_views(small_scene: Path):
    c2w, K, height, width = demo_cameras(SMALL)
    rgb, _ = render_demo_view(c2w[7], K, height, width)
    image = iio.imread(small_scene / f"images_{SMALL}" / "image007.png")
    assert np.abs(image.astype(np.float32) / 255.0 - rgb).max() <= 0.5 / 255.0 + 1e-6


@pytest.mark.slow
def test_factor_8_generation(tmp_path: Path):
    """The default factor: 504 x 378 images (about 6 s of CPU)."""
    scene = ensure_demo_scene(tmp_path, factor=8)
    images = sorted((scene / "images_8").iterdir())
    assert len(images) == N_VIEWS
    assert all(iio.imread(f).shape == (378, 504, 3) for f in images)


def test_rejects_bad_factor(tmp_path: Path):
    for factor in (0, -2, 1000):
        with pytest.raises(UserError, match="factor"):
            ensure_demo_scene(tmp_path, factor=factor)
    assert not any(tmp_path.iterdir())


def test_llff_round_trip(small_scene: Path):
    c2w_read = _llff_to_opencv(np.load(small_scene / "poses_bounds.npy"))
    c2w, _, _, _ = demo_cameras(SMALL)
    np.testing.assert_allclose(c2w_read, c2w, atol=1e-12)
    rotations = c2w[:, :3, :3]
    identities = np.tile(np.eye(3), (N_VIEWS, 1, 1))
    np.testing.assert_allclose(rotations.transpose(0, 2, 1) @ rotations, identities, atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(rotations), 1.0, atol=1e-12)
    # Forward-facing: every camera looks roughly along +z, on a small baseline.
    assert np.all(rotations[:, 2, 2] > 0.98)
    centers = c2w[:, :3, 3]
    assert np.ptp(centers[:, 0]) > 1.0 and np.ptp(centers[:, 2]) < 0.3


def test_loader_reads_the_demo_scene(small_scene: Path):
    from pola_gnt.data.llff import load_llff_scene

    scene = load_llff_scene(small_scene, factor=SMALL)
    _, K, height, width = demo_cameras(SMALL)
    assert len(scene.image_names) == N_VIEWS and scene.resolution == (height, width)
    np.testing.assert_allclose(scene.cameras.intrinsics[0].numpy(), K, rtol=1e-6)
    png = iio.imread(small_scene / f"images_{SMALL}" / "image005.png")
    np.testing.assert_allclose(scene.images[5].numpy(), png / 255.0, atol=1e-6)


def test_depth_is_camera_z_depth():
    """A camera high above the objects, looking straight at the wall `z = 9`: its upper half sees
    only the wall, whose z-depth is 9 at every pixel (not the ray length)."""
    c2w = np.eye(4)
    c2w[1, 3] = -3.0
    _, K, height, width = demo_cameras(SMALL)
    _, depth = render_demo_view(c2w, K, height, width)
    np.testing.assert_allclose(depth[: height // 2], 9.0, rtol=1e-6)


def _reprojection_differences(factor: int, view_a: int, view_b: int, detail: float = 0.0) -> tuple[float, float]:
    """Lift view A's pixels with their exact depth, project into view B: median colour difference
    where B sees the same point (not occluded), and the same pixels' difference without the warp."""
    c2w, K, height, width = demo_cameras(factor)
    intrinsics = torch.from_numpy(K).float()
    rgb_a, depth_a = render_demo_view(c2w[view_a], K, height, width, detail=detail)
    rgb_b, depth_b = render_demo_view(c2w[view_b], K, height, width, detail=detail)
    rays = pixel_rays(torch.from_numpy(c2w[view_a]).float(), intrinsics, pixel_grid(height, width))
    points = rays.origins + torch.from_numpy(depth_a).reshape(-1, 1) * rays.directions
    c2w_b = torch.from_numpy(c2w[view_b])[None].float()
    projection = project_points(points, c2w_b, intrinsics[None], height, width)
    pixels, depth_in_b, visible = projection.pixels[0], projection.depth[0], projection.visible[0]

    nearest = pixels.round().long()
    rows, cols = nearest[:, 1].clamp(0, height - 1), nearest[:, 0].clamp(0, width - 1)
    depth_seen_by_b = torch.from_numpy(depth_b)[rows, cols]
    unoccluded = visible & ((depth_in_b - depth_seen_by_b).abs() < 0.01 * depth_in_b)
    assert unoccluded.float().mean() > 0.5

    image_b = torch.from_numpy(rgb_b).permute(2, 0, 1)[None]  # [1, 3, H, W]
    scale = torch.tensor([width - 1, height - 1], dtype=torch.float32)
    grid = (2 * pixels[unoccluded] / scale - 1)[None, None]  # [1, 1, points, 2]
    sampled = torch.nn.functional.grid_sample(image_b, grid, align_corners=True)[0, :, 0].T
    colour_a = torch.from_numpy(rgb_a).reshape(-1, 3)[unoccluded]
    unwarped = torch.from_numpy(rgb_b).reshape(-1, 3)[unoccluded]
    return float((sampled - colour_a).abs().mean(-1).median()), float((unwarped - colour_a).abs().mean(-1).median())


def test_views_agree_where_they_see_the_same_point():
    """Where two views see the same surface point, the Lambertian colours agree."""
    for view_a, view_b in [(0, 4), (2, 17), (11, 8)]:
        warped, unwarped = _reprojection_differences(16, view_a, view_b)
        assert warped < 0.02, (view_a, view_b, warped)
        assert unwarped > 0.05  # without the reprojection the same pixels differ a lot: the check has teeth


def test_detail_is_a_surface_texture():
    """`detail` (the capture-like rendering of the COLMAP round trip) changes the colours, not the
    geometry, and stays a property of the surface: views still agree where they see the same point
    (measured 0.006 median difference at 504x378; the plain scene: 0.0003)."""
    c2w, K, height, width = demo_cameras(SMALL)
    plain, depth = render_demo_view(c2w[3], K, height, width)
    detailed, detailed_depth = render_demo_view(c2w[3], K, height, width, detail=0.5)
    np.testing.assert_array_equal(detailed_depth, depth)
    assert np.abs(detailed - plain).mean() > 0.05
    points = torch.from_numpy(np.random.default_rng(0).uniform(-3.0, 9.0, size=(10_000, 3)))
    pattern = demo_scene.detail_pattern(points)
    assert pattern.abs().max() < 1.0 and pattern.std() > 0.4
    warped, unwarped = _reprojection_differences(8, 0, 4, detail=0.5)
    assert warped < 0.02 and unwarped > 0.1, (warped, unwarped)


@pytest.mark.parametrize("factor", [8, SMALL])
def test_depths_lie_within_bounds(small_scene: Path, factor: int):
    bounds = np.load(small_scene / "poses_bounds.npy")[:, 15:]
    depths = demo_depths(factor)  # [views, H, W]
    _, _, height, width = demo_cameras(factor)
    assert depths.shape == (N_VIEWS, height, width) and np.all(np.isfinite(depths))  # every ray hits
    nearest, farthest = depths.reshape(N_VIEWS, -1).min(1), depths.reshape(N_VIEWS, -1).max(1)
    assert np.all(bounds[:, 0] <= nearest) and np.all(farthest <= bounds[:, 1])
    # Tight like LLFF's percentile bounds, not arbitrary padding (coarse factors see a little less
    # of the image border, where the nearest floor point is).
    assert np.all(bounds[:, 0] > 0.92 * nearest) and np.all(bounds[:, 1] < 1.05 * farthest)
    assert 2.0 < bounds[:, 0].min() and bounds[:, 1].max() < 11.0
