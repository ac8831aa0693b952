"""The fused Triton ray-attention kernel computes `polarity_ray_attention` and its gradients.

As in `test_triton_linear.py`, the kernel tests run in Triton's CPU interpreter in a child pytest with
`TRITON_INTERPRET=1` (`test_kernels_in_interpreter`) and are skipped here; the interpreter is slow,
so they use a few rays of short length. `TRITON_INTERPRET=1 pytest tests/test_triton_ray.py` runs
them directly. The CUDA tests (marker `gpu`) compare the compiled kernel with the PyTorch path.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from helpers.interpreter import INTERPRETING, assert_passes_in_interpreter, compiled_cuda, interpreter  # noqa: E402

from pola_gnt.attention import cpu_extension, triton_lookup  # noqa: E402
from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP  # noqa: E402
from pola_gnt.attention.ray import op as ray_op  # noqa: E402
from pola_gnt.attention.ray import triton_form as triton_ray  # noqa: E402
from pola_gnt.attention.reference import polarity_attention_reference  # noqa: E402

NAMES = ("q", "k", "v", "temp_same", "temp_opp")


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_kernels_in_interpreter(request):
    assert_passes_in_interpreter(__file__, request)


def make_inputs(
    rays,
    samples,
    heads,
    head_dim,
    masked,
    scale=1.0,
    dtype=torch.float32,
    device="cpu",
    seed=0,
    strided=True,
    edit=None,
):
    """Leaves `(q, k, v, temp_same, temp_opp)`: q, k, v `[rays, samples, heads d]` (with `strided`, the
    chunks of one `[rays, samples, 3 heads d]` projection, as the model passes them), temperatures
    `[heads, 2d]` in (0, 1); and a bool sample mask `[rays, samples]` or None. `edit` may set values of
    the projection `[rays, samples, 3 heads d]` (q, k, v channels in this order) in place first."""
    gen = torch.Generator().manual_seed(seed)
    dim = heads * head_dim
    qk = scale * torch.randn(rays, samples, 2 * dim, generator=gen)
    projection = torch.cat([qk, torch.randn(rays, samples, dim, generator=gen)], dim=-1)
    if edit is not None:
        edit(projection)
    if strided:
        projection = projection.to(device=device, dtype=dtype).requires_grad_()
        q, k, v = projection.chunk(3, dim=-1)
    else:
        q, k, v = (x.to(device=device, dtype=dtype).contiguous().requires_grad_() for x in projection.chunk(3, dim=-1))
    temp_same, temp_opp = (
        torch.sigmoid(torch.randn(heads, 2 * head_dim, generator=gen)).to(device).requires_grad_() for _ in range(2)
    )
    mask = None
    if masked:
        mask = (torch.rand(rays, samples, generator=gen) > 0.3).to(device)
        mask[:, 0] = True
    return (q, k, v, temp_same, temp_opp), mask


def reference(leaves, mask, heads):
    """`polarity_attention_reference` (fp64) of the leaves `(q, k, v, temp_same, temp_opp)` on the
    heads-split tensors `[rays, heads, samples, d]`."""
    q, k, v, temp_same, temp_opp = leaves
    q, k, v = (x.unflatten(-1, (heads, -1)).transpose(-2, -3) for x in (q, k, v))
    key_mask = None if mask is None else mask.unsqueeze(-2)
    out = polarity_attention_reference(q, k, v, temp_same.unsqueeze(-2), temp_opp.unsqueeze(-2), key_mask)
    return out.transpose(-2, -3).flatten(-2)


def run_kernel(leaves, mask, heads):
    q, k, v, temp_same, temp_opp = leaves
    visible = None if mask is None else mask.float()
    return triton_ray.polarity_ray_attention_triton(q, k, v, temp_same, temp_opp, visible, heads)


def grads_of(out, leaves, grad_out):
    """Gradients w.r.t. the five leaves of `make_inputs` (q, k, v share a leaf when strided)."""
    q, k, v, temp_same, temp_opp = leaves
    if q._base is not None and q._base is k._base:  # chunks of one projection leaf
        grad_qkv, grad_same, grad_opp = torch.autograd.grad(out, (q._base, temp_same, temp_opp), grad_out)
        return (*grad_qkv.chunk(3, dim=-1), grad_same, grad_opp)
    return torch.autograd.grad(out, leaves, grad_out)


def assert_close_scaled(actual, expected, rel: float, name: str = "", floor: float = 1e-6):
    """Elementwise |a - e| <= rel * max|e| + floor: relative to the tensor's scale (the floor covers
    gradients that vanish analytically, e.g. a one-sample ray's temperature gradients, ~1e-7 in fp32)."""
    expected = expected.to(torch.float64)
    actual = actual.to(torch.float64)
    scale = expected.abs().max().item() if expected.numel() else 0.0
    err = (actual - expected).abs().max().item() if expected.numel() else 0.0
    assert err <= rel * scale + floor, f"{name}: max error {err:.3e} vs scale {scale:.3e} (rel {rel})"


def check_against_reference(leaves, mask, heads, rel_out, rel_grad, seed=1, floor=1e-6):
    out = run_kernel(leaves, mask, heads)
    assert out.shape == leaves[0].shape and out.dtype == leaves[0].dtype and out.is_contiguous()
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)
    grads = grads_of(out, leaves, grad_out)
    fp64_leaves = [x.detach().double().requires_grad_() for x in leaves]
    expected = reference(fp64_leaves, mask, heads)
    expected_grads = torch.autograd.grad(expected, fp64_leaves, grad_out.double())
    assert_close_scaled(out, expected, rel=rel_out, name="out")
    for name, grad, want, leaf in zip(NAMES, grads, expected_grads, leaves):
        assert grad.shape == leaf.shape and torch.isfinite(grad).all(), name
        assert_close_scaled(grad, want, rel=rel_grad, name=f"d{name}", floor=floor)
    return out, grads


# (samples, heads, d, masked, strided): narrow heads packed side by side into 16-wide tiles (d = 2: 8
# heads a program, 4: 4, 8: 2; with 3 or 5 heads the last program's group is partial), heads narrower
# than their power-of-two slot (6 in 8, 12 in 16: padding lanes between packed heads), one head a
# program (16, 32) and the wide heads' 16-row, 8-warp tiling (64, 128); sample counts not multiples of
# the 32- and 16-sample tiles, a one-sample ray, contiguous rows.
SHAPES = [
    pytest.param(7, 1, 2, False, True, id="S7-h1-d2"),
    pytest.param(40, 4, 2, True, True, id="S40-h4-d2-masked"),
    pytest.param(23, 5, 4, True, True, id="S23-h5-d4-masked-partial-group"),
    pytest.param(40, 4, 8, True, True, id="S40-h4-d8-masked"),
    pytest.param(33, 3, 8, True, False, id="S33-h3-d8-masked-partial-group"),
    pytest.param(30, 3, 6, True, True, id="S30-h3-d6-masked-slot8"),
    pytest.param(18, 2, 12, False, True, id="S18-h2-d12-slot16"),
    pytest.param(130, 1, 16, True, True, id="S130-h1-d16-masked"),
    pytest.param(7, 4, 16, False, False, id="S7-h4-d16-contiguous"),
    pytest.param(40, 1, 32, False, True, id="S40-h1-d32"),
    pytest.param(1, 4, 32, True, True, id="S1-h4-d32-masked"),
    pytest.param(20, 1, 64, True, True, id="S20-h1-d64-masked"),
    pytest.param(9, 2, 128, True, True, id="S9-h2-d128-masked"),
]


@interpreter
@pytest.mark.parametrize("samples, heads, head_dim, masked, strided", SHAPES)
def test_matches_reference(samples, heads, head_dim, masked, strided):
    leaves, mask = make_inputs(2, samples, heads, head_dim, masked, strided=strided)
    assert leaves[0].is_contiguous() != strided
    # A one-sample ray's output is its own value whatever the weights: gradients w.r.t. the
    # temperatures vanish analytically and what is left is fp32 cancellation of O(|q| |v|) terms.
    floor = 2e-5 if samples == 1 else 1e-6
    check_against_reference(leaves, mask, heads, rel_out=1e-5, rel_grad=5e-5, floor=floor)


@interpreter
def test_a_ray_of_max_samples():
    """One ray of `MAX_SAMPLES` samples (the longest the kernel takes: 64 tiles of the backward's 16
    rows), two packed heads, against the fp64 reference."""
    leaves, mask = make_inputs(1, triton_ray.MAX_SAMPLES, 2, 8, masked=True, scale=2.0, seed=7)
    check_against_reference(leaves, mask, 2, rel_out=1e-5, rel_grad=5e-5)


@interpreter
@pytest.mark.parametrize("heads, head_dim", [(4, 8), (2, 16)])
def test_backward_kernels_meet_at_the_statistics_gradients(monkeypatch, heads, head_dim):
    """The backward is two kernels: the query kernel writes each head's `d kv[p]` and `d ksum[p]` (p = +, -)
    into a scratch that the key kernel reads. That scratch equals the fp64 gradients of the statistics
    `kv[p] = K_p^T v`, `ksum[p] = sum_j K_p[j]` (leaves of an fp64 form of the kernel's math, whose output
    is the reference's), zero across packed heads; and the two kernels' gradients equal the reference's."""
    rays, samples = 2, 37
    leaves, mask = make_inputs(rays, samples, heads, head_dim, masked=True, seed=8)
    assert mask is not None
    scratch = {}
    real_launch = triton_ray.launch

    def spy(kernel, grid, *args, **options):
        real_launch(kernel, grid, *args, **options)
        if kernel is triton_ray._ray_query_grad_kernel:
            scratch["state"], scratch["grid"], scratch["options"] = args[7].clone(), grid, options

    monkeypatch.setattr(triton_ray, "launch", spy)
    _, grads = check_against_reference(leaves, mask, heads, rel_out=1e-5, rel_grad=5e-5)
    group = scratch["options"]["GROUP"]
    assert group == 16 // head_dim and scratch["grid"] == (rays, heads // group)

    q, k, v, temp_same, temp_opp = (x.detach().double() for x in leaves)
    split = lambda x: x.unflatten(-1, (heads, head_dim)).transpose(1, 2)  # noqa: E731  [rays, heads, S, d]
    q, k, v = split(q), split(k), split(v)
    visible = mask.double()[:, None, :, None]
    features = torch.expm1(torch.clamp(k.abs(), max=EXPONENT_CLAMP)) * visible
    keys = {"+": features * (k > 0), "-": features * (k < 0)}
    kv = {p: (keys[p].transpose(-1, -2) @ v).requires_grad_() for p in keys}  # [rays, heads, d, d]
    ksum = {p: keys[p].sum(-2).requires_grad_() for p in keys}  # [rays, heads, d]
    positive, negative = q > 0, q < 0
    ts, to = temp_same[:, None, :], temp_opp[:, None, :]  # [heads, 1, 2d]
    d = head_dim
    same = torch.expm1(torch.clamp(torch.where(positive, ts[..., :d], ts[..., d:]) * q.abs(), max=EXPONENT_CLAMP))
    opp = torch.expm1(torch.clamp(torch.where(positive, to[..., d:], to[..., :d]) * q.abs(), max=EXPONENT_CLAMP))
    streams = [(same * positive, same * negative), (opp * negative, opp * positive)]  # (meets K+, meets K-)
    halves = []
    for (a, b), columns in zip(streams, (slice(0, d // 2), slice(d // 2, d))):
        num = a @ kv["+"] + b @ kv["-"]
        den = (a * ksum["+"][..., None, :]).sum(-1) + (b * ksum["-"][..., None, :]).sum(-1) + EPSILON
        halves.append(num[..., columns] / den[..., None])
    out = torch.cat(halves, -1).transpose(1, 2).flatten(-2)  # [rays, S, heads d]
    assert_close_scaled(out, reference([x.detach().double() for x in leaves], mask, heads), rel=1e-12)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).double()
    wanted = torch.autograd.grad(out, [kv["+"], kv["-"], ksum["+"], ksum["-"]], grad_out)

    # The scratch [rays, groups, 2 polarities, BLOCK_D, BLOCK_D + 1]: head g of a group at lanes [g SLOT, g SLOT + d).
    state, slot = scratch["state"].double(), scratch["options"]["SLOT"]
    for ray in range(rays):
        for head in range(heads):
            lanes = slice((head % group) * slot, (head % group) * slot + d)
            for index, polarity in enumerate("+-"):
                block = state[ray, head // group, index]
                assert_close_scaled(block[lanes, lanes], wanted[index][ray, head], rel=5e-5, name=f"d kv{polarity}")
                assert_close_scaled(block[lanes, -1], wanted[2 + index][ray, head], rel=5e-5, name=f"d ksum{polarity}")
    blocks = state[..., :-1].unflatten(-1, (group, slot)).unflatten(-3, (group, slot))  # [..., g, SLOT, g', SLOT]
    across = ~torch.eye(group, dtype=torch.bool)[:, None, :, None].expand(group, slot, group, slot)
    assert torch.all(blocks[..., across] == 0)  # nothing across packed heads
    assert all(torch.isfinite(g).all() for g in grads)


@interpreter
def test_fully_masked_ray_gives_zeros_and_finite_grads():
    leaves, mask = make_inputs(2, 9, 2, 8, masked=True, seed=2)
    assert mask is not None
    mask[1] = False
    out, grads = check_against_reference(leaves, mask, 2, rel_out=1e-5, rel_grad=5e-5)
    assert torch.all(out[1] == 0) and out[0].abs().max() > 0
    grad_q, grad_k, grad_v = grads[:3]
    assert torch.all(grad_q[1] == 0) and torch.all(grad_k[1] == 0) and torch.all(grad_v[1] == 0)
    assert torch.all(grad_k[0][~mask[0]] == 0) and torch.all(grad_v[0][~mask[0]] == 0)  # masked samples


@interpreter
def test_exponent_clamp_and_exact_zeros():
    """Exponent inputs just below and above the clamp (exactly at it, the fast paths keep the slope
    and the reference's torch.clamp does not), and channels that are exactly 0 (no polarity part: zero
    features and zero gradients, like relu's slope at 0)."""

    def edit(projection):  # q, k, v: channels [0, 16), [16, 32), [32, 48)
        clamp = EXPONENT_CLAMP
        projection[0, :4, 16:20] = torch.tensor([clamp - 0.01, -(clamp + 0.01), clamp + 5.0, -(clamp - 0.5)])  # k
        projection[0, :3, :4] = torch.tensor([50.0, -50.0, 2 * clamp, -(clamp - 1.0)])  # q
        projection[:, 5:8, :16] = 0.0  # q
        projection[:, 3:9, 17:21] = 0.0  # k

    leaves, mask = make_inputs(2, 20, 2, 8, masked=True, scale=12.0, seed=3, edit=edit)
    _, grads = check_against_reference(leaves, mask, 2, rel_out=1e-5, rel_grad=1e-4)
    assert torch.all(grads[1][:, 3:9, 1:5] == 0)  # d k at k = 0


@interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_large_magnitudes(dtype):
    """fp16 overflows at exp(11.1): the features are fp32 from the half inputs (many beyond the clamp).
    Inputs that round to exactly the clamp move off it (there the reference's slope is 0, the kernels' not)."""

    def off_the_clamp(projection):
        at_clamp = projection.to(dtype).float().abs() == EXPONENT_CLAMP
        projection[at_clamp] = projection[at_clamp].sign() * (EXPONENT_CLAMP - 0.5)

    leaves, mask = make_inputs(2, 24, 2, 16, masked=True, scale=30.0, dtype=dtype, seed=4, edit=off_the_clamp)
    out, grads = check_against_reference(leaves, mask, 2, rel_out=1e-2, rel_grad=5e-2)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert grads[0].dtype == dtype and grads[3].dtype == torch.float32


def test_empty_rays():
    """No rays: nothing to launch, empty output, zero temperature gradients."""
    leaves, mask = make_inputs(0, 5, 2, 8, masked=True)
    out = run_kernel(leaves, mask, 2)
    assert out.shape == (0, 5, 16)
    assert all(g.shape == x.shape for g, x in zip(torch.autograd.grad(out.sum(), leaves[3:]), leaves[3:]))


def test_ray_triton_supported(monkeypatch):
    q = torch.zeros(2, 5, 32)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not triton_ray.ray_triton_supported(q, 16, 5)  # CPU without the interpreter
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_ray.ray_triton_supported(q, 16, 5)
    assert triton_ray.ray_triton_supported(q.half(), 16, 5) and triton_ray.ray_triton_supported(q.bfloat16(), 16, 5)
    assert not triton_ray.ray_triton_supported(q.double(), 16, 5)  # fp64 stays on the PyTorch path
    assert triton_ray.ray_triton_supported(q, 2, 5) and triton_ray.ray_triton_supported(q, triton_ray.MAX_HEAD_DIM, 5)
    assert not triton_ray.ray_triton_supported(q, 15, 5)  # odd head dim
    assert not triton_ray.ray_triton_supported(q, 2 * triton_ray.MAX_HEAD_DIM, 5)
    assert triton_ray.ray_triton_supported(q, 16, triton_ray.MAX_SAMPLES)
    assert not triton_ray.ray_triton_supported(q, 16, triton_ray.MAX_SAMPLES + 1)  # long rays: polarity_attention


@pytest.mark.parametrize(
    "shape, heads, temp_shape, match",
    [
        ((2, 5, 32), 3, (3, 20), "divisible"),
        ((2, 5, 30), 2, (2, 30), "head dim"),
        ((2, 5, 32), 2, (2, 16), "temp_same"),
    ],
)
def test_rejects_bad_shapes(shape, heads, temp_shape, match):
    x = torch.zeros(shape)
    temp = torch.full(temp_shape, 0.5)
    with pytest.raises(ValueError, match=match):
        triton_ray.polarity_ray_attention_triton(x, x, x, temp, temp, None, heads)


def test_cpu_dispatch_does_not_take_triton(monkeypatch):
    """On the CPU `polarity_ray_attention` never calls the Triton kernel (even under the interpreter)."""

    def fail(*args):
        raise AssertionError("the Triton ray kernel ran on the CPU")

    monkeypatch.setattr(triton_ray, "polarity_ray_attention_triton", fail)
    # The PyTorch form rather than the C++ kernel: no compilation in a fresh interpreter child.
    monkeypatch.setattr(cpu_extension, "usable", lambda *args: False)
    leaves, mask = make_inputs(1, 6, 2, 4, masked=True)
    out = ray_op.polarity_ray_attention(*leaves, mask, 2)
    assert_close_scaled(out, reference(leaves, mask, 2), rel=1e-5)


@pytest.mark.gpu
@compiled_cuda
@pytest.mark.parametrize("head_dim", [2, 16, 64, 128])
def test_cuda_dispatch_matches_pytorch_path(monkeypatch, head_dim):
    """On CUDA `polarity_ray_attention` takes the Triton kernel; it matches the PyTorch path (both
    fused kernels off) and the fp64 reference, forward and gradients."""
    heads, samples = 2, 300
    leaves, mask = make_inputs(64, samples, heads, head_dim, masked=True, device="cuda", seed=5)
    # The lookup first (its first-use check calls the kernel too): the kernel passed it, and is then called.
    assert ray_op.triton_kernel(leaves[0], heads) is not None, "the Triton ray kernel failed its first-use check"
    calls = []
    kernel = triton_ray.polarity_ray_attention_triton

    def counting_kernel(*args):
        calls.append(args[0].shape)
        return kernel(*args)

    monkeypatch.setattr(triton_ray, "polarity_ray_attention_triton", counting_kernel)
    out = ray_op.polarity_ray_attention(*leaves, mask, heads)
    assert calls == [(64, samples, heads * head_dim)], "polarity_ray_attention did not take the Triton path"
    grad_out = torch.randn(out.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(6))
    grads = grads_of(out, leaves, grad_out)

    monkeypatch.setenv(triton_lookup.DISABLE_VARIABLE, "0")
    expected = ray_op.polarity_ray_attention(*leaves, mask, heads)
    expected_grads = grads_of(expected, leaves, grad_out)
    assert_close_scaled(out, expected, rel=1e-5, name="out")
    for name, grad, want in zip(NAMES, grads, expected_grads):
        assert_close_scaled(grad, want, rel=5e-5, name=f"d{name}")
    fp64_leaves = [x.detach().double().requires_grad_() for x in leaves]
    assert_close_scaled(out, reference(fp64_leaves, mask, heads), rel=1e-5, name="out vs fp64")


@pytest.mark.gpu
@compiled_cuda
@pytest.mark.parametrize("dtype, rel", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_cuda_longest_rays(dtype, rel):
    """`MAX_SAMPLES` samples per ray, GNT's chunked-projection layout, vs the fp64 reference."""
    leaves, mask = make_inputs(16, triton_ray.MAX_SAMPLES, 4, 16, masked=True, scale=2.0, dtype=dtype, device="cuda")
    check_against_reference(leaves, mask, 4, rel_out=rel, rel_grad=5 * rel)
