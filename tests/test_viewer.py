"""The web viewer (`apps/viewer.py`, `python -m pola_gnt.view`): the server starts on a free port and
serves the page, a render request returns the renderer's image for that camera (preview, then full
size), the opening camera is rendered with no move and the page follows the full image to done, a
render error is shown and leaves the server answering, the point cloud (an exported PLY or the live
points of the renders) toggles and `Show: Nothing` renders nothing, and a real browser shows it
(where Chromium is installed)."""

from __future__ import annotations

import math
import re
import threading
import time
import urllib.request
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from helpers import compose_config, load_script

from pola_gnt.apps import viewer as viewer_module
from pola_gnt.apps.camera_path_file import read_camera_path
from pola_gnt.apps.frames import frame_source_views, scene_fov
from pola_gnt.apps.viewer import (
    ClientView,
    ViewCamera,
    ViewerApp,
    c2w_of,
    orbit_depth,
    pose_of,
    refinement_levels,
    start_viewer,
)
from pola_gnt.data.blender import load_blender_scene
from pola_gnt.geometry.camera_paths import focus_depth
from pola_gnt.model.renderer import render_image
from pola_gnt.runs.config.stored import trained_run_config

FACTOR = 64  # the demo scene at 63 x 47
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def app(tiny_runs, tmp_path_factory):
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    overrides = [f"ckpt_path={checkpoint}", f"data.factor={FACTOR}", "view.port=0", "view.preview_rays=300"]
    run_dir = tmp_path_factory.mktemp("viewer")
    viewer = start_viewer(trained_run_config(compose_config(*overrides), run_dir, overrides), run_dir, str(checkpoint))
    yield viewer
    viewer.stop()


class RecordingScene:
    """A client's scene API that keeps the background images it is sent."""

    def __init__(self, scene):
        self.scene, self.images = scene, []

    def set_background_image(self, image, **_):
        self.images.append(image)

    def __getattr__(self, name):
        return getattr(self.scene, name)


class FakeClient:
    """What `ClientView` uses of a viser client, without a browser: the server's GUI and scene."""

    client_id = 10_000

    def __init__(self, app: ViewerApp, camera):
        self.gui, self.scene, self.camera = app.server.gui, RecordingScene(app.server.scene), camera
        self.downloads: list[tuple[str, bytes]] = []

    def send_file_download(self, name, content):
        self.downloads.append((name, content))


class FakeCamera:
    def __init__(self, c2w: torch.Tensor, fov_degrees: float, aspect: float):
        self.wxyz, self.position = pose_of(c2w)
        self.fov, self.aspect = math.radians(fov_degrees), aspect


def becomes(condition, timeout: float) -> bool:
    """Whether `condition()` turns true within `timeout` seconds."""
    start = time.perf_counter()
    while not condition():
        if time.perf_counter() - start >= timeout:
            return False
        time.sleep(0.05)
    return True


def wait_for(condition, timeout: float = 120.0) -> None:
    assert becomes(condition, timeout), "timed out"


def test_the_server_starts_on_a_free_port_and_serves_the_page(app):
    assert app.port > 0 and app.url == f"http://127.0.0.1:{app.port}"
    with urllib.request.urlopen(app.url, timeout=30) as response:
        assert response.status == 200
        assert b"<html" in response.read().lower()


def test_the_opening_cameras_sources_are_encoded_before_the_page_can_connect(tiny_runs, tmp_path):
    """The viewer renders the opening camera at 2x2 before it serves (a process's first render builds the
    fused kernels where they are not built yet): its source views are encoded when the server starts."""
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    overrides = [f"ckpt_path={checkpoint}", f"data.factor={FACTOR}", "view.port=0"]
    viewer = start_viewer(
        trained_run_config(compose_config(*overrides), tmp_path, overrides), tmp_path, str(checkpoint)
    )
    try:
        scene = viewer.renderer.scene
        opening = viewer.renderer.nearest_views(scene.cameras.c2w[scene.train_ids[0]])
        assert sorted(viewer.renderer.encoded.features) == sorted(opening)
        assert viewer.images_shown == 0  # nothing was sent anywhere
    finally:
        viewer.stop()


def test_viser_poses_are_opencv_c2w(app):
    scene = app.renderer.scene
    c2w = scene.cameras.c2w[scene.train_ids[1]]
    assert torch.allclose(c2w_of(*pose_of(c2w)), c2w, atol=1e-6)


def test_a_render_request_returns_the_renderers_image(app):
    scene, renderer = app.renderer.scene, app.renderer
    c2w = scene.cameras.c2w[scene.train_ids[2]]
    height, width = scene.resolution
    camera = ViewCamera(c2w, scene_fov(scene), height, width)
    view = ClientView(app, FakeClient(app, FakeCamera(c2w, scene_fov(scene), width / height)))
    try:
        view.camera_moved(camera)
        wait_for(lambda: view.images_shown >= 2)
        assert set(view.timings) == {"preview", "full"} and not view.errors
        preview, full = view.client.scene.images[-2:]
        assert preview.shape[0] * preview.shape[1] <= 300 and full.shape == (height, width, 3)
        # The same image as a direct render of that camera (the renderer `render_video` uses).
        views = frame_source_views(scene, c2w, renderer.num_source_views)
        net = renderer.net
        sources = net.source_views(
            scene.images[views].permute(0, 3, 1, 2), scene.cameras.c2w[views], scene.cameras.intrinsics[views]
        )
        direct = render_image(
            net, c2w, scene.cameras.intrinsics[0], height, width, sources, scene.depth_range, renderer.sampler, 4096
        )
        assert view.last is not None
        assert torch.allclose(view.last.rgb, direct.rgb, atol=1e-5)
        assert np.array_equal(full, renderer.image(view.last, "RGB"))
        assert "Nearest source views: " + scene.image_names[views[0]] in view.sources.content
        # Depth: the videos' colour map of the same frame.
        view.mode.value = "Depth"
        wait_for(lambda: len(view.client.scene.images) >= 3)
        assert np.array_equal(view.client.scene.images[-1], renderer.image(view.last, "Depth"))
    finally:
        view.close()


def test_the_opening_camera_renders_with_no_move_and_the_page_follows_the_full_image(app, monkeypatch):
    """The camera the server opens a tab at is rendered at once; the browser's reports of it (and one
    sent before the browser applied it) start nothing; the progress line counts the full image's
    chunks up to done."""
    scene = app.renderer.scene
    height, width = scene.resolution
    opening, other = (scene.cameras.c2w[scene.train_ids[i]] for i in (0, 4))
    client = FakeClient(app, FakeCamera(opening, scene_fov(scene), width / height))
    view = ClientView(app, client)
    monkeypatch.setattr(app.renderer, "chunk_rays", 700)  # 63 x 47 = 2961 rays: 5 chunks
    monkeypatch.setattr(viewer_module, "PROGRESS_INTERVAL_S", 0.0)
    shown: list[tuple[str, float]] = []
    show_progress = view._show_progress

    def recorded(text: str, percent: float) -> None:
        shown.append((text, percent))
        show_progress(text, percent)

    monkeypatch.setattr(view, "_show_progress", recorded)
    try:
        view.open_at(view.current_camera())
        wait_for(lambda: view.last_shown == (1, "full"))
        assert view.first_image_s is not None and set(view.timings) == {"preview", "full"} and not view.errors
        texts = [text for text, _ in shown]
        full = f"full image {width}x{height}"
        assert texts[0] == f"{full}: 0%"
        assert [text.split(" (")[0] for text in texts[1:-1]] == [f"{full}: {p}%" for p in (24, 47, 71, 95)]
        assert re.fullmatch(rf"{full}: done in \d+\.\d s", texts[-1]) and shown[-1][1] == 100.0
        assert view.progress.content == texts[-1] and view.progress_bar.value == 100.0
        # A report sent before the browser applied the opening camera, then its echo: no render.
        client.camera = FakeCamera(other, 75.0, width / height)
        view.client_camera_changed()
        client.camera = FakeCamera(opening, scene_fov(scene), width / height)
        view.client_camera_changed()
        assert view.generation == 1 and view.opening is None
        # A move after that renders.
        client.camera = FakeCamera(other, scene_fov(scene), width / height)
        view.client_camera_changed()
        wait_for(lambda: view.last_shown == (2, "full"))
    finally:
        view.close()


def test_a_move_before_the_opening_cameras_echo_is_rendered_when_the_wait_is_over(app, monkeypatch):
    """A browser whose echo of the opening camera never matches it (or a user quicker than the echo):
    the report is held for the wait, then rendered, though no other report follows."""
    monkeypatch.setattr(viewer_module, "OPENING_ECHO_WAIT_S", 1.0)
    scene = app.renderer.scene
    height, width = scene.resolution
    opening, other = (scene.cameras.c2w[scene.train_ids[i]] for i in (0, 4))
    client = FakeClient(app, FakeCamera(opening, scene_fov(scene), width / height))
    view = ClientView(app, client)
    try:
        view.open_at(view.current_camera())
        client.camera = FakeCamera(other, scene_fov(scene), width / height)
        view.client_camera_changed()
        assert view.generation == 1 and view.check_again is not None  # held
        wait_for(lambda: view.last_shown == (2, "full"), timeout=60)
        assert view.camera is not None and torch.allclose(view.camera.c2w, other.float(), atol=1e-5)
        assert view.opening is None
    finally:
        view.close()


def test_the_orbit_pivots_where_the_training_cameras_look(app, shared_dir):
    lego = load_blender_scene(shared_dir / "data" / "nerf_synthetic" / "lego", factor=8, test_views=2)
    c2w = lego.cameras.c2w[lego.train_ids[0]]
    # Blender's cameras circle the origin at radius 4.03, looking at it.
    assert orbit_depth(lego, c2w) == pytest.approx(float(c2w[:3, 3].norm()), rel=0.02)
    demo = app.renderer.scene  # forward-facing: GNT's spiral focus depth
    assert orbit_depth(demo, demo.cameras.c2w[0]) == focus_depth(demo.bounds)


def test_refinement_steps_grow_16x_and_end_at_full_size():
    camera = ViewCamera(torch.eye(4), 50.0, 378, 567)
    levels = refinement_levels(camera, 2048)
    assert [level for level, _ in levels] == ["preview", "refine", "full"]
    rays = [sized.height * sized.width for _, sized in levels]
    assert rays[0] <= 2048 and 16 * 2048 * 0.98 <= rays[1] <= 16 * 2048 and levels[-1][1] == camera
    assert [level for level, _ in refinement_levels(camera, 300_000)] == ["preview"]  # already full size
    assert all(sized.width / sized.height == pytest.approx(1.5, rel=0.02) for _, sized in levels)


def test_a_camera_move_cancels_the_render_in_progress(app):
    scene = app.renderer.scene
    calls = []
    stop = threading.Event()
    c2w = scene.cameras.c2w[scene.train_ids[0]]
    camera = ViewCamera(c2w, scene_fov(scene), *scene.resolution)
    assert app.renderer.render(camera, cancelled=lambda: calls.append(1) or stop.is_set()) is not None
    stop.set()
    assert app.renderer.render(camera, cancelled=stop.is_set) is None


def test_a_render_error_is_shown_and_the_server_goes_on(app, monkeypatch, caplog):
    scene = app.renderer.scene
    c2w = scene.cameras.c2w[scene.train_ids[0]]
    view = ClientView(app, FakeClient(app, FakeCamera(c2w, scene_fov(scene), 4 / 3)))
    real_render = app.renderer.render
    monkeypatch.setattr(app.renderer, "render", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("planted")))
    try:
        view.camera_moved(ViewCamera(c2w, scene_fov(scene), 12, 16))
        wait_for(lambda: view.errors)
        assert "RuntimeError: planted" in view.errors[0] and "render error" in view.status.content
        assert "planted" in caplog.text  # logged
        with urllib.request.urlopen(app.url, timeout=30) as response:
            assert response.status == 200
        monkeypatch.setattr(app.renderer, "render", real_render)
        view.camera_moved(ViewCamera(c2w, scene_fov(scene), 12, 16))
        wait_for(lambda: view.images_shown >= 1)  # the same loop renders again
    finally:
        view.close()


def test_stopping_the_viewer_stops_its_video_after_a_frame_and_keeps_the_frames(tiny_runs, tmp_path):
    """A video rendering from the page's button when the viewer stops (Ctrl-C): `stop` ends it after its
    current frame and waits for it, so no render outlives the interpreter; its frames stay in its run
    folder, no mp4 is written."""
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    overrides = [f"ckpt_path={checkpoint}", f"data.factor={FACTOR}", "view.port=0"]
    run = trained_run_config(compose_config(*overrides), tmp_path, overrides)
    viewer = start_viewer(run, tmp_path, str(checkpoint))
    try:
        scene = viewer.renderer.scene
        first, second = (scene.cameras.c2w[scene.train_ids[i]] for i in (0, 3))
        view = ClientView(viewer, FakeClient(viewer, FakeCamera(first, scene_fov(scene), 4 / 3)))
        view.mode.value = "Nothing"  # the video alone renders
        view.add_keyframe()
        view.client.camera = FakeCamera(second, scene_fov(scene), 4 / 3)
        view.add_keyframe()
        view.duration.value, view.fps.value = 20.0, 10  # 200 frames: far more than one stop's wait
        view.path_file.value = str(tmp_path / "path.json")
        view.report(view.render_video)
        assert "rendering 200 frames" in view.status.content
        frames = tmp_path / "videos"
        wait_for(lambda: any(frames.glob("*/frames/rgb/*.png")))
    finally:
        viewer.stop()
    assert viewer.video_threads and not any(thread.is_alive() for thread in viewer.video_threads)
    kept = list(frames.glob("*/frames/rgb/*.png"))
    assert 1 <= len(kept) < 200 and not list(frames.glob("*/*.mp4"))


def test_recorded_keyframes_save_a_camera_path(app, tmp_path):
    scene = app.renderer.scene
    first, second = (scene.cameras.c2w[scene.train_ids[i]] for i in (0, 3))
    camera = FakeCamera(first, scene_fov(scene), 4 / 3)
    view = ClientView(app, FakeClient(app, camera))
    try:
        view.report(view.save_path)
        assert "at least 2 keyframes" in view.status.content
        view.add_keyframe()
        view.client.camera = FakeCamera(second, scene_fov(scene), 4 / 3)
        view.add_keyframe()
        view.duration.value, view.fps.value = 1.0, 5
        view.path_file.value = str(tmp_path / "path.json")
        view.report(view.save_path)
        assert "saved 5 cameras" in view.status.content
        path = read_camera_path(tmp_path / "path.json")
        assert len(path) == 5 and path.fps == 5 and path.height == scene.resolution[0]
        assert torch.allclose(path.c2w[0], first, atol=1e-5) and torch.allclose(path.c2w[-1], second, atol=1e-5)
        assert view.client.downloads[0][0] == "path.json"
    finally:
        view.close()


@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")
def test_a_browser_shows_the_rendered_scene_and_a_drag_moves_the_camera(app, tmp_path):
    """Headless Chromium opens the page over the DevTools protocol: the page connects, shows the
    render, a mouse drag moves the camera and brings a new full-size image; RGB and depth differ."""
    browser_script = load_script("viewer_screenshots")
    with browser_script.HeadlessChromium(str(CHROMIUM), width=800, height=600) as browser:
        before = set(app.clients)
        browser.open(app.url)
        wait_for(lambda: set(app.clients) - before)
        view = app.clients[next(iter(set(app.clients) - before))]
        # No drag yet: the opening camera is rendered by itself, and the page says when it is done.
        wait_for(lambda: view.last_shown is not None and view.last_shown[1] == "full")
        assert view.first_image_s is not None and re.search(r"done in [\d.]+ s", view.progress.content)
        scene = app.renderer.scene
        opening = scene.cameras.c2w[scene.train_ids[0]]
        # The page opens there: the browser reports the camera it was set to (perhaps after the image).
        wait_for(lambda: torch.allclose(view.current_camera().c2w, opening, atol=1e-4), timeout=30)
        start = view.current_camera().c2w
        for _ in range(3):  # a drag the page missed (a busy CPU) is tried again
            browser.drag((400, 300), (460, 320))
            if becomes(lambda: view.generation > 1, timeout=20):
                break
        wait_for(lambda: view.last_shown == (view.generation, "full") and view.generation > 1)
        assert not torch.allclose(view.current_camera().c2w, start, atol=1e-4)  # the drag orbited the camera
        assert not view.errors
        time.sleep(1.0)
        browser.screenshot(tmp_path / "rgb.png")
        view.mode.value = "Depth"
        time.sleep(2.0)
        browser.screenshot(tmp_path / "depth.png")
    rgb, depth = iio.imread(tmp_path / "rgb.png"), iio.imread(tmp_path / "depth.png")
    assert rgb.shape[:2] == (600, 800) and rgb.std() > 0
    # Away from the control panel (right) the page is the background image: colour, then depth.
    assert np.abs(rgb[100:500, 50:400].astype(float) - depth[100:500, 50:400]).mean() > 10


class GeometryScene(RecordingScene):
    """A client's scene API that keeps the point clouds it is sent (None: removed)."""

    def __init__(self, scene):
        super().__init__(scene)
        self.clouds: list[np.ndarray | None] = []

    def add_point_cloud(self, name, points, colors, **_):
        assert name == "/geometry/points" and len(points) == len(colors)
        self.clouds.append(np.asarray(points))

    def remove_by_name(self, name):
        if name == "/geometry/points":
            self.clouds.append(None)


def test_the_point_cloud_exported_or_live_and_geometry_alone(tiny_runs, tmp_path):
    """An exported PLY is shown at once and toggled off; the live cloud is the full-size image's pixels
    unprojected at their rendered depth; `Nothing` renders no image."""
    from pola_gnt.apps.export.ply import PointCloud, write_point_cloud

    rng = np.random.default_rng(0)
    exported = PointCloud(rng.normal(size=(40, 3)).astype(np.float32), rng.integers(0, 256, (40, 3)).astype(np.uint8))
    write_point_cloud(tmp_path / "cloud.ply", exported)
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    overrides = [f"ckpt_path={checkpoint}", f"data.factor={FACTOR}", "view.port=0", "view.preview_rays=300"]
    overrides.append(f"view.point_cloud={tmp_path / 'cloud.ply'}")
    run = trained_run_config(compose_config(*overrides), tmp_path, overrides)
    viewer = start_viewer(run, tmp_path, str(checkpoint))
    try:
        scene = viewer.renderer.scene
        c2w = scene.cameras.c2w[scene.train_ids[1]]
        height, width = scene.resolution
        client = FakeClient(viewer, FakeCamera(c2w, scene_fov(scene), width / height))
        client.scene = GeometryScene(viewer.server.scene)
        view = ClientView(viewer, client)
        clouds = client.scene.clouds
        assert clouds[-1] is not None and np.array_equal(clouds[-1], exported.points)  # shown at once
        view.cloud_shown.value = False
        assert clouds[-1] is None
        view.cloud.value = "live"
        view.cloud_shown.value = True
        assert clouds[-1] is None and "no live points yet" in view.cloud_status.content
        camera = ViewCamera(c2w, scene_fov(scene), height, width)
        view.camera_moved(camera)
        wait_for(lambda: view.last_shown is not None and view.last_shown[1] == "full")
        live = clouds[-1]
        assert live is not None and len(live) == height * width  # fewer pixels than LIVE_POINTS_PER_IMAGE
        # Every live point lies on its pixel's ray at the rendered depth: projected back, the same depth.
        local = (torch.from_numpy(live).double() - c2w[:3, 3].double()) @ c2w[:3, :3].double()
        assert torch.allclose(local[:, 2].sort().values, view.last.depth.reshape(-1).double().sort().values, rtol=1e-4)
        # Geometry alone: no image is sent, none is rendered after a move.
        shown = view.images_shown
        view.mode.value = "Nothing"
        assert client.scene.images[-1] is None
        view.camera_moved(ViewCamera(scene.cameras.c2w[scene.train_ids[2]], scene_fov(scene), height, width))
        assert not becomes(lambda: view.images_shown > shown, 2.0)
        view.mode.value = "RGB"  # back to images: the current camera renders again
        wait_for(lambda: view.images_shown > shown)
        view.close()
    finally:
        viewer.stop()
