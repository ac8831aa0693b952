"""The read-out's consistency prior in the bf16 render network (`model.consistency_prior`): its fused
kernel (`model.render_kernels.prior_statistics`) against the PyTorch form run in float64, with every
case the kernel branches on (levels from the image or above it, features, angle weights, a feature
read at a working scale, points seen by no view, by one, by several); and the view-major form against
the network's own statistics, so the bf16 network renders the prior the network was trained with."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers.kernel_calls import count_kernel_calls
from helpers.networks import perturbed_quick_net

from pola_gnt.geometry.projection import pixels_to_grid, project_points, relative_directions
from pola_gnt.geometry.rays import pixel_grid, pixel_rays, points_along_rays
from pola_gnt.model import render_kernels
from pola_gnt.model.consistency_prior import (
    ConsistencyFeatures,
    FeatureRead,
    PriorImageCache,
    colour_pyramid,
    view_major_statistics,
    working_images,
    working_pyramid,
)
from pola_gnt.model.gnt import GNT, SourceViews, gather_source_samples, source_colour_statistics
from pola_gnt.model.sampler import sample_depths
from tests.helpers.config import net_settings

pytestmark = pytest.mark.skipif(not render_kernels.available(), reason="no C++ compiler for the render kernels")

VIEWS, HEIGHT, WIDTH, POINTS = 5, 23, 31, 300


@pytest.fixture
def kernel_calls(monkeypatch):
    """Calls of the render kernels' operators during the test: a kernel test fails where its PyTorch
    form ran instead (`helpers.kernel_calls`)."""
    return count_kernel_calls(monkeypatch, "pola_gnt_render")


def _inputs(features: bool, angles: bool, seed: int = 0) -> dict:
    """Random maps and reads: colours of 4 levels, unit-length features at a quarter of the size, grid
    points inside and up to half the image beyond its edges, visibility that leaves some points unseen
    and some seen once."""
    generator = torch.Generator().manual_seed(seed)
    colours = torch.rand(VIEWS, 12, HEIGHT, WIDTH, generator=generator).contiguous(memory_format=torch.channels_last)
    grid = torch.rand(VIEWS, POINTS, 2, generator=generator) * 3.0 - 1.5
    visible = torch.rand(VIEWS, POINTS, generator=generator) > 0.35
    visible[:, :10] = False  # seen by no view
    visible[:, 10:20] = False
    visible[2, 10:20] = True  # seen by one view
    maps = F.normalize(torch.randn(VIEWS, 16, 6, 8, generator=generator), dim=1) if features else None
    cosines = torch.rand(POINTS, VIEWS, generator=generator) * 0.2 + 0.8 if angles else None
    return {"colours": colours, "grid": grid, "visible": visible, "features": maps, "cosines": cosines}


def _fp64(inputs: dict) -> dict:
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}


@pytest.mark.parametrize("first_level", [0, 1], ids=["image is level 0", "levels above the image"])
@pytest.mark.parametrize("features", [False, True], ids=["colour", "features"])
@pytest.mark.parametrize("angles", [False, True], ids=["mean", "angle weights"])
@pytest.mark.parametrize("scale", [1.0, 2.0], ids=["own scale", "working scale 2"])
def test_the_prior_kernel_is_its_pytorch_form(kernel_calls, first_level, features, angles, scale):
    """The kernel (float32) against `view_major_statistics` in float64, to float32 rounding."""
    inputs = _inputs(features, angles)
    options = {
        "first_level": first_level,
        "feature_read": FeatureRead(4.0, 3.0, scale),
        "feature_weight": 0.3,
        "temperature": 0.25 if angles else 0.0,
    }
    with torch.inference_mode():
        got = render_kernels.prior_statistics(**inputs, **options)
        expected = view_major_statistics(**_fp64(inputs), **options)
    assert kernel_calls == {"prior_statistics": 1}
    for name, a, b in zip(("mean", "spread", "rgb"), got, expected, strict=True):
        assert a.dtype == torch.float32 and a.shape == b.shape
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-6, msg=name)
    mean, spread, _ = expected
    assert torch.equal(mean[:10], torch.zeros_like(mean[:10]))  # seen by no view: no colour ...
    # ... and, as a point seen once, the largest spread: 1/2 per colour level, 1 for the features.
    fallback = 0.5 + (0.3 if features else 0.0)
    torch.testing.assert_close(spread[:20], torch.full_like(spread[:20], fallback))


def test_the_prior_kernel_test_can_fail():
    """The control: reading half a pixel off (a grid shifted by half a pixel) is far outside the tolerance."""
    inputs = _inputs(True, True)
    shifted = {**inputs, "grid": inputs["grid"] + torch.tensor([1.0 / (WIDTH - 1), 0.0])}
    options = {"first_level": 0, "feature_read": FeatureRead(4.0, 3.0), "feature_weight": 0.3, "temperature": 0.25}
    with torch.inference_mode():
        got = render_kernels.prior_statistics(**shifted, **options)
        expected = view_major_statistics(**_fp64(inputs), **options)
    assert (got[1].double() - expected[1]).abs().max() > 1e-2


@pytest.mark.parametrize("levels", [1, 4])
@pytest.mark.parametrize("angles", [0.0, 0.25], ids=["mean", "angle weights"])
def test_the_view_major_form_is_the_networks_statistics(levels, angles):
    """`view_major_statistics` of a rig's samples equals the network's `source_colour_statistics` of the
    same samples (its gather, its layout): the render network's prior is the trained one."""
    generator = torch.Generator().manual_seed(3)
    height, width, views = 20, 26, 4
    intrinsics = torch.tensor([[20.0, 0.0, width / 2], [0.0, 20.0, height / 2], [0.0, 0.0, 1.0]])
    c2w = torch.eye(4).repeat(views, 1, 1)
    c2w[:, :2, 3] = (torch.rand(views, 2, generator=generator) - 0.5) * 1.5
    images = torch.rand(views, 3, height, width, generator=generator)
    sources = SourceViews(images, images.new_zeros(views, 2, 5, 7), c2w, intrinsics.expand(views, 3, 3).clone())
    rays = pixel_rays(torch.eye(4), intrinsics, pixel_grid(height, width))
    points = points_along_rays(rays, sample_depths(1.0, 9.0, len(rays), 10, jitter=False))
    gathered = gather_source_samples(points, rays.origins, sources, colour_levels=levels)
    mean, spread = source_colour_statistics(gathered, 0.0, angles)
    projection = project_points(points, c2w, sources.intrinsics, height, width, edge_margin=0.5)
    colours = torch.cat([images, colour_pyramid(images, levels)], dim=1)
    got_mean, got_spread, rgb = view_major_statistics(
        colours,
        pixels_to_grid(projection.pixels, height, width).flatten(1, 2),
        projection.visible.flatten(1),
        None,
        gathered.rel_dirs[..., 3].flatten(0, 1),
        0,
        FeatureRead(1.0, 0.0),
        0.0,
        angles,
    )
    assert not gathered.visible.all() and gathered.visible.any()
    assert torch.equal(projection.visible.flatten(1).t(), gathered.visible.flatten(0, 1))
    torch.testing.assert_close(got_mean, mean.flatten(0, 1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_spread, spread.flatten(0, 1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rgb.permute(2, 0, 1), gathered.values[..., :3].flatten(0, 1), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# The working size: a network trained at one resolution sees the same working images at another


@pytest.mark.parametrize(
    ("size", "height", "width", "factor"),
    [
        (0, 756, 1008, 1),
        (504, 378, 504, 1),
        (504, 756, 1008, 2),
        (504, 724, 980, 2),
        (504, 744, 1004, 2),
        (504, 1512, 2016, 4),
        (504, 300, 400, 1),
        (504, 1120, 504, 2),
        (504, 200, 150, 1),
    ],
)
def test_the_working_factor_brings_the_longer_side_nearest_the_working_size(size, height, width, factor):
    settings = replace(net_settings(), working_size=size)
    assert settings.working_factor(height, width) == factor


def test_working_images_are_means_of_whole_squares():
    images = torch.arange(2 * 3 * 5 * 7, dtype=torch.float32).reshape(2, 3, 5, 7)
    reduced = working_images(images, 2)
    assert reduced.shape == (2, 3, 3, 4)
    assert reduced[1, 2, 0, 0] == images[1, 2, :2, :2].mean()
    assert reduced[0, 1, 2, 3] == images[0, 1, 4, 6]  # the last cell of both odd sides: the one pixel it covers
    assert reduced[0, 0, 2, 1] == images[0, 0, 4, 2:4].mean()
    assert working_images(images, 1) is images


def _doubled(images: torch.Tensor) -> torch.Tensor:
    """Each pixel as a 2 x 2 square: images at twice the resolution whose working images at factor 2 are
    exactly the originals."""
    return images.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)


def test_the_working_pyramid_at_twice_the_resolution_is_the_pyramid_of_the_working_image():
    """Every level of the working image, upsampled to the full size; at factor 1 the pyramid above the image."""
    images = torch.rand(2, 3, 12, 16, generator=torch.Generator().manual_seed(5))
    pyramid = working_pyramid(_doubled(images), 3, 2)
    assert pyramid.shape == (2, 9, 24, 32)
    levels = [images, F.avg_pool2d(images, 2), F.avg_pool2d(images, 4)]
    for index, level in enumerate(levels):
        upsampled = F.interpolate(level, size=(24, 32), mode="bilinear", align_corners=False)
        torch.testing.assert_close(pyramid[:, 3 * index : 3 * index + 3], upsampled)
    assert torch.equal(working_pyramid(images, 3, 1), colour_pyramid(images, 3))


# The shipped checkpoints' read-out (experiment=pretrain): the prior's pyramid, features and angle weights,
# the source colour alone, the learned scores bounded.
SHIPPED_READOUT = {
    "readout_consistency_prior": 160.0,
    "readout_consistency_levels": 4,
    "readout_consistency_features": 0.3,
    "readout_consistency_feature_dims": 16,
    "readout_view_angle_weighting": 0.25,
    "readout_source_colour": True,
    "readout_colour_residual": False,
    "readout_score_bound": 2.0,
}


def _photos(views: int, height: int, width: int, scale: int) -> torch.Tensor:
    """Photos of one smooth scene at `scale` times `height` x `width`: pixel (u, v) of the scaled photo
    shows the scene at (u, v) / scale of the base one (the cameras' convention: the principal point at
    the image centre, integer pixel coordinates; so LLFF's images_4 and images_8 relate)."""
    generator = torch.Generator().manual_seed(7)
    frequencies = torch.rand(views, 3, 4, 2, generator=generator) * 0.5
    phases = torch.rand(views, 3, 4, generator=generator) * 6.3
    v, u = torch.meshgrid(torch.arange(height * scale) / scale, torch.arange(width * scale) / scale, indexing="ij")
    waves = torch.sin(
        frequencies[..., 0, None, None] * u + frequencies[..., 1, None, None] * v + phases[..., None, None]
    )
    return 0.5 + 0.12 * waves.sum(dim=2)  # [views, 3, H, W] in [0, 1]


def _scene(net: GNT, scale: int, working_size: int):
    """Four source views of `_photos` at `scale` times 48 x 64 (focal lengths and centres scaled), and the
    network at that working size."""
    height, width, views = 48, 64, 4
    focal = 58.0 * scale
    intrinsics = torch.tensor([[focal, 0.0, width * scale / 2], [0.0, focal, height * scale / 2], [0.0, 0.0, 1.0]])
    c2w = torch.eye(4).repeat(views, 1, 1)
    c2w[:, :2, 3] = (torch.rand(views, 2, generator=torch.Generator().manual_seed(8)) - 0.5) * 0.6
    net.settings = replace(net.settings, working_size=working_size)
    with torch.no_grad():
        return net.source_views(_photos(views, height, width, scale), c2w, intrinsics.expand(views, 3, 3).clone())


def test_a_network_at_a_working_size_renders_twice_the_resolution_as_it_renders_its_own():
    """The shipped use (its read-out): a network trained on 64-pixel-wide sources renders the same scene's sources
    at twice the resolution. With the working size (40) it sees the same working images (encoder input,
    pyramid, features), so the same rays render nearly the same colour and depth as at the base
    resolution; without it (0) the encoder and the prior see other images, far more different (the
    control). What still differs with it: the colours are read at the full resolution, and the working
    image is an area mean, a quarter of a base pixel off the base photo's samples (as LLFF's images_8 are
    off its images_4)."""
    net = perturbed_quick_net("pola_gnt", **SHIPPED_READOUT).eval()
    rays = pixel_rays(
        torch.eye(4), torch.tensor([[58.0, 0.0, 32.0], [0.0, 58.0, 24.0], [0.0, 0.0, 1.0]]), pixel_grid(48, 64)
    )
    depths = sample_depths(1.0, 9.0, len(rays), 16, jitter=False)
    errors = {}
    with torch.inference_mode():
        for size in (64, 0):
            base = net(rays, depths, _scene(net, 1, size))
            doubled_sources = _scene(net, 2, size)
            if size:
                assert net.working_factor(doubled_sources.images) == 2
            doubled = net(rays, depths, doubled_sources)
            errors[size] = (
                (doubled.rgb - base.rgb).abs().mean().item(),
                (doubled.depth - base.depth).abs().mean().item(),
            )
    assert errors[64][0] < errors[0][0] / 3 and errors[64][1] < errors[0][1] / 3, errors


@pytest.mark.parametrize("working_size", [0, 32], ids=["own size", "working factor 2"])
def test_the_prior_kept_per_image_is_the_prior_of_the_set(lpips_alex_weights, working_size):
    """`GNT.prior_image` of each view, kept (`PriorImageCache`) and given to a set of views
    (`SourceViews.keep_prior_images`), is what the set computes itself, bit for bit: the pyramid and the
    features are per image, and the features' projection comes from the set's summed moments."""
    net = perturbed_quick_net("pola_gnt", **SHIPPED_READOUT, working_size=working_size, encoder_input_scale=1.0)
    net.consistency_features = ConsistencyFeatures(2, str(lpips_alex_weights), dims=16)
    images = torch.rand(5, 3, 40, 64, generator=torch.Generator().manual_seed(9))
    cameras = torch.eye(4).repeat(5, 1, 1), torch.eye(3).repeat(5, 1, 1)
    cache = PriorImageCache()
    computed: list[int] = []

    def prior(view: int):
        computed.append(view)
        return net.prior_image(images[view : view + 1])

    factor = net.working_factor(images)
    for views in ([0, 1, 2, 3], [2, 3, 4, 0]):
        fresh = SourceViews(images[views], images.new_zeros(4, 2, 3, 3), cameras[0][views], cameras[1][views])
        kept = SourceViews(images[views], images.new_zeros(4, 2, 3, 3), cameras[0][views], cameras[1][views])
        kept.keep_prior_images(net, [cache.get(view, lambda view=view: prior(view)) for view in views])
        assert torch.equal(kept.coarse_colours(4, factor), fresh.coarse_colours(4, factor))
        extractor = net.consistency_features
        assert torch.equal(kept.consistency_maps(extractor, factor), fresh.consistency_maps(extractor, factor))
    assert computed == [0, 1, 2, 3, 4]  # each image once
    small = PriorImageCache(max_mb=1.5 * cache.entries[0].nbytes / 2**20)  # room for one image
    small.get(0, lambda: prior(0)), small.get(1, lambda: prior(1))
    assert list(small.entries) == [1]


def test_the_sample_geometry_kernel_is_project_points_and_relative_directions(kernel_calls):
    """`render_kernels.sample_geometry` (float32) against `project_points`, `pixels_to_grid` and
    `relative_directions` run in float64: the grid to float32 rounding, the same visibility (points in
    front and behind, inside, outside and around the edges), the directions to float32 rounding."""
    generator = torch.Generator().manual_seed(11)
    rays, samples, views, height, width = 40, 16, 5, 30, 44
    intrinsics = torch.tensor([[38.0, 0.0, width / 2], [0.0, 38.0, height / 2], [0.0, 0.0, 1.0]]).expand(views, 3, 3)
    angles = (torch.rand(views, generator=generator) - 0.5) * 0.6
    c2w = torch.eye(4).repeat(views, 1, 1)
    c2w[:, 0, 0], c2w[:, 0, 2], c2w[:, 2, 0], c2w[:, 2, 2] = angles.cos(), angles.sin(), -angles.sin(), angles.cos()
    c2w[:, :3, 3] = (torch.rand(views, 3, generator=generator) - 0.5) * 2.0
    origins = (torch.rand(rays, 3, generator=generator) - 0.5) * 0.5
    directions = torch.cat([(torch.rand(rays, 2, generator=generator) - 0.5) * 2.5, torch.ones(rays, 1)], dim=1)
    depths = torch.linspace(-1.0, 8.0, samples)  # some behind every camera
    points = origins[:, None, :] + depths[None, :, None] * directions[:, None, :]
    with torch.inference_mode():
        grid, visible, view_mask, rel_dirs = render_kernels.sample_geometry(
            points, origins, c2w, intrinsics.clone(), height, width
        )
    assert kernel_calls == {"sample_geometry": 1}
    projection = project_points(points.double(), c2w.double(), intrinsics.double(), height, width)
    expected_grid = pixels_to_grid(projection.pixels, height, width).flatten(1, 2)
    assert visible.any() and not visible.all() and (projection.depth < 0).any()
    assert torch.equal(visible, projection.visible.flatten(1)) and torch.equal(view_mask, visible.t())
    # where seen (elsewhere nothing reads it; near a camera's plane its pixels run to 1e4 and beyond)
    torch.testing.assert_close(grid.double()[visible], expected_grid[visible], rtol=1e-5, atol=1e-5)
    expected_dirs = relative_directions(points.double(), origins[:, None, :].double(), c2w[:, :3, 3].double())
    torch.testing.assert_close(rel_dirs.double(), expected_dirs, rtol=1e-5, atol=1e-5)
