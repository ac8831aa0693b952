"""The fused Triton view-attention kernels (`pola_gnt.attention.view.triton_form`) against the fp64 reference:
values and gradients of q, k, v and both temperatures, with masks, a point with every view masked,
exponents beyond the clamp, zero channels, strided k and v (chunks of one projection), fp32 and
bf16/fp16; the dispatch of `polarity_view_attention` on CUDA.

As in `test_triton_linear.py`, the kernels run in Triton's CPU interpreter in a child pytest with
`TRITON_INTERPRET=1` (`test_kernels_in_interpreter`); here those tests are skipped.
`TRITON_INTERPRET=1 pytest tests/test_triton_view.py` runs them directly.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from helpers.interpreter import INTERPRETING, assert_passes_in_interpreter, compiled_cuda, interpreter  # noqa: E402

from pola_gnt.attention import triton_lookup  # noqa: E402
from pola_gnt.attention.features import EXPONENT_CLAMP  # noqa: E402
from pola_gnt.attention.reference import polarity_attention_reference  # noqa: E402
from pola_gnt.attention.view import op as view_op  # noqa: E402
from pola_gnt.attention.view import triton_form as triton_view  # noqa: E402

LEAF_NAMES = ("q", "k", "v", "temp_same", "temp_opp")


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_kernels_in_interpreter(request):
    assert_passes_in_interpreter(__file__, request)


def view_case(points, views, heads, d, masked=True, strided=True, scale=1.0, seed=0, dtype=torch.float32, device="cpu"):
    """Inputs `[q, k, v, temp_same, temp_opp]` (q, k, v in `dtype`, temperatures in fp32 as the model's
    parameters are) with zeros in q and k, and the key mask (point 1 with every view masked) or None.
    With `strided`, k and v are the two halves of one `[P, views, 2 heads d]` tensor, as the module's
    projection gives them."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(points, heads, d, generator=gen, dtype=torch.float64) * scale
    kv = torch.randn(points, views, 2 * heads * d, generator=gen, dtype=torch.float64) * scale
    temp_same = torch.rand(heads, 2 * d, generator=gen, dtype=torch.float64) * 0.9 + 0.1
    temp_opp = torch.rand(heads, 2 * d, generator=gen, dtype=torch.float64) * 0.9 + 0.1
    q[0, 0, : d // 2] = 0.0  # relu's kink: exact zeros get relu's gradient 0
    kv[2, 0, :d] = 0.0
    q, kv = q.to(device, dtype), kv.to(device, dtype)  # cast before chunking: a copy of a chunk is contiguous
    # |k| exactly at the clamp (frequent in bf16) is a kink where the reference (torch.clamp) takes the
    # slope 0 and the fast paths the slope below it: keep keys off it.
    kv = torch.where(kv.abs() == EXPONENT_CLAMP, kv * 0.975, kv)
    k, v = (x.unflatten(-1, (heads, d)) for x in kv.chunk(2, dim=-1))
    if not strided:
        k, v = k.contiguous(), v.contiguous()
    mask = None
    if masked:
        mask = (torch.rand(points, views, generator=gen) > 0.3).to(device)
        mask[:, 0] = True
        mask[1] = False
    return [q, k, v, temp_same.to(device, torch.float32), temp_opp.to(device, torch.float32)], mask


def view_reference(q, k, v, temp_same, temp_opp, mask):
    """The fp64 reference with one query per point, heads split: `[P, heads, 1, d]` vs `[P, heads, views, d]`."""
    heads = q.shape[-2]
    return polarity_attention_reference(
        q.unsqueeze(-2),
        k.transpose(-2, -3),
        v.transpose(-2, -3),
        temp_same.unsqueeze(-2),
        temp_opp.unsqueeze(-2),
        None if mask is None else mask.unsqueeze(-2).expand(-1, heads, -1),
    ).squeeze(-2)


def values_and_grads(fn, inputs, grad):
    """`[out, d q, d k, d v, d temp_same, d temp_opp]` of `fn(*inputs)` against `grad`, with the inputs'
    strides as given (k and v stay chunks of one tensor)."""
    leaves = [x.detach().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    return [out, *torch.autograd.grad(out, leaves, grad.to(out.dtype))]


def triton_values_and_grads(inputs, mask, grad):
    visible = None if mask is None else mask.to(torch.float32)
    return values_and_grads(lambda *x: triton_view.polarity_view_attention_triton(*x, visible=visible), inputs, grad)


def assert_all_close(got, expected, rtol, atol_scale, names=("out", *LEAF_NAMES)):
    """`atol` scales with the largest value, at least 1 (with one visible view the output is ~v and
    the gradients through the normalisation are differences of O(1) terms that cancel to ~1e-6)."""
    for name, a, b in zip(names, got, expected, strict=True):
        assert torch.isfinite(a).all(), name
        atol = atol_scale * max(b.abs().max().item(), 1.0)
        torch.testing.assert_close(a.double(), b, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


# (points, views, heads, d, masked, strided, scale): 37 points are three interpreter blocks of 16;
# scale 30 puts many exponents beyond the clamp.
CASES = [
    pytest.param(5, 1, 1, 2, False, False, 1.0, id="d2-one-view"),
    pytest.param(37, 4, 4, 8, True, True, 1.0, id="d8-heads4-masked-strided"),
    pytest.param(20, 10, 1, 16, True, True, 30.0, id="d16-views10-masked-clamped"),
    pytest.param(9, 10, 4, 16, False, True, 1.0, id="d16-views10-heads4-strided"),
    pytest.param(6, 4, 4, 2, True, False, 30.0, id="d2-heads4-masked-clamped"),
    pytest.param(18, 3, 2, 64, True, True, 1.0, id="d64-widest-masked-strided"),
]


@interpreter
@pytest.mark.parametrize("points, views, heads, d, masked, strided, scale", CASES)
def test_fp32_values_and_gradients_equal_the_reference(points, views, heads, d, masked, strided, scale):
    inputs, mask = view_case(points, views, heads, d, masked, strided, scale)
    assert inputs[1].is_contiguous() != strided
    grad = torch.randn(points, heads, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = triton_values_and_grads(inputs, mask, grad)
    expected = values_and_grads(lambda *x: view_reference(*x, mask=mask), [x.double() for x in inputs], grad)
    # Beyond the clamp, weights of ~e^40 cancel in the gradients: a few fp32 ulp of those.
    assert_all_close(got, expected, rtol=2e-5, atol_scale=2e-6 if scale == 1.0 else 1e-5)
    for name, result, leaf in zip(LEAF_NAMES, got[1:], inputs):
        assert result.shape == leaf.shape and result.dtype == torch.float32, name

    out, grad_q, grad_k, grad_v = got[:4]
    assert torch.all(grad_q[0, 0, : d // 2] == 0) and torch.all(grad_k[2, 0, 0] == 0)  # zero channels
    if masked:  # point 1 sees no view: zeros out, and nothing flows back to it
        for x in (out[1], grad_q[1], grad_k[1], grad_v[1]):
            assert torch.equal(x, torch.zeros_like(x))


@interpreter
def test_temperatures_shared_by_all_heads_broadcast():
    """`[2d]` temperatures are expanded to every head, and their gradients summed back to `[2d]`."""
    inputs, mask = view_case(points=7, views=3, heads=2, d=4)
    inputs[3:] = [t[0] for t in inputs[3:]]
    grad = torch.randn(7, 2, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = triton_values_and_grads(inputs, mask, grad)
    expected = values_and_grads(lambda *x: view_reference(*x, mask=mask), [x.double() for x in inputs], grad)
    assert got[4].shape == got[5].shape == (8,)
    assert_all_close(got, expected, rtol=2e-5, atol_scale=2e-6)


@interpreter
@pytest.mark.parametrize("dtype, rounding", [(torch.float16, 1e-3), (torch.bfloat16, 8e-3)])
def test_half_precision_large_magnitudes(dtype, rounding):
    """fp16 overflows at exp(11.1): the features must be computed in fp32 from the half inputs.
    Against the reference at the same half inputs and output gradient, the output and d q, d k, d v
    differ by their rounding to half, and the fp32 temperature gradients by fp32 rounding only."""
    inputs, mask = view_case(points=21, views=6, heads=2, d=16, scale=30.0, seed=3, dtype=dtype)
    grad = torch.randn(21, 2, 16, generator=torch.Generator().manual_seed(4)).to(dtype).double()
    got = triton_values_and_grads(inputs, mask, grad)
    expected = values_and_grads(lambda *x: view_reference(*x, mask=mask), [x.double() for x in inputs], grad)
    assert got[0].dtype == dtype and [g.dtype for g in got[1:]] == [dtype] * 3 + [torch.float32] * 2
    assert_all_close(got[:4], expected[:4], rtol=rounding, atol_scale=rounding, names=("out", "q", "k", "v"))
    assert_all_close(got[4:], expected[4:], rtol=2e-5, atol_scale=1e-5, names=LEAF_NAMES[3:])


def test_view_triton_supported(monkeypatch):
    q = torch.zeros(5, 4, 16)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert triton_view.view_triton_supported(q) == q.is_cuda  # CPU without the interpreter: no
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert triton_view.view_triton_supported(q.to(dtype))
    assert not triton_view.view_triton_supported(q.double())  # fp64 stays on the PyTorch path
    for head_dim, supported in ((2, True), (64, True), (15, False), (128, False)):
        assert triton_view.view_triton_supported(torch.zeros(5, 4, head_dim)) == supported, head_dim


@pytest.mark.parametrize(
    "q_shape, k_shape, temp_shape, visible_shape, match",
    [
        ((5, 2, 8), (5, 3, 2, 4), (2, 16), None, "expected q"),
        ((5, 2, 128), (5, 3, 2, 128), (2, 256), None, "head dim"),
        ((5, 2, 8), (5, 3, 2, 8), (3, 16), None, "temp_same"),
        ((5, 2, 8), (5, 3, 2, 8), (2, 16), (5, 4), "visible"),
    ],
)
def test_rejects_bad_shapes(q_shape, k_shape, temp_shape, visible_shape, match):
    q, k = torch.zeros(q_shape), torch.zeros(k_shape)
    visible = None if visible_shape is None else torch.ones(visible_shape)
    with pytest.raises(ValueError, match=match):
        triton_view.polarity_view_attention_triton(q, k, k, torch.ones(temp_shape), torch.ones(temp_shape), visible)


@pytest.mark.gpu
@compiled_cuda
@pytest.mark.parametrize("dtype, rtol, atol_scale", [(torch.float32, 2e-5, 2e-6), (torch.bfloat16, 2e-2, 2e-2)])
def test_cuda_dispatch_takes_the_kernels_and_matches_pytorch(monkeypatch, dtype, rtol, atol_scale):
    """`polarity_view_attention` on CUDA (batch dims, strided k and v) runs the compiled kernels and
    gives the PyTorch form's values and gradients; fp32 also equals the fp64 reference."""
    inputs, mask = view_case(points=3000, views=10, heads=4, d=16, scale=3.0, seed=5, dtype=dtype, device="cuda")
    batched = [inputs[0].unflatten(0, (2, 1500)), *(x.unflatten(0, (2, 1500)) for x in inputs[1:3]), *inputs[3:]]
    grad = torch.randn(2, 1500, 4, 16, device="cuda", generator=torch.Generator("cuda").manual_seed(6))

    # The lookup first (its first-use check calls the kernel too): the kernel passed it, and is then called.
    assert view_op.triton_kernel(batched[0]) is not None, "the Triton view kernel failed its first-use check"
    calls = []
    kernels = triton_view.polarity_view_attention_triton

    def counting(*args):
        calls.append(args[0].shape)
        return kernels(*args)

    monkeypatch.setattr(triton_view, "polarity_view_attention_triton", counting)
    assert mask is not None
    batched_mask = mask.unflatten(0, (2, 1500))
    got = values_and_grads(lambda *x: view_op.polarity_view_attention(*x, key_mask=batched_mask), batched, grad)
    assert calls == [(3000, 4, 16)]
    monkeypatch.setenv(triton_lookup.DISABLE_VARIABLE, "0")
    pytorch = values_and_grads(lambda *x: view_op.polarity_view_attention(*x, key_mask=batched_mask), batched, grad)
    assert got[0].dtype == dtype
    assert_all_close(got, [x.double() for x in pytorch], rtol=rtol, atol_scale=atol_scale)
    if dtype == torch.float32:
        expected = values_and_grads(
            lambda *x: view_reference(*x, mask=mask), [x.double() for x in inputs], grad.flatten(0, 1).double()
        )
        flat = [got[0].flatten(0, 1), *(g.flatten(0, 1) for g in got[1:4]), *got[4:]]
        assert_all_close(flat, expected, rtol=rtol, atol_scale=atol_scale)
