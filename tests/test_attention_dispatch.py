"""`pola_gnt.attention.dispatch`: Triton on CUDA, else the C++ kernels on the CPU, else PyTorch; the
lookups and casts run only where their form is next in line. Which path each attention op takes on
real inputs: `test_cpu_kernels.py`, `test_triton_*.py` (CUDA)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from pola_gnt.attention import cpu_extension
from pola_gnt.attention.dispatch import dispatch


class CudaLooking(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the Triton branch without a GPU."""

    @property
    def is_cuda(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return True


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """The forms and lookups that ran, in order; `usable` says yes unless a test says otherwise."""
    ran: list[str] = []

    def usable(x: Tensor, head_dim: int | None = None, views: int = 1) -> bool:
        ran.append(f"usable {x.dtype} {head_dim} {views}")
        return True

    monkeypatch.setattr(cpu_extension, "usable", usable)
    return ran


def forms(calls: list[str], kernel_found: bool = True) -> dict:
    def lookup():
        calls.append("lookup")
        return (lambda x: x + 1) if kernel_found else None

    def cpu(*inputs: Tensor) -> Tensor:
        calls.append("cpu " + " ".join(str(x.dtype) for x in inputs))
        return inputs[0] * 2

    def pytorch() -> Tensor:
        calls.append("pytorch")
        return torch.zeros(())

    return dict(triton_lookup=lookup, cpu=cpu, pytorch=pytorch)


def test_cpu_inputs_take_the_cpu_kernel_in_the_compute_dtype(calls):
    x, y = torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.float64)
    out = dispatch((x, y), triton=lambda kernel: kernel(x), head_dim=8, views=5, **forms(calls))
    # No Triton lookup on the CPU; bf16 queries compute in fp32 and the result returns to bf16.
    assert calls == ["usable torch.float32 8 5", "cpu torch.float32 torch.float32"]
    assert out.dtype == torch.bfloat16 and torch.equal(out, torch.full((3,), 2.0, dtype=torch.bfloat16))


def test_without_the_cast_the_cpu_kernel_gets_the_inputs_as_they_are(calls):
    x = torch.ones(3, dtype=torch.bfloat16)
    dispatch((x, x), cast_for_cpu=False, **forms(calls))
    assert calls == ["usable torch.bfloat16 None 1", "cpu torch.bfloat16 torch.bfloat16"]


def test_pytorch_where_the_cpu_kernels_do_not_take_the_inputs(calls, monkeypatch):
    def usable(*args) -> bool:
        calls.append("usable")
        return False

    monkeypatch.setattr(cpu_extension, "usable", usable)
    dispatch((torch.ones(3),), triton=lambda kernel: kernel(0), **forms(calls))
    assert calls == ["usable", "pytorch"]


def test_not_fused_goes_straight_to_pytorch(calls):
    x = torch.ones(3).as_subclass(CudaLooking)
    dispatch((x,), triton=lambda kernel: kernel(x), fused=False, **forms(calls))
    assert calls == ["pytorch"]


def test_cuda_inputs_take_triton_first(calls):
    x = torch.ones(3).as_subclass(CudaLooking)
    out = dispatch((x,), triton=lambda kernel: kernel(x), **forms(calls))
    assert calls == ["lookup"] and torch.equal(out, torch.full((3,), 2.0))


def test_without_a_triton_kernel_the_next_form_runs(calls, monkeypatch):
    x = torch.ones(3).as_subclass(CudaLooking)
    monkeypatch.setattr(cpu_extension, "usable", lambda *args: False)  # as for a real CUDA tensor
    dispatch((x,), triton=lambda kernel: kernel(x), **forms(calls, kernel_found=False))
    assert calls == ["lookup", "pytorch"]


def test_an_op_without_a_form_skips_it(calls):
    x = torch.ones(3).as_subclass(CudaLooking)
    both = forms(calls)
    dispatch((x,), pytorch=both["pytorch"], triton_lookup=both["triton_lookup"])  # no Triton runner
    dispatch((torch.ones(3),), pytorch=both["pytorch"])  # no CPU form
    assert calls == ["pytorch", "pytorch"]
