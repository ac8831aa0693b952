"""Shared fixtures. Tests that need `../shared` (real fern scene, LPIPS weights) fail in CI when it
is missing and skip elsewhere; its location can be overridden with `POLA_GNT_SHARED`.

Under `CI=true` a skip is a failure unless its reason is on `CI_ALLOWED_SKIPS` (below): CI must not
pass while a required part (a kernel build, Triton, a download, a fault test) went untested."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest

# Type and shape checks (jaxtyping + beartype) of every pola_gnt function in this process and in the
# commands the tests start: set before pola_gnt is first imported (its import installs the hook).
os.environ["POLA_GNT_CHECK_SHAPES"] = "1"
# One intra-op thread in the tests and in the commands they start (unless OMP_NUM_THREADS is set):
# their models and images are tiny, so thread wake-ups cost more than they share. On the shared
# 2-core machine a tiny training step took 0.14 s (GNT) / 0.25-0.28 s (Pola-GNT) with one thread
# and 2.2-3.1 s / 2.6-5.3 s with two. Results are compared like with like (both sides one thread).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from helpers import TINY_RUN_OVERRIDES, interpreter, run_in_process  # noqa: E402

from pola_gnt.core.paths import DEMO_ENV, PROCEDURAL_ENV, PROJECT_ROOT  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# The skips CI accepts: reasons that hold on a CPU-only CI machine, each with why. Any other skip
# under CI=true fails its test (or its file, for a skip while collecting). Patterns match the start of
# the reason pytest reports.
CI_ALLOWED_SKIPS: dict[str, str] = {
    # The `gpu` tests and the compiled (not interpreted) Triton kernels: a CPU-only CI has no CUDA device.
    r"needs (a )?CUDA\b": "no CUDA device on a CPU-only CI (the gpu tests and compiled Triton kernels)",
    # helpers/interpreter.py: a Triton kernel test runs in its file's TRITON_INTERPRET=1 child pytest,
    # whose every `interpreter` test must pass there (the parent's `*_in_interpreter` test checks it);
    # in that child the parent test itself is the one skipped.
    r"runs in the file's TRITON_INTERPRET=1 child pytest": "run and checked in the interpreter child instead",
    r"this is the interpreter run": "the parent's check of the child, not run inside the child",
}


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason pytest gives for a skip (the message of `pytest.skip`, a `skipif` reason)."""
    longrepr = report.longrepr
    message = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return message.removeprefix("Skipped: ")


def ci_allows_skip(reason: str) -> bool:
    return any(re.match(pattern, reason) for pattern in CI_ALLOWED_SKIPS)


def _fail_unlisted_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under CI=true: a skipped report whose reason is not on `CI_ALLOWED_SKIPS` becomes a failure."""
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = skip_reason(report)
        if not ci_allows_skip(reason):
            report.outcome = "failed"
            report.longrepr = f"skipped under CI=true for a reason not on conftest.CI_ALLOWED_SKIPS: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    _fail_unlisted_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    _fail_unlisted_skip(outcome.get_result())


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The skip count and the reasons, one line each (CI's log shows what did not run and why)."""
    reasons = Counter(skip_reason(report) for report in terminalreporter.stats.get("skipped", []))
    terminalreporter.write_line(f"skipped: {sum(reasons.values())}")
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        listed = "on CI's list" if ci_allows_skip(reason) else "NOT on CI's list"
        terminalreporter.write_line(f"  {count:4d}  {reason}  ({listed})")


def pytest_configure(config: pytest.Config) -> None:
    # beartype reads omegaconf's DictConfig as a `typing.MutableMapping` hint and warns about that alias.
    config.addinivalue_line("filterwarnings", r"ignore:.*typing\.MutableMapping.*deprecated by PEP 585")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # In the Triton kernel files' child pytest: which tests must pass there (helpers/interpreter.py).
    interpreter.mark_interpreter_tests(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    # The Triton kernel files' child pytest (helpers/interpreter.py) starts now and runs beside the tests.
    interpreter.start_for_session(session)


def pytest_sessionfinish(session: pytest.Session) -> None:
    interpreter.stop_unfinished()


def _shared_dir() -> Path:
    return Path(os.environ.get("POLA_GNT_SHARED", PROJECT_ROOT.parent / "shared")).resolve()


def _require(path: Path) -> Path:
    if not path.exists():
        message = f"shared data missing: {path} (set POLA_GNT_SHARED to the shared/ folder)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session", autouse=True)
def demo_scene_in_tmp(tmp_path_factory):
    """The demo scene and the generated (procedural) scenes are written under pytest's temporary
    folder (for this process and the commands it starts), never in the project's `data/`: tests
    write only below tmp paths."""
    folder = tmp_path_factory.mktemp("demo_scene")
    generated = tmp_path_factory.mktemp("procedural_scenes")
    previous = {name: os.environ.get(name) for name in (DEMO_ENV, PROCEDURAL_ENV)}
    os.environ[DEMO_ENV], os.environ[PROCEDURAL_ENV] = str(folder), str(generated)
    yield folder
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return _require(_shared_dir())


@pytest.fixture(scope="session")
def llff_root(shared_dir: Path) -> Path:
    """Folder holding the real LLFF scene folders (fern)."""
    return _require(shared_dir / "data" / "nerf_llff_data")


@pytest.fixture(scope="session")
def fern_dir(llff_root: Path) -> Path:
    return _require(llff_root / "fern")


@pytest.fixture(scope="session")
def lpips_alex_weights(shared_dir: Path) -> Path:
    return _require(shared_dir / "lpips" / "alex_v0.1.npz")


@pytest.fixture(scope="session")
def lpips_calibration_dir(shared_dir: Path) -> Path:
    return _require(shared_dir / "lpips" / "calibration")


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory) -> dict[str, Path]:
    """A short demo-scene training run per model (`gnt`, `pola_gnt`): run folder with checkpoints and
    metrics. Trained by the train command's `main` in this process (a child process would spend most
    of its time importing). Tests that train this very command again compare with these runs
    (`test_study`'s multirun) or resume towards them (`test_train`'s resume)."""
    runs = {}
    for model in ("gnt", "pola_gnt"):
        run_dir = tmp_path_factory.mktemp(f"tiny_{model}")
        result = run_in_process("train", f"model={model}", *TINY_RUN_OVERRIDES, f"hydra.run.dir={run_dir}")
        assert result.returncode == 0, result.stderr[-3000:]
        runs[model] = run_dir
    return runs
