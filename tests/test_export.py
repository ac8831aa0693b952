"""`python -m pola_gnt.export` (`apps/export/`): a planted plane comes back as a plane (points and TSDF
mesh, the consistency filter removing a planted floating blob that otherwise spoils it), the cameras
files read back by `scene=transforms` and by pycolmap as the scene's cameras, the depth files, the whole
command on a tiny checkpoint, and bad input as one error line."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from helpers import assert_one_error_line, compose_config, run_in_process, run_settings, scene_and_data

from pola_gnt.apps.export.files import rotation_quaternion, write_camera_files
from pola_gnt.apps.export.fusion import check_not_empty, kept_pixels
from pola_gnt.apps.export.ply import PointCloud, read_point_cloud, write_point_cloud
from pola_gnt.apps.export.run import POINT_CLOUD_FILE, RECORD_FILE, export_rendered
from pola_gnt.apps.export.views import ExportView, RenderedView, view_agreement
from pola_gnt.core.errors import UserError
from pola_gnt.data.align import umeyama
from pola_gnt.data.scene import Scene
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.data.transforms_json import read_transforms
from pola_gnt.geometry.cameras import Cameras, look_at
from pola_gnt.geometry.rays import pixel_grid, pixel_rays
from pola_gnt.model.gnt import SourceViews

# A tilted plane n . x = offset in front of the cameras, which sit on a small grid at z ~ 0 looking at it.
PLANE_NORMAL = np.array([0.25, -0.15, 1.0]) / np.linalg.norm([0.25, -0.15, 1.0])
PLANE_OFFSET = 4.0
HEIGHT, WIDTH, FOCAL = 36, 48, 40.0


def plane_views(blob: bool = False) -> list[RenderedView]:
    """Five cameras seeing the plane, their exact depth; `blob`: a patch of the first view's depth pulled
    40% towards the camera (a floating blob no other view sees there)."""
    centres = torch.tensor(
        [[0.0, 0.0, 0.0], [0.4, 0.0, 0.1], [-0.4, 0.1, 0.0], [0.0, 0.35, -0.1], [0.1, -0.35, 0.05]],
        dtype=torch.float64,
    )
    target = torch.tensor([0.0, 0.0, PLANE_OFFSET], dtype=torch.float64)
    poses = look_at(centres, target, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))
    intrinsics = torch.tensor([[FOCAL, 0, WIDTH / 2], [0, FOCAL, HEIGHT / 2], [0, 0, 1]], dtype=torch.float64)
    normal = torch.from_numpy(PLANE_NORMAL)
    views = []
    for i, c2w in enumerate(poses):
        rays = pixel_rays(c2w, intrinsics, pixel_grid(HEIGHT, WIDTH).double())
        depth = (PLANE_OFFSET - rays.origins @ normal) / (rays.directions @ normal)  # z-depth: directions' z is 1
        depth = depth.reshape(HEIGHT, WIDTH).float()
        if blob and i == 0:
            depth[10:20, 15:30] *= 0.6
        rgb = torch.rand(HEIGHT, WIDTH, 3, generator=torch.Generator().manual_seed(i))
        view = ExportView(f"plane{i}", c2w.float(), intrinsics.float(), HEIGHT, WIDTH, None)
        ones = torch.ones(HEIGHT, WIDTH)
        views.append(RenderedView(view, [], rgb, depth, ones, ones, ones))
    return views


def plane_scene(views: list[RenderedView]) -> Scene:
    cameras = Cameras(torch.stack([v.view.c2w for v in views]), torch.stack([v.view.intrinsics for v in views]),
                      HEIGHT, WIDTH)  # fmt: skip
    return Scene(
        name="plane", path=Path("plane"), factor=1, image_names=[f"plane{i}.png" for i in range(len(views))],
        images=torch.stack([v.rgb for v in views]), cameras=cameras, bounds=torch.tensor([[3.0, 6.0]] * len(views)),
        train_ids=list(range(len(views))), test_ids=[], scale=1.0, rig="forward", depth_range=(3.0, 6.0),
    )  # fmt: skip


def plane_residuals(points: np.ndarray) -> tuple[np.ndarray, float]:
    """Distances of the points to the planted plane, and the angle (degrees) of their own best plane."""
    distances = points.astype(np.float64) @ PLANE_NORMAL - PLANE_OFFSET
    centred = points - points.mean(0)
    fitted = np.linalg.svd(centred, full_matrices=False)[2][-1]
    return distances, math.degrees(math.acos(min(1.0, abs(float(fitted @ PLANE_NORMAL)))))


def export_settings(**values):
    return replace(run_settings().export, **values)


@pytest.mark.parametrize("mesh_format", ["ply", "obj"])
def test_planted_plane_comes_back_as_a_plane(tmp_path, mesh_format):
    views = plane_views(blob=True)
    settings = export_settings(
        outputs=("pointcloud", "mesh", "depth"), consistent_views=2, mesh_resolution=48, mesh_format=mesh_format
    )
    written = export_rendered(views, plane_scene(views), settings, tmp_path, seed=0)
    cloud = read_point_cloud(tmp_path / POINT_CLOUD_FILE)
    assert len(cloud) == written.counts["points"] > 0.8 * 5 * HEIGHT * WIDTH
    distances, angle = plane_residuals(cloud.points)
    assert np.abs(distances).max() < 1e-4 and angle < 0.01  # exact depth: the points lie on the plane
    # The mesh: TSDF fusion of the same depth, within a voxel of the plane, its faces towards the cameras.
    voxel = written.mesh["voxel_size"]
    if mesh_format == "ply":
        vertices = read_point_cloud(tmp_path / "mesh.ply").points
    else:
        lines = (tmp_path / "mesh.obj").read_text().splitlines()
        vertices = np.array([line.split()[1:4] for line in lines if line.startswith("v ")], dtype=np.float64)
        faces = np.array([line.split()[1:4] for line in lines if line.startswith("f ")], dtype=np.int64) - 1
        normals = np.cross(vertices[faces[:, 1]] - vertices[faces[:, 0]], vertices[faces[:, 2]] - vertices[faces[:, 0]])
        assert np.mean(normals @ PLANE_NORMAL < 0) > 0.99  # facing the cameras (at z ~ 0, the plane at z ~ 4)
    assert len(vertices) == written.mesh["vertices"] > 100
    distances, angle = plane_residuals(vertices)
    assert np.abs(distances).max() < voxel and angle < 0.5
    # The depth files: float32 depth as rendered, 16-bit PNG levels within half a level of it.
    record = json.loads((tmp_path / "depth" / "depth.json").read_text())
    depth = np.load(tmp_path / "depth" / "plane1.npy")
    assert depth.dtype == np.float32 and np.array_equal(depth, views[1].depth.numpy())
    levels = iio.imread(tmp_path / "depth" / "plane1.png")
    assert levels.dtype == np.uint16
    assert np.abs(levels * record["png_depth_scale"] - depth).max() <= 0.5 * record["png_depth_scale"] + 1e-6


def test_consistency_filter_removes_a_floating_blob():
    """The control of the test above: the blob is kept without the consistency filter (and then the
    points are no plane), removed with it."""
    views = plane_views(blob=True)
    for consistent_views, blob_kept in ((0, True), (2, False)):
        kept = kept_pixels(views, export_settings(consistent_views=consistent_views))
        assert bool(kept.masks[0][10:20, 15:30].any()) == blob_kept
        points = torch.cat(
            [
                (pixel_rays(v.view.c2w, v.view.intrinsics, pixel_grid(HEIGHT, WIDTH)).directions
                 * v.depth.reshape(-1, 1) + v.view.c2w[:3, 3])[m.reshape(-1)]
                for v, m in zip(views, kept.masks)
            ]
        ).numpy()  # fmt: skip
        distances, _ = plane_residuals(points)
        assert (np.abs(distances).max() > 1.0) == blob_kept
    # Every other pixel of the plane is seen by at least 2 of the 4 other views at its depth.
    assert kept.counts["consistent"] > 0.9 * (kept.counts["with_depth"] - 150)


def test_confidence_and_voxel_filters(tmp_path):
    views = plane_views()
    for i, view in enumerate(views):
        view.confidence = torch.full((HEIGHT, WIDTH), 0.2 * (i + 1))  # 0.2 .. 1.0
    kept = kept_pixels(views, export_settings(min_confidence=0.5, consistent_views=0))
    assert [bool(mask.all()) for mask in kept.masks] == [False, False, True, True, True]
    assert [bool(mask.any()) for mask in kept.masks] == [False, False, True, True, True]
    settings = export_settings(outputs=("pointcloud",), min_confidence=0.0, consistent_views=0, voxel_size=0.5)
    written = export_rendered(views, plane_scene(views), settings, tmp_path, seed=0)
    cloud = read_point_cloud(tmp_path / POINT_CLOUD_FILE)
    keys = np.floor(cloud.points / 0.5)
    assert written.counts["points"] == len(cloud) == len(np.unique(keys, axis=0)) < 5 * HEIGHT * WIDTH / 10
    capped = export_settings(outputs=("pointcloud",), consistent_views=0, max_points=100)
    assert export_rendered(views, plane_scene(views), capped, tmp_path, seed=0).counts["points"] == 100


def test_point_cloud_ply_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    cloud = PointCloud(
        rng.normal(size=(50, 3)).astype(np.float32),
        rng.integers(0, 256, (50, 3)).astype(np.uint8),
        rng.random(50).astype(np.float32),
    )
    write_point_cloud(tmp_path / "cloud.ply", cloud)
    back = read_point_cloud(tmp_path / "cloud.ply")
    assert np.array_equal(back.points, cloud.points) and np.array_equal(back.colours, cloud.colours)
    assert back.confidence is not None and np.array_equal(back.confidence, cloud.confidence)


def test_view_agreement_counts_the_views_that_see_one_colour():
    """Four source views see a grey point; one of them (a planted outlier) sees it red."""
    c2w = look_at(
        torch.tensor([[-0.3, 0.0, 0.0], [0.3, 0.0, 0.0], [0.0, 0.3, 0.0], [0.0, -0.3, 0.0]]),
        torch.tensor([0.0, 0.0, 4.0]),
        torch.tensor([0.0, 1.0, 0.0]),
    )
    images = torch.full((4, 3, 20, 20), 0.5)
    images[3, 0] = 1.0  # the fourth view sees red everywhere
    intrinsics = torch.tensor([[20.0, 0, 10], [0, 20.0, 10], [0, 0, 1]]).expand(4, 3, 3)
    sources = SourceViews(images=images, features=torch.zeros(4, 1, 5, 5), c2w=c2w, intrinsics=intrinsics)
    points = torch.tensor([[0.0, 0.0, 4.0], [0.0, 0.0, -4.0]])  # the second behind every camera
    assert view_agreement(points, sources, 0.1).tolist() == [0.75, 0.0]
    assert view_agreement(points, sources, 0.6).tolist() == [1.0, 0.0]


# ---- the cameras, read back -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_scene():
    return load_scene(*scene_and_data(compose_config("data.factor=32")))


def test_cameras_read_back_by_transforms_loader_and_pycolmap(tmp_path, demo_scene):
    pycolmap = pytest.importorskip("pycolmap")
    scene = demo_scene
    folder = write_camera_files(tmp_path, scene, None)
    c2w = scene.cameras.c2w.double().numpy()
    intrinsics = scene.cameras.intrinsics.double().numpy()
    # transforms.json as read, before the loader normalises: the scene's cameras exactly.
    raw = read_transforms(folder)
    assert np.allclose(raw.c2w, c2w, atol=1e-6) and np.allclose(raw.intrinsics, intrinsics, atol=1e-9)
    assert (raw.height, raw.width) == scene.resolution
    # The loader (scene=transforms): the same images, intrinsics and split; the poses normalised again,
    # which is a similarity of these (its scale, then a rigid recentring).
    loaded = load_scene(*scene_and_data(compose_config("scene=transforms", f"scene.path={folder}", "data.factor=1")))
    assert torch.equal(loaded.images, scene.images)
    assert torch.allclose(loaded.cameras.intrinsics, scene.cameras.intrinsics)
    assert (loaded.train_ids, loaded.test_ids) == (scene.train_ids, scene.test_ids)
    fit = umeyama(c2w[:, :3, 3], loaded.cameras.c2w.double().numpy()[:, :3, 3])
    assert fit.scale == pytest.approx(loaded.scale, rel=1e-5)
    assert np.allclose(fit.apply(c2w[:, :3, 3]), loaded.cameras.c2w.numpy()[:, :3, 3], atol=1e-5)
    assert np.allclose(fit.rotation[None] @ c2w[:, :3, :3], loaded.cameras.c2w.numpy()[:, :3, :3], atol=1e-5)
    # pycolmap reads the COLMAP text model as the same cameras.
    model = pycolmap.Reconstruction(str(folder / "colmap"))
    assert len(model.images) == len(scene.image_names)
    for image in model.images.values():
        index = [Path(name).stem for name in scene.image_names].index(Path(image.name).stem)
        colmap_c2w = np.eye(4)
        colmap_c2w[:3, :4] = image.cam_from_world().inverse().matrix()
        assert np.allclose(colmap_c2w, c2w[index], atol=1e-6)
        camera = model.cameras[image.camera_id]
        assert (camera.height, camera.width) == scene.resolution
        K = intrinsics[index]
        assert np.allclose(camera.params, [K[0, 0], K[1, 1], K[0, 2], K[1, 2]])


def test_rotation_quaternion_is_colmaps():
    pycolmap = pytest.importorskip("pycolmap")
    rng = np.random.default_rng(1)
    for _ in range(20):
        rotation = np.linalg.qr(rng.normal(size=(3, 3)))[0]
        rotation *= np.sign(np.linalg.det(rotation))
        w, x, y, z = rotation_quaternion(rotation)
        assert np.allclose(pycolmap.Rotation3d(np.array([x, y, z, w])).matrix(), rotation, atol=1e-9)


# ---- the command -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_runs) -> Path:
    return tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"


def export(tiny_checkpoint: Path, run_dir: Path, *overrides: str):
    return run_in_process(
        "export", f"ckpt_path={tiny_checkpoint}", "export.views=3", "export.scale=0.5",
        f"hydra.run.dir={run_dir}", *overrides,
    )  # fmt: skip


def test_export_writes_every_output(tmp_path, tiny_checkpoint):
    everything = "export.outputs=[pointcloud,mesh,depth,cameras]"
    # The tiny model's depth agrees little between views: filters loose enough for a mesh of 3 views.
    loose = ("export.min_confidence=0", "export.consistent_views=1")
    result = export(tiny_checkpoint, tmp_path, everything, "export.mesh_resolution=32", *loose)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / RECORD_FILE).read_text())
    assert record["views"] == ["image001", "image006", "image013"]  # 3 of the 17 training views, evenly spaced
    assert set(record["files"]) == {"pointcloud", "mesh", "depth", "cameras"}
    cloud = read_point_cloud(tmp_path / POINT_CLOUD_FILE)
    assert len(cloud) == record["counts"]["points"] > 0
    assert cloud.confidence is not None and 0 <= cloud.confidence.min() and cloud.confidence.max() <= 1
    for name in record["views"]:
        depth = np.load(tmp_path / "depth" / f"{name}.npy")
        assert depth.shape == (47, 63) and (depth > 0).all()
        confidence = np.load(tmp_path / "depth" / f"{name}.confidence.npy")
        assert confidence.shape == depth.shape and 0 <= confidence.min() and confidence.max() <= 1
    assert (tmp_path / "mesh.ply").exists() and record["mesh"]["faces"] > 0
    assert (tmp_path / "cameras" / "transforms.json").exists()
    assert len(list((tmp_path / "cameras" / "images").iterdir())) == 20
    assert "rendering" in result.stderr  # the progress bar


def assert_error_after_progress(result, *fragments: str) -> str:
    """`assert_one_error_line` for an error found after the rendering's progress bar (its own line on
    stderr, redrawn in place): exit code 2, and past the bar exactly one line, `error: ...`."""
    stderr = result.stderr if isinstance(result.stderr, str) else result.stderr.decode()
    lines = [line for line in stderr.strip().split("\n") if not line.split("\r")[-1].startswith("rendering:")]
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def test_empty_cloud_names_the_threshold():
    views = plane_views()
    for view in views:
        view.confidence = torch.full((HEIGHT, WIDTH), 0.5)
    settings = export_settings(min_confidence=0.6, consistent_views=0)
    with pytest.raises(UserError, match=r"export.min_confidence=0.6: keeps none of 8640 .* is 0.500\); lower it"):
        check_not_empty(kept_pixels(views, settings), views, settings)
    settings = export_settings(min_confidence=0.5, consistent_views=0)
    check_not_empty(kept_pixels(views, settings), views, settings)  # 0.5 keeps them: no error


def test_bad_input_is_one_error_line(tmp_path, tiny_checkpoint, monkeypatch):
    # A filter that keeps nothing, named with what to do (3 views: at most 2 others agree).
    result = export(tiny_checkpoint, tmp_path / "a", "export.consistent_views=3")
    assert_error_after_progress(result, "export.consistent_views=3", "lower it")
    # A checkpoint whose read-out gives no depth (its pooling scores broken: NaN weights, NaN depth).
    checkpoint = torch.load(tiny_checkpoint, map_location="cpu", weights_only=False)
    checkpoint["state_dict"]["net.readout.score.bias"].fill_(float("nan"))
    broken = tmp_path / "broken.ckpt"
    torch.save(checkpoint, broken)
    result = export(broken, tmp_path / "b")
    assert_error_after_progress(result, "broken.ckpt: its read-out gives no depth")
    # Values the settings refuse.
    assert_one_error_line(export(tiny_checkpoint, tmp_path / "c", "export.outputs=[points]"), "export.outputs")
    assert_one_error_line(export(tiny_checkpoint, tmp_path / "c", "export.scale=2"), "export.scale")
    assert_one_error_line(run_in_process("export", f"hydra.run.dir={tmp_path / 'd'}"), "ckpt_path")
    # The optional extra missing: the line names it, before the checkpoint is read.
    monkeypatch.setitem(sys.modules, "skimage", None)
    monkeypatch.setitem(sys.modules, "skimage.measure", None)
    result = export(tiny_checkpoint, tmp_path / "e", "export.outputs=[mesh]")
    assert_one_error_line(result, "scikit-image", '".[export]"')
    assert not (tmp_path / "e" / RECORD_FILE).exists()


def test_render_rays_gives_the_read_outs_peak_weight():
    """`render_rays(peak_weights=)`: per ray the largest of the read-out's weights, as the network's own
    forward gives them, in ray order whatever the chunks and workers; colour and depth unchanged."""
    from helpers.networks import perturbed_quick_net, random_target_rig

    from pola_gnt.model.renderer import render_rays
    from pola_gnt.model.sampler import DepthSampler

    net = perturbed_quick_net("pola_gnt")
    sources, rays, _ = random_target_rig(net)
    sampler, depth_range = DepthSampler(16), (1.0, 12.0)
    with torch.inference_mode():
        direct = net(rays, sampler(rays, depth_range), sources)
    plain = render_rays(net, rays, sources, depth_range, sampler, 100)
    for workers in (1, 2):
        peaks: list[torch.Tensor] = []
        rgb, depth = render_rays(net, rays, sources, depth_range, sampler, 100, workers, peak_weights=peaks)
        assert torch.equal(rgb, plain[0]) and torch.equal(depth, plain[1])
        peak = torch.cat(peaks)
        assert peak.shape == (len(rays),) and (peak > 0).all() and (peak <= 1 + 1e-6).all()
        assert torch.allclose(peak, direct.weights.float().amax(dim=-1), atol=1e-5)
