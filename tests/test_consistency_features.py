"""The read-out's feature consistency (`model.net.readout_consistency_features`): AlexNet's fixed ImageNet
features compared across the source views, added to the colour spread of the consistency prior."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from helpers import net_settings
from test_model import MODEL_KINDS, TINY_ENCODER, make_sources, square_rig, target_rays, textured_plane_views

from pola_gnt.core.errors import UserError
from pola_gnt.geometry.rays import pixel_rays
from pola_gnt.model import GNT, SourceViews
from pola_gnt.model.backbone import weights_from_checkpoint
from pola_gnt.model.consistency_prior import (
    ConsistencyFeatures,
    directions_from_moments,
    feature_moments,
    feature_spread,
    principal_directions,
)
from pola_gnt.model.feature_cache import FrozenFeatureCache
from pola_gnt.model.gnt import GatheredSamples, gather_source_samples, source_colour_statistics


def _torchvision_alexnet(weights) -> torch.nn.Module:
    reference = torchvision.models.alexnet(weights=None).eval()
    with np.load(weights) as npz:
        state = {k.removeprefix("features."): torch.from_numpy(npz[k]) for k in npz.files if k.startswith("features.")}
    reference.features.load_state_dict(state)
    return reference


@pytest.mark.parametrize(("layer", "end"), [(1, 2), (2, 5), (3, 8)])
def test_the_features_are_alexnets_own_scaled_to_unit_length(lpips_alex_weights, layer, end):
    """conv `layer`'s relu output of torchvision's AlexNet with the same weights (its `features[:end]`),
    each pixel's vector divided by its length."""
    extractor = ConsistencyFeatures(layer, str(lpips_alex_weights))
    reference = _torchvision_alexnet(lpips_alex_weights)
    image = torch.rand(2, 3, 67, 91, generator=torch.Generator().manual_seed(0))
    normalised = (image - torch.tensor([0.485, 0.456, 0.406])[:, None, None]) / torch.tensor([0.229, 0.224, 0.225])[
        :, None, None
    ]
    with torch.no_grad():
        expected = F.normalize(reference.features[:end](normalised), dim=1)
    got = extractor(image)
    assert got.shape == expected.shape and got.shape[1] == extractor.channels
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.norm(dim=1), torch.ones_like(got[:, 0]), rtol=1e-5, atol=1e-5)
    # bf16 autocast around it changes nothing: the features are computed in fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(extractor(image), got)


def test_principal_directions_keep_the_spread_of_features_in_their_span():
    """Features that vary in 3 directions of 40 channels: projected on 3 principal directions, every
    distance between two views' features (so every spread) is kept; on 2 it shrinks by what the third
    held, the direction of least variance. The directions are orthonormal, the largest first."""
    generator = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(40, 3, generator=generator, dtype=torch.float64))[0]
    scales = torch.tensor([3.0, 2.0, 0.5], dtype=torch.float64)
    codes = torch.randn(4, 9, 7, 3, generator=generator, dtype=torch.float64) * scales  # [views, h, w, 3]
    offset = torch.randn(40, generator=generator, dtype=torch.float64)  # a common part: no variance
    maps = (codes @ basis.T + offset).permute(0, 3, 1, 2)  # [views, 40, h, w]
    directions = principal_directions(maps, 3)
    torch.testing.assert_close(directions.T @ directions, torch.eye(3, dtype=torch.float64))
    assert abs(float((directions[:, 0] @ basis[:, 0]).abs())) > 0.99  # the largest variance first

    def spread(directions: torch.Tensor | None) -> torch.Tensor:
        projected = maps if directions is None else torch.einsum("vchw,cd->vdhw", maps, directions)
        per_pixel = projected.permute(2, 3, 0, 1)  # [h, w, views, channels]: rays, samples, views, channels
        return feature_spread(per_pixel, torch.ones(per_pixel.shape[:3], dtype=torch.bool), dim=2)

    torch.testing.assert_close(spread(directions), spread(None))
    assert (spread(principal_directions(maps, 2)) < spread(None) - 1e-6).float().mean() > 0.9


def test_projected_features_are_the_full_features_on_their_principal_directions(lpips_alex_weights):
    """`ConsistencyFeatures(dims=K)` returns K channels: the unit-length features projected on their own
    K principal directions over the views; 0, or K at least the layer's channels, projects nothing."""
    image = torch.rand(3, 3, 67, 91, generator=torch.Generator().manual_seed(1))
    full = ConsistencyFeatures(2, str(lpips_alex_weights))(image)
    projected = ConsistencyFeatures(2, str(lpips_alex_weights), dims=16)
    assert projected.channels == 16 and projected.dims == 16
    got = projected(image)
    assert got.shape == (3, 16, *full.shape[2:])
    torch.testing.assert_close(got, torch.einsum("vchw,cd->vdhw", full, principal_directions(full, 16)))
    for dims in (0, 192, 500):
        assert torch.equal(ConsistencyFeatures(2, str(lpips_alex_weights), dims=dims)(image), full)


def test_principal_directions_are_the_centred_covariances_eigenvectors():
    """Against the naive fp64 reference: the covariance of the centred vectors of every view's pixels,
    `eigh`'s leading eigenvectors. The moments' difference `outer / n - mean mean^T` loses nothing that
    shows; each direction is signed with its largest entry positive, and a view's moments plus another's
    are both views' together."""
    generator = torch.Generator().manual_seed(2)
    maps = F.normalize(torch.rand(3, 24, 7, 9, generator=generator, dtype=torch.float64) + 0.2, dim=1)
    flat = maps.transpose(0, 1).flatten(1)
    centred = flat - flat.mean(dim=1, keepdim=True)
    values, vectors = torch.linalg.eigh(centred @ centred.T / flat.shape[1])
    assert float(values[-5] - values[-6]) > 1e-4  # the 5 leading directions are well defined
    reference = vectors[:, -5:].flip(-1)
    got = principal_directions(maps, 5)
    assert got.dtype == torch.float64
    largest = got.gather(0, got.abs().argmax(dim=0, keepdim=True))
    assert bool((largest > 0).all())
    torch.testing.assert_close(got, reference * torch.sign((got * reference).sum(dim=0)), rtol=0, atol=1e-10)
    together = feature_moments(maps[:2])
    apart = [feature_moments(maps[:1]), feature_moments(maps[1:2])]
    torch.testing.assert_close(directions_from_moments([together], 5), directions_from_moments(apart, 5))


@pytest.mark.parametrize("dims", [0, 16])
def test_the_cached_consistency_maps_are_a_fresh_extractions_bit_for_bit(lpips_alex_weights, dims):
    """Training keeps each source image's unit-length maps and moments (`model.feature_cache`): a step
    that draws kept images gets what extracting them afresh gives, bit for bit, in any order and mix of
    kept and new ones; where the cache does not apply (no gradients, eval mode, unnamed images) it is a
    fresh extraction and keeps nothing."""
    net = _tiny("pola_gnt", lpips_alex_weights, readout_consistency_feature_dims=dims).train()
    extractor = net.consistency_features
    assert extractor is not None and extractor.dims == dims
    images = torch.rand(4, 3, 67, 91, generator=torch.Generator().manual_seed(3))
    keys = [("scene", view) for view in range(4)]
    cache = FrozenFeatureCache(64)
    for order in ([0, 1, 2], [1, 3, 0, 2], [1, 3, 0, 2], [2]):  # all new, mixed, all kept, one
        fresh = extractor(images[order])
        cached = cache.consistency_maps(net, images[order], [keys[i] for i in order])
        assert cached.dtype == torch.float32 and cached.shape[1] == (dims or 192)
        assert torch.equal(cached, fresh), order
    assert (cache.hits, cache.misses) == (3 + 4 + 1, 4) and len(cache.entries) == 4
    kept = cache.bytes
    with torch.no_grad():
        assert torch.equal(cache.consistency_maps(net, images, keys), extractor(images))
    assert torch.equal(cache.consistency_maps(net, images, None), extractor(images))
    net.eval()
    assert torch.equal(cache.consistency_maps(net, images, keys), extractor(images))
    assert (cache.hits, cache.misses, cache.bytes) == (8, 4, kept)  # none of these touched it


def test_feature_spread_is_zero_where_views_agree_and_one_where_they_cannot_tell():
    """sqrt(1 - |mean|^2) of unit vectors: 0 for equal vectors, sqrt(1/2) for two orthogonal ones, and 1
    (the largest there is) where fewer than two views see the point."""
    features = torch.zeros(1, 4, 3, 2)  # [rays, samples, views, channels]
    features[0, 0] = torch.tensor([0.6, 0.8])  # three views agree
    features[0, 1, 0] = torch.tensor([1.0, 0.0])
    features[0, 1, 1] = torch.tensor([0.0, 1.0])  # two orthogonal views (the third does not see it)
    features[0, 2, 0] = torch.tensor([1.0, 0.0])  # one view only
    visible = torch.ones(1, 4, 3, dtype=torch.bool)
    visible[0, 1, 2] = visible[0, 2, 1:] = False
    visible[0, 3] = False  # no view
    spread = feature_spread(features * visible[..., None], visible, dim=2)
    torch.testing.assert_close(spread, torch.tensor([[0.0, 0.5**0.5, 1.0, 1.0]]), rtol=0, atol=5e-4)
    # against the two-pass form in fp64 (subtract the mean, then square), on random unit vectors
    generator = torch.Generator().manual_seed(0)
    features = F.normalize(torch.randn(50, 7, 4, 192, generator=generator, dtype=torch.float64), dim=-1)
    visible = torch.rand(50, 7, 4, generator=generator) > 0.3
    features = features * visible[..., None]
    count = visible.sum(dim=2, keepdim=True).clamp(min=1)[..., None]
    mean = features.sum(dim=2, keepdim=True) / count
    two_pass = (((features - mean).square() * visible[..., None]).sum(dim=2) / count[:, :, 0]).sum(-1).sqrt()
    two_pass = torch.where(visible.sum(dim=2) >= 2, two_pass, torch.ones_like(two_pass))
    torch.testing.assert_close(feature_spread(features.float(), visible, dim=2).double(), two_pass, rtol=0, atol=1e-5)


def test_the_feature_spread_is_added_to_the_colour_spread():
    """`source_colour_statistics` with gathered features: the colour statistics plus the weight times
    `feature_spread`, the mean colour unchanged."""
    generator = torch.Generator().manual_seed(3)
    values = torch.rand(2, 5, 3, 4, generator=generator)
    visible = torch.rand(2, 5, 3, generator=generator) > 0.3
    features = F.normalize(torch.randn(2, 5, 3, 6, generator=generator), dim=-1) * visible[..., None]
    values = values * visible[..., None]
    plain = GatheredSamples(values=values, visible=visible, rel_dirs=torch.zeros(2, 5, 3, 4))
    mean, spread = source_colour_statistics(plain)
    with_features = replace(plain, consistency=features)
    got_mean, got_spread = source_colour_statistics(with_features, 0.3)
    assert torch.equal(got_mean, mean)
    torch.testing.assert_close(got_spread, spread + 0.3 * feature_spread(features, visible, dim=2))


def test_features_find_a_surface_that_the_views_see_at_different_exposures(lpips_alex_weights):
    """A textured plane at z = 3 seen by four cameras whose exposures differ (gains 1.0, 0.8, 0.65, 0.5,
    as auto-exposure in a hand-held capture): the colours of the views disagree everywhere, on the plane
    too, and the least colour spread misses the plane for most rays; the features, unit length, keep the
    patch's structure and not its brightness, and the colour spread plus the feature spread finds the
    plane for far more rays."""
    height, width, plane_z = 64, 80, 3.0
    gains = (1.0, 0.8, 0.65, 0.5)
    camera, c2w, images = textured_plane_views(
        height,
        width,
        plane_z,
        lambda x, y, view: (
            gains[view]
            * torch.stack(
                [0.5 + 0.5 * torch.sin(5 * x), 0.5 + 0.5 * torch.cos(4 * y), 0.5 + 0.5 * torch.sin(3 * (x + y))]
            )
        ),
    )
    sources = SourceViews(
        images=images, features=torch.zeros(4, 1, height, width), c2w=c2w, intrinsics=camera.expand(4, 3, 3)
    )
    pixels = torch.stack(torch.meshgrid(torch.arange(20.0, 60.0), torch.arange(16.0, 48.0), indexing="xy"), -1)
    rays = pixel_rays(torch.eye(4), camera, pixels.reshape(-1, 2))
    depths = torch.linspace(1.5, 6.0, 46).expand(len(rays), 46)  # 0.1 apart, one sample at 3.0
    points = rays.origins[:, None] + depths[..., None] * rays.directions[:, None]
    extractor = ConsistencyFeatures(1, str(lpips_alex_weights))
    gathered = gather_source_samples(points, rays.origins, sources, consistency=extractor)

    def hits(feature_weight: float) -> float:
        _, spread = source_colour_statistics(gathered, feature_weight)
        error = (depths[0][spread.argmin(dim=-1)] - plane_z).abs()
        return (error < 0.15).float().mean().item()

    colour_hits, feature_hits = hits(0.0), hits(1.0)
    assert feature_hits > 0.8 and feature_hits > colour_hits + 0.3, (colour_hits, feature_hits)


def _tiny(kind: str, weights, **values) -> GNT:
    torch.manual_seed(0)
    view_attention, ray_attention = MODEL_KINDS[kind]
    settings = net_settings(
        view_attention=view_attention,
        ray_attention=ray_attention,
        width=32,
        n_blocks=2,
        heads=4,
        encoder=replace(TINY_ENCODER, backbone_weights=str(weights) if weights else None),
        readout_consistency_prior=160.0,
        readout_source_colour=True,
        readout_consistency_features=0.3,
        **values,
    )
    return GNT(settings).eval()


@pytest.mark.parametrize("kind", list(MODEL_KINDS))
def test_the_network_adds_the_feature_spread_to_its_prior(lpips_alex_weights, kind):
    """With its learned read-out layers at zero, the network's colour and depth are the prior's: the
    source colour pooled by softmax(-prior x (colour spread + weight x feature spread)); without the
    features the render differs (the features count)."""
    net = _tiny(kind, lpips_alex_weights)
    sources = make_sources(square_rig(z=0.0, half_side=0.3))
    rays = target_rays([(16.0, 12.0), (10.0, 8.0), (1.0, 1.0), (30.0, 20.0)])
    depths = torch.linspace(1.0, 6.0, 12).expand(4, 12)
    with torch.no_grad():
        got = net(rays, depths, sources)
        points = rays.origins[:, None] + depths[..., None] * rays.directions[:, None]
        gathered = gather_source_samples(points, rays.origins, sources, consistency=net.consistency_features)
        mean, spread = source_colour_statistics(gathered, 0.3)
        seen = gathered.visible.any(dim=-1)
        weights = torch.softmax((-160.0 * spread).masked_fill(~seen, float("-inf")), dim=-1)
        torch.testing.assert_close(got.rgb, (weights[..., None] * mean).sum(dim=1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.depth, (weights * depths).sum(dim=-1), rtol=1e-5, atol=1e-5)
        without = GNT(replace(net.settings, readout_consistency_features=0.0)).eval()
        assert without.consistency_features is None
        assert not torch.allclose(without(rays, depths, sources).rgb, got.rgb, atol=1e-3)


def test_a_checkpoint_holds_the_feature_weights(lpips_alex_weights, tmp_path, monkeypatch):
    """The convolutions are buffers of the state dict: a network rebuilt for a checkpoint
    (`weights_from_checkpoint`, as eval, videos and the viewer do) needs no npz, and renders the same."""
    trained = _tiny("pola_gnt", lpips_alex_weights)
    state = trained.state_dict()
    assert {"consistency_features.weight0", "consistency_features.weight1"} <= set(state)
    assert "consistency_features.weight2" not in state  # conv2 is the last (layer 2)
    monkeypatch.delenv("POLA_GNT_LPIPS_WEIGHTS", raising=False)
    missing = tmp_path / "gone.npz"
    with pytest.raises(UserError, match="gone.npz: no such file") as err:
        _tiny("pola_gnt", missing)
    assert "\n" not in str(err.value)
    with weights_from_checkpoint():
        rebuilt = _tiny("pola_gnt", missing)
    rebuilt.load_state_dict(state, strict=True)
    sources = make_sources(square_rig(z=0.0, half_side=0.3))
    rays = target_rays([(16.0, 12.0), (10.0, 8.0)])
    depths = torch.linspace(1.0, 6.0, 12).expand(2, 12)
    with torch.no_grad():
        assert torch.equal(rebuilt(rays, depths, sources).rgb, trained(rays, depths, sources).rgb)


def test_feature_settings_are_checked():
    """A non-negative weight, only with the prior it adds to, layers 1 to 5, none with GNT's network."""
    settings = net_settings(readout_consistency_prior=160.0, readout_consistency_features=0.3)
    settings.check("model.net")
    for bad, match in (
        ({"readout_consistency_features": -0.1}, "readout_consistency_features"),
        ({"readout_consistency_feature_layer": 0}, "readout_consistency_feature_layer"),
        ({"readout_consistency_feature_layer": 6}, "readout_consistency_feature_layer"),
        ({"readout_consistency_feature_dims": -1}, "readout_consistency_feature_dims"),
        ({"readout_consistency_prior": 0.0}, "readout_consistency_features: 0.3 times .* prior, which is off"),
    ):
        with pytest.raises(UserError, match=match) as err:
            replace(settings, **bad).check("model.net")
        assert "\n" not in str(err.value)
    gnt = net_settings(
        "gnt", compat="gnt", readout_consistency_prior=0.0, readout_source_colour=False, encoder=TINY_ENCODER
    )
    gnt.check("model.net")
    with pytest.raises(UserError, match="model.net.readout_consistency_features: 0.3"):
        replace(gnt, readout_consistency_features=0.3).check("model.net")


@pytest.mark.parametrize(("layer", "stride", "offset"), [(1, 4, 3), (2, 8, 7), (3, 16, 15)])
def test_the_feature_maps_are_read_where_their_pixels_sit(lpips_alex_weights, layer, stride, offset):
    """Feature pixel j of conv `layer` is centred on image pixel stride * j + offset (its receptive field's
    centre): a point that projects there reads that feature pixel exactly, not the one that stretching
    the map's corners onto the image's would put there."""
    extractor = ConsistencyFeatures(layer, str(lpips_alex_weights))
    assert (extractor.stride, extractor.offset) == (stride, offset)
    height, width = 96, 128
    camera = torch.tensor([[100.0, 0.0, width / 2], [0.0, 100.0, height / 2], [0.0, 0.0, 1.0]])
    images = torch.rand(2, 3, height, width, generator=torch.Generator().manual_seed(4))
    c2w = torch.eye(4).repeat(2, 1, 1)
    sources = SourceViews(images, torch.zeros(2, 1, height, width), c2w, camera.expand(2, 3, 3))
    maps = sources.consistency_maps(extractor)
    row, col = 2, 3
    u, v = stride * col + offset, stride * row + offset
    depth = 2.0
    point = torch.tensor([(u - camera[0, 2]) / camera[0, 0] * depth, (v - camera[1, 2]) / camera[1, 1] * depth, depth])
    gathered = gather_source_samples(point.view(1, 1, 3), torch.zeros(1, 3), sources, consistency=extractor)
    assert gathered.consistency is not None
    torch.testing.assert_close(gathered.consistency[0, 0], maps[:, :, row, col], rtol=1e-5, atol=1e-6)


def test_the_prior_sweep_renders_the_feature_consistency_as_the_network_does(lpips_alex_weights):
    """`scripts/sweep_consistency_prior.py --features W`: the same colour and depth as an untrained network
    with `readout_consistency_features=W`, for both models."""
    from helpers import load_script

    sweep = load_script("sweep_consistency_prior")
    sources = make_sources(square_rig(z=0.0, half_side=0.3))
    rays = target_rays([(16.0, 12.0), (10.0, 8.0), (1.0, 1.0), (30.0, 20.0)])
    depths = torch.linspace(1.0, 6.0, 12).expand(4, 12)
    extractor = ConsistencyFeatures(2, str(lpips_alex_weights))
    with torch.no_grad():
        renders = sweep.prior_renders(rays, depths, sources, [3], [160.0], [0.0, 0.3], extractor)
        for kind in MODEL_KINDS:
            expected = _tiny(kind, lpips_alex_weights, readout_consistency_levels=3)(rays, depths, sources)
            rgb, depth = renders[3, 160.0, 0.3]
            torch.testing.assert_close(rgb, expected.rgb, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(depth, expected.depth, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(renders[3, 160.0, 0.0][0], rgb, atol=1e-3)
