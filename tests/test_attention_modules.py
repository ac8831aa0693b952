"""View (cross) and ray (self) attention modules: shapes, gradients, masks, factories."""

from __future__ import annotations

import pytest
import torch

from pola_gnt.attention import RAY_ATTENTION_KINDS, VIEW_ATTENTION_KINDS, build_ray_attention, build_view_attention
from pola_gnt.attention.linear.op import resolve_form

DIM, HEADS, POINTS, VIEWS, RAYS, SAMPLES = 32, 4, 6, 5, 3, 12


def _view_inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(POINTS, DIM, generator=gen)
    tokens = torch.randn(POINTS, VIEWS, DIM, generator=gen)
    rel_dirs = torch.randn(POINTS, VIEWS, 4, generator=gen)
    mask = torch.rand(POINTS, VIEWS, generator=gen) > 0.3
    mask[0] = False  # a point seen by no view
    mask[1] = True
    return query, tokens, rel_dirs, mask


def _output_bias(module: torch.nn.Module) -> torch.Tensor:
    """Output of the module when the attention part is zero: the output projection's bias."""
    layer = module.out_fc if hasattr(module, "out_fc") else module.proj
    return layer.bias


def _ray_modules():
    torch.manual_seed(0)
    return [
        ("pola", build_ray_attention("pola", DIM, HEADS)),
        ("pola-no-lepe", build_ray_attention("pola", DIM, HEADS, lepe=False)),
        ("softmax", build_ray_attention("softmax", DIM, HEADS)),
    ]


@pytest.mark.parametrize("kind", VIEW_ATTENTION_KINDS)
def test_view_attention_shapes_gradients_and_all_masked_points(kind):
    torch.manual_seed(0)
    module = build_view_attention(kind, DIM, HEADS)
    query, tokens, rel_dirs, mask = _view_inputs()
    query.requires_grad_(True)
    out = module(query, tokens, rel_dirs, mask)
    assert out.shape == (POINTS, DIM)
    assert torch.isfinite(out).all()
    # The point with no visible view gets zeros from the attention: only the output bias remains.
    torch.testing.assert_close(out[0], _output_bias(module).detach().expand(DIM))
    out.square().sum().backward()
    assert torch.isfinite(query.grad).all()
    for name, param in module.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    assert module(query, tokens, rel_dirs, torch.zeros_like(mask)).isfinite().all()


@pytest.mark.parametrize("kind", VIEW_ATTENTION_KINDS)
def test_masking_a_view_equals_removing_it(kind):
    torch.manual_seed(0)
    module = build_view_attention(kind, DIM, HEADS).double()
    query, tokens, rel_dirs, mask = (x.double() if x.is_floating_point() else x for x in _view_inputs(1))
    out = module(query, tokens, rel_dirs, mask)
    for point in range(1, POINTS):  # point 0 sees nothing (tested above)
        visible = mask[point].nonzero().squeeze(-1)
        alone = module(
            query[point : point + 1],
            tokens[point : point + 1, visible],
            rel_dirs[point : point + 1, visible],
            torch.ones(1, len(visible), dtype=torch.bool),
        )
        torch.testing.assert_close(out[point : point + 1], alone)


@pytest.mark.parametrize("kind", VIEW_ATTENTION_KINDS)
def test_view_attention_depends_on_visible_views_and_directions(kind):
    """Guards against a module that ignores its keys or the relative-direction embedding."""
    torch.manual_seed(0)
    module = build_view_attention(kind, DIM, HEADS)
    query, tokens, rel_dirs, mask = _view_inputs()
    out = module(query, tokens, rel_dirs, mask)
    assert not torch.allclose(out[1], module(query, tokens * 2, rel_dirs, mask)[1])
    assert not torch.allclose(out[1], module(query, tokens, rel_dirs + 1, mask)[1])


def test_ray_attention_shapes_gradients_and_all_masked_rays():
    tokens = torch.randn(RAYS, SAMPLES, DIM, requires_grad=True)
    mask = torch.rand(RAYS, SAMPLES) > 0.3
    mask[0] = False
    for name, module in _ray_modules():
        out = module(tokens, mask)
        assert out.shape == (RAYS, SAMPLES, DIM), name
        assert torch.isfinite(out).all(), name
        assert module(tokens, None).shape == (RAYS, SAMPLES, DIM), name
        if name != "pola":  # LePE adds its conv bias; without it only the output bias remains
            torch.testing.assert_close(out[0], _output_bias(module).detach().expand(SAMPLES, DIM))
        tokens.grad = None
        out.square().sum().backward()
        assert torch.isfinite(tokens.grad).all(), name
        for param_name, param in module.named_parameters():
            assert param.grad is not None and torch.isfinite(param.grad).all(), (name, param_name)


@pytest.mark.parametrize("samples", [SAMPLES, 48])
@pytest.mark.parametrize("kind", ["pola-no-lepe", "softmax"])
def test_masking_a_sample_equals_removing_it(kind, samples):
    # 12 samples of head dim 8 take the quadratic form of pola, 48 the linear one.
    assert resolve_form("auto", samples, samples, DIM // HEADS) == ("quadratic" if samples == SAMPLES else "linear")
    module = dict(_ray_modules())[kind].double()
    tokens = torch.randn(1, samples, DIM, dtype=torch.float64)
    mask = torch.ones(1, samples, dtype=torch.bool)
    mask[0, [2, 7, samples - 1]] = False
    out = module(tokens, mask)
    kept = mask[0].nonzero().squeeze(-1)
    removed = module(tokens[:, kept], None)
    torch.testing.assert_close(out[:, kept], removed)


def test_pola_lepe_ignores_masked_sample_values():
    """With LePE, v of a masked sample is zeroed before the conv: its content cannot leak."""
    module = dict(_ray_modules())["pola"]
    tokens = torch.randn(1, SAMPLES, DIM)
    mask = torch.ones(1, SAMPLES, dtype=torch.bool)
    mask[0, 5] = False
    changed = tokens.clone()
    changed[0, 5] = 10 * torch.randn(DIM)
    keep = mask[0]
    torch.testing.assert_close(module(tokens, mask)[:, keep], module(changed, mask)[:, keep])
    # ... while without the mask the neighbours of sample 5 do change.
    assert not torch.allclose(module(tokens, None)[:, 4], module(changed, None)[:, 4])


def test_pola_temperatures_and_parameters():
    view = build_view_attention("pola", DIM, HEADS)
    ray = build_ray_attention("pola", DIM, HEADS)
    for module in (view, ray):
        assert module.s1.shape == module.s2.shape == (HEADS, 2 * DIM // HEADS)
        temp_same, temp_opp = module.temperatures()
        torch.testing.assert_close(temp_same, torch.full((HEADS, 2 * DIM // HEADS), 0.5))
        torch.testing.assert_close(temp_opp, torch.full((HEADS, 2 * DIM // HEADS), 0.5))
    assert view.to_qg.out_features == 2 * DIM and view.to_kv.out_features == 2 * DIM
    assert ray.to_qkvg.out_features == 4 * DIM
    assert ray.lepe.kernel_size == (5,) and ray.lepe.groups == DIM
    assert build_ray_attention("pola", DIM, HEADS, lepe=False).lepe is None


def test_temperatures_receive_gradients():
    module = build_ray_attention("pola", DIM, HEADS)
    module(torch.randn(RAYS, SAMPLES, DIM)).square().sum().backward()
    assert module.s1.grad.abs().sum() > 0 and module.s2.grad.abs().sum() > 0


def test_unknown_kinds_and_bad_shapes_raise():
    with pytest.raises(ValueError, match="pola, softmax, subtraction"):
        build_view_attention("linear", DIM, HEADS)
    with pytest.raises(ValueError, match="pola, softmax"):
        build_ray_attention("subtraction", DIM, HEADS)
    assert set(RAY_ATTENTION_KINDS) == {"pola", "softmax"}
    with pytest.raises(ValueError, match="even head dim"):
        build_ray_attention("pola", 12, 4)
    with pytest.raises(ValueError, match="divisible"):
        build_view_attention("softmax", 30, 4)


def test_bf16_autocast_modules_are_finite():
    query, tokens, rel_dirs, mask = _view_inputs()
    for kind in VIEW_ATTENTION_KINDS:
        module = build_view_attention(kind, DIM, HEADS)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(query * 100, tokens * 100, rel_dirs, mask)
        assert torch.isfinite(out.float()).all(), kind
    for name, module in _ray_modules():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(100 * torch.randn(RAYS, SAMPLES, DIM), None)
        assert torch.isfinite(out.float()).all(), name


def test_lepe_shifted_sums_equal_the_depthwise_convolution():
    """The channels-last LePE computes exactly `Conv1d(groups=channels)` along the samples, with gradients."""
    from torch import nn

    from pola_gnt.attention.ray.pytorch_form import depthwise_conv_along_samples

    conv = nn.Conv1d(12, 12, kernel_size=5, padding=2, groups=12).double()
    x = torch.randn(3, 9, 12, dtype=torch.float64, requires_grad=True)
    ours = depthwise_conv_along_samples(x, conv)
    reference = conv(x.transpose(-1, -2)).transpose(-1, -2)
    torch.testing.assert_close(ours, reference)
    grad = torch.randn_like(ours)
    for a, b in zip(
        torch.autograd.grad(ours, (x, *conv.parameters()), grad),
        torch.autograd.grad(reference, (x, *conv.parameters()), grad),
    ):
        torch.testing.assert_close(a, b)
