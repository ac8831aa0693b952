"""Counting the calls of a C++ extension's operators, so that a test of a fused path fails when the
PyTorch form ran instead (the kernels fall back silently where they are not built or not usable).

    calls = count_kernel_calls(monkeypatch, "pola_gnt_render")
    ...  # code under test
    assert calls["view_token_inputs"] == 1

The package calls its operators as `getattr(torch.ops, LIBRARY).name(...)` at each call
(`attention.cpu_extension.ops`, `model.render_kernels`), so a counting stand-in for the namespace
on `torch.ops` sees every call until monkeypatch takes it away.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch


class _CountedOperator:
    """An operator (overload packet) that counts its calls; attributes (`.default`) pass through."""

    def __init__(self, name: str, operator, calls: Counter[str]):
        self._name, self._operator, self._calls = name, operator, calls

    def __call__(self, *args, **kwargs):
        self._calls[self._name] += 1
        return self._operator(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._operator, name)


class _CountingNamespace:
    def __init__(self, namespace, calls: Counter[str]):
        self._namespace, self._calls = namespace, calls

    def __getattr__(self, name: str):
        return _CountedOperator(name, getattr(self._namespace, name), self._calls)


def count_kernel_calls(monkeypatch: pytest.MonkeyPatch, *libraries: str) -> Counter[str]:
    """Calls of each operator of `libraries` (`torch.ops.<library>`) from now until the test ends, by
    operator name (the name alone: the libraries' operator names differ)."""
    calls: Counter[str] = Counter()
    for library in libraries:
        monkeypatch.setattr(torch.ops, library, _CountingNamespace(getattr(torch.ops, library), calls), raising=False)
    return calls
