"""A run folder's own files: checkpoints that never hold non-finite weights (`SafeCheckpointIO`),
and a lock so that one run folder serves one run at a time (`RunLock`)."""

from __future__ import annotations

import fcntl
import io
import os
import socket
import time
from pathlib import Path

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from pola_gnt.core.errors import UserError
from pola_gnt.core.files import disk_error, is_disk_error, write_atomic

LOCK_NAME = "run.lock"


class NonFiniteError(Exception):
    """Training produced a NaN or infinite value (loss, gradient, weights, validation score)."""

    def __init__(self, step: int, quantity: str, detail: str = ""):
        self.step, self.quantity, self.detail = step, quantity, detail
        super().__init__(f"non-finite {quantity} at step {step}{f' ({detail})' if detail else ''}")


def non_finite_tensors(state_dict: dict) -> list[str]:
    """Names of floating-point tensors in `state_dict` holding a NaN or an infinity."""
    return [
        name
        for name, value in state_dict.items()
        if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all())
    ]


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint writer: refuses non-finite weights, writes atomically in the checkpoint's
    own folder (Lightning's default stages through `$TMPDIR`), one line for a full disk."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        bad = non_finite_tensors(checkpoint.get("state_dict", {}))
        if bad:
            step = int(checkpoint.get("global_step", -1))
            raise NonFiniteError(step, "weights", f"{len(bad)} tensors, e.g. {bad[0]}; {path.name} not written")
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise disk_error(path.parent, err) if is_disk_error(err) else err from None
        write_atomic(path, buffer.getbuffer())


# ---- one run per folder ----------------------------------------------------------------------


class RunLock:
    """An exclusive lock on a run folder: `run.lock` holding the PID, host and start time.

    Taken with `flock`, so the kernel releases it when the process ends in any way (SIGKILL
    included): a lock file left by a killed run is stale and simply taken over.
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.handle: int | None = None
        self.previous: str = ""  # content of a stale lock file that was taken over

    def acquire(self) -> RunLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise disk_error(self.path.parent, err) if is_disk_error(err) else err from None
        while True:
            try:
                handle = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise disk_error(self.path, err) if is_disk_error(err) else err from None
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(handle, 4096, 0).decode(errors="replace").strip() or "another process"
                os.close(handle)
                raise UserError(
                    f"{self.path.parent}: already in use by a running training ({holder}); wait for it to "
                    f"finish, stop it, or pick another hydra.run.dir"
                ) from None
            try:  # the file may have been removed by its previous holder after we opened it: retry
                same = os.fstat(handle).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(handle)
        self.previous = os.pread(handle, 4096, 0).decode(errors="replace").strip()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        content = f"pid {os.getpid()} on {socket.gethostname()}, since {stamp}\n".encode()
        try:
            os.ftruncate(handle, 0)
            os.pwrite(handle, content, 0)
        except OSError as err:
            os.close(handle)
            raise disk_error(self.path, err, len(content)) if is_disk_error(err) else err from None
        self.handle = handle
        return self

    def release(self) -> None:
        if self.handle is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only folder: the flock is released below all the same
        os.close(self.handle)
        self.handle = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
