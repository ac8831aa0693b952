"""polarity_attention (every form) and the view form against the package's fp64 reference of the math
(`pola_gnt.attention.reference`)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP, expm1_
from pola_gnt.attention.linear import op as linear_op
from pola_gnt.attention.linear import pytorch_form as linear_pytorch_form
from pola_gnt.attention.linear.op import polarity_attention, resolve_form
from pola_gnt.attention.reference import polarity_attention_reference
from pola_gnt.attention.view.op import polarity_view_attention

# "linear" runs whole short sequences (`ray.pytorch_form`), "chunked" forces the chunked linear form that
# long sequences take, "quadratic" is the explicit-weights form.
FORMS = ("linear", "chunked", "quadratic")


def reference(q, k, v, temp_same, temp_opp, key_mask=None, **options) -> torch.Tensor:
    """The package's fp64 reference with the modules' temperatures `[heads, 2d]` (as `[heads, 1, 2d]`)."""
    return polarity_attention_reference(q, k, v, temp_same.unsqueeze(-2), temp_opp.unsqueeze(-2), key_mask, **options)


def _inputs(num_queries, num_keys, batch=2, heads=2, d=4, seed=0, dtype=torch.float32, masked=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, num_queries, d, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, heads, num_keys, d, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, heads, num_keys, d, generator=gen, dtype=torch.float64)
    temp_same = torch.rand(heads, 2 * d, generator=gen, dtype=torch.float64) * 0.9 + 0.1
    temp_opp = torch.rand(heads, 2 * d, generator=gen, dtype=torch.float64) * 0.9 + 0.1
    key_mask = torch.rand(batch, heads, num_keys, generator=gen) > 0.35 if masked else None
    if key_mask is not None:
        key_mask[..., 0] = True
    tensors = [x.to(dtype) for x in (q, k, v, temp_same, temp_opp)]
    return tensors, key_mask


def _run(form, q, k, v, temp_same, temp_opp, key_mask=None):
    """The module convention: temps `[heads, 2d]` broadcast as `[heads, 1, 2d]`."""
    with pytest.MonkeyPatch.context() as patch:
        if form == "chunked":
            patch.setattr(linear_op, "SHORT_SEQUENCE", 0)
        return polarity_attention(
            q,
            k,
            v,
            temp_same.unsqueeze(-2),
            temp_opp.unsqueeze(-2),
            key_mask,
            form="linear" if form == "chunked" else form,
        )


@pytest.fixture
def small_chunks(monkeypatch):
    """Force the linear form to walk its sequences in several chunks."""
    monkeypatch.setattr(linear_op, "SHORT_SEQUENCE", 0)
    monkeypatch.setattr(linear_pytorch_form, "_MIN_CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(linear_pytorch_form, "_MAX_CHUNK_ELEMENTS", 3 * 2 * 2 * 4)  # 3 tokens of [2 heads, 2d = 8]


# --------------------------------------------------------------------------------------------------
# Values


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("num_queries,num_keys", [(6, 6), (1, 7), (5, 9)])
def test_matches_reference(form, masked, num_queries, num_keys):
    (q, k, v, ts, to), mask = _inputs(num_queries, num_keys, masked=masked)
    expected = reference(q, k, v, ts, to, mask)
    out = _run(form, q, k, v, ts, to, mask)
    assert out.dtype == torch.float32 and out.shape == q.shape
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


def test_linear_form_in_chunks_matches_reference(small_chunks):
    (q, k, v, ts, to), mask = _inputs(11, 13, dtype=torch.float64)
    expected = reference(q, k, v, ts, to, mask)
    torch.testing.assert_close(_run("linear", q, k, v, ts, to, mask), expected)


@pytest.mark.parametrize("form", FORMS)
def test_masking_a_key_equals_deleting_it(form):
    (q, k, v, ts, to), _ = _inputs(5, 8, batch=1, heads=1, masked=False)
    mask = torch.ones(1, 1, 8, dtype=torch.bool)
    mask[..., [1, 6]] = False
    kept = mask[0, 0]
    # Huge values on the masked keys: any leak into numerator or denominator would show.
    k[..., ~kept, :] *= 50
    v[..., ~kept, :] *= 1e4
    torch.testing.assert_close(
        _run(form, q, k, v, ts, to, mask), _run(form, q, k[..., kept, :], v[..., kept, :], ts, to)
    )


@pytest.mark.parametrize("form", FORMS)
def test_all_masked_query_gives_zeros_and_finite_gradients(form):
    (q, k, v, ts, to), mask = _inputs(4, 6)
    mask[0] = False
    for x in (q, k, v, ts, to):
        x.requires_grad_(True)
    out = _run(form, q, k, v, ts, to, mask)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert (out[1].abs() > 0).any()
    out.sum().backward()
    for x in (q, k, v, ts, to):
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("form", FORMS)
def test_polarity_routing(form):
    """Positive q and k only interact through (+, +): the opposite-sign stream sees zero weight.

    With q >= 0, `Qo = expm1(po * [q-, q+]) = [0, expm1(po q+)]` and with k >= 0,
    `K = [expm1(k+), 0]`, so `Qo . K = 0` for every key and `out_o = 0 / eps = 0`; the same-sign
    stream is plain positive-weight attention. Flipping the sign of q swaps the roles.
    """
    (q, k, v, ts, to), _ = _inputs(5, 7, masked=False)
    q, k = q.abs() + 0.1, k.abs() + 0.1
    d, half = q.shape[-1], q.shape[-1] // 2
    out = _run(form, q, k, v, ts, to)
    assert torch.equal(out[..., half:], torch.zeros_like(out[..., half:]))
    # Temperature channels [0, d) act on q+ in the same-sign stream, on q- in the opposite one.
    weights = torch.expm1(ts[:, None, :d] * q) @ torch.expm1(k).transpose(-1, -2)  # [B, H, Nq, Nk]
    expected = (weights @ v[..., :half]) / (weights.sum(-1, keepdim=True) + EPSILON)
    torch.testing.assert_close(out[..., :half], expected)

    flipped = _run(form, -q, k, v, ts, to)
    assert torch.equal(flipped[..., :half], torch.zeros_like(flipped[..., :half]))
    weights = torch.expm1(to[:, None, :d] * q) @ torch.expm1(k).transpose(-1, -2)
    expected = (weights @ v[..., half:]) / (weights.sum(-1, keepdim=True) + EPSILON)
    torch.testing.assert_close(flipped[..., half:], expected)


@pytest.mark.parametrize("form", FORMS)
def test_small_temperature_limit(form):
    """temp -> 0: expm1(t x) = t x + O(t^2), so a uniform query temperature cancels in the
    normalisation and the output tends to linear attention with query features [q+, q-] (keys keep
    expm1), with an error O(t). Once the weights t * (...) fall below EPSILON the eps term takes over
    and the output goes to 0, as for a query of all zeros."""
    (q, k, v, _, _), mask = _inputs(4, 6, dtype=torch.float64)
    d = q.shape[-1]
    ones = torch.ones(q.shape[1], 2 * d, dtype=torch.float64)
    limit = reference(q, k, v, ones, ones, mask, query_map=lambda z: z)
    errors = []
    for temp in (1e-1, 1e-2, 1e-3):
        errors.append((_run(form, q, k, v, temp * ones, temp * ones, mask) - limit).abs().max())
        assert errors[-1] < temp
    assert errors[0] > 5 * errors[1] > 25 * errors[2]  # first-order convergence
    # A large temperature is visibly different from that limit ...
    assert (_run(form, q, k, v, ones, ones, mask) - limit).abs().max() > 0.1
    # ... and a vanishing one is dominated by eps: zero output.
    vanishing = _run(form, q, k, v, 1e-12 * ones, 1e-12 * ones, mask)
    assert vanishing.abs().max() < 1e-4 * limit.abs().max()


def test_auto_form_picks_the_cheaper_order():
    assert resolve_form("auto", 1, 10, 32) == "quadratic"  # view attention: one query, ~10 views
    assert resolve_form("auto", 4096, 4096, 32) == "linear"
    assert resolve_form("auto", 64, 64, 16) == "linear"
    assert resolve_form("auto", 64, 64, 32) == "quadratic"
    assert resolve_form("quadratic", 4096, 4096, 32) == "quadratic"
    with pytest.raises(ValueError, match="form"):
        resolve_form("fast", 1, 1, 2)
    (q, k, v, ts, to), _ = _inputs(3, 3, masked=False)
    with pytest.raises(ValueError, match="even"):
        polarity_attention(q[..., :3], k[..., :3], v[..., :3], ts[..., :6], to[..., :6])


# --------------------------------------------------------------------------------------------------
# Gradients


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("masked", [False, True])
def test_gradcheck(form, masked):
    (q, k, v, ts, to), mask = _inputs(4, 5, batch=1, dtype=torch.float64, masked=masked)
    inputs = tuple(x.requires_grad_(True) for x in (q, k, v, ts, to))
    assert torch.autograd.gradcheck(lambda *x: _run(form, *x, mask), inputs)


@pytest.mark.parametrize("temp_shape", [(1, 8), (8,), (2, 1, 8)])
def test_gradcheck_linear_in_chunks_with_broadcast_temperatures(small_chunks, temp_shape):
    """Several chunks, and temperatures shared across batch or heads reduce their gradients."""
    (q, k, v, _, _), mask = _inputs(7, 8, batch=1, dtype=torch.float64)
    ts = torch.rand(temp_shape, dtype=torch.float64, requires_grad=True)
    to = torch.rand(temp_shape, dtype=torch.float64, requires_grad=True)
    inputs = (q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True), ts, to)
    assert torch.autograd.gradcheck(lambda *x: polarity_attention(*x, mask, form="linear"), inputs)


def test_clamped_exponent_gradients_match_autograd():
    """Above the clamp the features are constant: the custom backward must agree with autograd of the reference."""
    (q, k, v, ts, to), mask = _inputs(4, 5, dtype=torch.float64)
    q, k = q * 40, k * 40  # many exponents beyond EXPONENT_CLAMP
    weights = torch.linspace(-1, 1, q.shape[-1], dtype=torch.float64)
    grads = {}
    for form, run in (*((form, partial(_run, form)) for form in FORMS), ("reference", reference)):
        inputs = [x.clone().requires_grad_(True) for x in (q, k, v, ts, to)]
        (run(*inputs, mask) * weights).sum().backward()
        grads[form] = [x.grad for x in inputs]
    for form in FORMS:
        for fast, expected in zip(grads[form], grads["reference"]):
            torch.testing.assert_close(fast, expected)


# --------------------------------------------------------------------------------------------------
# Reduced precision


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_bf16_autocast_is_finite_and_accurate(form, scale):
    (q, k, v, ts, to), mask = _inputs(16, 24, d=8)
    q, k, v = q * scale, k * scale, v * scale
    expected = _run(form, *(x.double() for x in (q, k, v, ts, to)), mask)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, ts, to)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # A bf16 projection under autocast, as in the modules.
        q_bf16 = leaves[0] @ torch.eye(q.shape[-1])
        assert q_bf16.dtype == torch.bfloat16
        out = _run(form, q_bf16, *leaves[1:], mask)
        assert out.dtype == torch.bfloat16
        out.float().square().sum().backward()
    assert torch.isfinite(out.float()).all()
    # bf16 rounding of q (8 bits) is the only error source: relative 2^-8 of the output scale.
    torch.testing.assert_close(out.double(), expected, rtol=0.05, atol=0.02 * scale)
    for x in leaves:
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("form", FORMS)
def test_half_inputs_with_large_magnitudes_are_finite(form):
    (q, k, v, ts, to), mask = _inputs(16, 24, d=8)
    leaves = [(x * 6e4 / x.abs().max()).half().requires_grad_(True) for x in (q, k, v)]  # |x| <= 6e4
    leaves += [ts.half().requires_grad_(True), to.half().requires_grad_(True)]
    out = _run(form, *leaves, mask)
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    (out.float() / 6e4).square().sum().backward()
    for x in leaves:
        assert torch.isfinite(x.grad).all()


def test_sums_over_many_large_keys_stay_finite():
    """The documented bound: 2d * e^(2 * 20) * 1e6 keys * 6.5e4 fits in fp32 (fp32 summation
    of 1e6 terms costs some 1e-4 relative accuracy)."""
    num_keys = 1_000_000
    q = torch.full((1, 1, 8), 1e4)  # every exponent clamped: features e^20
    k = torch.full((1, num_keys, 8), 1e4)
    v = torch.full((1, num_keys, 8), 6.5e4)
    temps = torch.ones(1, 16)
    out = polarity_attention(q, k, v, temps, temps, form="linear")
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[..., :4], torch.full((1, 1, 4), 6.5e4), rtol=1e-3, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_linear_dispatch_matches_quadratic(monkeypatch):
    """On CUDA the linear form is the Triton kernel, which passed its first-use check and ran (else
    PyTorch would be compared with itself); it matches the quadratic form."""
    from pola_gnt.attention.linear import triton_form

    (q, k, v, ts, to), mask = _inputs(300, 257, d=16)
    args = [x.cuda() for x in (q, k, v, ts, to)]
    assert linear_op.triton_kernel(args[0]) is not None, "the Triton kernel failed its first-use check"
    calls = []
    kernel = triton_form.polarity_attention_triton

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(triton_form, "polarity_attention_triton", counting)  # after the check: its calls not counted
    linear = _run("linear", *args, mask.cuda())
    assert calls == [(2, 2, 300, 16)], "the linear form did not run the Triton kernel"
    quadratic = _run("quadratic", *args, mask.cuda())
    assert len(calls) == 1  # the quadratic form has no Triton kernel
    torch.testing.assert_close(linear, quadratic, rtol=1e-4, atol=1e-5)


def test_quadratic_form_keeps_only_its_inputs_for_backward():
    """Under autograd the quadratic form recomputes feature maps and weights in backward: what it
    saves is about the size of q, k, v (without recomputation it would be several times that)."""
    points, heads, views, d = 512, 4, 6, 16
    q = torch.randn(points, heads, 1, d, requires_grad=True)
    k = torch.randn(points, heads, views, d, requires_grad=True)
    v = torch.randn(points, heads, views, d, requires_grad=True)
    temp = torch.full((heads, 1, 2 * d), 0.5, requires_grad=True)
    saved_bytes = []

    def pack(tensor):
        saved_bytes.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = polarity_attention(q, k, v, temp, temp, form="quadratic")
    input_bytes = sum(t.numel() * t.element_size() for t in (q, k, v, temp, temp))
    assert sum(saved_bytes) <= 1.5 * input_bytes, (sum(saved_bytes), input_bytes)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, temp))


# --------------------------------------------------------------------------------------------------
# View form: one query per point over a few keys, heads in place (`view.op`)


def _view_inputs(points=5, views=6, heads=2, d=4, scale=1.0, seed=1, dtype=torch.float64):
    """q `[points, heads, d]`, k, v `[points, views, heads, d]`, temps `[heads, 2d]`, mask `[points, views]`
    with one point whose views are all masked."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(points, heads, d, generator=gen, dtype=torch.float64) * scale
    k = torch.randn(points, views, heads, d, generator=gen, dtype=torch.float64) * scale
    v = torch.randn(points, views, heads, d, generator=gen, dtype=torch.float64)
    ts = torch.rand(heads, 2 * d, generator=gen, dtype=torch.float64) * 0.9 + 0.1
    to = torch.rand(heads, 2 * d, generator=gen, dtype=torch.float64) * 0.9 + 0.1
    mask = torch.rand(points, views, generator=gen) > 0.3
    mask[:, 0] = True
    mask[1] = False
    return [x.to(dtype) for x in (q, k, v, ts, to)], mask


def _view_reference(q, k, v, ts, to, mask):
    """The reference with one query per point, heads split: `[points, heads, 1, d]` vs `[points, heads, views, d]`."""
    return reference(
        q.unsqueeze(-2),
        k.transpose(-2, -3),
        v.transpose(-2, -3),
        ts,
        to,
        mask.unsqueeze(-2).expand(-1, q.shape[-2], -1),
    ).squeeze(-2)


@pytest.mark.parametrize("views", [1, 4, 10])
def test_view_form_matches_reference(views):
    (q, k, v, ts, to), mask = _view_inputs(views=views, dtype=torch.float32)
    expected = _view_reference(q, k, v, ts, to, mask)
    out = polarity_view_attention(q, k, v, ts, to, mask)
    assert out.dtype == torch.float32 and out.shape == q.shape
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # every view masked: zeros
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", [1.0, 30.0])  # 30: many exponents beyond the clamp
def test_view_form_values_and_gradients_equal_the_reference_fp64(scale):
    inputs, mask = _view_inputs(scale=scale)
    grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    results = {}
    for name, fn in (("view", polarity_view_attention), ("reference", _view_reference)):
        leaves = [x.clone().requires_grad_(True) for x in inputs]
        out = fn(*leaves, mask)
        results[name] = [out, *torch.autograd.grad(out, leaves, grad)]
    for view, expected in zip(results["view"], results["reference"]):
        assert torch.isfinite(view).all()
        torch.testing.assert_close(view, expected, rtol=1e-10, atol=1e-12 * expected.abs().max().item())


def test_view_form_gradcheck():
    (q, k, v, ts, to), mask = _view_inputs(points=3, views=4)
    inputs = tuple(x.requires_grad_(True) for x in (q, k, v, ts, to))
    assert torch.autograd.gradcheck(lambda *x: polarity_view_attention(*x, mask), inputs)


def test_view_form_masked_views_have_no_effect():
    (q, k, v, ts, to), mask = _view_inputs(dtype=torch.float32)
    k2, v2 = k.clone(), v.clone()
    k2[~mask], v2[~mask] = 50.0, 1e4  # any leak of a masked view would show
    torch.testing.assert_close(
        polarity_view_attention(q, k2, v2, ts, to, mask), polarity_view_attention(q, k, v, ts, to, mask)
    )


@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_view_form_bf16_autocast_and_half_inputs_are_finite(scale):
    (q, k, v, ts, to), mask = _view_inputs(points=16, views=10, d=8, dtype=torch.float32)
    expected = polarity_view_attention(
        *(x.double() * s for x, s in zip((q, k, v, ts, to), (scale, scale, scale, 1, 1))), mask
    )
    leaves = [(x * s).requires_grad_(True) for x, s in zip((q, k, v), (scale, scale, scale))]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = polarity_view_attention((leaves[0] @ torch.eye(8)), *leaves[1:], ts, to, mask)
        assert out.dtype == torch.bfloat16
        out.float().square().sum().backward()
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.double(), expected, rtol=0.05, atol=0.02 * scale)
    for x in leaves:
        assert torch.isfinite(x.grad).all()
    half = [(x * 6e4 / x.abs().max()).half().requires_grad_(True) for x in (q, k, v)]  # |x| <= 6e4
    out = polarity_view_attention(*half, ts.half(), to.half(), mask)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    (out.float() / 6e4).square().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in half)


def test_fast_expm1_is_accurate_over_the_feature_range():
    """The fp32 CPU `expm1_` (Kahan's formula) against fp64 `expm1`: a few ulp everywhere, including
    0, denormals, values below fp32's resolution of exp(z) and the clamp bound."""
    z = torch.cat(
        [
            torch.zeros(3),
            torch.logspace(-44, 0, 4000, dtype=torch.float64).float(),
            torch.linspace(0, EXPONENT_CLAMP, 4000),
            torch.tensor([EXPONENT_CLAMP]),
        ]
    )
    expected = torch.expm1(z.double())
    out = expm1_(z.clone())
    assert torch.equal(out[:3], torch.zeros(3))
    relative = (out.double() - expected).abs() / expected.clamp(min=1e-300)
    assert relative[3:].max() < 3e-7
