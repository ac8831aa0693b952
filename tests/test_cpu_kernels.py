"""The fused CPU kernels (C++, `pola_gnt.attention.cpu_extension`: `view.cpu_form`, `ray.cpu_form`)
against the fp64 reference of the math: values and gradients of q, k, v and both temperatures, with
masks, all-masked points and rays, exponents beyond the clamp, zero channels, strided inputs (chunks
of one projection), fp32 and bf16/fp16; and the same function as the PyTorch forms they replace."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from helpers.kernel_calls import count_kernel_calls

from pola_gnt.attention import cpu_extension
from pola_gnt.attention.ray.cpu_form import samples_conv_cpu
from pola_gnt.attention.ray.op import polarity_ray_attention
from pola_gnt.attention.reference import polarity_attention_reference
from pola_gnt.attention.view.op import polarity_view_attention
from pola_gnt.model import render_kernels


@pytest.fixture(params=["fused", "pytorch"])
def cpu_path(request, monkeypatch):
    """Run a test through the fused kernels and through the PyTorch forms; the fused case fails where
    no kernel ran (a failed build or an input the kernels refuse falls back to the PyTorch forms),
    the PyTorch case where one did."""
    calls = count_kernel_calls(monkeypatch, "pola_gnt_cpu")
    if request.param == "pytorch":
        monkeypatch.setattr(cpu_extension, "usable", lambda *args, **kwargs: False)
    yield request.param
    assert bool(calls) == (request.param == "fused"), f"{request.param}: kernels called {dict(calls)}"


def test_the_kernels_build_on_this_machine():
    """CI and this machine have a C++ compiler: the fused path must really run in the tests below
    (without one, users still get correct results from the PyTorch forms, with a warning)."""
    assert cpu_extension.available()
    assert cpu_extension.usable(torch.zeros(1, 8), 8, views=10)
    assert not cpu_extension.usable(torch.zeros(1, 6), 6)  # no compiled head dim: PyTorch forms
    assert not cpu_extension.usable(torch.zeros(1, 8, dtype=torch.bfloat16), 8)


def test_the_render_kernels_build_on_this_machine(recwarn):
    """The rendering network's kernels (`model.render_kernels`, `csrc/render_cpu.cpp`) as the attention's:
    a failed build only warns and renders through the PyTorch forms, so CI checks that it builds."""
    assert render_kernels.available(), [str(warning.message) for warning in recwarn]
    operators = torch.ops.pola_gnt_render
    kernels = ("sample_geometry", "prior_statistics", "view_token_inputs", "masked_max_views", "layer_norm_rows")
    for name in (*kernels, "subtraction_view_attention", "softmax_ray_attention"):
        assert hasattr(operators, name), name


def test_a_failed_build_is_a_warning_and_false(tmp_path, monkeypatch):
    """What users without a compiler get, and what the build tests above guard against in CI."""
    from pola_gnt.core import cpp_build

    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "builds"))
    monkeypatch.delenv(cpp_build.DISABLE_VARIABLE, raising=False)
    with pytest.warns(RuntimeWarning, match="the fused CPU test kernels could not be built"):
        assert cpp_build.build_extension("pola_gnt_broken", broken, "test") is False


def test_the_kernels_can_be_switched_off():
    code = "from pola_gnt.attention import cpu_extension; print(cpu_extension.available())"
    env = {**os.environ, "POLA_GNT_CPU_KERNELS": "0"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "False"


def test_an_edited_shared_header_gives_a_new_build(tmp_path, monkeypatch):
    """torch's build cache does not see headers, so the build's name carries their contents: an edit of
    `core/csrc/vector_math.h` must not reuse an extension built from the old one."""
    from pola_gnt.core import cpp_build

    header = tmp_path / "vector_math.h"
    header.write_text("// one version\n")
    monkeypatch.setattr(cpp_build, "HEADERS", (header,))
    first = cpp_build.build_name("lib", cpu_extension.SOURCE)
    assert cpp_build.build_name("lib", cpu_extension.SOURCE) == first
    header.write_text("// another version\n")
    assert cpp_build.build_name("lib", cpu_extension.SOURCE) != first


def _reference_grads(fn, inputs, grad):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    return [out.detach(), *torch.autograd.grad(out, leaves, grad)]


def _assert_all_close(got, expected, rtol, atol_scale):
    """`atol` scales with the largest value, at least 1 (with one visible view the output is ~v and
    the gradients through the normalisation are differences of O(1) terms that cancel to ~1e-6)."""
    for name, a, b in zip(("out", "q", "k", "v", "temp_same", "temp_opp"), got, expected):
        assert torch.isfinite(a).all(), name
        atol = atol_scale * max(b.abs().max().item(), 1.0)
        torch.testing.assert_close(a.double(), b, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


# --------------------------------------------------------------------------------------------------
# View attention: q [P, H, d], k, v [P, V, H, d]


def _view_case(points=9, views=6, heads=2, d=8, scale=1.0, seed=0, strided=True, zeros=True):
    """Inputs in fp64, the mask (one point with no visible view), and (`zeros`) zeros in q and k. With `strided`,
    k and v are the two halves of one `[P, V, 2 H d]` tensor, as the module's projection gives them."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(points, heads, d, generator=gen, dtype=torch.float64) * scale
    kv = torch.randn(points, views, 2 * heads * d, generator=gen, dtype=torch.float64) * scale
    ts = torch.rand(heads, 2 * d, generator=gen, dtype=torch.float64) * 0.9 + 0.1
    to = torch.rand(heads, 2 * d, generator=gen, dtype=torch.float64) * 0.9 + 0.1
    if zeros:  # relu's kink: exact zeros must get relu's gradient 0 (gradcheck's differences cannot see it)
        q[0, 0, : d // 2] = 0.0
        kv[2, 0, :d] = 0.0
    k, v = (x.unflatten(-1, (heads, d)) for x in kv.chunk(2, dim=-1))
    if not strided:
        k, v = k.contiguous(), v.contiguous()
    mask = torch.rand(points, views, generator=gen) > 0.3
    mask[:, 0] = True
    mask[1] = False
    return [q, k, v, ts, to], mask


def _view_reference(q, k, v, ts, to, mask):
    heads = q.shape[-2]
    return polarity_attention_reference(
        q.unsqueeze(-2),
        k.transpose(-2, -3),
        v.transpose(-2, -3),
        ts.unsqueeze(-2),
        to.unsqueeze(-2),
        mask.unsqueeze(-2).expand(-1, heads, -1),
    ).squeeze(-2)


@pytest.mark.parametrize("d", [2, 8, 16])
@pytest.mark.parametrize("views", [1, 4, 10])
@pytest.mark.parametrize("scale", [1.0, 30.0])  # 30: many exponents beyond the clamp
def test_view_kernel_equals_the_reference_in_fp64(cpu_path, d, views, scale):
    inputs, mask = _view_case(views=views, d=d, scale=scale)
    grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = _reference_grads(lambda *x: polarity_view_attention(*x, mask), inputs, grad)
    expected = _reference_grads(lambda *x: _view_reference(*x, mask), inputs, grad)
    _assert_all_close(got, expected, rtol=1e-10, atol_scale=1e-11)
    assert torch.equal(got[0][1], torch.zeros_like(got[0][1]))  # every view masked: zeros
    assert torch.equal(got[2][1], torch.zeros_like(got[2][1]))  # ... and no key gradient


def test_view_kernel_in_fp32_is_within_a_few_ulp_of_the_reference():
    inputs, mask = _view_case(points=64, views=10, heads=4, d=16, seed=3)
    grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = _reference_grads(lambda *x: polarity_view_attention(*x, mask), [x.float() for x in inputs], grad.float())
    expected = _reference_grads(lambda *x: _view_reference(*x, mask), inputs, grad)
    _assert_all_close(got, expected, rtol=2e-5, atol_scale=2e-6)


def test_view_kernel_gradcheck():
    inputs, mask = _view_case(points=3, views=3, d=4, strided=False, zeros=False)
    leaves = tuple(x.requires_grad_(True) for x in inputs)
    assert torch.autograd.gradcheck(lambda *x: polarity_view_attention(*x, mask), leaves)


# --------------------------------------------------------------------------------------------------
# Ray attention: q, k, v [R, S, H d] (heads in place)


def _ray_case(rays=5, samples=13, heads=2, d=8, scale=1.0, seed=0, zeros=True):
    """q, k, v as three chunks of one `[R, S, 4 H d]` tensor (rows strided, as `to_qkvg` gives them)."""
    gen = torch.Generator().manual_seed(seed)
    qkvg = torch.randn(rays, samples, 4 * heads * d, generator=gen, dtype=torch.float64) * scale
    ts = torch.rand(heads, 2 * d, generator=gen, dtype=torch.float64) * 0.9 + 0.1
    to = torch.rand(heads, 2 * d, generator=gen, dtype=torch.float64) * 0.9 + 0.1
    q, k, v, _ = qkvg.chunk(4, dim=-1)
    if zeros:
        q[0, 0, :3] = 0.0
        k[0, -1, :3] = 0.0
    mask = torch.rand(rays, samples, generator=gen) > 0.25
    mask[:, 0] = True
    mask[1] = False
    return [q, k, v, ts, to], mask


def _ray_reference(q, k, v, ts, to, mask, heads):
    def split(x):
        return x.unflatten(-1, (heads, -1)).transpose(-2, -3)

    key_mask = mask.unsqueeze(-2).expand(-1, heads, -1)
    out = polarity_attention_reference(split(q), split(k), split(v), ts.unsqueeze(-2), to.unsqueeze(-2), key_mask)
    return out.transpose(-2, -3).flatten(-2)


@pytest.mark.parametrize("d", [2, 8, 16])
@pytest.mark.parametrize("samples", [1, 13, 64])
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_ray_kernel_equals_the_reference_in_fp64(cpu_path, d, samples, scale):
    heads = 2
    inputs, mask = _ray_case(samples=samples, heads=heads, d=d, scale=scale)
    grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = _reference_grads(lambda *x: polarity_ray_attention(*x, mask, heads), inputs, grad)
    expected = _reference_grads(lambda *x: _ray_reference(*x, mask, heads), inputs, grad)
    _assert_all_close(got, expected, rtol=1e-10, atol_scale=1e-11)
    assert torch.equal(got[0][1], torch.zeros_like(got[0][1]))  # every sample masked: zeros


def test_ray_kernel_without_a_mask_and_in_fp32():
    heads = 4
    inputs, _ = _ray_case(rays=6, samples=48, heads=heads, d=16, seed=4)
    grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = _reference_grads(
        lambda *x: polarity_ray_attention(*x, None, heads), [x.float() for x in inputs], grad.float()
    )
    expected = _reference_grads(lambda *x: _ray_reference(*x, torch.ones(6, 48, dtype=torch.bool), heads), inputs, grad)
    _assert_all_close(got, expected, rtol=2e-5, atol_scale=2e-6)


def test_ray_kernel_gradcheck():
    inputs, mask = _ray_case(rays=2, samples=5, d=4, zeros=False)
    leaves = tuple(x.detach().clone().requires_grad_(True) for x in inputs)
    assert torch.autograd.gradcheck(lambda *x: polarity_ray_attention(*x, mask, 2), leaves)


@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_ray_attention_bf16_autocast_and_half_inputs_are_finite(scale):
    heads = 4
    inputs, mask = _ray_case(rays=4, samples=32, heads=heads, d=8, scale=1.0)
    q, k, v, ts, to = (x.float() for x in inputs)
    expected = polarity_ray_attention(*(x.double() * scale for x in (q, k, v)), ts.double(), to.double(), mask, heads)
    leaves = [(x * scale).requires_grad_(True) for x in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = polarity_ray_attention(leaves[0] @ torch.eye(q.shape[-1]), *leaves[1:], ts, to, mask, heads)
        assert out.dtype == torch.bfloat16
        out.float().square().sum().backward()
    torch.testing.assert_close(out.double(), expected, rtol=0.05, atol=0.02 * scale)
    assert all(torch.isfinite(x.grad).all() for x in leaves)
    half = [(x * 6e4 / x.abs().max()).half().requires_grad_(True) for x in (q, k, v)]  # |x| <= 6e4
    out = polarity_ray_attention(*half, ts.half(), to.half(), mask, heads)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    (out.float() / 6e4).square().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in half)


# --------------------------------------------------------------------------------------------------
# Both kernels


def test_results_do_not_depend_on_the_thread_count():
    """Work is split into blocks fixed by the sizes, and the temperature gradients' partial sums are
    added in block order: 1 and 2 threads give the same bits."""
    (q, k, v, ts, to), mask = _view_case(points=700, views=5, heads=4, d=8, seed=5)
    (qr, kr, vr, _, _), ray_mask = _ray_case(rays=40, samples=24, heads=4, d=8, seed=6)
    inputs = [x.float() for x in (q, k, v, ts, to, qr, kr, vr)]
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            leaves = [x.clone().requires_grad_(True) for x in inputs]
            view = polarity_view_attention(*leaves[:5], mask)
            ray = polarity_ray_attention(*leaves[5:], leaves[3], leaves[4], ray_mask, 4)
            (view.square().sum() + ray.square().sum()).backward()
            results.append([view, ray, *(x.grad for x in leaves)])
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*results):
        assert torch.equal(one, two)


def test_the_fused_and_the_pytorch_forms_agree_in_fp32(monkeypatch):
    """Same inputs through both paths, as training on a machine without a compiler would see them."""
    heads = 4
    (q, k, v, ts, to), mask = _view_case(points=50, views=4, heads=heads, d=8, seed=7)
    (qr, kr, vr, _, _), ray_mask = _ray_case(rays=8, samples=32, heads=heads, d=8, seed=8)
    inputs = [x.float() for x in (q, k, v, ts, to, qr, kr, vr)]

    def run():
        leaves = [x.clone().requires_grad_(True) for x in inputs]
        view = polarity_view_attention(*leaves[:5], mask)
        ray = polarity_ray_attention(*leaves[5:], leaves[3], leaves[4], ray_mask, heads)
        (view.square().sum() + ray.square().sum()).backward()
        return [view, ray, *(x.grad for x in leaves)]

    fused = run()
    monkeypatch.setattr(cpu_extension, "usable", lambda *args, **kwargs: False)
    pytorch = run()
    for a, b in zip(fused, pytorch):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * b.abs().max().item())


# --------------------------------------------------------------------------------------------------
# LePE: depthwise convolution along the samples


def test_samples_conv_equals_conv1d_in_fp64():
    """`residual + conv1d(x * mask)` (PyTorch's depthwise, zero-padded conv1d) with x a strided chunk."""
    gen = torch.Generator().manual_seed(0)
    channels, taps = 8, 5
    x = torch.randn(3, 7, 3 * channels, generator=gen, dtype=torch.float64)[..., channels : 2 * channels]
    residual = torch.randn(3, 7, channels, generator=gen, dtype=torch.float64)
    weight = torch.randn(channels, 1, taps, generator=gen, dtype=torch.float64)
    bias = torch.randn(channels, generator=gen, dtype=torch.float64)
    mask = torch.rand(3, 7, generator=gen) > 0.3
    mask[1] = False

    def fused(x, residual, weight, bias):
        return samples_conv_cpu(x, weight[:, 0, :].t(), bias, mask.double(), residual)

    def reference(x, residual, weight, bias):
        masked = (x * mask[..., None]).transpose(1, 2)
        conv = torch.nn.functional.conv1d(masked, weight, bias, padding=taps // 2, groups=channels)
        return residual + conv.transpose(1, 2)

    inputs = [x, residual, weight, bias]
    grad = torch.randn(3, 7, channels, generator=gen, dtype=torch.float64)
    got = _reference_grads(fused, inputs, grad)
    expected = _reference_grads(reference, inputs, grad)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    leaves = tuple(t.detach().clone().requires_grad_(True) for t in inputs)
    assert torch.autograd.gradcheck(fused, leaves)


def test_pola_ray_attention_module_is_the_same_through_both_paths(monkeypatch):
    """The module (projections, kernel, LePE, gate) in fp64: fused and PyTorch paths agree to rounding,
    parameter gradients included."""
    from pola_gnt.attention.modules import PolaRayAttention

    torch.manual_seed(0)
    module = PolaRayAttention(32, 4).double()
    tokens = torch.randn(6, 20, 32, dtype=torch.float64)
    mask = torch.rand(6, 20) > 0.2

    def run():
        module.zero_grad()
        x = tokens.clone().requires_grad_(True)
        out = module(x, mask)
        out.square().sum().backward()
        return [out, x.grad, *(p.grad for p in module.parameters())]

    fused = run()
    monkeypatch.setattr(cpu_extension, "usable", lambda *args, **kwargs: False)
    pytorch = run()
    for a, b in zip(fused, pytorch):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.skipif(not cpu_extension.available(), reason="the fused CPU kernels are not built")
def test_the_operators_shapes_are_known_to_torch_compile():
    """torch.compile (`model.compile`) traces the kernels through their registered fake (shape-only)
    implementations; `opcheck` runs each operator for real and on fake tensors and compares them, with
    more than one work block (the backward operators return one temperature partial per block)."""
    ops = torch.ops.pola_gnt_cpu
    checks = ("test_schema", "test_faketensor")
    (q, k, v, ts, to), mask = _view_case(points=300, views=4, heads=2, d=8)
    visible = mask.double()
    torch.library.opcheck(ops.view_forward.default, (q, k, v, ts, to, visible), test_utils=checks)
    torch.library.opcheck(ops.view_backward.default, (torch.randn_like(q), q, k, v, ts, to, visible), test_utils=checks)
    (q, k, v, ts, to), mask = _ray_case(rays=20, samples=9, heads=2, d=8)
    visible = mask.double()
    torch.library.opcheck(ops.ray_forward.default, (q, k, v, ts, to, visible, 2), test_utils=checks)
    grad = torch.randn(q.shape, dtype=q.dtype)
    torch.library.opcheck(ops.ray_backward.default, (grad, q, k, v, ts, to, visible, 2), test_utils=checks)
    x, weight, bias = torch.randn(20, 9, 16, dtype=torch.float64), torch.randn(3, 16, dtype=torch.float64), None
    torch.library.opcheck(ops.samples_conv_forward.default, (x, weight, bias, visible, x.clone()), test_utils=checks)
    torch.library.opcheck(ops.samples_conv_backward.default, (x.clone(), x, weight, visible), test_utils=checks)
