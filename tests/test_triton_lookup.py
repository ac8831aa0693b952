"""The Triton kernels' first-use check (`triton_lookup`, run by each op's `triton_kernel` lookup): a
kernel that compiles and matches the fp64 reference is used; one that fails to compile or computes
something else is not, with one warning, and the PyTorch forms take over; `POLA_GNT_TRITON_KERNELS=0`
switches the kernels off.

The checks run the kernels, so like `test_triton_linear.py` this file reruns itself in a child
pytest with `TRITON_INTERPRET=1`, where CPU tensors go to the kernels (on a CUDA machine the same
checks run compiled, at the first call of each kernel).
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("triton")

from helpers.interpreter import INTERPRETING, assert_passes_in_interpreter, interpreter  # noqa: E402

from pola_gnt.attention import triton_lookup  # noqa: E402
from pola_gnt.attention.linear import op as linear_op  # noqa: E402
from pola_gnt.attention.linear import triton_form as linear_triton  # noqa: E402
from pola_gnt.attention.ray import op as ray_op  # noqa: E402
from pola_gnt.attention.ray import triton_form as ray_triton  # noqa: E402
from pola_gnt.attention.view import op as view_op  # noqa: E402
from pola_gnt.attention.view import triton_form as view_triton  # noqa: E402


@pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
def test_checks_in_interpreter(request):
    assert_passes_in_interpreter(__file__, request)


@pytest.fixture(autouse=True)
def fresh_checks(monkeypatch):
    monkeypatch.setattr(triton_lookup, "_checked", {})
    monkeypatch.delenv(triton_lookup.DISABLE_VARIABLE, raising=False)


def _lookups():
    """Each kernel's lookup with queries of its layout (head dim 8, 2 heads)."""
    return {
        "view": (lambda q: view_op.triton_kernel(q), torch.zeros(5, 2, 8)),
        "ray": (lambda q: ray_op.triton_kernel(q, 2), torch.zeros(3, 9, 16)),
        "linear": (lambda q: linear_op.triton_kernel(q), torch.zeros(1, 2, 9, 8)),
    }


@interpreter
@pytest.mark.parametrize("kernel", ["view", "ray", "linear"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_that_match_the_reference_are_used(kernel, dtype):
    lookup, q = _lookups()[kernel]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        assert lookup(q.to(dtype)) is not None
    assert list(triton_lookup._checked.values()) == [True]
    # Checked once per (kernel, device, dtype, head dim).
    assert lookup(q.to(dtype)) is not None and len(triton_lookup._checked) == 1


@interpreter
@pytest.mark.parametrize("failure", ["raises", "wrong values"])
def test_a_kernel_that_fails_its_check_is_not_used(monkeypatch, failure):
    real = view_triton.polarity_view_attention_triton

    def broken(*args):
        if failure == "raises":
            raise RuntimeError("PTX assembly failed\nmore detail")
        return real(*args) * 1.01

    monkeypatch.setattr(view_triton, "polarity_view_attention_triton", broken)
    lookup, q = _lookups()["view"]
    with pytest.warns(RuntimeWarning, match="Triton view attention kernel failed its first-use check") as record:
        assert lookup(q) is None
    message = str(record[0].message)
    assert ("PTX assembly failed" in message) == (failure == "raises") and "more detail" not in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning only: the result is remembered
        assert lookup(q) is None


@interpreter
def test_the_kernels_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(triton_lookup.DISABLE_VARIABLE, "0")
    for lookup, q in _lookups().values():
        assert lookup(q) is None
    assert triton_lookup._checked == {}  # nothing was run


def test_cpu_tensors_never_reach_the_kernels_outside_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not any(
        supported
        for supported in (
            view_triton.view_triton_supported(torch.zeros(5, 2, 8)),
            ray_triton.ray_triton_supported(torch.zeros(3, 9, 16), 8, 9),
            linear_triton.triton_supported(torch.zeros(1, 2, 9, 8)),
        )
    )
