"""The fused Triton kernel of the linear op (`linear.triton_form`) computes the linear-form polarity
attention and its gradients.

Without a GPU the kernels run in Triton's CPU interpreter. Triton decides between interpreter and
compiler for good when `triton.language` is imported (its own helpers such as `tl.zeros` are jit
functions), which may already have happened in this pytest process. So `test_kernels_in_interpreter`
reruns this file in a child pytest with `TRITON_INTERPRET=1`; there the kernel tests run, and here
they are skipped. `TRITON_INTERPRET=1 pytest tests/test_triton_linear.py` runs them directly.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from helpers.interpreter import INTERPRETING, assert_passes_in_interpreter, compiled_cuda, interpreter  # noqa: E402

from pola_gnt.attention.linear import op as linear_op  # noqa: E402
from pola_gnt.attention.linear import triton_form as triton_linear  # noqa: E402
from pola_gnt.attention.linear.op import polarity_attention  # noqa: E402
from pola_gnt.attention.linear.pytorch_form import polarity_attention_linear  # noqa: E402
from pola_gnt.attention.reference import polarity_attention_reference as reference  # noqa: E402


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_kernels_in_interpreter(request):
    assert_passes_in_interpreter(__file__, request)


def make_inputs(
    batch, heads, num_queries, num_keys, head_dim, masked, scale=1.0, dtype=torch.float32, device="cpu", seed=0
):
    """q, k, v `[batch, heads, N, d]`, per-head temperatures `[heads, 1, 2d]` in (0, 1), key mask."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return (scale * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype).requires_grad_()

    q = randn(batch, heads, num_queries, head_dim)
    k = randn(batch, heads, num_keys, head_dim)
    v = (torch.randn(batch, heads, num_keys, head_dim, generator=gen)).to(device=device, dtype=dtype).requires_grad_()
    temp_same = torch.sigmoid(torch.randn(heads, 1, 2 * head_dim, generator=gen)).to(device).requires_grad_()
    temp_opp = torch.sigmoid(torch.randn(heads, 1, 2 * head_dim, generator=gen)).to(device).requires_grad_()
    mask = None
    if masked:
        mask = (torch.rand(batch, heads, num_keys, generator=gen) > 0.3).to(device)
        mask[..., 0] = True  # at least one visible key per query
    return q, k, v, temp_same, temp_opp, mask


def assert_close_scaled(actual, expected, rel: float, name: str = ""):
    """Elementwise |a - e| <= rel * max|e| (+ a tiny floor): relative to the tensor's scale."""
    expected = expected.to(torch.float64)
    actual = actual.to(torch.float64)
    scale = expected.abs().max().item()
    err = (actual - expected).abs().max().item()
    assert err <= rel * scale + 1e-12, f"{name}: max error {err:.3e} vs scale {scale:.3e} (rel {rel})"


# (batch, heads, Nq, Nk, d, masked): self and cross attention, lengths not multiples of the blocks
# (64 rows), several key splits, padded head dims (8 -> 16 wide blocks, 12 -> 16/8).
SHAPES = [
    pytest.param(2, 2, 70, 70, 16, False, id="self"),
    pytest.param(2, 2, 70, 70, 16, True, id="self-masked"),
    pytest.param(1, 3, 100, 37, 16, True, id="cross-masked"),
    pytest.param(2, 1, 9, 150, 8, False, id="cross-d8"),
    pytest.param(1, 2, 40, 65, 12, True, id="cross-d12"),
]


@interpreter
@pytest.mark.parametrize("batch, heads, num_queries, num_keys, head_dim, masked", SHAPES)
def test_forward_matches_reference(batch, heads, num_queries, num_keys, head_dim, masked):
    q, k, v, temp_same, temp_opp, mask = make_inputs(batch, heads, num_queries, num_keys, head_dim, masked)
    with torch.no_grad():
        out = triton_linear.polarity_attention_triton(q, k, v, temp_same, temp_opp, mask)
        pytorch_linear = polarity_attention(q, k, v, temp_same, temp_opp, mask, form="linear")
    assert out.shape == (batch, heads, num_queries, head_dim) and out.dtype == torch.float32
    assert_close_scaled(out, reference(q, k, v, temp_same, temp_opp, mask), rel=1e-5, name="vs float64")
    assert_close_scaled(out, pytorch_linear, rel=1e-5, name="vs PyTorch linear")


# The wide heads' tilings: d = 64 (64-row blocks, 4 warps on a GPU) and 128 (32-row blocks, 8 warps).
WIDE = [
    pytest.param(1, 1, 70, 45, 64, True, id="cross-d64-masked"),
    pytest.param(1, 2, 40, 33, 128, True, id="cross-d128-masked"),
]


@interpreter
@pytest.mark.parametrize(
    "batch, heads, num_queries, num_keys, head_dim, masked",
    [SHAPES[1], SHAPES[2], pytest.param(1, 2, 33, 20, 32, True, id="cross-d32"), *WIDE],
)
def test_backward_matches_reference(batch, heads, num_queries, num_keys, head_dim, masked):
    inputs = make_inputs(batch, heads, num_queries, num_keys, head_dim, masked, seed=1)
    leaves, mask = inputs[:5], inputs[5]
    out = triton_linear.polarity_attention_triton(*leaves, mask)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    grads = torch.autograd.grad(out, leaves, grad_out)
    expected = torch.autograd.grad(reference(*leaves, mask), leaves, grad_out.double())
    pytorch_linear = torch.autograd.grad(polarity_attention(*leaves, mask, form="linear"), leaves, grad_out)
    names = ("q", "k", "v", "temp_same", "temp_opp")
    for name, grad, want, torch_grad, leaf in zip(names, grads, expected, pytorch_linear, leaves):
        assert grad.shape == leaf.shape, name  # temperatures reduced back to [heads, 1, 2d]
        assert_close_scaled(grad, want, rel=2e-5, name=f"d{name} vs float64")
        assert_close_scaled(grad, torch_grad, rel=2e-5, name=f"d{name} vs PyTorch linear")


@interpreter
@pytest.mark.parametrize("multiprocessors", [108, 132])  # an A100's, an H100's
def test_split_reductions_at_a_gpus_split_count(monkeypatch, multiprocessors):
    """The key-state and query-state reductions split as on a GPU of that many SMs (4 programs an SM:
    here one 64-row block a split, every block its own partial sum), and still equal the reference.
    The interpreter's own default is two splits."""
    grids = {}
    real_launch = triton_linear.launch

    def spy(kernel, grid, *args, **options):
        grids.setdefault(kernel.fn.__name__, grid)
        real_launch(kernel, grid, *args, **options)

    monkeypatch.setattr(triton_linear, "launch", spy)
    inputs = make_inputs(2, 2, 300, 330, 16, masked=True, seed=9)
    leaves, mask = inputs[:5], inputs[5]
    q, k, v, temp_same, temp_opp = leaves
    out = triton_linear.polarity_attention_triton(q, k, v, temp_same, temp_opp, mask, multiprocessors=multiprocessors)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(10))
    grads = torch.autograd.grad(out, leaves, grad_out)
    assert grids["_key_state_kernel"] == (4, 6, 2)  # 330 keys: 6 blocks, 6 splits (2 with the default)
    assert grids["_query_state_grad_kernel"] == (4, 5, 2)  # 300 queries: 5 blocks, 5 splits
    assert_close_scaled(out, reference(*leaves, mask), rel=1e-5, name="forward")
    expected = torch.autograd.grad(reference(*leaves, mask), leaves, grad_out.double())
    for name, grad, want in zip(("q", "k", "v", "temp_same", "temp_opp"), grads, expected):
        assert_close_scaled(grad, want, rel=2e-5, name=f"d{name}")


@interpreter
def test_masked_keys_have_no_effect():
    """Dropping the masked keys gives the same output, and they receive zero gradients."""
    q, k, v, temp_same, temp_opp, _ = make_inputs(1, 1, 20, 30, 16, masked=False, seed=3)
    mask = torch.zeros(1, 1, 30, dtype=torch.bool)
    mask[..., ::3] = True
    out = triton_linear.polarity_attention_triton(q, k, v, temp_same, temp_opp, mask)
    kept = triton_linear.polarity_attention_triton(q, k[..., ::3, :], v[..., ::3, :], temp_same, temp_opp)
    assert_close_scaled(out, kept, rel=1e-6)
    grad_k, grad_v = torch.autograd.grad(out.square().sum(), (k, v))
    assert grad_k[..., ~mask[0, 0], :].abs().max() == 0 and grad_v[..., ~mask[0, 0], :].abs().max() == 0
    assert grad_k[..., mask[0, 0], :].abs().max() > 0


@interpreter
def test_all_keys_masked_gives_zeros_and_finite_grads():
    q, k, v, temp_same, temp_opp, _ = make_inputs(2, 2, 10, 7, 16, masked=False)
    mask = torch.zeros(2, 2, 7, dtype=torch.bool)
    mask[0, 0] = True  # one head keeps its keys: its output is a normal attention output
    out = triton_linear.polarity_attention_triton(q, k, v, temp_same, temp_opp, mask)
    assert torch.all(out[mask.sum(-1) == 0] == 0)
    assert out[0, 0].abs().max() > 0
    grads = torch.autograd.grad(out.sum(), (q, k, v, temp_same, temp_opp))
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.all(grads[0][mask.sum(-1) == 0] == 0)  # no keys: nothing depends on those queries


@interpreter
def test_large_magnitudes_stay_finite_and_exact_fp32():
    """|q|, |k| ~ 100 push every exponent to the clamp: still finite and equal to the reference."""
    leaves_and_mask = make_inputs(1, 2, 30, 25, 16, masked=True, scale=100.0, seed=4)
    leaves, mask = leaves_and_mask[:5], leaves_and_mask[5]
    out = triton_linear.polarity_attention_triton(*leaves, mask)
    assert torch.isfinite(out).all()
    assert_close_scaled(out, reference(*leaves, mask), rel=1e-5)
    grads = torch.autograd.grad(out.sum(), leaves)
    expected = torch.autograd.grad(reference(*leaves, mask).sum(), leaves)
    for grad, want in zip(grads, expected):
        assert torch.isfinite(grad).all()
        assert_close_scaled(grad, want, rel=1e-4)


@interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_large_magnitudes(dtype):
    """fp16 overflows at exp(11.1): features must be computed in fp32 from the half inputs."""
    leaves_and_mask = make_inputs(1, 2, 40, 30, 16, masked=True, scale=30.0, dtype=dtype, seed=5)
    leaves, mask = leaves_and_mask[:5], leaves_and_mask[5]
    out = triton_linear.polarity_attention_triton(*leaves, mask)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert_close_scaled(out, reference(*leaves, mask), rel=1e-2)  # output rounding to half
    grads = torch.autograd.grad(out.float().sum(), leaves)
    assert all(torch.isfinite(g).all() for g in grads)
    assert grads[0].dtype == dtype and grads[3].dtype == torch.float32


def test_triton_supported(monkeypatch):
    q = torch.zeros(2, 5, 16)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert triton_linear.triton_supported(q) == q.is_cuda  # CPU without the interpreter: no
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_linear.triton_supported(q)
    assert not triton_linear.triton_supported(q.double())  # fp64 stays on the PyTorch path
    assert not triton_linear.triton_supported(torch.zeros(2, 5, 15))  # odd head dim
    assert not triton_linear.triton_supported(torch.zeros(2, 5, 256))  # above MAX_HEAD_DIM


@pytest.mark.parametrize("head_dim", [15, 256])
def test_rejects_unsupported_head_dims(head_dim):
    x = torch.zeros(1, 4, head_dim)
    temp = torch.full((1, 2 * head_dim), 0.5)
    with pytest.raises(ValueError, match="head dim"):
        triton_linear.polarity_attention_triton(x, x, x, temp, temp)


def test_rejects_mismatched_temperature():
    x = torch.zeros(1, 4, 16)
    with pytest.raises(ValueError, match="temp_same"):
        triton_linear.polarity_attention_triton(x, x, x, torch.full((1, 16), 0.5), torch.full((1, 32), 0.5))


@pytest.mark.gpu
@compiled_cuda
@pytest.mark.parametrize("dtype, rel", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_cuda_long_sequence_matches_pytorch_linear(dtype, rel):
    """64K tokens of self-attention on CUDA (compiled kernels) vs the PyTorch linear form in fp32."""
    leaves_and_mask = make_inputs(1, 4, 65536, 65536, 32, masked=True, scale=2.0, dtype=dtype, device="cuda", seed=6)
    leaves, mask = leaves_and_mask[:5], leaves_and_mask[5]
    out = triton_linear.polarity_attention_triton(*leaves, mask)
    fp32_leaves = [t.detach().float().requires_grad_() for t in leaves]
    expected = polarity_attention_linear(*fp32_leaves, mask)
    assert out.dtype == dtype
    assert_close_scaled(out, expected, rel=rel, name="forward")
    grad_out = torch.randn(out.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(7))
    grads = torch.autograd.grad(out, leaves, grad_out.to(dtype))
    expected_grads = torch.autograd.grad(expected, fp32_leaves, grad_out)
    for name, grad, want in zip(("q", "k", "v", "temp_same", "temp_opp"), grads, expected_grads):
        assert_close_scaled(grad, want, rel=rel * 5, name=f"d{name}")


@pytest.mark.gpu
@compiled_cuda
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_cuda_cross_attention_and_dispatch(monkeypatch, head_dim):
    """Cross attention with all head dims up to 128 on CUDA; `polarity_attention` calls the kernel
    (which passed its first-use check) and gives its result."""
    leaves_and_mask = make_inputs(2, 3, 1000, 777, head_dim, masked=True, device="cuda", seed=8)
    leaves, mask = leaves_and_mask[:5], leaves_and_mask[5]
    out = triton_linear.polarity_attention_triton(*leaves, mask)
    assert_close_scaled(out, reference(*leaves, mask), rel=1e-5, name="forward")
    assert linear_op.triton_kernel(leaves[0]) is not None, "the Triton kernel failed its first-use check"
    calls = []
    kernel = triton_linear.polarity_attention_triton

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(triton_linear, "polarity_attention_triton", counting)
    assert torch.equal(polarity_attention(*leaves, mask, form="linear"), out)
    assert calls == [leaves[0].shape]
    grad_out = torch.randn(out.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(9))
    grads = torch.autograd.grad(out, leaves, grad_out)
    expected = torch.autograd.grad(reference(*leaves, mask), leaves, grad_out.double())
    for name, grad, want in zip(("q", "k", "v", "temp_same", "temp_opp"), grads, expected):
        assert_close_scaled(grad, want, rel=2e-5, name=f"d{name}")
