"""Process-wide CPU settings shared by every command and benchmark (both models alike).

glibc serves every allocation above its mmap threshold (128 KiB at first, raised adaptively) from
fresh `mmap` pages and unmaps them on free, so each new view- or ray-sized tensor of a forward or
backward pass pays one page fault per 4 KiB page when first written. In a virtual machine that costs
about as much as the arithmetic: filling a fresh 8 MB tensor took ~6 ms here against ~0.3 ms for a
reused one. Raising the threshold to glibc's maximum (32 MiB) and keeping freed memory in the heap
(no trimming) lets the next pass reuse the same pages. Tensors above 32 MiB are still mapped and
returned as before, so peak memory is unchanged; the heap simply keeps its high-water mark.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_MMAP_THRESHOLD = 32 * 2**20  # glibc's largest allowed value on 64-bit systems
_TRIM_THRESHOLD = 2**31 - 1  # never give heap memory back while the process runs
_TOP_PAD = 64 * 2**20  # grow the heap in large steps

M_MMAP_THRESHOLD = _M_MMAP_THRESHOLD

_configured = False


def mallopt(parameter: int, value: int) -> bool:
    """glibc's `mallopt(parameter, value)`; False where it is unavailable (not Linux, not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): leave the allocator alone
        return False
    function.argtypes, function.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return function(parameter, value) == 1


def configure_cpu_allocator() -> bool:
    """Keep freed CPU memory for reuse (see the module docstring). Returns whether it applied
    (glibc on Linux only; elsewhere nothing changes). Idempotent."""
    global _configured
    if not _configured:
        _configured = all(
            mallopt(parameter, value)
            for parameter, value in (
                (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD),
                (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD),
                (_M_TOP_PAD, _TOP_PAD),
            )
        )
    return _configured
