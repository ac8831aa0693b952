"""Files written safely: atomic writes staged next to their target (never in `$TMPDIR`), and one
clear line for a full or read-only disk. (A run folder's checkpoints and lock: `runs.run_folder`.)

Every file the project writes (checkpoints, `metrics.json`, view PNGs) goes through `write_atomic`:
a temporary file in the target's own folder, flushed to disk, then renamed over the target. An
interruption (SIGKILL, full disk) leaves the previous file intact and at most a temporary
`.NAME.*.tmp` file, which the next run in that folder removes (`clean_temporaries`). Files written
by another program (videos by ffmpeg) go through `staged_file`, whole folders (image folders, a
processed scene) through `staged_folder`: the same temporary-then-rename in one place.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pola_gnt.core.errors import UserError

TEMPORARY_SUFFIX = ".tmp"
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EXDEV, errno.EFBIG}


def _size(n_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n_bytes < 1024 or unit == "TB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    return ""  # unreachable


def free_space(folder: Path) -> int | None:
    try:
        return os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    except OSError:
        return None


def disk_error(path: Path, err: OSError, needed: int | None = None) -> UserError:
    """One line for a write that the file system refused: the path, the reason, the space needed."""
    reason = err.strerror or type(err).__name__
    message = f"{path}: cannot write ({reason})"
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        free = free_space(path.parent if not path.is_dir() else path)
        parts = [
            f"{_size(needed)} needed" if needed is not None else None,
            f"{_size(free)} free" if free is not None else None,
        ]
        if any(parts):
            message += f": {', '.join(p for p in parts if p)} on {path.parent}"
        message += "; free some space or use another hydra.run.dir, then run the same command again"
    elif err.errno == errno.EROFS:
        message += "; the folder is on a read-only file system: use another hydra.run.dir"
    elif err.errno in (errno.EACCES, errno.EPERM):
        message += "; no write permission: use another hydra.run.dir"
    return UserError(message)


def is_disk_error(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in DISK_ERRNOS


@contextlib.contextmanager
def staged_file(path: Path, suffix: str = "") -> Iterator[Path]:
    """A new empty temporary file next to `path` (`.NAME.XXXXXX.tmp` + `suffix`), to be written in
    the block; renamed over `path` when the block completes, removed when it fails. `suffix` keeps
    an extension that the writer goes by (ffmpeg's container format)."""
    path = Path(path)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f"{TEMPORARY_SUFFIX}{suffix}", dir=path.parent)
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        os.chmod(temporary, 0o644)  # mkstemp makes it private
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)  # removed before any error is reported: the free space is the real one


@contextlib.contextmanager
def staged_folder(target: Path, replace: bool = False) -> Iterator[Path]:
    """A new folder next to `target` (`.NAME.XXXXXX.tmp`) to be filled in the block; renamed to
    `target` when the block completes, removed when it fails, so `target` never appears half-written.

    An empty `target` folder is replaced. A non-empty one is replaced only with `replace` (the old
    folder is moved aside first and removed after the rename); otherwise, when another process has
    put `target` in place meanwhile (another rank generating the same folder), that one is kept.
    """
    target = Path(target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=TEMPORARY_SUFFIX, dir=target.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private
        yield staging
        if replace and target.is_dir() and any(target.iterdir()):
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", suffix=TEMPORARY_SUFFIX, dir=target.parent))
            os.replace(target, old / target.name)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
            return
        try:
            os.replace(staging, target)
        except OSError:
            if replace or not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_atomic(path: Path, data: bytes | bytearray | memoryview) -> None:
    """Write `data` to `path` through a temporary file in the same folder (flushed, then renamed):
    readers see the old file or the new one, never a part. A full or read-only disk raises a
    `UserError` naming the path and the space needed, with the temporary file removed."""
    path = Path(path)
    try:
        with staged_file(path) as temporary, open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
    except OSError as err:
        if is_disk_error(err):
            raise disk_error(path, err, needed=len(data)) from None
        raise


def clean_temporaries(*folders: Path) -> list[Path]:
    """Remove the temporary files an interrupted run left (`.NAME.*.tmp`); returns what was removed."""
    removed = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for file in folder.glob(f".*{TEMPORARY_SUFFIX}*"):
            if file.is_file():
                file.unlink(missing_ok=True)
                removed.append(file)
    return removed


def strict_json_values(document: Any, path: str = "", reasons: dict[str, str] | None = None) -> Any:
    """`document` with every non-finite float replaced by None; `reasons[path]` says which value it was."""
    reasons = {} if reasons is None else reasons
    if isinstance(document, dict):
        return {k: strict_json_values(v, f"{path}.{k}" if path else str(k), reasons) for k, v in document.items()}
    if isinstance(document, (list, tuple)):
        return [strict_json_values(v, f"{path}[{i}]", reasons) for i, v in enumerate(document)]
    if isinstance(document, float) and not math.isfinite(document):
        reasons[path] = f"non-finite value ({document})"
        return None
    return document


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks (checkpoints, downloaded archives)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
