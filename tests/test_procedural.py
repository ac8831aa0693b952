"""Procedurally generated scenes: rigs, LLFF layout, determinism, exact depth, caching, atomicity."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from pola_gnt.core.errors import UserError
from pola_gnt.data import procedural
from pola_gnt.data.llff import load_llff_scene
from pola_gnt.data.procedural import (
    PROCEDURAL_VERSION,
    build_procedural_scene,
    ensure_procedural_scene,
    procedural_depth,
    procedural_resolution,
    procedural_rig,
)
from pola_gnt.data.raytrace import Box
from pola_gnt.geometry.cameras import llff_to_opencv
from pola_gnt.geometry.projection import project_points
from pola_gnt.geometry.rays import pixel_grid, pixel_rays

FAMILY = 7
SMALL = 16  # 126 x 94 images: under a second a scene
TINY = 32  # 63 x 47


def _first_of_each_rig() -> dict[str, int]:
    found: dict[str, int] = {}
    for index in range(10):
        found.setdefault(procedural_rig(FAMILY, index), index)
    return found


RIG_INDEX = _first_of_each_rig()


def _folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def _cameras(scene_dir: Path, factor: int) -> tuple[np.ndarray, torch.Tensor, int, int]:
    """c2w `[views, 4, 4]` (OpenCV) read back from `poses_bounds.npy`, the loader's `K` and (H, W)."""
    matrices = np.load(scene_dir / "poses_bounds.npy")[:, :15].reshape(-1, 3, 5)
    height, width = procedural_resolution(factor)
    focal = matrices[0, 2, 4] * width / matrices[0, 1, 4]
    K = torch.tensor([[focal, 0.0, width / 2], [0.0, focal, height / 2], [0.0, 0.0, 1.0]], dtype=torch.float64)
    return llff_to_opencv(matrices[:, :, :4]), K, height, width


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> dict[str, Path]:
    """One generated scene of each rig at `SMALL`."""
    root = tmp_path_factory.mktemp("procedural")
    return {rig: ensure_procedural_scene(root / rig, FAMILY, index, SMALL) for rig, index in RIG_INDEX.items()}


def test_both_rigs_occur_and_scene_json_agrees(scenes: dict[str, Path]):
    assert set(RIG_INDEX) == {"forward", "object"}
    for rig, scene_dir in scenes.items():
        info = json.loads((scene_dir / "scene.json").read_text())
        assert info == {
            "family_seed": FAMILY,
            "index": RIG_INDEX[rig],
            "rig": rig,
            "version": PROCEDURAL_VERSION,
            "views": 20 if rig == "forward" else 30,
            "resolution": [1512, 2016],
        }
        assert procedural_rig(FAMILY, RIG_INDEX[rig]) == rig == build_procedural_scene(FAMILY, RIG_INDEX[rig]).rig


def test_loads_as_an_llff_scene(scenes: dict[str, Path]):
    for scene_dir in scenes.values():
        views = json.loads((scene_dir / "scene.json").read_text())["views"]
        names = sorted(p.name for p in (scene_dir / f"images_{SMALL}").iterdir())
        assert names == [f"image{i:03d}.png" for i in range(views)]
        scene = load_llff_scene(scene_dir, factor=SMALL)
        assert scene.resolution == (94, 126) and len(scene.image_names) == views
        assert 0.0 <= float(scene.images.min()) and float(scene.images.max()) <= 1.0
        assert float(scene.images.std()) > 0.08  # textured, not a blank frame
        # Every image has texture everywhere: a busy high-pass in each quarter of the frame.
        high_pass = (scene.images[:, 1:, 1:] - scene.images[:, :-1, :-1]).abs().mean(-1)  # [views, H-1, W-1]
        quarters = high_pass[:, :46, :62], high_pass[:, :46, 62:], high_pass[:, 46:, :62], high_pass[:, 46:, 62:]
        assert all(float(q.mean()) > 0.02 for q in quarters)
        _, K, height, width = _cameras(scene_dir, SMALL)
        np.testing.assert_allclose(scene.cameras.intrinsics[0].numpy(), K.numpy(), rtol=1e-6)


def test_rigs_have_their_geometry(scenes: dict[str, Path]):
    """Forward: cameras on a small grid all looking along +z. Object: cameras around a common
    centre, looking at it from directions spread over tens of degrees."""
    forward, _, _, _ = _cameras(scenes["forward"], SMALL)
    assert np.all(forward[:, 2, 2] > 0.98)  # every optical axis close to +z
    spread = np.ptp(forward[:, :3, 3], axis=0)
    assert spread[0] > spread[2] and spread[1] > spread[2]  # a grid across, not along, the view
    orbit, _, _, _ = _cameras(scenes["object"], SMALL)
    axes = orbit[:, :3, 2]
    assert np.degrees(np.arccos(np.clip(axes @ axes.T, -1, 1))).max() > 30.0
    # The optical axes pass close to one point: the least-squares closest point to all of them.
    centres = orbit[:, :3, 3]
    projectors = np.eye(3)[None] - axes[:, :, None] * axes[:, None, :]
    focus = np.linalg.solve(projectors.sum(0), (projectors @ centres[:, :, None]).sum(0))[:, 0]
    distances = np.linalg.norm(centres - focus, axis=1)
    offsets = np.linalg.norm((projectors @ (focus - centres)[:, :, None])[:, :, 0], axis=1)
    assert offsets.max() < 0.1 * distances.min()


def test_generation_is_deterministic(scenes: dict[str, Path], tmp_path: Path):
    index = RIG_INDEX["forward"]
    again = ensure_procedural_scene(tmp_path / "again", FAMILY, index, SMALL)
    assert _folder_bytes(again) == _folder_bytes(scenes["forward"])
    other = ensure_procedural_scene(tmp_path / "other", FAMILY, index + 1, SMALL)
    first, second = _folder_bytes(again), _folder_bytes(other)
    assert first["poses_bounds.npy"] != second["poses_bounds.npy"]
    assert first[f"images_{SMALL}/image000.png"] != second[f"images_{SMALL}/image000.png"]


def test_depth_is_finite_and_inside_the_bounds(scenes: dict[str, Path]):
    for scene_dir in scenes.values():
        depths = np.load(scene_dir / f"depth_{SMALL}.npy")
        bounds = np.load(scene_dir / "poses_bounds.npy")[:, 15:]
        assert depths.dtype == np.float32 and depths.shape == (len(bounds), 94, 126)
        assert np.all(np.isfinite(depths)) and np.all(depths > 0)  # every pixel sees a surface
        nearest, farthest = depths.reshape(len(bounds), -1).min(1), depths.reshape(len(bounds), -1).max(1)
        assert np.all(bounds[:, 0] <= nearest) and np.all(farthest <= bounds[:, 1])
        assert np.all(bounds[:, 0] > 0.7 * nearest) and np.all(bounds[:, 1] < 1.3 * farthest)  # tight
        assert 0.9 <= bounds[:, 0].min() and bounds[:, 1].max() / bounds[:, 0].min() < 30.0
        depth = procedural_depth(scene_dir, 3, SMALL)
        assert depth.dtype == np.float64
        np.testing.assert_array_equal(depth, depths[3])


def _reprojection(scene_dir: Path, view_a: int, view_b: int) -> tuple[float, float, float]:
    """Lift view A's pixels with their depth from `depth_F.npy`, project into view B: the fraction
    B sees unoccluded (its own traced depth agrees), and there the median colour difference between
    A and B resampled, and without the warp."""
    c2w, K, height, width = _cameras(scene_dir, SMALL)
    depth_a, depth_b = procedural_depth(scene_dir, view_a, SMALL), procedural_depth(scene_dir, view_b, SMALL)
    rays = pixel_rays(torch.from_numpy(c2w[view_a]), K, pixel_grid(height, width).double())
    points = rays.origins + torch.from_numpy(depth_a).reshape(-1, 1) * rays.directions
    projection = project_points(points, torch.from_numpy(c2w[view_b])[None], K[None], height, width)
    pixels, depth_in_b, visible = projection.pixels[0], projection.depth[0], projection.visible[0]
    nearest = pixels.round().long()
    seen = torch.from_numpy(depth_b)[nearest[:, 1].clamp(0, height - 1), nearest[:, 0].clamp(0, width - 1)]
    unoccluded = visible & ((depth_in_b - seen).abs() < 0.01 * depth_in_b)

    def image(view: int) -> torch.Tensor:
        return torch.from_numpy(iio.imread(scene_dir / f"images_{SMALL}" / f"image{view:03d}.png") / 255.0)

    image_a, image_b = image(view_a), image(view_b)
    scale = torch.tensor([width - 1, height - 1], dtype=torch.float64)
    grid = (2 * pixels[unoccluded] / scale - 1)[None, None]
    sampled = torch.nn.functional.grid_sample(image_b.permute(2, 0, 1)[None], grid, align_corners=True)[0, :, 0].T
    colour_a = image_a.reshape(-1, 3)[unoccluded]
    unwarped = image_b.reshape(-1, 3)[unoccluded]
    return (
        float(unoccluded.double().mean()),
        float((sampled - colour_a).abs().mean(-1).median()),
        float((unwarped - colour_a).abs().mean(-1).median()),
    )


@pytest.mark.parametrize("rig", ["forward", "object"])
def test_views_agree_where_they_see_the_same_point(scenes: dict[str, Path], rig: str):
    """The written depth and poses are geometrically consistent with the images: where view B sees
    the point that view A's depth puts at a pixel, the colours agree (up to resampling the fine
    texture: measured 0.01-0.017 median at 126x94, 0.08-0.14 without the warp)."""
    for view_a, view_b in [(0, 1), (5, 7)]:
        seen, warped, unwarped = _reprojection(scenes[rig], view_a, view_b)
        assert seen > 0.3, (rig, view_a, view_b, seen)
        assert warped < 0.03, (rig, view_a, view_b, warped)
        assert unwarped > 2.5 * warped  # without the reprojection the same pixels differ: the check has teeth


@pytest.mark.parametrize("rig", ["forward", "object"])
def test_a_surface_point_has_one_colour_in_every_view(rig: str):
    """Shade the points view 0 sees at its pixel centres from view 0 and from view 4 (unsampled
    rays aimed at the points): where view 4 sees the same point, the colour is the same to float
    precision (Lambertian shading, textures defined on the surface)."""
    scene = build_procedural_scene(FAMILY, RIG_INDEX[rig])
    height, width = procedural_resolution(TINY)
    K = torch.from_numpy(procedural._intrinsics(scene.focal, height, width))
    c2w_a, c2w_b = torch.from_numpy(scene.c2w[0]), torch.from_numpy(scene.c2w[4])
    rays = pixel_rays(c2w_a, K, pixel_grid(height, width).double())
    depth_a, _ = procedural._nearest_hit(scene, c2w_a[:3, 3], rays.directions)
    colour_a = procedural._shade(scene, c2w_a[:3, 3], rays.directions)
    points = c2w_a[:3, 3] + depth_a[:, None] * rays.directions
    z_in_b = (points - c2w_b[:3, 3]) @ c2w_b[:3, 2]
    directions_b = (points - c2w_b[:3, 3]) / z_in_b[:, None]  # camera z-component 1, as pixel rays
    depth_b, _ = procedural._nearest_hit(scene, c2w_b[:3, 3], directions_b)
    same_point = (z_in_b > 0) & ((depth_b - z_in_b).abs() < 1e-9 * z_in_b)  # nothing in front of the point
    assert same_point.double().mean() > 0.3
    colour_b = procedural._shade(scene, c2w_b[:3, 3], directions_b)
    assert float((colour_a - colour_b)[same_point].abs().max()) < 1e-4


def test_box_intersection_and_normals():
    """The oriented box of `data.raytrace`: hits at the exact ray parameter from outside and from
    inside, misses beside it, normals on the faces."""
    turn = math.radians(30.0)
    rotation = torch.tensor(
        [[math.cos(turn), 0.0, math.sin(turn)], [0.0, 1.0, 0.0], [-math.sin(turn), 0.0, math.cos(turn)]],
        dtype=torch.float64,
    )
    box = Box(
        center=torch.tensor([0.0, 0.0, 5.0], dtype=torch.float64),
        rotation=rotation,
        half_size=torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64),
        texture=lambda a, b: torch.stack([a, b, a * 0], dim=-1),
    )
    origins = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.2, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 5.0]], dtype=torch.float64)
    directions = torch.tensor(
        [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [math.cos(turn), 0.0, -math.sin(turn)]], dtype=torch.float64
    )
    depth = box.intersect(origins, directions)
    # Along z towards the centre: in the box's frame the ray starts at (2.5, 0, -4.33) and runs along
    # (-1/2, 0, cos 30): inside the x-slab for t in [3, 7], the z-slab for t in [2.69, 7.31], so it
    # enters at t = 3 through the face x' = +1.
    assert float(depth[0]) == pytest.approx(3.0, rel=1e-12) and float(depth[1]) == pytest.approx(3.0, rel=1e-12)
    assert math.isinf(float(depth[2]))  # passes above the box
    assert float(depth[3]) == pytest.approx(1.0, rel=1e-12)  # from the centre along the box's x axis: its face
    points = origins + depth.nan_to_num(posinf=0.0)[:, None] * directions
    normals = box.normals(points[[0, 3]])
    np.testing.assert_allclose(normals.numpy(), rotation[:, [0, 0]].T.numpy(), atol=1e-12)  # both on x' = +1
    # A random turned box against its own slab description: a point is on the surface it reports.
    rng = np.random.default_rng(0)
    many = torch.from_numpy(rng.normal(size=(2000, 3)))
    starts = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64).expand_as(many)
    hits = box.intersect(starts, many)
    finite = torch.isfinite(hits)
    assert 0 < int(finite.sum()) < len(many)
    local = (starts[finite] + hits[finite, None] * many[finite] - box.center) @ rotation
    assert float(((local.abs() / box.half_size).amax(-1) - 1.0).abs().max()) < 1e-9


def test_rejects_bad_arguments(tmp_path: Path):
    for family_seed, index, factor in [(FAMILY, -1, SMALL), (-3, 0, SMALL), (FAMILY, 0, 200), (FAMILY, 0, 0)]:
        with pytest.raises(UserError) as caught:
            ensure_procedural_scene(tmp_path / "scene", family_seed, index, factor)
        assert "\n" not in str(caught.value)
    with pytest.raises(UserError, match="index"):
        procedural_rig(FAMILY, -1)
    assert not any(tmp_path.iterdir())
    with pytest.raises(UserError, match="not found"):
        procedural_depth(tmp_path, 0, SMALL)


def test_an_existing_scene_is_not_regenerated(scenes: dict[str, Path], monkeypatch):
    scene_dir = scenes["object"]
    before = {f: f.stat().st_mtime_ns for f in scene_dir.rglob("*")}

    def fail(*args, **kwargs):
        raise AssertionError("regenerated an existing procedural scene")

    monkeypatch.setattr(procedural, "render_procedural_view", fail)
    monkeypatch.setattr(procedural, "_poses_bounds", fail)
    assert ensure_procedural_scene(scene_dir, FAMILY, RIG_INDEX["object"], SMALL) == scene_dir
    assert {f: f.stat().st_mtime_ns for f in scene_dir.rglob("*")} == before


def test_another_factor_is_added_to_an_existing_scene(tmp_path: Path):
    index = RIG_INDEX["forward"]
    scene_dir = ensure_procedural_scene(tmp_path / "scene", FAMILY, index, TINY)
    poses = (scene_dir / "poses_bounds.npy").stat().st_mtime_ns
    ensure_procedural_scene(scene_dir, FAMILY, index, 48)
    assert (scene_dir / "poses_bounds.npy").stat().st_mtime_ns == poses  # bounds hold at every factor
    assert iio.imread(scene_dir / "images_48" / "image000.png").shape == (31, 42, 3)
    depths = np.load(scene_dir / "depth_48.npy")
    bounds = np.load(scene_dir / "poses_bounds.npy")[:, 15:]
    assert np.all(bounds[:, 0] <= depths.min((1, 2))) and np.all(depths.max((1, 2)) <= bounds[:, 1])


def test_a_folder_of_another_version_is_regenerated(tmp_path: Path):
    index = RIG_INDEX["object"]
    scene_dir = ensure_procedural_scene(tmp_path / "scene", FAMILY, index, TINY)
    expected = _folder_bytes(scene_dir)
    info = json.loads((scene_dir / "scene.json").read_text())
    (scene_dir / "scene.json").write_text(json.dumps({**info, "version": PROCEDURAL_VERSION - 1}))
    (scene_dir / f"images_{TINY}" / "image000.png").write_bytes(b"old")
    (scene_dir / "depth_8.npy").write_bytes(b"old")  # another factor of the old version: gone too
    ensure_procedural_scene(scene_dir, FAMILY, index, TINY)
    assert _folder_bytes(scene_dir) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scene"]  # no staging or old folder left


def test_interrupted_generation_leaves_nothing(tmp_path: Path, monkeypatch):
    real_render = procedural.render_procedural_view
    calls = []

    def render_then_crash(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_render(*args, **kwargs)

    monkeypatch.setattr(procedural, "render_procedural_view", render_then_crash)
    with pytest.raises(KeyboardInterrupt):
        ensure_procedural_scene(tmp_path / "scene", FAMILY, 0, TINY)
    assert not any(tmp_path.iterdir())  # neither the scene nor a staging folder

    monkeypatch.setattr(procedural, "render_procedural_view", real_render)
    ensure_procedural_scene(tmp_path / "scene", FAMILY, 0, TINY)
    assert sorted(p.name for p in (tmp_path / "scene").iterdir()) == [
        f"depth_{TINY}.npy",
        f"images_{TINY}",
        "poses_bounds.npy",
        "scene.json",
    ]


def test_concurrent_generations_give_one_complete_scene(tmp_path: Path):
    """Two workers generating the same scene at once (threads here; processes alike): one complete
    folder with the bytes of a generation alone, no staging folders left."""
    reference = _folder_bytes(ensure_procedural_scene(tmp_path / "alone", FAMILY, 1, TINY))
    errors: list[BaseException] = []

    def generate() -> None:
        try:
            ensure_procedural_scene(tmp_path / "shared" / "scene", FAMILY, 1, TINY)
        except BaseException as err:  # reported by the test, not lost in the thread
            errors.append(err)

    threads = torch.get_num_threads()  # each worker sets and restores it: they may restore each other's
    workers = [threading.Thread(target=generate) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    torch.set_num_threads(threads)
    assert not errors
    assert _folder_bytes(tmp_path / "shared" / "scene") == reference
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == ["scene"]


def test_refuses_a_folder_it_did_not_write(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not a procedural scene folder"):
        ensure_procedural_scene(tmp_path, FAMILY, 0, TINY)
    assert (tmp_path / "notes.txt").read_text() == "mine"
