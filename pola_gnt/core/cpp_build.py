"""Building this package's C++ extensions (the fused CPU kernels) on first use.

Each is compiled with the C++ compiler PyTorch finds (`torch.utils.cpp_extension`, about 20 s, cached
under `$TORCH_EXTENSIONS_DIR`, by default `~/.cache/torch_extensions`, in a folder of this checkout and
Python environment: the build command names the source's path and the environment's headers, so one
folder shared by two checkouts or environments would be rebuilt whenever commands from them alternate).
Without a compiler, or with `POLA_GNT_CPU_KERNELS=0`, `build_extension` returns False and the callers
use their PyTorch forms, which compute the same functions.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import warnings
from pathlib import Path

import torch

DISABLE_VARIABLE = "POLA_GNT_CPU_KERNELS"


# Headers the sources include (`#include "../../core/csrc/..."`). torch's build cache notices a changed
# source but not a changed header, so their contents go into the build's name.
HEADERS = (Path(__file__).resolve().parent / "csrc" / "vector_math.h",)


def build_name(library: str, source: Path) -> str:
    """The build's name, so its cache folder: the library's, and a digest of the source's path, the
    Python environment and the shared headers' contents (see the module docstring)."""
    digest = hashlib.sha1(f"{source}|{sys.prefix}".encode())
    for header in HEADERS:
        digest.update(header.read_bytes())
    return f"{library}_{digest.hexdigest()[:10]}"


def build_extension(library: str, source: Path, what: str) -> bool:
    """Compile (or find the cached build of) the C++ extension `source`, whose `TORCH_LIBRARY` is
    `library`, and register its operators. False, with one warning naming `what`, where it cannot be built."""
    if os.environ.get(DISABLE_VARIABLE) == "0":
        return False
    # Importing cpp_extension on a machine without CUDA logs a warning about CUDA_HOME that does not
    # concern a CPU build.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension

        # at::parallel_for's OpenMP region is compiled into the extension, hence -fopenmp. Without
        # trapping math GCC may if-convert the sign selections and vectorise the loops (the kernels
        # never read floating-point exception flags). AVX2 and FMA where PyTorch itself runs its AVX2
        # (or AVX-512) kernels, so the build never uses an instruction the CPU lacks.
        vector_flags = ["-mavx2", "-mfma"] if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else []
        cpp_extension.load(
            name=build_name(library, source),
            sources=[str(source)],
            extra_cflags=["-O3", "-fopenmp", "-fno-trapping-math", "-fno-math-errno", *vector_flags],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
        )
    except Exception as error:  # no compiler, no headers, a failed build: the PyTorch forms still work
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        warnings.warn(
            f"pola_gnt: the fused CPU {what} kernels could not be built ({first_line}); "
            "using the slower PyTorch forms (same results)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True
