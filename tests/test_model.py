"""Model tests on a tiny synthetic rig: encoder shapes, gathering, masking, read-out, autocast.

Rig: OpenCV cameras looking down +z. The target camera sits at the origin; source cameras sit on a
small square either at z = 0 (beside the target) or at z = 1.5 (ahead of it, so that samples with
depth < 1.5 are behind every source camera).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from helpers import net_settings

from pola_gnt.core.errors import UserError
from pola_gnt.geometry.projection import project_points
from pola_gnt.geometry.rays import Rays, pixel_rays, points_along_rays
from pola_gnt.model import GNT, ImageEncoder, SourceViews
from pola_gnt.model.gnt import gather_source_samples, masked_max, sinusoidal_encoding, source_colour_statistics
from pola_gnt.model.sampler import DepthSampler
from pola_gnt.model.settings import EncoderSettings

HEIGHT, WIDTH, FOCAL = 24, 32, 30.0
MODEL_KINDS = {"gnt": ("subtraction", "softmax"), "pola_gnt": ("pola", "pola")}
TINY_ENCODER = EncoderSettings(
    stage_channels=(8, 16, 16),
    stage_blocks=(1, 1, 1),
    feature_channels=32,
    backbone="none",
    backbone_weights=None,
    backbone_trainable_layers=0,
    feature_cache_mb=0,
)
# GNT's encoder (conf/model/gnt.yaml)
FULL_ENCODER = replace(TINY_ENCODER, stage_channels=(64, 128, 256), stage_blocks=(3, 4, 6))


def intrinsics() -> torch.Tensor:
    return torch.tensor([[FOCAL, 0.0, WIDTH / 2], [0.0, FOCAL, HEIGHT / 2], [0.0, 0.0, 1.0]])


def square_rig(z: float, half_side: float = 0.2) -> torch.Tensor:
    """Four cameras looking down +z at the corners of a square in the plane `z`: `[4, 4, 4]`."""
    c2w = torch.eye(4).repeat(4, 1, 1)
    c2w[:, 0, 3] = torch.tensor([-1.0, 1.0, -1.0, 1.0]) * half_side
    c2w[:, 1, 3] = torch.tensor([-1.0, -1.0, 1.0, 1.0]) * half_side
    c2w[:, 2, 3] = z
    return c2w


def make_sources(c2w: torch.Tensor, seed: int = 0, feature_size: tuple[int, int] | None = None) -> SourceViews:
    """Random images and random features (default: same size as the images) for cameras `c2w`."""
    generator = torch.Generator().manual_seed(seed)
    n_views = c2w.shape[0]
    height, width = feature_size or (HEIGHT, WIDTH)
    return SourceViews(
        images=torch.rand(n_views, 3, HEIGHT, WIDTH, generator=generator),
        features=torch.randn(n_views, 32, height, width, generator=generator),
        c2w=c2w,
        intrinsics=intrinsics().expand(n_views, 3, 3),
    )


def target_rays(pixels: list[tuple[float, float]]) -> Rays:
    return pixel_rays(torch.eye(4), intrinsics(), torch.tensor(pixels))


def tiny_model(kind: str, seed: int = 0) -> GNT:
    torch.manual_seed(seed)
    view_attention, ray_attention = MODEL_KINDS[kind]
    settings = net_settings(
        view_attention=view_attention, ray_attention=ray_attention, width=32, n_blocks=2, heads=4, encoder=TINY_ENCODER
    )
    return GNT(settings).eval()


# --------------------------------------------------------------------------------------------------
# Encoder


@pytest.mark.parametrize("size", [(24, 32), (25, 35)])
def test_encoder_outputs_32_channels_at_quarter_resolution(size):
    encoder = ImageEncoder(TINY_ENCODER)
    features = encoder(torch.rand(2, 3, *size))
    assert features.shape == (2, 32, math.ceil(size[0] / 4), math.ceil(size[1] / 4))


def test_full_encoder_has_about_9m_parameters():
    n_params = sum(p.numel() for p in ImageEncoder(FULL_ENCODER).parameters())
    assert 8.5e6 < n_params < 9.5e6


def test_encoder_rejects_too_small_images():
    with pytest.raises(UserError, match="model.net.encoder: input"):
        ImageEncoder(TINY_ENCODER)(torch.rand(1, 3, 16, 32))


def test_gnt_transformer_parameter_count_matches_reference():
    counts = GNT(net_settings("gnt")).parameter_counts()  # GNT's own config: width 64, 4 blocks
    assert 0.42e6 < counts["transformer"] < 0.46e6  # GNT reference: about 0.44 M at depth 4


# --------------------------------------------------------------------------------------------------
# Building blocks


def test_sinusoidal_encoding_has_63_numbers_for_3d_input_at_10_frequencies():
    x = torch.tensor([[0.5, -1.0, 2.0]])
    code = sinusoidal_encoding(x, 10)
    assert code.shape == (1, 63)
    assert torch.equal(code[:, :3], x)
    assert torch.allclose(code[:, 3 + 3 * 4 : 3 + 3 * 5], torch.sin(x * 16.0))  # 5th frequency is 2^4


def test_masked_max_ignores_masked_views_and_gives_zeros_when_none_visible():
    tokens = torch.tensor([[[1.0, 5.0], [3.0, -2.0], [9.0, 9.0]], [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]])
    mask = torch.tensor([[True, True, False], [False, False, False]])
    assert torch.equal(masked_max(tokens, mask), torch.tensor([[3.0, 5.0], [0.0, 0.0]]))


# --------------------------------------------------------------------------------------------------
# Gathering


def rotated_camera() -> torch.Tensor:
    """A camera turned 20 degrees about y and 10 about x, away from the origin."""
    a, b = math.radians(20), math.radians(10)
    rot_y = torch.tensor([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]])
    rot_x = torch.tensor([[1, 0, 0], [0, math.cos(b), -math.sin(b)], [0, math.sin(b), math.cos(b)]])
    c2w = torch.eye(4)
    c2w[:3, :3] = rot_y @ rot_x
    c2w[:3, 3] = torch.tensor([0.3, -0.2, 0.1])
    return c2w[None]


def point_seen_at(c2w: torch.Tensor, u: float, v: float, depth: float) -> torch.Tensor:
    """World point that camera `c2w` `[4, 4]` sees at pixel (u, v) and z-depth `depth`: `[3]`."""
    camera = torch.linalg.inv(intrinsics()) @ torch.tensor([u, v, 1.0]) * depth
    return c2w[:3, :3] @ camera + c2w[:3, 3]


@pytest.mark.parametrize("u, v", [(7, 5), (0, 0), (WIDTH - 1, HEIGHT - 1), (20, 13)])
def test_gather_reads_the_exact_pixel_a_point_projects_to(u, v):
    c2w = rotated_camera()
    sources = make_sources(c2w)
    point = point_seen_at(c2w[0], u, v, depth=2.5)
    gathered = gather_source_samples(point[None, None], torch.zeros(1, 3), sources)
    assert gathered.values.shape == (1, 1, 1, 35)
    assert gathered.visible.item()
    values = gathered.values[0, 0, 0]
    assert torch.allclose(values[:3], sources.images[0, :, v, u], atol=1e-4)
    assert torch.allclose(values[3:], sources.features[0, :, v, u], atol=1e-4)


EDGE = 0.5 - 1e-3  # just inside the half-pixel strip beyond the outer pixel centres


@pytest.mark.parametrize(
    "u, v, row, col",
    [
        (-EDGE, 5, 5, 0),  # left strip
        (WIDTH - 1 + EDGE, 7, 7, WIDTH - 1),  # right strip
        (10, -0.3, 0, 10),  # top strip
        (12, HEIGHT - 1 + EDGE, HEIGHT - 1, 12),  # bottom strip
        (-0.4, -0.45, 0, 0),  # corner
        (WIDTH - 0.6, HEIGHT - 0.8, HEIGHT - 1, WIDTH - 1),  # opposite corner
    ],
)
def test_gather_reads_the_edge_pixel_in_the_half_pixel_strip(u, v, row, col):
    """A point on an edge pixel's area but outside the outer pixel centres is visible (pixel-area
    rule) and reads that edge pixel's colour and feature, not a blend with zero padding (which
    would read (1 - d) times it at a distance d beyond the centre: 0.5 of it at the image border)."""
    c2w = rotated_camera()
    sources = make_sources(c2w)
    sources.images = 0.5 + 0.5 * sources.images  # no dark pixels: a blend with black cannot pass
    point = point_seen_at(c2w[0], u, v, depth=2.5)
    gathered = gather_source_samples(point[None, None], torch.zeros(1, 3), sources)
    assert gathered.visible.item()
    values = gathered.values[0, 0, 0]
    assert torch.allclose(values[:3], sources.images[0, :, row, col], atol=1e-4)
    assert torch.allclose(values[3:], sources.features[0, :, row, col], atol=1e-4)


@pytest.mark.parametrize("u, v", [(-0.55, 5), (WIDTH - 0.45, 7), (10, -0.51), (12, HEIGHT - 0.4)])
def test_gather_masks_points_beyond_the_edge_pixels(u, v):
    c2w = rotated_camera()
    sources = make_sources(c2w)
    point = point_seen_at(c2w[0], u, v, depth=2.5)
    gathered = gather_source_samples(point[None, None], torch.zeros(1, 3), sources)
    assert not gathered.visible.item()
    assert torch.count_nonzero(gathered.values) == 0


def test_gather_reads_quarter_resolution_features_at_the_same_normalised_position():
    c2w = rotated_camera()
    sources = make_sources(c2w, feature_size=(HEIGHT // 4, WIDTH // 4))
    corners = [((0, 0), (0, 0)), ((WIDTH - 1, HEIGHT - 1), (-1, -1)), ((0, HEIGHT - 1), (-1, 0))]
    for (u, v), (row, col) in corners:
        point = point_seen_at(c2w[0], u, v, depth=3.0)
        features = gather_source_samples(point[None, None], torch.zeros(1, 3), sources).values[0, 0, 0, 3:]
        assert torch.allclose(features, sources.features[0, :, row, col], atol=1e-4)


def test_gather_zeroes_points_behind_the_camera():
    c2w = rotated_camera()
    sources = make_sources(c2w)
    # The mirror image of a point in front: projects inside the image, but from behind.
    in_front = point_seen_at(c2w[0], 10, 8, depth=2.0)
    behind = 2 * c2w[0, :3, 3] - in_front
    projection = project_points(behind[None], c2w, intrinsics()[None], HEIGHT, WIDTH)
    assert (projection.pixels[0, 0] >= 0).all() and projection.depth[0, 0] < 0  # inside, yet behind
    gathered = gather_source_samples(behind[None, None], torch.zeros(1, 3), sources)
    assert not gathered.visible.item()
    assert torch.count_nonzero(gathered.values) == 0


# --------------------------------------------------------------------------------------------------
# Forward, gradients, read-out


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_forward_shapes_finite_and_gradients_reach_encoder_and_transformer(kind):
    model = tiny_model(kind).train()
    c2w = square_rig(z=0.0)
    images = make_sources(c2w).images
    sources = model.source_views(images, c2w, intrinsics().expand(4, 3, 3))
    rays = target_rays([(5.0, 4.0), (16.0, 12.0), (25.5, 18.2)])
    depths = torch.linspace(2.0, 6.0, 8).expand(3, 8)

    out = model(rays, depths, sources)
    assert out.rgb.shape == (3, 3) and out.depth.shape == (3,)
    assert out.weights.shape == (3, 8) and out.seen.shape == (3, 8) and out.seen.dtype == torch.bool
    assert all(torch.isfinite(t).all() for t in (out.rgb, out.depth, out.weights))

    (out.rgb.square().sum() + out.depth.sum()).backward()
    # The read-out's score bias shifts every score of a ray alike, which the softmax ignores: its
    # gradient is 0 up to rounding, so it is not asked for.
    without_gradient = [
        name
        for name, p in model.named_parameters()
        if (p.grad is None or not p.grad.any()) and name != "readout.score.bias"
    ]
    assert without_gradient == []
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_weights_sum_to_one_over_seen_samples_and_depth_is_within_the_samples(kind):
    torch.manual_seed(1)
    model = tiny_model(kind)
    # Random read-out scores so the weights are not uniform.
    torch.nn.init.normal_(model.readout.score.weight, std=1.0)
    sources = make_sources(square_rig(z=1.5))
    rays = target_rays([(16.0, 12.0), (12.0, 9.0), (21.0, 15.0)])
    depths = torch.stack([torch.linspace(0.5, 6.0, 12), torch.linspace(1.0, 4.0, 12), torch.linspace(2.0, 40.0, 12)])

    with torch.no_grad():
        out = model(rays, depths, sources)
    # Rays 0 and 1 start behind the sources (z < 1.5): their first samples are unseen.
    assert out.seen.any(dim=-1).all() and not out.seen[:2, 0].any()
    assert torch.allclose(out.weights.sum(dim=-1), torch.ones(3))
    assert torch.count_nonzero(out.weights[~out.seen]) == 0
    assert out.weights[out.seen].std() > 1e-3  # not uniform: the check above is not trivial
    # The expected depth lies between the nearest and farthest *seen* sample (hence within all samples).
    nearest_seen = depths.masked_fill(~out.seen, float("inf")).min(dim=-1).values
    farthest_seen = depths.masked_fill(~out.seen, float("-inf")).max(dim=-1).values
    assert (out.depth >= nearest_seen - 1e-5).all() and (out.depth <= farthest_seen + 1e-5).all()


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_ray_seen_by_no_view_gets_uniform_weights_and_finite_output(kind):
    model = tiny_model(kind)
    sources = make_sources(square_rig(z=1.5))
    rays = target_rays([(16.0, 12.0), (16.0, 12.0)])
    depths = torch.stack([torch.linspace(0.3, 1.2, 6), torch.linspace(2.0, 5.0, 6)])  # ray 0 behind all
    with torch.no_grad():
        out = model(rays, depths, sources)
    assert not out.seen[0].any() and out.seen[1].all()
    assert torch.allclose(out.weights[0], torch.full((6,), 1 / 6))
    assert torch.isfinite(out.rgb).all() and torch.isfinite(out.depth).all()


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_bf16_autocast_forward_is_finite_and_close_to_fp32(kind):
    model = tiny_model(kind)
    sources = make_sources(square_rig(z=0.0))
    rays = target_rays([(5.0, 4.0), (16.0, 12.0)])
    depths = torch.linspace(2.0, 6.0, 8).expand(2, 8)
    with torch.no_grad():
        reference = model(rays, depths, sources)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(rays, depths, sources)
    assert torch.isfinite(out.rgb).all() and torch.isfinite(out.depth).all()
    assert out.rgb.dtype == torch.float32
    assert torch.equal(out.seen, reference.seen)  # geometry stays fp32 under autocast
    assert torch.allclose(out.rgb, reference.rgb, atol=0.1)


# --------------------------------------------------------------------------------------------------
# Masking: what no source view sees must not influence the output


def read_pixels(sources: SourceViews, points: torch.Tensor) -> torch.Tensor:
    """Bool `[views, H, W]`: pixels that bilinear reads of `points` `[n, 3]` touch, visible or not."""
    projection = project_points(points, sources.c2w, sources.intrinsics, HEIGHT, WIDTH)
    touched = torch.zeros(sources.c2w.shape[0], HEIGHT, WIDTH, dtype=torch.bool)
    for view in range(sources.c2w.shape[0]):
        for u, v in projection.pixels[view].tolist():
            for col in {math.floor(u), math.ceil(u)}:
                for row in {math.floor(v), math.ceil(v)}:
                    if 0 <= col < WIDTH and 0 <= row < HEIGHT:
                        touched[view, row, col] = True
    return touched


def perturbed(sources: SourceViews, where: torch.Tensor) -> SourceViews:
    """Sources whose images and (same-size) features change at the pixels `where` `[views, H, W]`."""
    region = where[:, None].float()
    return SourceViews(
        images=sources.images * (1 - region) + (1 - sources.images) * region,
        features=sources.features + 5.0 * region,
        c2w=sources.c2w,
        intrinsics=sources.intrinsics,
    )


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_sample_seen_by_no_view_does_not_affect_the_ray(kind):
    model = tiny_model(kind)
    sources = make_sources(square_rig(z=1.5))
    rays = target_rays([(20.0, 15.0)])
    # The first sample (depth 1.0) is behind every source camera (z = 1.5); the others are seen.
    depths = torch.tensor([[1.0, 2.5, 3.0, 3.6, 4.3, 5.0, 6.0]])
    with torch.no_grad():
        reference = model(rays, depths, sources)
    assert reference.seen.tolist() == [[False] + [True] * 6]

    points = rays.origins[:, None] + depths[..., None] * rays.directions[:, None]  # [1, samples, 3]
    read_by_unseen = read_pixels(sources, points[0, :1])
    read_by_seen = read_pixels(sources, points[0, 1:])
    garbage_only = read_by_unseen & ~read_by_seen
    assert garbage_only.any()  # the unseen sample projects (mirrored) into the images

    with torch.no_grad():
        # 1. What the unseen sample would read changes: the output must not.
        changed_reads = model(rays, depths, perturbed(sources, garbage_only))
        # 2. The unseen sample moves (still behind every source): its token changes through the
        #    positional code, but it is no key of the ray attention and has no read-out weight.
        moved_depths = depths.clone()
        moved_depths[0, 0] = 0.4
        moved = model(rays, moved_depths, sources)
        # Control: the same kind of change on what a seen sample reads does change the output.
        changed_seen = model(rays, depths, perturbed(sources, read_by_seen & ~read_by_unseen))

    for out in (changed_reads, moved):
        assert torch.allclose(out.rgb, reference.rgb, atol=1e-6)
        assert torch.allclose(out.depth, reference.depth, atol=1e-6)
        assert torch.allclose(out.weights, reference.weights, atol=1e-6)
    assert not torch.allclose(changed_seen.rgb, reference.rgb, atol=1e-4)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_view_invisible_to_every_sample_is_the_same_as_no_view(kind):
    model = tiny_model(kind)
    c2w = square_rig(z=0.0)
    # A fifth camera at the target looking backwards (-z): every sample is behind it.
    looking_back = torch.diag(torch.tensor([-1.0, 1.0, -1.0, 1.0]))
    with_extra = make_sources(torch.cat([c2w, looking_back[None]]), seed=3)
    without_extra = SourceViews(
        images=with_extra.images[:4],
        features=with_extra.features[:4],
        c2w=with_extra.c2w[:4],
        intrinsics=with_extra.intrinsics[:4],
    )
    rays = target_rays([(5.0, 4.0), (16.0, 12.0), (27.0, 20.0)])
    depths = torch.linspace(2.0, 6.0, 10).expand(3, 10)
    with torch.no_grad():
        out_with = model(rays, depths, with_extra)
        out_without = model(rays, depths, without_extra)
    assert (
        not gather_source_samples(
            rays.origins[:, None] + depths[..., None] * rays.directions[:, None], rays.origins, with_extra
        )
        .visible[..., 4]
        .any()
    )
    assert torch.allclose(out_with.rgb, out_without.rgb, atol=1e-5)
    assert torch.allclose(out_with.depth, out_without.depth, atol=1e-5)


def test_colour_spread_is_zero_where_views_agree_and_high_where_they_cannot_tell():
    from pola_gnt.model.gnt import GatheredSamples, source_colour_statistics

    values = torch.zeros(1, 4, 3, 5)  # [rays, samples, views, 3 + C]
    values[0, 0, :, :3] = torch.tensor([0.2, 0.4, 0.6])  # three views agree
    values[0, 1, :, :3] = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # they disagree
    values[0, 2, 0, :3] = 0.7  # one view only
    visible = torch.ones(1, 4, 3, dtype=torch.bool)
    visible[0, 2, 1:] = False
    visible[0, 3] = False  # no view
    values = values * visible[..., None]
    _, spread = source_colour_statistics(
        GatheredSamples(values=values, visible=visible, rel_dirs=torch.zeros(1, 4, 3, 4))
    )
    expected_disagreement = math.sqrt(2 / 9)  # std of (0, 1, 0) in every channel
    torch.testing.assert_close(spread, torch.tensor([[0.0, expected_disagreement, 0.5, 0.5]]))


def test_the_colour_pyramid_averages_squares_of_pixels():
    """Level k is the mean over 2^k x 2^k squares: a one-pixel checkerboard is uniform grey from level 1
    on, a constant image stays constant at every level, odd sides included (the last cell averages
    the pixels it covers, no zero padding), and level 0 (the image itself) is not repeated."""
    from pola_gnt.model.consistency_prior import colour_pyramid

    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(12), indexing="ij")
    checker = ((rows + cols) % 2).float().expand(2, 3, 8, 12)
    pyramid = colour_pyramid(checker, 3)
    assert pyramid.shape == (2, 6, 8, 12)
    torch.testing.assert_close(pyramid, torch.full_like(pyramid, 0.5))
    constant = torch.full((1, 3, 5, 7), 0.3)
    torch.testing.assert_close(colour_pyramid(constant, 4), torch.full((1, 9, 5, 7), 0.3))
    assert colour_pyramid(constant, 1).shape == (1, 0, 5, 7)


def textured_plane_views(
    height: int, width: int, plane_z: float, texture: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four cameras of `square_rig(0, 0.3)` (focal 0.8 width) looking at a plane at depth `plane_z`
    whose colour at world (x, y) in view v is `texture(x, y, v)` `[3, H, W]`: (intrinsics, c2w, images)."""
    focal = 0.8 * width
    camera = torch.tensor([[focal, 0.0, width / 2], [0.0, focal, height / 2], [0.0, 0.0, 1.0]])
    c2w = square_rig(z=0.0, half_side=0.3)
    rows, cols = torch.meshgrid(
        torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32), indexing="ij"
    )
    images = torch.zeros(4, 3, height, width)
    for view in range(4):
        x = (cols - camera[0, 2]) / focal * plane_z + c2w[view, 0, 3]
        y = (rows - camera[1, 2]) / focal * plane_z + c2w[view, 1, 3]
        images[view] = texture(x, y, view)
    return camera, c2w, images


def test_spread_over_blur_levels_finds_a_noisy_surface_that_pixels_miss():
    """A textured plane at z = 3 seen by four cameras whose images carry strong pixel noise (sigma 0.25):
    the depth where the views disagree least is on the plane for far more rays when the spread is
    measured on 4 levels of the blur pyramid (patches) than on the pixels alone, and it errs by half as
    much; with noise-free images both find the plane (the levels add no bias)."""
    height, width, plane_z = 48, 64, 3.0
    camera, c2w, clean = textured_plane_views(
        height,
        width,
        plane_z,
        lambda x, y, _: torch.stack(
            [0.5 + 0.5 * torch.sin(4 * x), 0.5 + 0.5 * torch.cos(3 * y), 0.5 + 0.5 * torch.sin(2 * (x + y))]
        ),
    )
    noisy = clean + 0.25 * torch.randn(clean.shape, generator=torch.Generator().manual_seed(0))
    pixels = torch.stack(torch.meshgrid(torch.arange(12.0, 52.0), torch.arange(10.0, 38.0), indexing="xy"), -1)
    rays = pixel_rays(torch.eye(4), camera, pixels.reshape(-1, 2))
    depths = torch.linspace(1.5, 6.0, 46).expand(len(rays), 46)  # 0.1 apart, one sample at 3.0
    points = rays.origins[:, None] + depths[..., None] * rays.directions[:, None]

    def depth_error(images: torch.Tensor, levels: int) -> tuple[float, float]:
        """The share of rays whose least-spread sample is the plane's neighbour, and the mean error."""
        sources = SourceViews(
            images=images, features=torch.zeros(4, 1, height, width), c2w=c2w, intrinsics=camera.expand(4, 3, 3)
        )
        _, spread = source_colour_statistics(gather_source_samples(points, rays.origins, sources, colour_levels=levels))
        error = (depths[0][spread.argmin(dim=-1)] - plane_z).abs()
        return (error < 0.15).float().mean().item(), error.mean().item()

    pixel_hits, pixel_error = depth_error(noisy, 1)
    patch_hits, patch_error = depth_error(noisy, 4)
    assert patch_hits > 2 * pixel_hits and patch_error < 0.6 * pixel_error, (
        pixel_hits,
        patch_hits,
        pixel_error,
        patch_error,
    )
    assert depth_error(clean, 1)[0] == depth_error(clean, 4)[0] == 1.0


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_consistency_prior_moves_the_read_out_to_the_samples_the_views_agree_about(kind):
    """A target ray through a textured plane at z = 3 seen by four sources: with the prior, the
    read-out weights peak at the sample nearest the plane and the depth lands there; without it they
    are uniform (zero-initialised scores)."""
    from pola_gnt.model.gnt import PooledReadout

    torch.manual_seed(0)
    plane_z = 3.0
    sources = make_sources(square_rig(z=0.0, half_side=0.3))
    # Texture the plane: every source image shows the plane's pattern as seen from its camera.
    height, width = sources.images.shape[-2:]
    focal = intrinsics()[0, 0].item()

    def pattern(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # the plane's colours at (x, y)
        return torch.stack(
            [0.5 + 0.5 * torch.sin(9 * x), 0.5 + 0.5 * torch.cos(7 * y), 0.5 + 0.5 * torch.sin(5 * (x + y))]
        )

    rows, cols = torch.meshgrid(
        torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32), indexing="ij"
    )
    for view in range(len(sources.c2w)):
        cx, cy = sources.c2w[view, 0, 3], sources.c2w[view, 1, 3]
        x = (cols - intrinsics()[0, 2]) / focal * plane_z + cx
        y = (rows - intrinsics()[1, 2]) / focal * plane_z + cy
        sources.images[view] = pattern(x, y)
    rays = target_rays([(16.0, 12.0), (10.0, 8.0)])
    depths = torch.linspace(1.0, 6.0, 26).expand(2, 26)  # one sample at 3.0 exactly
    model = tiny_model(kind)
    with torch.no_grad():
        uniform = model(rays, depths, sources)
        model.readout = PooledReadout(model.readout.norm.normalized_shape[0], consistency_prior=40.0)
        prior = model(rays, depths, sources)
    assert torch.allclose(uniform.weights, uniform.weights[:, :1].expand_as(uniform.weights), atol=1e-6)
    assert (prior.weights.argmax(dim=-1) == 10).all()  # depths[10] == 3.0
    assert (prior.depth - plane_z).abs().max() < 0.3 < (uniform.depth - plane_z).abs().min()

    # With the source colours, training starts from the image-based render: the plane's colour where
    # each ray meets it (the learned colour layer starts at zero).
    with torch.no_grad():
        model.readout = PooledReadout(
            model.readout.norm.normalized_shape[0], consistency_prior=40.0, source_colour=True
        )
        blended = model(rays, depths, sources)
    hits = rays.origins + plane_z * rays.directions / rays.directions[:, 2:]
    expected = pattern(hits[:, 0], hits[:, 1]).t()
    # Within the colour change of the pattern between the samples nearest the plane (0.2 apart).
    assert (blended.rgb - expected).abs().mean() < 0.05 and (blended.rgb - expected).abs().max() < 0.15


def _blend_inputs(generator: torch.Generator):
    """Random inputs of `SourceViewBlend` for 3 rays x 5 samples x 4 views, some views and one whole
    sample unseen, colours zero where unseen (as gathered)."""
    visible = torch.rand(3, 5, 4, generator=generator) > 0.3
    visible[0, 0] = False
    visible[0, 1] = True
    rgb = torch.rand(3, 5, 4, 3, generator=generator) * visible[..., None]
    return (
        torch.randn(3, 5, 4, 8, generator=generator),
        torch.randn(3, 5, 4, 4, generator=generator),
        torch.randn(3, 5, 8, generator=generator),
        rgb,
        visible,
    )


def test_the_view_blend_starts_as_the_plain_mean_of_the_visible_views():
    """Zero-initialised scores: the blended colour is `source_colour_statistics`'s mean, 0 where no
    view sees the sample; so a pretraining with the blend starts where one without it does."""
    from pola_gnt.model.gnt import GatheredSamples, SourceViewBlend, source_colour_statistics

    generator = torch.Generator().manual_seed(0)
    view_tokens, rel_dirs, point_tokens, rgb, visible = _blend_inputs(generator)
    blended = SourceViewBlend(8)(view_tokens, rel_dirs, point_tokens, rgb, visible)
    mean, _ = source_colour_statistics(GatheredSamples(values=rgb, visible=visible, rel_dirs=rel_dirs))
    torch.testing.assert_close(blended, mean, rtol=1e-6, atol=1e-6)
    assert torch.equal(blended[0, 0], torch.zeros(3))


def test_the_view_blend_takes_the_colour_of_the_view_its_scores_prefer():
    """A score that grows with the relative direction's last number (GNT's cosine between the target
    and source rays) puts the colour on the view whose ray is nearest the target's; unseen views never
    count, whatever their score."""
    from pola_gnt.model.gnt import SourceViewBlend

    generator = torch.Generator().manual_seed(1)
    view_tokens, rel_dirs, point_tokens, rgb, visible = _blend_inputs(generator)
    visible[0, 0] = True
    blend = SourceViewBlend(8)
    with torch.no_grad():
        for layer in (blend.view, blend.point):
            layer.weight.zero_()
        blend.view.bias.zero_()
        blend.direction.weight.zero_()
        blend.direction.weight[0, 3] = 1.0  # hidden unit 0 = relu(cosine)
        blend.score.weight[0, 0] = 1000.0
    rel_dirs[..., 3] = torch.rand(3, 5, 4, generator=generator)
    rgb = torch.rand(3, 5, 4, 3, generator=generator) * visible[..., None]
    with torch.no_grad():
        blended = blend(view_tokens, rel_dirs, point_tokens, rgb, visible)
    nearest = rel_dirs[..., 3].masked_fill(~visible, -1.0).argmax(dim=-1)  # [rays, samples]
    expected = rgb.gather(2, nearest[..., None, None].expand(3, 5, 1, 3))[:, :, 0]
    seen = visible.any(dim=-1)
    torch.testing.assert_close(blended[seen], expected[seen], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_the_view_blend_trains_and_needs_the_source_colour(kind):
    """Gradients reach the blend's layers through the read-out's colour; without the source colour it
    is one error line."""
    settings = replace(tiny_model(kind).settings, readout_source_colour=True, readout_view_blend=True)
    settings.check("model.net")
    torch.manual_seed(0)
    model = GNT(settings)
    assert model.view_blend is not None
    sources = make_sources(square_rig(z=0.0, half_side=0.3))
    rays = target_rays([(16.0, 12.0), (10.0, 8.0)])
    out = model(rays, torch.linspace(1.0, 6.0, 8).expand(2, 8), sources)
    out.rgb.sum().backward()
    assert model.view_blend.score.weight.grad is not None and model.view_blend.score.weight.grad.abs().sum() > 0
    with pytest.raises(UserError, match="readout_view_blend"):
        replace(settings, readout_source_colour=False).check("model.net")


def test_angle_weights_follow_the_views_angles_to_the_target_ray():
    """`angle_weights` against a float64 reference of its rule, softmax(-(angle - nearest) / (T x mean
    angle)) over the visible views; a small temperature picks the nearest visible view, a large one
    tends to the plain mean; hidden views weigh 0 and a point no view sees gets no weight at all; the
    same weights when every angle is scaled (units of the views' mean angle)."""
    from pola_gnt.model.consistency_prior import angle_weights

    generator = torch.Generator().manual_seed(3)
    angles = torch.rand(6, 7, 5, generator=generator, dtype=torch.float64) * 0.2 + 0.01  # radians
    visible = torch.rand(6, 7, 5, generator=generator) > 0.3
    visible[0, 0] = False  # no view
    visible[0, 1] = False
    visible[0, 1, 2] = True  # one view
    got = angle_weights(angles.cos().float(), visible, 0.5, dim=2).double()
    seen = visible.any(dim=-1)
    masked = angles.masked_fill(~visible, float("inf"))
    nearest = masked.amin(dim=-1, keepdim=True)
    mean = (angles * visible).sum(-1, keepdim=True) / visible.sum(-1, keepdim=True).clamp(min=1)
    reference = torch.softmax(-(masked - nearest) / (0.5 * mean), dim=-1)
    torch.testing.assert_close(got[seen], reference[seen], rtol=1e-4, atol=1e-4)  # float32 arccos near 1
    assert torch.equal(got[0, 0], torch.zeros(5, dtype=torch.float64))
    assert got[0, 1, 2] == 1.0 and got[~visible].abs().max() == 0.0
    sharp = angle_weights(angles.cos().float(), visible, 1e-4, dim=2)
    assert torch.equal(sharp[seen].argmax(dim=-1), masked[seen].argmin(dim=-1))
    assert torch.allclose(sharp[seen].amax(dim=-1), torch.ones(()), atol=1e-6)
    flat = angle_weights(angles.cos().float(), visible, 1e4, dim=2)
    plain = visible / visible.sum(-1, keepdim=True).clamp(min=1)
    torch.testing.assert_close(flat[seen], plain[seen].float(), rtol=1e-3, atol=1e-3)
    scaled = angle_weights((angles * 3.0).cos().float(), visible, 0.5, dim=2)
    torch.testing.assert_close(scaled, got.float(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_the_angle_weighted_source_colour_is_the_nearest_views_as_the_temperature_falls(kind):
    """`readout_view_angle_weighting`: a view-weighted mean of real colours, the plain mean's at a large
    temperature; the spread (agreement over all views) does not change; it needs the source colour
    and is not combined with the learned blend (one error line each)."""
    from pola_gnt.model.gnt import GatheredSamples, source_colour_statistics

    generator = torch.Generator().manual_seed(4)
    rgb = torch.rand(3, 5, 4, 3, generator=generator)
    visible = torch.rand(3, 5, 4, generator=generator) > 0.2
    rel_dirs = torch.zeros(3, 5, 4, 4)
    rel_dirs[..., 3] = torch.cos(torch.rand(3, 5, 4, generator=generator) * 0.3)
    gathered = GatheredSamples(values=rgb * visible[..., None], visible=visible, rel_dirs=rel_dirs)
    mean, spread = source_colour_statistics(gathered)
    weighted, weighted_spread = source_colour_statistics(gathered, 0.0, 0.25)
    assert torch.equal(weighted_spread, spread)
    assert not torch.allclose(weighted, mean, atol=1e-3)
    torch.testing.assert_close(source_colour_statistics(gathered, 0.0, 1e4)[0], mean, rtol=1e-3, atol=1e-3)
    nearest = rel_dirs[..., 3].masked_fill(~visible, -2.0).argmax(dim=-1)
    expected = rgb.gather(2, nearest[..., None, None].expand(3, 5, 1, 3))[:, :, 0]
    seen = visible.any(dim=-1)
    torch.testing.assert_close(source_colour_statistics(gathered, 0.0, 1e-4)[0][seen], expected[seen])
    settings = replace(tiny_model(kind).settings, readout_source_colour=True, readout_view_angle_weighting=0.25)
    settings.check("model.net")
    for bad, match in (
        ({"readout_view_angle_weighting": -1.0}, "readout_view_angle_weighting"),
        ({"readout_source_colour": False}, "readout_view_angle_weighting: weighs the source colour"),
        ({"readout_view_blend": True}, "readout_view_blend already weighs"),
    ):
        with pytest.raises(UserError, match=match) as err:
            replace(settings, **bad).check("model.net")
        assert "\n" not in str(err.value)


def test_bounded_scores_refine_the_prior_and_never_leave_the_bound():
    """`readout_score_bound` B: the learned scores enter as B tanh(score / B), against a float64
    reference. However large the learned scores, two samples' pooling weights differ from the prior's
    ratio by at most exp(2B); small scores pass unchanged (training starts alike); B = 0 is the
    unbounded read-out."""
    from pola_gnt.model.gnt import PooledReadout

    torch.manual_seed(0)
    width, bound, prior = 8, 1.5, 40.0
    tokens = torch.randn(3, 12, width)
    seen = torch.ones(3, 12, dtype=torch.bool)
    seen[1, :4] = False
    depths = torch.linspace(1.0, 4.0, 12).expand(3, 12)
    colours = (torch.rand(3, 12, 3), torch.rand(3, 12) * 0.3)
    bounded = PooledReadout(width, prior, source_colour=True, colour_residual=False, score_bound=bound)
    unbounded = PooledReadout(width, prior, source_colour=True, colour_residual=False)
    prior_only = PooledReadout(width, prior, source_colour=True, colour_residual=False)
    with torch.no_grad():
        bounded.score.weight.normal_(std=30.0)  # trained scores far beyond the bound
        unbounded.load_state_dict(bounded.state_dict())
        out = bounded(tokens, seen, depths, colours)
        free = unbounded(tokens, seen, depths, colours)
        base = prior_only(tokens, seen, depths, colours)

        learned = bounded.score(bounded.norm(tokens))[..., 0].double()
        reference = bound * torch.tanh(learned / bound) - prior * colours[1].double()
        expected = torch.softmax(reference.masked_fill(~seen, float("-inf")), dim=-1)
    torch.testing.assert_close(out.weights.double(), expected, rtol=1e-5, atol=1e-6)
    assert (out.weights[~seen] == 0).all()
    for ray in range(3):  # log-weights against the prior alone's: moved alike up to 2B
        ray_shift = (out.weights[ray].log() - base.weights[ray].log())[seen[ray]]
        assert ray_shift.max() - ray_shift.min() <= 2 * bound + 1e-4
    assert (free.weights - out.weights).abs().max() > 0.1  # the unbounded scores do move the pooling further
    with torch.no_grad():
        bounded.score.weight.mul_(1e-4)  # near zero: tanh's slope 1
        unbounded.load_state_dict(bounded.state_dict())
        torch.testing.assert_close(
            bounded(tokens, seen, depths, colours).weights, unbounded(tokens, seen, depths, colours).weights
        )
    settings = replace(tiny_model("pola_gnt").settings, readout_score_bound=-1.0)
    with pytest.raises(UserError, match="readout_score_bound") as err:
        settings.check("model.net")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_without_the_colour_residual_the_colour_is_the_pooled_source_colour(kind):
    """`readout_colour_residual=false`: no learned colour layer; each ray's colour is the source views'
    mean colour pooled with the read-out's weights (a blend of real pixels, inside their range),
    whatever the trained scores; gradients still reach the scores. Without the source colour it is
    one error line (there would be no colour)."""
    settings = replace(tiny_model(kind).settings, readout_source_colour=True, readout_colour_residual=False)
    settings.check("model.net")
    torch.manual_seed(0)
    model = GNT(settings)
    assert model.readout.to_rgb is None
    with torch.no_grad():
        model.readout.score.weight.normal_()  # trained scores: not the prior's alone
    sources = make_sources(square_rig(z=0.0, half_side=0.3))
    rays = target_rays([(16.0, 12.0), (10.0, 8.0), (3.0, 20.0)])
    depths = torch.linspace(1.0, 6.0, 10).expand(3, 10)
    out = model(rays, depths, sources)
    mean, _ = source_colour_statistics(gather_source_samples(points_along_rays(rays, depths), rays.origins, sources))
    torch.testing.assert_close(out.rgb, (out.weights[..., None] * mean).sum(dim=1))
    assert out.rgb.min() >= 0.0 and out.rgb.max() <= 1.0
    out.rgb.sum().backward()
    assert model.readout.score.weight.grad is not None and model.readout.score.weight.grad.abs().sum() > 0
    with pytest.raises(UserError, match="readout_colour_residual: false leaves no colour"):
        replace(settings, readout_source_colour=False).check("model.net")


def test_consistency_levels_are_checked():
    """1 to 6 levels, more than one only with the prior they measure for, and none with GNT's network."""
    settings = replace(tiny_model("pola_gnt").settings, readout_consistency_prior=40.0, readout_consistency_levels=4)
    settings.check("model.net")
    for bad, match in (
        ({"readout_consistency_levels": 0}, "from 1 to 6"),
        ({"readout_consistency_levels": 7}, "from 1 to 6"),
        ({"readout_consistency_prior": 0.0}, "prior, which is off"),
    ):
        with pytest.raises(UserError, match=match):
            replace(settings, **bad).check("model.net")
    gnt = replace(tiny_model("gnt").settings, compat="gnt", readout_consistency_prior=0.0, readout_source_colour=False)
    gnt.check("model.net")
    with pytest.raises(UserError, match="model.net.readout_consistency_levels: 2"):
        replace(gnt, readout_consistency_levels=2).check("model.net")


def test_depth_sampler_jitters_within_the_bins_from_a_seed_and_is_fixed_without_one():
    """The model's sampler (the data module only yields rays): a training batch's seed gives the same
    jittered depths wherever it is drawn, each inside its inverse-depth bin; no seed gives the bin edges."""
    rays = target_rays([(10.0, 12.0), (30.0, 5.0), (2.0, 2.0)])
    sampler = DepthSampler(n_samples=8)
    fixed = sampler(rays, (2.0, 6.0))
    edges = 1.0 / torch.linspace(1.0 / 2.0, 1.0 / 6.0, 8)
    assert torch.allclose(fixed, edges.expand(3, 8))
    jittered = sampler(rays, (2.0, 6.0), seed=7)
    assert torch.equal(jittered, sampler(rays, (2.0, 6.0), seed=7))
    assert not torch.equal(jittered, sampler(rays, (2.0, 6.0), seed=8))
    assert bool((jittered >= 2.0 - 1e-6).all() and (jittered <= 6.0 + 1e-6).all())
    assert bool((jittered.diff(dim=-1) > 0).all())  # still ordered near to far


@pytest.mark.parametrize(("levels", "angle_weighting"), [(1, 0.0), (3, 0.25)])
def test_the_prior_sweep_renders_what_an_untrained_network_renders(levels, angle_weighting):
    """`scripts/sweep_consistency_prior.py` skips the transformer: an untrained network's read-out
    ignores it (its score and colour layers start at zero), so the script's colour and depth for each
    (levels, weight) equal the network's own with those settings (the views' angle weighting too),
    for both models."""
    from helpers import load_script

    sweep = load_script("sweep_consistency_prior")
    sources = make_sources(square_rig(z=0.0, half_side=0.3))
    rays = target_rays([(16.0, 12.0), (10.0, 8.0), (1.0, 1.0), (30.0, 20.0)])
    depths = torch.linspace(1.0, 6.0, 12).expand(4, 12)
    with torch.no_grad():
        renders = sweep.prior_renders(
            rays, depths, sources, [levels], [40.0, 160.0], view_angle_weighting=angle_weighting
        )
        for kind in MODEL_KINDS:
            for weight in (40.0, 160.0):
                settings = replace(
                    tiny_model(kind).settings,
                    readout_consistency_prior=weight,
                    readout_consistency_levels=levels,
                    readout_source_colour=True,
                    readout_view_angle_weighting=angle_weighting,
                )
                expected = GNT(settings).eval()(rays, depths, sources)
                rgb, depth = renders[levels, weight, 0.0]
                torch.testing.assert_close(rgb, expected.rgb, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(depth, expected.depth, rtol=1e-5, atol=1e-5)
