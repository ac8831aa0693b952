"""Process-wide CPU settings of every command and benchmark (both models alike), applied by the entry
points (`prepare_process`) and never by importing the package: a library user's process is theirs.

OpenMP's wait policy. OpenMP workers that spin between parallel regions take the CPU from whatever
else runs, and when the machine is shared a worker that lost its core stalls every following region
of the pass: on a 2-core machine with one other busy process, a 4K-token polarity attention forward
took 3.1 s instead of 0.04 s, and a quick-size training step 0.92 s (GNT) / 1.68 s (Pola-GNT) instead
of 0.42 s / 0.71 s. Sleeping waiters avoid that, at a cost on an otherwise idle machine (there the
same steps take 0.28 s / 0.47 s instead of 0.22 s / 0.38 s): on a dedicated machine,
`OMP_WAIT_POLICY=ACTIVE`. It must be set before OpenMP starts, i.e. before torch is imported, so the
entry points call `prepare_process` before their other imports. A value set by the user is kept.

The allocator. glibc serves every allocation above its mmap threshold (128 KiB at first, raised adaptively) from
fresh `mmap` pages and unmaps them on free, so each new view- or ray-sized tensor of a forward or
backward pass pays one page fault per 4 KiB page when first written. In a virtual machine that costs
about as much as the arithmetic: filling a fresh 8 MB tensor took ~6 ms here against ~0.3 ms for a
reused one. Raising the threshold to glibc's maximum (32 MiB) and keeping freed memory in the heap
(no trimming) lets the next pass reuse the same pages. Tensors above 32 MiB are still mapped and
returned as before, so peak memory is unchanged; the heap simply keeps its high-water mark.

Library noise. Messages a user cannot act on are filtered here, each by its exact text and origin, so
that what a command prints on stderr is ours or worth reading (`quiet_library_noise`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import warnings

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_MMAP_THRESHOLD = 32 * 2**20  # glibc's largest allowed value on 64-bit systems
_TRIM_THRESHOLD = 2**31 - 1  # never give heap memory back while the process runs
_TOP_PAD = 64 * 2**20  # grow the heap in large steps

M_MMAP_THRESHOLD = _M_MMAP_THRESHOLD

_configured = False
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def set_openmp_wait_policy() -> None:
    """Sleeping OpenMP waiters (see the module docstring), unless the user chose a policy."""
    os.environ.setdefault(WAIT_POLICY_ENV, "PASSIVE")


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


class DropMessage(logging.Filter):
    """Drops a logger's records whose message starts with `prefix`."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


# Lightning's `rank_zero_info` logger (its advertisement below is logged there, on every trainer).
LIGHTNING_INFO_LOGGER = "pytorch_lightning.utilities.rank_zero"
LITLOGGER_TIP = "💡 Tip: For seamless cloud logging and experiment tracking"


def quiet_library_noise() -> None:
    """Filter the libraries' messages a user cannot act on (each exact). Idempotent."""
    # Lightning's own flattening of dataloaders (CombinedLoader, utilities/_pytree.py) builds torch's
    # `LeafSpec()`, deprecated in torch 2.14: printed by every trainer, fixed only in Lightning.
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"pytorch_lightning\.utilities\._pytree",
    )
    # An advertisement for Lightning's cloud logger, printed by every trainer without one.
    logger = logging.getLogger(LIGHTNING_INFO_LOGGER)
    if not any(isinstance(f, DropMessage) and f.prefix == LITLOGGER_TIP for f in logger.filters):
        logger.addFilter(DropMessage(LITLOGGER_TIP))


def prepare_process() -> None:
    """Every command's process-wide settings: called by an entry point before torch is imported."""
    set_openmp_wait_policy()
    configure_cpu_allocator()
    quiet_library_noise()
