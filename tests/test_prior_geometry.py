"""The prior's geometry (issue 49): neighbouring rays aggregated on their depth planes, the read-out
composited front to back, the prior's spread as an input of the network, and training rays drawn as
patches. Each mechanism against a naive reference, with a control that
shows the comparison can fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import TINY_OVERRIDES, net_settings
from helpers.networks import perturbed_quick_net, random_source_views

from pola_gnt.core.errors import UserError
from pola_gnt.data.datamodule import TrainSteps
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.geometry.rays import RayGrid, patch_pixels, pixel_grid, pixel_rays
from pola_gnt.model.gnt import GNT, front_to_back_weights
from pola_gnt.model.inference import FastRenderNetwork
from pola_gnt.model.neighbours import aggregate_spread, box_mean
from pola_gnt.model.renderer import ImageRays, render_image, render_rays
from pola_gnt.model.sampler import DepthSampler, sample_depths
from pola_gnt.runs.config.app import compose_config
from pola_gnt.runs.config.read import read_run_settings

WINDOWS = (0.0, 0.05, 0.1)


def _naive_box_mean(values: np.ndarray, radius: int) -> np.ndarray:
    """The mean over the clipped square around each ray, one ray at a time (fp64)."""
    patches, rows, cols, _ = values.shape
    out = np.empty_like(values, dtype=np.float64)
    for p in range(patches):
        for r in range(rows):
            for c in range(cols):
                window = values[p, max(0, r - radius) : r + radius + 1, max(0, c - radius) : c + radius + 1]
                out[p, r, c] = window.reshape(-1, values.shape[-1]).mean(axis=0)
    return out


@pytest.mark.parametrize("radius", [0, 1, 3, 9])
def test_box_mean_is_the_mean_over_the_clipped_window(radius):
    values = torch.rand(2, 7, 9, 3, generator=torch.Generator().manual_seed(0))
    expected = _naive_box_mean(values.double().numpy(), radius)
    assert np.allclose(box_mean(values, radius).numpy(), expected, atol=1e-6)
    if radius:  # control: a zero-padded window (divided by its full size) differs at the edges
        padded = torch.nn.functional.avg_pool2d(
            values.permute(0, 3, 1, 2), 2 * radius + 1, stride=1, padding=radius, count_include_pad=True
        ).permute(0, 2, 3, 1)
        assert not np.allclose(padded.numpy(), expected, atol=1e-3)


def test_aggregated_spread_is_the_mean_of_its_windows_in_ray_order():
    grid = RayGrid(patches=2, rows=6, cols=5, image_size=20)
    spread = torch.rand(grid.rays, 4, generator=torch.Generator().manual_seed(1))
    radii = grid.radii(WINDOWS)
    assert radii == [0, 1, 2]
    planes = spread.reshape(2, 6, 5, 4).double().numpy()
    expected = sum(_naive_box_mean(planes, r) for r in radii) / len(radii)
    got = aggregate_spread(spread, grid, WINDOWS)
    assert np.allclose(got.reshape(2, 6, 5, 4).numpy(), expected, atol=1e-6)
    constant = torch.full((grid.rays, 4), 0.25)
    assert torch.allclose(aggregate_spread(constant, grid, WINDOWS), constant)  # a flat cost stays flat
    with pytest.raises(ValueError, match="the grid holds 60"):
        aggregate_spread(spread[:-1], grid, WINDOWS)


def test_neighbours_recover_a_plane_that_each_ray_alone_misses():
    """What the aggregation is for: on a fronto-parallel wall every ray's cost has its minimum at the wall's
    plane plus noise as large as the contrast (a textureless wall); alone, most rays pick a wrong plane,
    aggregated over their neighbours nearly all pick the right one."""
    generator = torch.Generator().manual_seed(2)
    grid, planes, wall = RayGrid(1, 32, 32, 32), 16, 5
    contrast = (torch.arange(planes) - wall).abs().float() * 0.01
    spread = contrast + 0.05 * torch.rand(grid.rays, planes, generator=generator)
    alone = (spread.argmin(dim=-1) == wall).float().mean()
    together = (aggregate_spread(spread, grid, (0.1, 0.2)).argmin(dim=-1) == wall).float().mean()
    assert alone < 0.5 < 0.95 < together


def test_front_to_back_weights_let_the_first_consistent_sample_hide_those_behind():
    scores = torch.tensor([[-10.0, 0.0, -0.1, 0.0], [-0.5, -1.0, 0.0, float("-inf")]])
    weights = front_to_back_weights(scores, temperature=0.5)
    alpha = torch.exp((scores - scores.amax(dim=-1, keepdim=True)) / 0.5)
    expected = torch.zeros_like(alpha)
    for ray in range(2):
        light = 1.0
        for sample in range(4):
            expected[ray, sample] = alpha[ray, sample] * light
            light *= 1 - alpha[ray, sample]
    assert torch.allclose(weights, expected)
    assert torch.allclose(weights.sum(dim=-1), torch.ones(2))  # the best sample's alpha is 1
    assert weights[0, 2:].abs().max() == 0  # behind the first best sample nothing counts ...
    assert weights[0, 1] > 0.99  # ... and the equally good sample behind it gets nothing (softmax: half)
    assert torch.softmax(scores, dim=-1)[0, 3] > 0.3  # control: the softmax weighs both alike


def _quick_net(seed: int = 0, **overrides) -> GNT:
    return perturbed_quick_net("pola_gnt", seed, **overrides)


def _sources(net: GNT, height: int = 36, width: int = 44, views: int = 4):
    return random_source_views(net, height, width, views, seed=3)


@pytest.mark.parametrize("precision", ["exact", "fp32"])
def test_a_render_with_neighbours_is_one_pass_over_the_whole_image_in_any_tiles(precision):
    """The renderer's two passes (the prior of every tile, aggregated over the whole image, then the network
    per tile) give the pixels of the network's one pass over all the image's rays as one grid, whatever the
    tiles; the aggregation changes them (control)."""
    net = _quick_net(readout_neighbour_windows=WINDOWS)
    sources, intrinsics = _sources(net)
    height, width, sampler = 36, 44, DepthSampler(8)
    network = net if precision == "exact" else FastRenderNetwork(net, torch.float32)
    images = [
        render_image(network, torch.eye(4), intrinsics, height, width, sources, (1.0, 12.0), sampler, chunk)
        for chunk in (300, 2000)
    ]
    for image in images[1:]:
        assert torch.equal(image.rgb, images[0].rgb) and torch.equal(image.depth, images[0].depth)
    rays = pixel_rays(torch.eye(4), intrinsics, pixel_grid(height, width))
    with torch.inference_mode():
        whole = net(rays, sampler(rays, (1.0, 12.0)), sources, ImageRays(height, width).grid)
    assert torch.allclose(images[0].rgb.reshape(-1, 3), whole.rgb.clamp(0, 1), atol=1e-5)
    assert torch.allclose(images[0].depth.reshape(-1), whole.depth, atol=1e-4)
    alone = render_image(_quick_net(), torch.eye(4), intrinsics, height, width, sources, (1.0, 12.0), sampler, 2000)
    assert not torch.allclose(alone.depth, images[0].depth, atol=1e-3)  # control: each ray alone


def test_a_render_with_neighbours_counts_both_passes_in_its_progress():
    net = _quick_net(readout_neighbour_windows=WINDOWS)
    sources, intrinsics = _sources(net)
    rays = pixel_rays(torch.eye(4), intrinsics, pixel_grid(36, 44))
    told: list[tuple[int, int]] = []
    render_rays(
        net, rays, sources, (1.0, 12.0), DepthSampler(8), 300, progress=lambda d, t: told.append((d, t)),
        image=ImageRays(36, 44),
    )  # fmt: skip
    assert told[-1] == (2 * 1584, 2 * 1584) and [d for d, _ in told] == sorted(d for d, _ in told)
    assert told[5] == (1584, 3168)  # the prior's pass of 6 chunks first


def test_the_agreement_input_starts_at_zero_and_learns():
    """The spread as an input of the point tokens, zero-initialised: at first the same render as without it
    (the old checkpoints' network), and a gradient reaches it."""
    with_input, without = _quick_net(readout_agreement_input=True), _quick_net()
    without.load_state_dict(with_input.state_dict(), strict=False)
    sources, intrinsics = _sources(with_input)
    rays = pixel_rays(torch.eye(4), intrinsics, pixel_grid(6, 8) * 3)
    depths = sample_depths(1.0, 12.0, len(rays), 12, jitter=False)
    out = with_input(rays, depths, sources)
    assert torch.allclose(out.rgb, without(rays, depths, sources).rgb, atol=1e-6)
    out.rgb.sum().backward()
    assert with_input.agreement_embedding is not None
    assert with_input.agreement_embedding.weight.grad is not None
    assert with_input.agreement_embedding.weight.grad.abs().sum() > 0


def test_patch_pixels_and_shared_depth_planes():
    tops, lefts = torch.tensor([0, 2]), torch.tensor([1, 0])
    assert patch_pixels(tops, lefts, 2, width=5).tolist() == [1, 2, 6, 7, 10, 11, 15, 16]
    rays = pixel_rays(torch.eye(4), torch.eye(3), torch.zeros(8, 2))
    depths = DepthSampler(6)(rays, (1.0, 5.0), seed=3, grid=RayGrid(2, 2, 2, 5))
    assert torch.equal(depths[:4], depths[:1].expand(4, 6)) and torch.equal(depths[4:], depths[4:5].expand(4, 6))
    assert not torch.equal(depths[0], depths[4])  # each patch its own jitter
    one_by_one = DepthSampler(6)(rays, (1.0, 5.0), seed=3)
    assert not torch.equal(one_by_one[0], one_by_one[1])  # control: without a grid, each ray its own


def test_training_steps_draw_their_rays_as_patches(fern_dir):
    overrides = [*TINY_OVERRIDES, "data.ray_patch_size=4", "data.rays_per_step=40", "data.val_rays=16"]
    settings = read_run_settings(compose_config(*overrides))
    scene = load_scene(settings.scene, settings.data)
    step = TrainSteps(scene, settings.data, n_steps=1, seed=0, rank=0)[0].targets[0]
    assert step.grid is not None and (step.grid.patches, step.grid.rows, step.grid.cols) == (2, 4, 4)
    assert len(step.rays) == 32 and step.grid.image_size == max(scene.resolution)
    directions = step.rays.directions.reshape(2, 4, 4, 3)
    steps_right = directions[:, :, 1:, 0] - directions[:, :, :-1, 0]  # neighbours a pixel apart, row by row
    assert torch.allclose(steps_right, steps_right[:, :1, :1].expand_as(steps_right), atol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["data.ray_patch_size=100"], "data.rays_per_step: 512 rays hold no 100 x 100 patch"),
        (["data.ray_patch_size=-1"], "data.ray_patch_size"),
        (["model.net.readout_neighbour_windows=[0,0.7]"], "model.net.readout_neighbour_windows[1]"),
        (
            ["model.net.readout_consistency_prior=0", "model.net.readout_neighbour_windows=[0.01]"],
            "model.net.readout_neighbour_windows: works on the consistency prior's spread, which is off",
        ),
        (["model.net.readout_composite_share=2"], "model.net.readout_composite_share"),
    ],
)
def test_bad_geometry_settings_are_one_user_error(overrides, fragment):
    with pytest.raises(UserError) as error:
        read_run_settings(compose_config("experiment=quick", "trainer=cpu", *overrides))
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_the_mechanisms_are_off_by_default():
    settings = net_settings()
    assert not settings.uses_neighbours
    assert settings.readout_composite_temperature == 0 and not settings.readout_agreement_input
