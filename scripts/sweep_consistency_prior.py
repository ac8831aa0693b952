"""What the read-out's photo-consistency prior renders on its own, before any training, for a grid of
its settings: a scene's test views scored as `eval` scores them.

    python scripts/sweep_consistency_prior.py scene=fern [data.num_source_views=8] \
        [--levels 1 2 3 4] [--weights 40 80 160 240] [--features 0 0.2 0.4 --feature-layer 2] [--out FILE.json]

With `model.net.readout_source_colour` an untrained network's colour is the source views' mean colour
pooled over the samples by `softmax(-weight x spread)` (`gnt.PooledReadout`: its learned score and colour
layers start at zero), the spread measured on `levels` levels of the blur pyramid
(`model.net.readout_consistency_levels`, `consistency_prior.colour_pyramid`), plus `features` times the spread of
AlexNet's unit-length features of conv `--feature-layer` (`model.net.readout_consistency_features`,
`consistency_prior.ConsistencyFeatures`; weights found as the LPIPS weights are; projected as
`model.net.readout_consistency_feature_dims=K` says): a plane-sweep stereo render. The colour mean is
weighted by the views' angles to the target ray as `model.net.readout_view_angle_weighting=T` says.
That is where a pretraining starts, and the floor that what the network learns must beat: this script
renders it for every (levels, weight, features) through the model's own gather, statistics and read-out
(without the transformer, which an untrained read-out ignores), so a prior is chosen by measurement.

Key=value arguments are config overrides (scene, factor, source views, samples; experiment=quick's by
default); each finished test view is said on stderr, then the table is printed (with the depth's
abs-rel error where the scene has an exact depth, the demo scene's); `--out` also writes its rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from pola_gnt.core.errors import UserError, exit_on_user_error
from pola_gnt.data.datamodule import eval_source_ids
from pola_gnt.data.scene_loading import exact_depth_source, load_scene
from pola_gnt.evaluation.scoring import ViewScorer, build_image_metrics
from pola_gnt.geometry.rays import Rays, pixel_grid, pixel_rays, points_along_rays
from pola_gnt.model.consistency_prior import ConsistencyFeatures
from pola_gnt.model.gnt import (
    GatheredSamples,
    PooledReadout,
    SourceViews,
    gather_source_samples,
    source_colour_statistics,
)
from pola_gnt.model.sampler import DepthSampler
from pola_gnt.runs.config.app import compose_config
from pola_gnt.runs.config.read import read_run_settings

CHUNK_RAYS = 1024


def prior_renders(
    rays: Rays,
    depths: torch.Tensor,
    sources: SourceViews,
    levels: list[int],
    weights: list[float],
    features: Sequence[float] = (0.0,),
    extractor: ConsistencyFeatures | None = None,
    view_angle_weighting: float = 0.0,
) -> dict[tuple[int, float, float], tuple[torch.Tensor, torch.Tensor]]:
    """`(levels, weight, features) -> (rgb [rays, 3], depth [rays])` of an untrained network with the
    source-colour read-out: one gather (at the most levels asked; the features of `extractor`, needed
    when a `features` weight is not 0), the statistics of each level count from its first levels, the
    read-out of each weight."""
    points = points_along_rays(rays, depths)
    gathered = gather_source_samples(
        points, rays.origins, sources, colour_levels=max(levels), consistency=extractor if any(features) else None
    )
    tokens = torch.zeros(*depths.shape, 1)  # the read-out's learned parts start at zero: tokens do not count
    seen = gathered.visible.any(dim=-1)
    out = {}
    for level_count in levels:
        coarse = gathered.coarse_rgb
        if coarse is not None:
            coarse = coarse[..., : 3 * (level_count - 1)] if level_count > 1 else None
        for feature_weight in features:
            statistics = source_colour_statistics(
                GatheredSamples(
                    gathered.values[..., :3], gathered.visible, gathered.rel_dirs, coarse, gathered.consistency
                ),
                feature_weight,
                view_angle_weighting,
            )
            for weight in weights:
                result = PooledReadout(1, weight, source_colour=True)(tokens, seen, depths, statistics)
                out[level_count, weight, feature_weight] = (result.rgb, result.depth)
    return out


def sweep(
    overrides: list[str],
    levels: list[int],
    weights: list[float],
    features: Sequence[float] = (0.0,),
    feature_layer: int = 2,
) -> list[dict]:
    if min(levels) < 1 or max(levels) > 6:
        raise UserError(f"--levels: from 1 to 6, got {levels}")
    if min(weights) <= 0:
        raise UserError(f"--weights: positive, got {weights}")
    if min(features) < 0:
        raise UserError(f"--features: 0 or positive, got {features}")
    if not 1 <= feature_layer <= 5:
        raise UserError(f"--feature-layer: from 1 to 5, got {feature_layer}")
    settings = read_run_settings(compose_config("experiment=quick", *overrides))
    extractor = None
    if any(features):
        net = settings.model.net
        extractor = ConsistencyFeatures(
            feature_layer,
            net.encoder.backbone_weights,
            settings.metrics.lpips_weights,
            net.readout_consistency_feature_dims,
        )
    scene = load_scene(settings.scene, settings.data)
    metrics = build_image_metrics(settings.metrics)
    # Depth errors where the scene has an exact depth (the demo scene), as `eval` scores them.
    scorer = ViewScorer(scene, metrics, "standard", exact_depth_source(settings.scene, scene))
    sampler = DepthSampler(settings.render.n_samples)
    height, width = scene.resolution
    images = scene.images.permute(0, 3, 1, 2)  # [views, 3, H, W]
    scores: dict[tuple[int, float, float], list[dict]] = {}
    for view in scene.test_ids:
        ids = eval_source_ids(scene, view, settings.data.num_source_views)
        unused = torch.zeros(len(ids), 1, height, width)  # encoder features: the statistics do not read them
        sources = SourceViews(images[ids], unused, scene.cameras.c2w[ids], scene.cameras.intrinsics[ids])
        rays = pixel_rays(scene.cameras.c2w[view], scene.cameras.intrinsics[view], pixel_grid(height, width))
        chunks: dict[tuple[int, float, float], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for start in range(0, len(rays), CHUNK_RAYS):
            chunk = rays[start : start + CHUNK_RAYS]
            for key, (rgb, depth) in prior_renders(
                chunk,
                sampler(chunk, scene.depth_range),
                sources,
                levels,
                weights,
                features,
                extractor,
                settings.model.net.readout_view_angle_weighting,
            ).items():
                chunks.setdefault(key, []).append((rgb, depth))
        gt = scene.images[view]
        for key, parts in chunks.items():
            image = torch.cat([rgb for rgb, _ in parts]).reshape(height, width, 3).clamp(0.0, 1.0)
            view_scores = metrics(image, gt)
            if scorer.exact_depth is not None:
                depth = torch.cat([depth for _, depth in parts]).reshape(height, width)
                view_scores["depth_abs_rel"] = scorer.depth_scores(view, depth)[0]["depth_abs_rel"]
            scores.setdefault(key, []).append(view_scores)
        print(f"view {scene.image_names[view]} done", file=sys.stderr, flush=True)
    rows = []
    for (level_count, weight, feature_weight), per_view in scores.items():
        row = {"levels": level_count, "weight": weight, "features": feature_weight}
        for name in per_view[0]:
            values = [v[name] for v in per_view if v[name] is not None]
            row[name] = sum(values) / len(values) if values else None
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    names = [name for name in rows[0] if name not in ("levels", "weight", "features")]
    widths = [max(7, len(name)) for name in names]
    lines = ["levels  weight  features  " + "  ".join(f"{name:>{w}s}" for name, w in zip(names, widths))]
    for row in rows:
        values = "  ".join(f"{'-':>{w}s}" if row[n] is None else f"{row[n]:{w}.3f}" for n, w in zip(names, widths))
        lines.append(f"{row['levels']:6d}  {row['weight']:6.0f}  {row['features']:8.2f}  {values}")
    return "\n".join(lines)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. scene=fern data.num_source_views=8")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--weights", type=float, nargs="+", default=[40.0, 80.0, 160.0, 240.0])
    parser.add_argument("--features", type=float, nargs="+", default=[0.0], help="feature spread weights")
    parser.add_argument("--feature-layer", type=int, default=2, help="AlexNet conv of the features (1 to 5)")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    started = time.perf_counter()
    rows = sweep(args.overrides, args.levels, args.weights, args.features, args.feature_layer)
    print(format_rows(rows))
    print(f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps({"overrides": args.overrides, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
