"""Measure the point cloud `python -m pola_gnt.export` fuses against a reference surface, for a grid of
its filters: accuracy, completeness (mean distances both ways), precision / recall within 1% of the
reference's extent (`evaluation.point_cloud_metrics`), the points kept and the filters' time.

    python scripts/measure_export_geometry.py ckpt_path=CKPT scene=demo [export.scale=0.25 ...] \
        --out FILE.json [--cache RENDERS.pt] [--reference exact|colmap] \
        [--confidence peak,agreement,both] [--min-confidence 0,0.2] [--consistent-views 0,1,2]

The camera set is rendered once (as the export renders it; `--cache` keeps the renders for another
grid), then every combination of the grid is filtered and fused from the same renders. References:
- `exact`: the demo scene's (and generated scenes') exact depth of every view, unprojected: the surface
  the cameras see;
- `none`: no scores, the points kept and the filters' time only;
- `colmap`: a sparse reconstruction of the scene's images by pycolmap (SIFT, exhaustive matching,
  incremental mapping: `data.colmap.run_sfm`), brought into the scene's frame by the similarity that
  best maps its cameras onto the scene's (Umeyama on the centres): a sanity bound where no exact
  geometry exists (DTU's reference scans are not in ../shared).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pola_gnt.core.errors import UserError, exit_on_user_error


def exact_reference(run_settings: Any, scene: Any, stride: int = 2) -> Any:
    """The exact surface points `[n, 3]` every view of the demo scene sees (every `stride`-th pixel)."""
    import numpy as np
    import torch

    from pola_gnt.data.scene_loading import exact_depth_source
    from pola_gnt.geometry.rays import pixel_grid, pixel_rays

    exact_depth = exact_depth_source(run_settings.scene, scene)
    if exact_depth is None:
        raise UserError(f"--reference exact: scene {scene.name} has no exact depth (only scene=demo)")
    height, width = scene.resolution
    pixels = pixel_grid(height, width).double()
    keep = ((pixels[:, 0] % stride) == 0) & ((pixels[:, 1] % stride) == 0)
    points = []
    for view in range(len(scene.image_names)):
        rays = pixel_rays(scene.cameras.c2w[view].double(), scene.cameras.intrinsics[view].double(), pixels[keep])
        depth = exact_depth(view).reshape(-1)[keep]
        finite = torch.isfinite(depth)
        points.append((rays.origins + depth[:, None] * rays.directions)[finite])
    return torch.cat(points).numpy().astype(np.float64)


def colmap_reference(scene: Any, say: Any) -> tuple[Any, dict[str, Any]]:
    """pycolmap's sparse points of the scene's images, in the scene's frame, and the fit's record."""
    import imageio.v3 as iio
    import numpy as np
    from omegaconf import OmegaConf
    from tqdm import tqdm

    from pola_gnt.core.paths import PROJECT_ROOT
    from pola_gnt.data.align import camera_errors, umeyama
    from pola_gnt.data.colmap import camera_to_world, registered_images, run_sfm
    from pola_gnt.data.images import to_uint8
    from pola_gnt.runs.config.read import read_process_data_settings

    config = OmegaConf.load(PROJECT_ROOT / "conf" / "process_data.yaml")
    for key in ("defaults", "hydra"):
        config.pop(key, None)
    config.merge_with({"input": "unused", "out": "unused", "matching": "exhaustive"})
    options = read_process_data_settings(config)
    with tempfile.TemporaryDirectory(prefix="export-colmap-") as work:
        image_dir = Path(work) / "images"
        image_dir.mkdir()
        for name, image in zip(scene.image_names, scene.images):
            iio.imwrite(image_dir / f"{Path(name).stem}.png", to_uint8(image))
        result = run_sfm(image_dir, Path(work), len(scene.image_names), options, say, tqdm)
    model = result.reconstruction
    if model is None:
        raise UserError(f"--reference colmap: pycolmap registered no model from {scene.name}'s images")
    registered = registered_images(model)
    names = [Path(name).stem for name in scene.image_names]
    pairs = [(names.index(Path(name).stem), image) for name, image in registered.items()]
    colmap_c2w = np.stack([camera_to_world(image) for _, image in pairs])
    scene_c2w = scene.cameras.c2w[[index for index, _ in pairs]].double().numpy()
    fit = umeyama(colmap_c2w[:, :3, 3], scene_c2w[:, :3, 3])
    errors = camera_errors(colmap_c2w, scene_c2w)
    points = np.array([point.xyz for point in model.points3D.values()], dtype=np.float64)
    record = {
        "registered": len(pairs),
        "images": len(names),
        "points": len(points),
        "camera_centre_error_of_spread": errors.centre_error,
        "camera_rotation_error_deg": errors.rotation_error_deg,
    }
    return fit.apply(points), record


def row_keys(confidence: str, minimum: float, views: int) -> dict[str, Any]:
    return {"confidence": confidence, "min_confidence": minimum, "consistent_views": views}


def parse_list(text: str, kind: type) -> list:
    return [kind(item) for item in text.split(",") if item]


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("overrides", nargs="+", help="the export's overrides: ckpt_path=CKPT scene=NAME export.*=...")
    parser.add_argument("--out", type=Path, required=True, help="the rows as JSON")
    parser.add_argument("--cache", type=Path, help="keep the renders here (and read them back when present)")
    parser.add_argument("--reference", choices=("exact", "colmap", "none"), default="exact", help="none: times only")
    parser.add_argument("--confidence", default="peak", help="comma-separated export.confidence kinds")
    parser.add_argument("--min-confidence", default="0", help="comma-separated export.min_confidence values")
    parser.add_argument("--consistent-views", default="0,1", help="comma-separated export.consistent_views values")
    parser.add_argument("--fraction", type=float, default=0.01, help="precision / recall threshold: extent share")
    args = parser.parse_args()

    from pola_gnt.core.process import prepare_process

    prepare_process()
    import torch
    from lightning_fabric import Fabric

    from pola_gnt.apps.export.fusion import fuse_point_cloud, kept_pixels
    from pola_gnt.apps.export.run import render_views
    from pola_gnt.apps.export.views import combined_confidence
    from pola_gnt.apps.trained_runs import load_trained_checkpoint
    from pola_gnt.data.scene_loading import load_scene
    from pola_gnt.evaluation.point_cloud_metrics import point_cloud_scores
    from pola_gnt.runs.config.app import compose_config
    from pola_gnt.runs.config.stored import trained_run_config

    cfg = compose_config(*args.overrides)
    work_dir = args.out.parent
    work_dir.mkdir(parents=True, exist_ok=True)
    trained = load_trained_checkpoint(trained_run_config(cfg, work_dir, args.overrides))
    settings = trained.settings
    scene = load_scene(settings.scene, settings.data)
    if args.cache is not None and args.cache.exists():
        rendered, render_s = torch.load(args.cache, weights_only=False)
        print(f"renders     {args.cache} ({len(rendered)} views, rendered in {render_s:.0f} s)", flush=True)
    else:
        precision: Any = settings.trainer.precision
        fabric = Fabric(accelerator=settings.trainer.accelerator, devices=1, precision=precision)
        started = time.perf_counter()
        rendered = render_views(trained, scene, fabric)
        render_s = time.perf_counter() - started
        if args.cache is not None:
            torch.save((rendered, render_s), args.cache)
    reference = None
    if args.reference == "none":
        reference_record = {"kind": "none: points and times only"}
    elif args.reference == "exact":
        reference, reference_record = exact_reference(settings, scene), {"kind": "exact depth of every view"}
    else:
        reference, reference_record = colmap_reference(scene, lambda line: print(f"colmap      {line}", flush=True))
        reference_record["kind"] = "pycolmap sparse points"
    rows = []
    grid = itertools.product(
        args.confidence.split(","),
        parse_list(args.min_confidence, float),
        parse_list(args.consistent_views, int),
    )
    for confidence, minimum, views in grid:
        for view in rendered:
            view.confidence = combined_confidence(view.peak, view.agreement, confidence)
        export = dataclasses.replace(
            settings.export, confidence=confidence, min_confidence=minimum, consistent_views=views
        )
        started = time.perf_counter()
        kept = kept_pixels(rendered, export)
        if not kept.counts["consistent"]:
            rows.append({**row_keys(confidence, minimum, views), "points": 0})
            continue
        cloud, counts = fuse_point_cloud(rendered, kept, export, settings.seed)
        filter_s = time.perf_counter() - started
        row = {**row_keys(confidence, minimum, views), "filter_s": round(filter_s, 3), "counts": counts}
        if reference is None:
            rows.append({**row, "points": len(cloud)})
            print(f"{confidence:>9} >= {minimum:<5g} views >= {views}: {len(cloud):>8} points ({filter_s:.2f} s)")
            continue
        scores = point_cloud_scores(cloud.points.astype("float64"), reference, args.fraction)
        rows.append({**row, **scores})
        print(
            f"{confidence:>9} >= {minimum:<5g} views >= {views}: {scores['points']:>8} points, accuracy "
            f"{scores['accuracy']:.4f}, completeness {scores['completeness']:.4f}, precision "
            f"{scores['precision']:.3f}, recall {scores['recall']:.3f} ({filter_s:.1f} s)",
            flush=True,
        )
    document = {
        "command": " ".join(sys.argv),
        "checkpoint": str(trained.path),
        "scene": scene.name,
        "views": len(rendered),
        "size": [rendered[0].view.width, rendered[0].view.height],
        "render_s": render_s,
        "reference": reference_record,
        "rows": rows,
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
