"""Reliability of training runs: exact resume from any step, honest exits on signals, divergence,
one run per folder, full disks. Runs are tiny (see conftest.TINY_OVERRIDES) and mostly in-process."""

from __future__ import annotations

import contextlib
import csv
import ctypes
import errno
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from helpers import CONFIG_DIR, TINY_OVERRIDES, assert_one_error_line, read_metrics, run_in_process, train_in_process
from hydra import compose, initialize_config_dir

from pola_gnt.attention import cpu_extension
from pola_gnt.core.errors import RunStopped, UserError
from pola_gnt.core.files import write_atomic
from pola_gnt.core.paths import PROJECT_ROOT
from pola_gnt.model import render_kernels
from pola_gnt.runs.guards import TrainingGuard
from pola_gnt.runs.run_folder import LOCK_NAME, NonFiniteError, RunLock, SafeCheckpointIO
from pola_gnt.runs.system import GNTSystem

COMMON = ["model=pola_gnt", *TINY_OVERRIDES, "seed=3", "trainer.val_check_interval=2"]
MAX_STEPS = 8


def config(*overrides: str):
    with initialize_config_dir(CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=[*COMMON, f"trainer.max_steps={MAX_STEPS}", *overrides])


def csv_rows(run_dir: Path) -> list[dict]:
    with (run_dir / "csv" / "metrics.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def send_signal_at(monkeypatch, hook: str, signum: int, steps: set[int] | None = None) -> None:
    """Make the process receive `signum` (a real signal) when `TrainingGuard.<hook>` runs at one of
    `steps` (global steps; None: the first call), as a user's `kill` would arrive."""
    original = getattr(TrainingGuard, hook)
    sent = set()

    def hooked(self, trainer, *args, **kwargs):
        step = trainer.global_step
        if (steps is None and not sent) or (steps is not None and step in steps and step not in sent):
            sent.add(step)
            os.kill(os.getpid(), signum)
        return original(self, trainer, *args, **kwargs)

    monkeypatch.setattr(TrainingGuard, hook, hooked)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("straight")
    train_in_process(config(), run_dir)
    return run_dir


def test_resume_from_several_steps_matches_uninterrupted_run(straight_run, tmp_path, monkeypatch):
    """SIGTERM at steps 1, 3 and 5 of 8 (before and after the middle), each resumed with ckpt_path=last:
    the same test metrics, the same logged training curve, and the earlier log rows kept."""
    for stop in (1, 3, 5):
        with monkeypatch.context() as patch:
            send_signal_at(patch, "on_train_batch_start", signal.SIGTERM, {stop})
            with pytest.raises(RunStopped) as stopped:
                train_in_process(config(*(["ckpt_path=last"] if stop > 1 else [])), tmp_path)
        assert stopped.value.exit_code == 143
        message = str(stopped.value)
        assert f"at step {stop}" in message and "ckpt_path=last" in message and f"saved at step {stop}" in message
        assert not (tmp_path / "metrics.json").exists()
    train_in_process(config("ckpt_path=last"), tmp_path)
    first, second = read_metrics(straight_run), read_metrics(tmp_path)
    assert second["global_step"] == first["global_step"] == MAX_STEPS
    assert second["mean"] == first["mean"] and second["per_image"] == first["per_image"]
    # The CSV log holds every step once, as the uninterrupted run's (learning rates, loss, val PSNR).
    assert csv_rows(tmp_path) == csv_rows(straight_run)
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) > 1  # appended, not replaced


def test_sigterm_during_test_says_metrics_not_written(straight_run, tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        send_signal_at(patch, "on_test_batch_start", signal.SIGTERM)
        with pytest.raises(RunStopped) as stopped:
            train_in_process(config(), tmp_path)
    assert stopped.value.exit_code == 143 and "metrics.json was not written" in str(stopped.value)
    assert not (tmp_path / "metrics.json").exists()
    train_in_process(config("ckpt_path=last"), tmp_path)  # the trained model is tested, nothing retrained
    assert read_metrics(tmp_path)["mean"] == read_metrics(straight_run)["mean"]


def test_sigint_exits_130_with_resume_hint(tmp_path, monkeypatch):
    send_signal_at(monkeypatch, "on_validation_batch_start", signal.SIGINT)
    with pytest.raises(RunStopped) as stopped:
        train_in_process(config(), tmp_path)
    assert stopped.value.exit_code == 130 and "resume with: python -m pola_gnt.train" in str(stopped.value)
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def _finite_checkpoint(path: Path) -> bool:
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


@pytest.mark.parametrize("fault", ["loss", "learning_rate"])
def test_divergence_stops_at_once_and_keeps_last_good_checkpoint(fault, tmp_path, monkeypatch):
    original = GNTSystem.training_step

    def diverging_step(self, batch, batch_idx):
        loss = original(self, batch, batch_idx)
        if self.global_step == 5:
            if fault == "loss":
                return loss * float("nan")
            for group in self.optimizers().optimizer.param_groups:  # a blown-up learning rate
                group["lr"] = float("inf")
        return loss

    monkeypatch.setattr(GNTSystem, "training_step", diverging_step)
    with pytest.raises(RunStopped) as stopped:
        train_in_process(config(), tmp_path)
    message = str(stopped.value)
    assert stopped.value.exit_code == 3 and "diverged" in message and "step 6" in message
    assert ("loss" if fault == "loss" else "weights") in message and "(step 4)" in message
    checkpoints = tmp_path / "checkpoints"
    assert torch.load(checkpoints / "last.ckpt", weights_only=False)["global_step"] == 4
    assert all(_finite_checkpoint(p) for p in checkpoints.glob("*.ckpt"))
    assert not any("nan" in p.name for p in checkpoints.iterdir())
    assert not (tmp_path / "metrics.json").exists()


def test_checkpoint_io_refuses_non_finite_weights(tmp_path):
    with pytest.raises(NonFiniteError):
        SafeCheckpointIO().save_checkpoint(
            {"state_dict": {"w": torch.tensor([1.0, float("inf")])}, "global_step": 7}, tmp_path / "x.ckpt"
        )
    assert list(tmp_path.iterdir()) == []


# ---- one run per folder ------------------------------------------------------------------------


def test_run_lock_refuses_a_second_holder_and_takes_over_a_stale_one(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(UserError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path).acquire()
    assert not (tmp_path / LOCK_NAME).exists()
    (tmp_path / LOCK_NAME).write_text("pid 999999 on elsewhere, since yesterday\n")  # a killed run's file
    lock = RunLock(tmp_path).acquire()
    assert lock.previous.startswith("pid 999999") and str(os.getpid()) in (tmp_path / LOCK_NAME).read_text()
    lock.release()


def _train_arguments(run_dir: Path, *extra: str) -> list[str]:
    return [*COMMON, f"hydra.run.dir={run_dir}", *extra]


def _train_command(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pola_gnt.train", *_train_arguments(run_dir, *extra)]


def test_second_run_on_a_folder_refuses_and_a_killed_run_is_resumed(tmp_path):
    errors = tempfile.TemporaryFile()  # the first run's stderr, for a failure's message (a file: a pipe could fill)
    first = subprocess.Popen(
        _train_command(tmp_path, "trainer.max_steps=400"),
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    try:
        # Until its first checkpoint, however long that takes on a loaded machine (up to 10 minutes, no
        # tighter deadline): the first run must still be running then, holding the folder.
        deadline = time.monotonic() + 600
        while not (tmp_path / "checkpoints" / "last.ckpt").is_file() and first.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint after 10 minutes"
            time.sleep(0.2)
        errors.seek(0)
        assert first.poll() is None, (first.returncode, errors.read().decode(errors="replace")[-3000:])
        # The second run (the command's `main` in this process: another process than the first's).
        second = run_in_process("train", *_train_arguments(tmp_path, "trainer.max_steps=400", "seed=4"))
        assert_one_error_line(second, f"pid {first.pid}")
    finally:
        first.kill()
        first.wait()
        errors.close()
    assert (tmp_path / LOCK_NAME).exists()  # left by the killed run: stale
    (tmp_path / "checkpoints" / ".last.ckpt.half.tmp").write_bytes(b"half")  # a write cut short
    resumed = run_in_process("train", *_train_arguments(tmp_path, f"trainer.max_steps={MAX_STEPS}", "ckpt_path=last"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not list((tmp_path / "checkpoints").glob(".*.tmp")) and not (tmp_path / LOCK_NAME).exists()


def test_sigterm_to_a_real_process_exits_143_with_one_line(tmp_path):
    process = subprocess.Popen(
        _train_command(tmp_path, "trainer.max_steps=400"),
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (tmp_path / "checkpoints" / "last.ckpt").is_file() and time.time() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    lines = [line for line in stderr.splitlines() if not line.startswith(("/", " ", "  "))]  # minus warnings
    assert process.returncode == 143, stderr[-2000:]
    assert lines[-1].startswith("stopped: SIGTERM") and "ckpt_path=last" in lines[-1]
    assert f"hydra.run.dir={tmp_path}" in lines[-1]


# ---- disks ---------------------------------------------------------------------------------------


def test_full_disk_write_is_one_line_and_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    target.write_text('{"old": true}')

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(UserError) as err:
        write_atomic(target, b"x" * 5000)
    message = str(err.value)
    assert str(target) in message and "No space left" in message and "4.9 KB needed" in message
    assert "\n" not in message
    assert target.read_text() == '{"old": true}' and list(tmp_path.iterdir()) == [target]


def test_checkpoints_are_staged_in_their_folder_not_tmpdir(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "missing"))
    SafeCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(2)}}, tmp_path / "ckpt" / "a.ckpt")
    assert torch.load(tmp_path / "ckpt" / "a.ckpt", weights_only=False)["state_dict"]["w"].sum() == 2


# Full and read-only disks, end to end: the train command's exit code 2 and one `error:` line, no
# traceback, no temporary file left (its `main` in this process, where Hydra would print a traceback).
# Without root's mounts (every machine): a file size limit makes a checkpoint write fail as on a full
# disk, and a folder without write permission stands for a read-only one. With them (where a tmpfs can
# be mounted): a real full and a real read-only file system.

# A 1 MB file size limit: the run's checkpoints (3.2 MB at width 64) exceed it; its other files (config,
# logs, images: under 40 kB) do not.
_FILE_SIZE_LIMIT = 2**20


@contextlib.contextmanager
def file_size_limit(limit: int):
    """RLIMIT_FSIZE for this process (for root and non-root alike; Python ignores SIGXFSZ, so a write
    past the limit fails with EFBIG, `File too large`). The fused kernels are built first: their build
    is no part of the test and writes larger files."""
    cpu_extension.available(), render_kernels.available()
    previous = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, previous[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, previous)


class _CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapabilitySets(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@contextlib.contextmanager
def root_obeys_folder_permissions():
    """Run as root, this thread drops CAP_DAC_OVERRIDE from its effective capabilities (it stays
    permitted, and comes back afterwards): root then obeys a folder's permissions as everyone does.
    Nothing to do for other users."""
    if os.geteuid() != 0:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header, sets = _CapabilityHeader(0x20080522, 0), (_CapabilitySets * 2)()  # _LINUX_CAPABILITY_VERSION_3
    assert libc.capget(ctypes.byref(header), sets) == 0, os.strerror(ctypes.get_errno())
    dac_override = 1 << 1  # CAP_DAC_OVERRIDE
    sets[0].effective &= ~dac_override
    assert libc.capset(ctypes.byref(header), sets) == 0, os.strerror(ctypes.get_errno())
    try:
        yield
    finally:
        sets[0].effective |= dac_override
        assert libc.capset(ctypes.byref(header), sets) == 0, os.strerror(ctypes.get_errno())


def _assert_one_disk_error(result) -> str:
    lines = [line for line in result.stderr.strip().splitlines() if line.startswith("error:")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


def test_training_past_a_file_size_limit_is_one_line_as_a_full_disk(tmp_path):
    run_dir = tmp_path / "run"
    arguments = _train_arguments(run_dir, "trainer.max_steps=4", "model.net.width=64", "model.net.heads=2")
    with file_size_limit(_FILE_SIZE_LIMIT):
        result = run_in_process("train", *arguments)
    line = _assert_one_disk_error(result)
    assert "last.ckpt: cannot write (File too large)" in line and "MB needed" in line, line
    assert "free some space or use another hydra.run.dir" in line, line
    assert not list(run_dir.rglob("*.tmp")) and not list((run_dir / "checkpoints").iterdir())


def test_training_into_a_folder_without_write_permission_is_one_line(tmp_path):
    """For root as for anyone else (`root_obeys_folder_permissions`)."""
    protected = tmp_path / "protected"
    protected.mkdir()
    protected.chmod(0o555)
    try:
        with root_obeys_folder_permissions():
            result = run_in_process("train", *_train_arguments(protected / "run", "trainer.max_steps=4"))
    finally:
        protected.chmod(0o755)
    line = _assert_one_disk_error(result)
    assert "cannot write (Permission denied); no write permission: use another hydra.run.dir" in line, line
    assert not list(protected.iterdir())


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs (needs root); skipped where it cannot be mounted (the tests above cover the same
    faults without a mount)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(mount_point)], capture_output=True)
    if result.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.mark.parametrize("mode", ["full", "read-only"])
def test_training_on_a_full_or_read_only_tmpfs(small_disk, mode):
    """The train command's `main` in this process: its exit code and what it wrote on stderr, where
    Hydra would print a traceback."""
    run_dir = small_disk / "run"
    if mode == "full":
        arguments = _train_arguments(run_dir, "trainer.max_steps=4", "model.net.width=64", "model.net.heads=2")
    else:
        run_dir.mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
        arguments = _train_arguments(run_dir / "sub", "trainer.max_steps=4")
    result = run_in_process("train", *arguments)
    line = _assert_one_disk_error(result)
    if mode == "full":
        assert "No space left on device" in line and "needed" in line
        assert not list(run_dir.rglob("*.tmp"))
    else:
        assert "Read-only file system" in line


def test_metrics_json_is_strict_json_with_null_reasons(tmp_path):
    from pola_gnt.evaluation.scoring import ViewResult, write_results

    results = [
        ViewResult(
            0, "a.png", {"psnr": float("nan"), "ssim": 0.5, "lpips": None}, {"psnr": 10.0, "ssim": 0.1, "lpips": None}
        )
    ]
    document = write_results(tmp_path, {"scene": "x"}, results, (1.0, 2.0), save_images=False)
    parsed = read_metrics(tmp_path)  # strict JSON: a NaN or infinity constant fails
    assert parsed == document and parsed["mean"]["psnr"] is None and parsed["per_image"][0]["psnr"] is None
    assert "nan" in parsed["null_reasons"]["mean.psnr"] and "per_image[0].psnr" in parsed["null_reasons"]


@pytest.mark.slow
def test_random_sigkills_then_resume_give_the_uninterrupted_metrics(tmp_path):
    """SIGKILL at random moments (start-up, training steps, validation, checkpoint and log writes,
    the test phase), resuming after each: the finished run's metrics and logs equal an uninterrupted one's."""
    import random

    rng = random.Random(12)
    steps = ["trainer.max_steps=12"]
    straight = tmp_path / "straight"
    started = time.monotonic()
    done = subprocess.run(
        _train_command(straight, *steps), cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # Kill moments scale with this machine's speed: within the first 90% of an uninterrupted run.
    duration = time.monotonic() - started
    # A resumed run has less left to do and may finish before its kill moment: the kills go on in
    # a fresh run folder until at least two have hit (every finished run is compared).
    kills = 0
    for round_ in range(4):
        if kills >= 2:
            break
        run_dir = tmp_path / f"killed{round_}"
        for attempt in range(7):  # up to six random kills, then a run left to finish
            resume = ["ckpt_path=last"] if (run_dir / "checkpoints" / "last.ckpt").is_file() else []
            process = subprocess.Popen(
                _train_command(run_dir, *steps, *resume),
                cwd=PROJECT_ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                process.wait(timeout=rng.uniform(0.1, 0.9) * duration if attempt < 6 else 600)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                kills += 1
                for file in (run_dir / "checkpoints").glob("*.ckpt"):  # every checkpoint left loads
                    torch.load(file, map_location="cpu", weights_only=False)
                continue
            assert process.returncode == 0, process.stderr.read()[-2000:]
            break
        else:
            pytest.fail("the run never finished")
        first, second = read_metrics(straight), read_metrics(run_dir)
        assert second["mean"] == first["mean"] and second["per_image"] == first["per_image"]
        assert csv_rows(run_dir) == csv_rows(straight)
    assert kills >= 2


def test_sigkill_during_a_write_leaves_the_old_file_and_a_cleanable_temporary(tmp_path):
    from pola_gnt.core.files import clean_temporaries

    target = tmp_path / "last.ckpt"
    target.write_bytes(b"old checkpoint")
    code = (
        "import sys; from pathlib import Path; from pola_gnt.core.files import write_atomic; "
        "print('go', flush=True); write_atomic(Path(sys.argv[1]), b'x' * (1 << 31))"
    )
    process = subprocess.Popen([sys.executable, "-c", code, str(target)], cwd=PROJECT_ROOT, stdout=subprocess.PIPE)
    assert process.stdout.readline().strip() == b"go"
    deadline = time.time() + 60
    while not list(tmp_path.glob(".last.ckpt.*.tmp")) and time.time() < deadline:
        time.sleep(0.01)
    process.kill()
    process.wait()
    assert target.read_bytes() == b"old checkpoint"
    assert clean_temporaries(tmp_path) and sorted(tmp_path.iterdir()) == [target]
