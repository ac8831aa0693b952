"""`render.precision` (`pola_gnt.model.inference`): which precision `auto` picks and why, the fallback
on a CPU without bf16 units, the moves out of the per-sample path (equal to the GNT's forward in fp32),
bf16 rendering against the fp64 network, and the bf16 forms of the fused CPU kernels against the fp64
reference of the math."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers.kernel_calls import count_kernel_calls
from helpers.networks import perturbed_quick_net, random_target_rig

from pola_gnt.attention import cpu_extension
from pola_gnt.attention.ray.cpu_form import samples_conv_cpu
from pola_gnt.attention.ray.op import polarity_ray_attention
from pola_gnt.attention.reference import polarity_attention_reference
from pola_gnt.attention.view.op import polarity_view_attention
from pola_gnt.core.errors import UserError
from pola_gnt.geometry.rays import pixel_grid, pixel_rays
from pola_gnt.model import inference, render_kernels
from pola_gnt.model.inference import FastRenderNetwork, render_network, resolve_render_precision
from pola_gnt.model.renderer import render_image
from pola_gnt.model.sampler import DepthSampler
from pola_gnt.runs.config.app import compose_config
from pola_gnt.runs.config.read import read_run_settings

CPUINFO_LINES = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 {extra}\n\n"


def _cpuinfo(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / f"cpuinfo_{extra or 'plain'}"
    path.write_text(CPUINFO_LINES.format(extra=extra))
    return path


# --------------------------------------------------------------------------------------------------
# Which precision, and why


@pytest.mark.parametrize(
    ("extra", "feature"), [("avx512f avx512_bf16", "AVX512-BF16"), ("amx_tile amx_bf16 avx512_bf16", "AMX"), ("", None)]
)
def test_the_cpu_features_are_read_from_cpuinfo(tmp_path, extra, feature):
    assert inference.cpu_bf16_feature(_cpuinfo(tmp_path, extra)) == feature
    assert inference.cpu_bf16_feature(tmp_path / "missing") is None  # not Linux: no bf16 assumed


def test_auto_picks_bf16_where_the_cpu_has_it_and_fp32_elsewhere(tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(inference, "CPUINFO", _cpuinfo(tmp_path, "avx512_bf16"))
    chosen = resolve_render_precision("auto", cpu)
    assert chosen.dtype == torch.bfloat16 and "AVX512-BF16" in chosen.reason
    # The fallback: a CPU that reports no bf16 units renders with the GNT itself, in fp32.
    monkeypatch.setattr(inference, "CPUINFO", _cpuinfo(tmp_path, ""))
    fallback = resolve_render_precision("auto", cpu)
    assert fallback.dtype == torch.float32 and "no AVX512-BF16 or AMX" in fallback.reason
    # A GPU keeps the trainer's precision (today's behaviour); explicit choices are taken as given.
    assert resolve_render_precision("auto", torch.device("cuda")).dtype == torch.float32
    assert resolve_render_precision("fp32", cpu).dtype == torch.float32
    assert resolve_render_precision("bf16", cpu).dtype == torch.bfloat16


def test_fp32_renders_with_the_network_itself_and_says_so(capsys):
    net = perturbed_quick_net("pola_gnt")
    inference._announce.cache_clear()  # the line is printed once per process
    fp32 = resolve_render_precision("fp32", torch.device("cpu"))
    assert render_network(net, fp32) is net  # training's forward: today's outputs bit for bit
    assert "render precision: fp32 (render.precision=fp32)" in capsys.readouterr().out
    bf16 = render_network(net, resolve_render_precision("bf16", torch.device("cpu")))
    assert isinstance(bf16, FastRenderNetwork) and bf16.dtype == torch.bfloat16
    # GNT's converted checkpoints (model.net.compat=gnt) keep GNT's exact forward.
    compat = copy.deepcopy(net)
    compat.gnt_compatible = True
    assert render_network(compat, resolve_render_precision("bf16", torch.device("cpu"))) is compat
    assert "render precision: fp32 (model.net.compat=gnt renders with GNT's exact forward)" in capsys.readouterr().out


def test_a_misspelt_precision_is_one_error_line():
    with pytest.raises(UserError, match="render.precision"):
        read_run_settings(compose_config("render.precision=bf17"))
    assert read_run_settings(compose_config()).render.precision == "auto"
    with pytest.raises(UserError, match="render.workers"):
        read_run_settings(compose_config("render.workers=0"))
    assert read_run_settings(compose_config()).render.workers is None


# --------------------------------------------------------------------------------------------------
# The fast network: the same function as the GNT


READOUTS = {
    "quick": {},
    "gnt": {"readout_consistency_prior": 0.0, "readout_source_colour": False},
    "view_blend": {"readout_view_blend": True},
    "consistency_levels": {"readout_consistency_prior": 160.0, "readout_consistency_levels": 4},
    "source_colour_only": {"readout_colour_residual": False},
    "consistency_features": {
        "readout_consistency_prior": 160.0,
        "readout_consistency_levels": 4,
        "readout_consistency_features": 0.3,
    },
    "view_angle_weighting": {
        "readout_consistency_prior": 160.0,
        "readout_consistency_levels": 4,
        "readout_view_angle_weighting": 0.25,
    },
    "score_bound": {
        "readout_consistency_prior": 160.0,
        "readout_consistency_levels": 4,
        "readout_view_angle_weighting": 0.25,
        "readout_colour_residual": False,
        "readout_score_bound": 0.05,  # below the perturbed scores' size: the bound is active
    },
    "consistency_feature_dims": {
        "readout_consistency_prior": 160.0,
        "readout_consistency_levels": 4,
        "readout_consistency_features": 0.3,
        "readout_consistency_feature_dims": 16,
    },
    # the prior on the sources' working images, half their size (the rig's 40 x 48: working factor 2); the
    # encoder at their full working size, which its 3 stages need
    "consistency_features_working_size": {
        "readout_consistency_prior": 160.0,
        "readout_consistency_levels": 4,
        "readout_consistency_features": 0.3,
        "readout_consistency_feature_dims": 16,
        "readout_view_angle_weighting": 0.25,
        "working_size": 24,
        "encoder_input_scale": 1.0,
    },
}


def _readout(request, name: str) -> dict:
    """READOUTS[name]; the feature consistency's AlexNet weights from the shared folder."""
    overrides = dict(READOUTS[name])
    if name.startswith("consistency_feature"):
        weights = str(request.getfixturevalue("lpips_alex_weights"))
        encoder = read_run_settings(compose_config("experiment=quick")).model.net.encoder
        overrides["encoder"] = replace(encoder, backbone_weights=weights)
    return overrides


# The default run checks the quick preset's read-out and the shipped checkpoints' (the feature consistency);
# every other read-out runs with `-m slow` (each of these tests takes 5-15 s of a 2-core CPU).
DEFAULT_READOUTS = ("quick", "consistency_features")


def readout_cases(names) -> list:
    return [name if name in DEFAULT_READOUTS else pytest.param(name, marks=pytest.mark.slow) for name in names]


@pytest.mark.parametrize("kind", ["pola_gnt", "gnt"])
@pytest.mark.parametrize("readout", readout_cases(READOUTS))
def test_the_moved_computations_equal_the_network_in_fp32(kind, readout, request):
    """Projected feature maps, the colour term per sample, the direction code per ray and the split
    fusion layer: each the same function as the GNT's forward, to 1e-4 (rounding only); with each
    read-out (the quick preset's, GNT's, the source colour blended over the views, the prior's spread
    over 4 blur levels, the source colour without the learned residual, the source colour weighted by
    the views' angles, the feature consistency, the learned scores bounded)."""
    net = perturbed_quick_net(kind, **_readout(request, readout))
    sources, rays, depths = random_target_rig(net)
    with torch.inference_mode():
        expected = net(rays, depths, sources)
        got = FastRenderNetwork(net, torch.float32)(rays, depths, sources)
    assert not expected.seen.all() and expected.seen.any()  # samples outside every view are part of the case
    # Rounding only: 1e-4 of colours in [0, 1], depths in [1, 12] and weights. The fast network's sample
    # geometry (render_kernels.sample_geometry) rounds its projections and directions in its own order of
    # float operations, a unit in the last place, which the views' angle weights amplify where the angles are
    # small (their arccos near 1): at most 9.5e-5 measured, 5e-5 without the angle weights.
    for name in ("rgb", "depth", "weights"):
        torch.testing.assert_close(getattr(got, name), getattr(expected, name), rtol=1e-5, atol=1e-4, msg=name)
    assert torch.equal(got.seen, expected.seen)


def test_the_projection_of_the_feature_maps_commutes_with_the_bilinear_read():
    """The first move on its own: reading `W_f F` equals `W_f` times the read of `F`, border pixels and
    points half a pixel outside included (border padding)."""
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(2, 8, 5, 7, generator=generator, dtype=torch.float64)
    weight = torch.randn(6, 8, generator=generator, dtype=torch.float64)
    grid = torch.rand(2, 50, 2, generator=generator, dtype=torch.float64) * 2.4 - 1.2  # beyond the edges too
    read = inference._bilinear_channels(features, grid, "border")  # [2, 8, 50]
    projected = inference._bilinear_channels(torch.einsum("wc,vchx->vwhx", weight, features), grid, "border")
    torch.testing.assert_close(projected, torch.einsum("wc,vcp->vwp", weight, read), rtol=1e-12, atol=1e-12)


@pytest.fixture(params=["fused", "pytorch"])
def kernel_forms(request, monkeypatch):
    """bf16 through the fused C++ kernels (the attention's and the renderer's) and, as where they cannot
    be built, through the PyTorch forms. The fused case fails where the kernels did not run (a failed
    build falls back to the PyTorch forms without an error); the PyTorch case where they did."""
    calls = count_kernel_calls(monkeypatch, "pola_gnt_cpu", "pola_gnt_render")
    if request.param == "pytorch":
        monkeypatch.setattr(cpu_extension, "usable", lambda *args, **kwargs: False)
        monkeypatch.setattr(render_kernels, "_built", False)
    yield request.param
    if request.param == "fused":
        missing = FUSED_KERNELS[request.node.callspec.params["kind"]] - set(calls)
        assert not missing, f"fused: {sorted(missing)} not called (kernels called {dict(calls)})"
    else:
        assert not calls, f"pytorch: kernels called {dict(calls)}"


# The C++ operators a network's forward calls in the fused case, whatever its read-out (which may add
# others, such as the consistency prior's): the render kernels of every network (`model.render_kernels`)
# and its attentions' (Pola-GNT's `attention.cpu_extension`, GNT's in the render kernels).
_EVERY_NETWORK = {"sample_geometry", "view_token_inputs", "masked_max_views", "layer_norm_rows"}
FUSED_KERNELS = {
    "pola_gnt": _EVERY_NETWORK | {"view_forward", "ray_forward", "samples_conv_forward"},
    "gnt": _EVERY_NETWORK | {"subtraction_view_attention", "softmax_ray_attention"},
}


@pytest.mark.parametrize("kind", ["pola_gnt", "gnt"])
@pytest.mark.parametrize(
    "readout",
    readout_cases(["quick", "view_blend", "consistency_levels", "source_colour_only", "consistency_features"]),
)
def test_bf16_rendering_is_close_to_the_network_and_finite(kind, kernel_forms, readout, request):
    """bf16 weights and activations; fp32 feature maps, norms, softmax and read-out; fp32 outputs.
    Against the network's fp32 forward (itself within 1e-6 of exact arithmetic, see the fp64 tests of
    every op): colours within 0.03 at 99% of the rays, 0.15 at the worst and 0.005 on average (bf16 keeps
    8 bits, 0.4% per rounding, and these random weights are rougher than trained ones: on fern the
    trained models' bf16 and fp32 PSNR agree to 0.01 dB), depths within 1% of the depth range on average.
    The worst ray is one whose read-out sits near a tie between samples, where a rounding moves the pooled
    colour: 0.13 seen for Pola-GNT's quick read-out in the PyTorch forms on an AVX2 CPU (AMD EPYC Milan,
    where `F.linear` rounds bias and activation separately), 0.05-0.09 elsewhere."""
    net = perturbed_quick_net(kind, **_readout(request, readout))
    sources, rays, depths = random_target_rig(net)
    with torch.inference_mode():
        expected = net(rays, depths, sources)
        got = FastRenderNetwork(net, torch.bfloat16)(rays, depths, sources)
    assert got.rgb.dtype == got.depth.dtype == torch.float32
    assert torch.isfinite(got.rgb).all() and torch.isfinite(got.depth).all()
    error = (got.rgb - expected.rgb).abs()
    worst, typical = error.max().item(), error.quantile(0.99).item()
    assert worst < 0.15 and typical < 0.03 and error.mean() < 0.005, (worst, typical, error.mean())
    depth_error = (got.depth - expected.depth).abs() / (depths.max() - depths.min())
    assert depth_error.mean() < 0.01, depth_error.mean()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_image_renders_the_same_pixels_in_any_chunks(precision):
    """Why `render.chunk_rays` is the machine's choice (`runs.config.stored.COMMAND_SECTIONS`), not the
    checkpoint's: the rays per pass change no pixel, in either precision."""
    net = perturbed_quick_net("gnt")
    sources, _, _ = random_target_rig(net)
    network = render_network(net, resolve_render_precision(precision, torch.device("cpu")))
    intrinsics, sampler = sources.intrinsics[0], DepthSampler(16)
    images = [
        render_image(network, torch.eye(4), intrinsics, 40, 48, sources, (1.0, 12.0), sampler, chunk)
        for chunk in (100, 1200)
    ]
    assert torch.equal(images[0].rgb, images[1].rgb) and torch.equal(images[0].depth, images[1].depth)


# --------------------------------------------------------------------------------------------------
# The bf16 forms of the fused CPU kernels


def _bf16_and_rounded(*tensors: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The inputs in bf16, and the same values in fp64 for the reference (so that only the kernels'
    own arithmetic and the bf16 output are measured)."""
    low = [x.bfloat16() for x in tensors]
    return low, [x.double() for x in low]


# (heads, head dim): one and two 8-float vectors a head row in the AVX2 forms, and an odd head count.
HEAD_SHAPES = [(4, 8), (4, 16), (3, 8)]


def test_the_bf16_kernels_have_their_avx2_forms_where_the_cpu_has_avx2():
    """The tests below then check the AVX2 forms (elsewhere the generic loops, which they check too)."""
    assert cpu_extension.available()
    has_avx2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    assert cpu_extension.ops().avx2_forms() == has_avx2


@pytest.mark.parametrize("heads, d", HEAD_SHAPES)
@pytest.mark.parametrize("scale", [1.0, 30.0])  # 30: exponents beyond the clamp
@pytest.mark.parametrize("views", [4, 3, 9])  # the AVX2 form takes views 4 at a time
def test_the_bf16_view_kernel_against_the_fp64_reference(scale, heads, d, views):
    """bf16 q, k, v in, fp32 temperatures, exponentials in fp32, bf16 out: within bf16's rounding of the
    output (2^-8 relative) of the reference on the same inputs."""
    generator = torch.Generator().manual_seed(3)
    points = 300
    q = torch.randn(points, heads, d, generator=generator) * scale
    kv = torch.randn(points, views, 2 * heads * d, generator=generator) * scale
    k, v = kv[..., : heads * d].unflatten(-1, (heads, d)), kv[..., heads * d :].unflatten(-1, (heads, d))
    ts, to = (torch.rand(heads, 2 * d, generator=generator) * 0.9 + 0.1 for _ in range(2))
    mask = torch.rand(points, views, generator=generator) > 0.3
    (q16, k16, v16), (q64, k64, v64) = _bf16_and_rounded(q, k, v)
    with torch.inference_mode():
        got = polarity_view_attention(q16, k16, v16, ts, to, mask)
    expected = polarity_attention_reference(
        q64.unsqueeze(-2),
        k64.transpose(-2, -3),
        v64.transpose(-2, -3),
        ts.double().unsqueeze(-2),
        to.double().unsqueeze(-2),
        mask.unsqueeze(-2).expand(-1, heads, -1),
    ).squeeze(-2)
    assert got.dtype == torch.bfloat16 and torch.isfinite(got.float()).all()
    torch.testing.assert_close(got.double(), expected, rtol=2**-7, atol=1e-3 * max(expected.abs().max().item(), 1.0))


@pytest.mark.parametrize("heads, d", HEAD_SHAPES)
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_the_bf16_ray_kernel_and_lepe_against_fp64(scale, heads, d):
    generator = torch.Generator().manual_seed(4)
    rays, samples = 6, 32
    qkv = torch.randn(rays, samples, 3 * heads * d, generator=generator) * scale
    q, k, v = qkv.chunk(3, dim=-1)
    ts, to = (torch.rand(heads, 2 * d, generator=generator) * 0.9 + 0.1 for _ in range(2))
    mask = torch.rand(rays, samples, generator=generator) > 0.2
    (q16, k16, v16), (q64, k64, v64) = _bf16_and_rounded(q, k, v)
    with torch.inference_mode():
        got = polarity_ray_attention(q16, k16, v16, ts, to, mask, heads)

    def split(x):
        return x.unflatten(-1, (heads, -1)).transpose(-2, -3)

    expected = (
        polarity_attention_reference(
            split(q64),
            split(k64),
            split(v64),
            ts.double().unsqueeze(-2),
            to.double().unsqueeze(-2),
            mask.unsqueeze(-2).expand(-1, heads, -1),
        )
        .transpose(-2, -3)
        .flatten(-2)
    )
    assert got.dtype == torch.bfloat16 and torch.isfinite(got.float()).all()
    torch.testing.assert_close(got.double(), expected, rtol=2**-7, atol=1e-3 * max(expected.abs().max().item(), 1.0))

    # The LePE's depthwise convolution: bf16 values and residual, fp32 weights, sums in fp32.
    weight, bias = torch.randn(5, heads * d, generator=generator), torch.randn(heads * d, generator=generator)
    visible = mask.to(torch.bfloat16)
    with torch.inference_mode():
        conv = samples_conv_cpu(v16, weight, bias, visible, got)
    masked = v64 * mask[..., None]
    padded = torch.nn.functional.pad(masked, (0, 0, 2, 2))
    expected_conv = (
        got.double() + bias.double() + sum(padded[:, t : t + samples] * weight[t].double() for t in range(5))
    )
    assert conv.dtype == torch.bfloat16
    torch.testing.assert_close(conv.double(), expected_conv, rtol=2**-7, atol=1e-2)


def test_the_bf16_kernels_take_no_gradients():
    """Training stays fp32/fp64: with autograd on, bf16 inputs take the PyTorch forms (in fp32)."""
    assert cpu_extension.available()
    x = torch.zeros(2, 4, 8, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert cpu_extension.usable(x, 8, views=4)
    assert not cpu_extension.usable(x, 8, views=4)


def test_an_autocast_around_the_bf16_network_changes_nothing():
    """A bf16-mixed trainer's test phase renders under autocast: the fast network keeps its own
    precision (fp32 geometry and projections, its encoder's autocast), so the pixels are those without."""
    net = perturbed_quick_net("pola_gnt")
    sources, rays, depths = random_target_rig(net)
    fast = FastRenderNetwork(net, torch.bfloat16)
    with torch.inference_mode():
        encoded = fast.source_views(sources.images, sources.c2w, sources.intrinsics)
        plain = fast(rays, depths, encoded)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            encoded_under = FastRenderNetwork(net, torch.bfloat16).source_views(
                sources.images, sources.c2w, sources.intrinsics
            )
            under = FastRenderNetwork(net, torch.bfloat16)(rays, depths, encoded_under)
    assert torch.equal(encoded_under.features, encoded.features)
    assert torch.equal(under.rgb, plain.rgb) and torch.equal(under.depth, plain.depth)


def test_rays_are_fp32_under_autocast():
    """A bf16-mixed trainer tests (and a GPU's bf16 autocast renders) under autocast: the rays stay
    those of fp32, or the image edges are read up to a pixel off."""
    intrinsics = torch.tensor([[400.0, 0.0, 252.0], [0.0, 400.0, 189.0], [0.0, 0.0, 1.0]])
    c2w = torch.eye(4)
    c2w[:3, 3] = torch.tensor([0.3, -0.2, 1.7])
    pixels = pixel_grid(378, 504)
    plain = pixel_rays(c2w, intrinsics, pixels)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = pixel_rays(c2w, intrinsics, pixels)
    assert under.directions.dtype == torch.float32
    assert torch.equal(under.directions, plain.directions) and torch.equal(under.origins, plain.origins)
