"""Running Triton kernel tests on the CPU: Triton picks interpreter or compiler for good when
`triton.language` is first imported, which may already have happened in the pytest process. So each
kernel test file reruns itself in a child pytest with `TRITON_INTERPRET=1`; there its `interpreter`
tests run, here they are skipped (and the `compiled_cuda` ones run only on a CUDA machine).

    @pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
    def test_kernels_in_interpreter():
        assert_passes_in_interpreter(__file__)
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
interpreter = pytest.mark.skipif(not INTERPRETING, reason="runs in the file's TRITON_INTERPRET=1 child pytest")
compiled_cuda = pytest.mark.skipif(
    INTERPRETING or not torch.cuda.is_available(), reason="needs a CUDA device and compiled kernels"
)


def assert_passes_in_interpreter(test_file: str) -> None:
    """Run `test_file`'s tests (not gpu, not slow) in a child pytest under `TRITON_INTERPRET=1`; they
    must pass, and some must have run rather than all being skipped."""
    child = subprocess.run(
        [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-m", "not gpu and not slow"],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-2000:]
    assert " passed" in child.stdout
