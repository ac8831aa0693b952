"""Depth scoring on the demo scene: the error functions, the best-constant baseline, and that the
exact depth is the same quantity, in the same units, as the renderer's depth."""

from __future__ import annotations

import math
from dataclasses import replace

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from helpers import compose_config, scene_and_data
from hypothesis import given, settings

from pola_gnt.data.demo_scene import demo_depth
from pola_gnt.data.scene_loading import exact_depth_source, load_scene
from pola_gnt.evaluation.depth_metrics import best_abs_rel_constant, best_constant_errors, depth_errors
from pola_gnt.geometry.projection import project_points
from pola_gnt.geometry.rays import pixel_grid, pixel_rays, points_along_rays

depth_maps = st.lists(st.floats(0.5, 50.0, allow_nan=False), min_size=1, max_size=40).map(
    lambda values: torch.tensor(values, dtype=torch.float64)
)


def test_exact_depth_scores_zero_and_errors_are_their_definitions():
    exact = torch.tensor([[1.0, 2.0], [4.0, 8.0]])
    assert depth_errors(exact, exact) == {"abs_rel": 0.0, "rmse": 0.0}
    pred = torch.tensor([[2.0, 2.0], [3.0, 8.0]])  # errors +1, 0, -1, 0
    errors = depth_errors(pred, exact)
    assert errors["abs_rel"] == pytest.approx((1 / 1 + 1 / 4) / 4)
    assert errors["rmse"] == pytest.approx(math.sqrt(2 / 4))


def test_best_constants_by_hand():
    exact = torch.tensor([1.0, 2.0, 10.0])
    # abs-rel: weights 1, 1/2, 1/10; the weight at or below 1 is already 1 > 1.6 / 2: the minimiser is 1.
    assert best_abs_rel_constant(exact) == 1.0
    baseline = best_constant_errors(exact)
    assert baseline["abs_rel"] == pytest.approx((0 + 1 / 2 + 9 / 10) / 3)
    assert baseline["rmse"] == pytest.approx(float(exact.std(unbiased=False)))  # at the mean, 13 / 3
    # The plain median (2) is worse for abs-rel: the baseline is the weighted median on purpose.
    assert depth_errors(torch.full((3,), 2.0), exact)["abs_rel"] > baseline["abs_rel"]


@settings(max_examples=200, deadline=None)
@given(exact=depth_maps, other=st.floats(0.1, 80.0))
def test_best_constant_scores_exactly_the_baseline_and_no_constant_does_better(exact, other):
    baseline = best_constant_errors(exact)
    at_abs_rel = depth_errors(torch.full_like(exact, best_abs_rel_constant(exact)), exact)
    at_mean = depth_errors(torch.full_like(exact, float(exact.mean())), exact)
    assert at_abs_rel["abs_rel"] == baseline["abs_rel"]
    assert at_mean["rmse"] == baseline["rmse"]
    # The abs-rel objective is piecewise linear: its minimum is at one of the values. Check all of
    # them and an arbitrary other constant.
    for constant in [*exact.tolist(), other]:
        errors = depth_errors(torch.full_like(exact, constant), exact)
        assert errors["abs_rel"] >= baseline["abs_rel"] - 1e-12
        assert errors["rmse"] >= baseline["rmse"] - 1e-12


def test_depth_errors_refuse_mismatched_or_non_positive_maps():
    with pytest.raises(ValueError, match="shape"):
        depth_errors(torch.ones(2, 3), torch.ones(3, 2))
    with pytest.raises(ValueError, match="positive"):
        depth_errors(torch.ones(2), torch.tensor([1.0, 0.0]))


def _demo_scene(tmp_path, factor: int):
    scene_cfg, data_cfg = scene_and_data(compose_config(f"scene.path={tmp_path / 'demo'}", f"data.factor={factor}"))
    return scene_cfg, load_scene(scene_cfg, data_cfg)


def _agreeing(scene, rays, depth_along_rays: torch.Tensor, view_b: int, depth_b: torch.Tensor) -> float:
    """Fraction of the rays whose point at `depth_along_rays` projects into view B at the depth B sees there."""
    height, width = scene.resolution
    points = points_along_rays(rays, depth_along_rays.reshape(-1, 1))[:, 0]
    c2w_b, intrinsics_b = scene.cameras.c2w[view_b][None].double(), scene.cameras.intrinsics[view_b][None].double()
    projection = project_points(points, c2w_b, intrinsics_b, height, width)
    nearest = projection.pixels[0].round().long()
    seen = depth_b[nearest[:, 1].clamp(0, height - 1), nearest[:, 0].clamp(0, width - 1)]
    close = (projection.depth[0] - seen).abs() < 0.01 * seen
    return float((projection.visible[0] & close).double().mean())


def test_exact_depth_is_the_renderers_z_depth_in_the_normalised_scene(tmp_path):
    """Lift view A's pixels along the renderer's rays (loaded, normalised cameras) by the exact depth,
    project into view B: where B sees the same point, its exact depth agrees. This holds only for the
    camera z-depth scaled by the scene's normalisation: the ray length, or the demo's unscaled depth,
    put the points off the surfaces."""
    scene_cfg, scene = _demo_scene(tmp_path, factor=32)
    exact_depth = exact_depth_source(scene_cfg, scene)
    assert exact_depth is not None
    assert exact_depth_source(replace(scene_cfg, kind="llff"), scene) is None
    height, width = scene.resolution
    cameras = scene.cameras
    for view_a, view_b in [(0, 3), (8, 12), (16, 9)]:
        depth_a, depth_b = exact_depth(view_a), exact_depth(view_b)
        assert depth_a.shape == (height, width)
        rays = pixel_rays(
            cameras.c2w[view_a].double(), cameras.intrinsics[view_a].double(), pixel_grid(height, width).double()
        )
        ray_length = rays.directions.norm(dim=-1)
        assert _agreeing(scene, rays, depth_a.flatten(), view_b, depth_b) > 0.6, (view_a, view_b)
        assert _agreeing(scene, rays, depth_a.flatten() * ray_length, view_b, depth_b) < 0.2  # distance along the ray
        assert _agreeing(scene, rays, depth_a.flatten() / scene.scale, view_b, depth_b) < 0.2  # the demo's own units


def test_scorer_reports_depth_in_the_scenes_own_units(tmp_path):
    """The scorer's depth errors: 0 for the exact depth, the best constant's for a constant, and RMSE
    in the demo's units (the normalised depth divided by the scene scale)."""
    from pola_gnt.evaluation.scoring import ViewScorer

    scene_cfg, scene = _demo_scene(tmp_path, factor=32)
    exact_depth = exact_depth_source(scene_cfg, scene)
    scorer = ViewScorer(scene, metrics=None, protocol="standard", exact_depth=exact_depth)
    view = scene.test_ids[1]
    exact = exact_depth(view)
    scores, returned = scorer.depth_scores(view, exact.float())
    assert torch.equal(returned, exact)
    assert scores["depth_abs_rel"] < 1e-6 and scores["depth_rmse"] < 1e-5  # float32 rounding only
    own = exact / scene.scale
    flat = torch.full_like(exact, float(own.mean()) * scene.scale)
    scores, _ = scorer.depth_scores(view, flat)
    assert scores["depth_rmse"] == pytest.approx(scores["depth_baseline_rmse"], rel=1e-9)
    assert scores["depth_baseline_rmse"] == pytest.approx(float(own.std(unbiased=False)), rel=1e-9)
    # The scorer's units are the demo's own, in which the scene is built (the traced depth, unscaled).
    np.testing.assert_allclose(own.numpy(), demo_depth(view, scene.factor), rtol=1e-12)
