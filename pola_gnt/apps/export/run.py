"""`python -m pola_gnt.export`'s library: a checkpoint's geometry written for other tools.

The camera set is rendered once (colour, depth, confidence: `views`) and serves every output that needs
depth: `depth/` (`files`), `pointcloud.ply` (`fusion`), `mesh.ply|obj` (`tsdf`); `cameras/` needs no
render. `export.json` records what was written, the settings, how many pixels each filter kept, and
the time of each stage."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning_fabric import Fabric
from tqdm import tqdm

from pola_gnt.apps.export.files import json_bytes, write_camera_files, write_depth_files
from pola_gnt.apps.export.fusion import KeptPixels, check_not_empty, fuse_point_cloud, kept_pixels
from pola_gnt.apps.export.ply import PointCloud, write_mesh, write_point_cloud
from pola_gnt.apps.export.tsdf import import_marching_cubes, tsdf_mesh
from pola_gnt.apps.export.views import RenderedView, check_depth, export_views, render_export_view
from pola_gnt.apps.frames import EncodedViews
from pola_gnt.apps.trained_runs import TrainedCheckpoint, load_trained_checkpoint
from pola_gnt.core.files import write_atomic
from pola_gnt.data.scene import Scene
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.model.render_memory import budget_chunk_rays, render_workers
from pola_gnt.runs.config.stored import TrainedRunConfig
from pola_gnt.runs.settings import ExportSettings

POINT_CLOUD_FILE = "pointcloud.ply"
MESH_FILE = "mesh"  # .ply or .obj (export.mesh_format)
RECORD_FILE = "export.json"
RENDERED_OUTPUTS = ("pointcloud", "mesh", "depth")


def render_views(trained: TrainedCheckpoint, scene: Scene, fabric: Fabric) -> list[RenderedView]:
    """Every view of the camera set, rendered with a progress bar over its rays."""
    config = trained.settings
    settings = config.export
    views = export_views(scene, settings, config.video)
    trained.system.net.to(fabric.device).eval()
    net = trained.system.rendering_network(fabric.device)
    source_count = config.data.num_source_views
    chunk_rays = budget_chunk_rays(config.render, config.model.net, source_count, fabric.device)
    workers = render_workers(config.render, config.model.net, source_count, chunk_rays, fabric.device)
    height, width = views[0].height, views[0].width
    print(
        f"export      {settings.cameras} cameras, {len(views)} views at {width}x{height}, "
        f"{source_count} source views, {config.render.n_samples} samples per ray, {chunk_rays} rays per pass, "
        f"{workers} at once",
        flush=True,
    )
    encoded = EncodedViews(net, scene, fabric.device, workers)
    rendered = []
    with tqdm(total=len(views), desc="rendering", unit="view", dynamic_ncols=True) as bar:
        for view in views:

            def progress(done: int, total: int, name: str = view.name) -> None:
                bar.set_postfix_str(f"{name} {100 * done / total:.0f}%", refresh=True)

            rendered.append(
                render_export_view(
                    net,
                    scene,
                    view,
                    encoded,
                    trained.system.sampler,
                    chunk_rays,
                    workers,
                    source_count,
                    settings,
                    fabric,
                    progress,
                )  # fmt: skip
            )
            bar.update()
    return rendered


@dataclass
class ExportedFiles:
    """What `export_rendered` wrote, and its record."""

    files: dict[str, str] = field(default_factory=dict)  # output -> path
    counts: dict[str, int] = field(default_factory=dict)  # pixels and points left after each filter
    mesh: dict[str, Any] = field(default_factory=dict)  # the TSDF grid, vertices and faces
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage


def point_cloud_of(
    rendered: list[RenderedView], settings: ExportSettings, seed: int
) -> tuple[PointCloud, dict[str, int], KeptPixels]:
    """The point cloud of the rendered views: the pixels every filter keeps (one line when a filter
    keeps none), fused, thinned by voxel and cap (`seed`); the counts after each filter, the kept pixels."""
    kept = kept_pixels(rendered, settings)
    check_not_empty(kept, rendered, settings)
    cloud, counts = fuse_point_cloud(rendered, kept, settings, seed)
    return cloud, counts, kept


def export_rendered(
    rendered: list[RenderedView], scene: Scene, settings: ExportSettings, out_dir: Path, seed: int
) -> ExportedFiles:
    """The outputs that need depth (`depth/`, `pointcloud.ply`, `mesh.*`) from the rendered views."""
    written = ExportedFiles()
    clock = time.perf_counter()

    def timed(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        written.timings[f"{stage}_s"] = round(now - clock, 3)
        clock = now

    if "depth" in settings.outputs:
        written.files["depth"] = str(write_depth_files(out_dir, rendered, scene, settings.confidence))
        timed("depth")
    if "pointcloud" not in settings.outputs and "mesh" not in settings.outputs:
        return written
    cloud, written.counts, kept = point_cloud_of(rendered, settings, seed)
    timed("filter")
    if "pointcloud" in settings.outputs:
        write_point_cloud(out_dir / POINT_CLOUD_FILE, cloud)
        written.files["pointcloud"] = str(out_dir / POINT_CLOUD_FILE)
        timed("pointcloud")
    if "mesh" in settings.outputs:
        with tqdm(total=len(rendered), desc="fusing", unit="view", dynamic_ncols=True) as bar:
            mesh, grid = tsdf_mesh(
                rendered, kept.masks, torch.from_numpy(cloud.points), settings.mesh_resolution,
                settings.mesh_truncation, bar.update,
            )  # fmt: skip
        path = out_dir / f"{MESH_FILE}.{settings.mesh_format}"
        write_mesh(path, mesh)
        written.files["mesh"] = str(path)
        written.mesh = {**grid, "vertices": len(mesh.vertices), "faces": len(mesh.faces)}
        timed("mesh")
    return written


def run_export(run: TrainedRunConfig, run_dir: Path) -> dict[str, Any]:
    """Write the outputs `export.outputs` of the checkpoint into `run_dir`; returns `export.json`'s record."""
    settings = run.settings.export
    if "mesh" in settings.outputs:
        import_marching_cubes()  # a missing extra: one line before anything loads
    started = time.perf_counter()
    trained = load_trained_checkpoint(run)
    config = trained.settings
    scene = load_scene(config.scene, config.data)
    precision: Any = config.trainer.precision  # Lightning's precision names
    fabric = Fabric(accelerator=config.trainer.accelerator, devices=1, precision=precision)
    print(f"checkpoint  {trained.path} ({config.model.name}, step {trained.system.checkpoint_step})", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    written = ExportedFiles()
    views: list[str] = []
    timings: dict[str, float] = {"load_s": round(time.perf_counter() - started, 3)}
    if any(output in settings.outputs for output in RENDERED_OUTPUTS):
        clock = time.perf_counter()
        rendered = render_views(trained, scene, fabric)
        views = [view.view.name for view in rendered]
        check_depth(rendered, str(trained.path))
        timings["render_s"] = round(time.perf_counter() - clock, 3)
        written = export_rendered(rendered, scene, settings, run_dir, config.seed)
        timings.update(written.timings)
    if "cameras" in settings.outputs:
        clock = time.perf_counter()
        point_cloud = f"../{POINT_CLOUD_FILE}" if "pointcloud" in settings.outputs else None
        written.files["cameras"] = str(write_camera_files(run_dir, scene, point_cloud))
        timings["cameras_s"] = round(time.perf_counter() - clock, 3)
    timings["total_s"] = round(time.perf_counter() - started, 3)
    record = {
        "checkpoint": str(trained.path),
        "step": trained.system.checkpoint_step,
        "model": config.model.name,
        "scene": scene.name,
        "scale": scene.scale,
        "resolution": list(scene.resolution),
        "n_samples": config.render.n_samples,
        "num_source_views": config.data.num_source_views,
        "export": dataclasses.asdict(settings),
        "views": views,
        "counts": written.counts,
        "mesh": written.mesh,
        "files": written.files,
        "timings": timings,
    }
    write_atomic(run_dir / RECORD_FILE, json_bytes(record))
    for output, path in written.files.items():
        print(f"wrote       {output}: {path}", flush=True)
    counts = written.counts
    if counts:
        print(
            f"points      {counts['with_depth']} pixels with depth, {counts['confident']} confident, "
            f"{counts['consistent']} consistent, {counts['points']} points written",
            flush=True,
        )
    return record
