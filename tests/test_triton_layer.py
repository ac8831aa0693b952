"""`PolarityAttention` on the fused Triton kernels: the ray kernel (self-attention) and the linear
kernel (cross-attention, and self-attention past the ray kernel's `MAX_SAMPLES`), against the layer's
fp64 math (`test_attention_layer.layer_reference`), with its negative control.

As in `test_triton_ray.py`, the kernels run in Triton's CPU interpreter in a child pytest with
`TRITON_INTERPRET=1` (`test_kernels_in_interpreter`); there the ops' dispatch is sent to the Triton
branch for CPU tensors (on a GPU, CUDA tensors take it), each kernel's first-use check is skipped (the
comparison here is the check), and a count of the kernels' calls shows they ran.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from helpers.interpreter import INTERPRETING, assert_passes_in_interpreter, interpreter  # noqa: E402
from test_attention_layer import assert_matches, inputs, random_mask, randomised  # noqa: E402

from pola_gnt.attention import PolarityAttention, triton_lookup  # noqa: E402
from pola_gnt.attention.linear import op as linear_op  # noqa: E402
from pola_gnt.attention.linear import triton_form as linear_form  # noqa: E402
from pola_gnt.attention.ray import op as ray_op  # noqa: E402
from pola_gnt.attention.ray import triton_form as ray_form  # noqa: E402


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_kernels_in_interpreter(request):
    assert_passes_in_interpreter(__file__, request)


@pytest.fixture
def triton_calls(monkeypatch):
    """The ops' dispatch takes the Triton branch wherever a kernel takes the inputs (CPU tensors in
    the interpreter), else the PyTorch form; counts of each kernel's calls."""
    calls = {"ray": 0, "linear": 0}

    def dispatch(inputs, *, pytorch, triton=None, triton_lookup=None, fused=True, **_):
        kernel = triton_lookup() if fused and triton is not None and triton_lookup is not None else None
        return pytorch() if kernel is None or triton is None else triton(kernel)

    def counted(name, kernel):
        def run(*args, **kwargs):
            calls[name] += 1
            return kernel(*args, **kwargs)

        return run

    for op in (ray_op, linear_op):
        monkeypatch.setattr(op, "dispatch", dispatch)
    monkeypatch.setattr(triton_lookup, "passes_check", lambda *args: True)
    monkeypatch.delenv(triton_lookup.DISABLE_VARIABLE, raising=False)
    monkeypatch.setattr(
        ray_form, "polarity_ray_attention_triton", counted("ray", ray_form.polarity_ray_attention_triton)
    )
    monkeypatch.setattr(
        linear_form, "polarity_attention_triton", counted("linear", linear_form.polarity_attention_triton)
    )
    return calls


@interpreter
@pytest.mark.parametrize("lepe", ["1d", None])
def test_self_attention_on_the_ray_kernel(triton_calls, lepe):
    layer = randomised(PolarityAttention(32, heads=2, lepe=lepe))
    x, mask = inputs(2, 13, 32, scale=2.0), random_mask(2, 13)
    assert_matches(layer, x, mask=mask, rel=1e-4)
    assert triton_calls == {"ray": 1, "linear": 0}
    with pytest.raises(AssertionError):  # negative control: the streams exchanged in the reference
        assert_matches(layer, x, mask=mask, rel=1e-2, swap_streams=True)


@interpreter
def test_cross_attention_on_the_linear_kernel(triton_calls):
    """40 queries over 48 keys of head dim 16: the linear order is the cheaper one (`resolve_form`),
    which the fused linear kernel computes."""
    layer = randomised(PolarityAttention(32, heads=2))
    x, context, mask = inputs(2, 40, 32), inputs(2, 48, 32, seed=4), random_mask(2, 48)
    assert_matches(layer, x, context, mask, rel=1e-4)
    assert triton_calls == {"ray": 0, "linear": 1}


@interpreter
def test_long_self_attention_falls_to_the_linear_kernel(triton_calls, monkeypatch):
    """Past the ray kernel's `MAX_SAMPLES` (lowered to 8 here, so that the interpreter stays quick),
    self-attention runs on the linear kernel."""
    monkeypatch.setattr(ray_form, "MAX_SAMPLES", 8)
    layer = randomised(PolarityAttention(32, heads=2))
    x, mask = inputs(1, 40, 32), random_mask(1, 40)
    assert_matches(layer, x, mask=mask, rel=1e-4)
    assert triton_calls == {"ray": 0, "linear": 1}


@interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_the_kernels(triton_calls, dtype):
    layer = randomised(PolarityAttention(32, heads=2)).to(dtype)
    x = inputs(2, 40, 32, scale=8.0).detach().to(dtype).requires_grad_()
    for context in (None, inputs(2, 48, 32, seed=4, scale=8.0).detach().to(dtype)):
        out = layer(x, context)
        assert out.dtype == dtype and torch.isfinite(out).all()
        out.float().sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
    assert triton_calls["ray"] == 1 and triton_calls["linear"] == 1
