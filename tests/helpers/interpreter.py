"""Running Triton kernel tests on the CPU: Triton picks interpreter or compiler for good when
`triton.language` is first imported, which may already have happened in the pytest process. So the
kernel test files rerun in a child pytest with `TRITON_INTERPRET=1`; there their `interpreter`
tests run, here they are skipped (and the `compiled_cuda` ones run only on a CUDA machine).

    @pytest.mark.skipif(INTERPRETING, reason="this is the interpreter run")
    def test_kernels_in_interpreter(request):
        assert_passes_in_interpreter(__file__, request)

Each test marked `interpreter` must pass in the child: the child reports which of its tests carry the
mark (a junit property, `mark_interpreter_tests`), and a file's parent test fails where one of them
failed or was skipped there, where none ran, or where a marked test of the parent's session is
missing from the child.

Every kernel file of a pytest session shares one child pytest (one start-up, which costs more than
most files' kernel tests), started as soon as the session's tests are collected (conftest's
`pytest_collection_finish`), so that it runs beside the tests before them on an idle core; each
file's test then waits for it and checks its own file's results there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pola_gnt.core.paths import PROJECT_ROOT

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
INTERPRETER_REASON = "runs in the file's TRITON_INTERPRET=1 child pytest"
interpreter = pytest.mark.skipif(not INTERPRETING, reason=INTERPRETER_REASON)
_PROPERTY = "interpreter_test"  # the junit property of the child's `interpreter` tests
compiled_cuda = pytest.mark.skipif(
    INTERPRETING or not torch.cuda.is_available(), reason="needs a CUDA device and compiled kernels"
)


@dataclass(frozen=True)
class ChildRun:
    """One child pytest over some kernel files: its exit code, output, and each test's outcome by
    the dotted module it belongs to (`tests.test_triton_view`; None where pytest names no module), its
    name within the module (`Class::test[id]`, as in a node id) and whether it is an `interpreter` test."""

    returncode: int
    output: str
    # (module, test name, passed | skipped | failed, marked `interpreter`)
    outcomes: tuple[tuple[str | None, str, str, bool], ...]


_STARTED: dict[tuple[str, ...], tuple[subprocess.Popen, tempfile.TemporaryDirectory, float]] = {}
_CHILD_RUNS: dict[tuple[str, ...], ChildRun] = {}
_TIMEOUT_S = 900


def _module_name(test_file: str | Path) -> str:
    return ".".join(Path(test_file).resolve().relative_to(PROJECT_ROOT).with_suffix("").parts)


def _is_interpreter_test(item: pytest.Item) -> bool:
    return any(mark.kwargs.get("reason") == INTERPRETER_REASON for mark in item.iter_markers("skipif"))


def mark_interpreter_tests(items: list[pytest.Item]) -> None:
    """In the child (conftest's `pytest_collection_modifyitems`): the `interpreter` tests carry a junit
    property, so that the parent knows which tests must have passed here."""
    if INTERPRETING:
        for item in items:
            if _is_interpreter_test(item):
                item.user_properties.append((_PROPERTY, "1"))


def _interpreter_tests_of(items, test_file: str) -> set[str]:
    """The names (`Class::test[id]`) of the session's `interpreter` tests in `test_file`."""
    path = Path(test_file).resolve()
    return {item.nodeid.split("::", 1)[1] for item in items if Path(item.path) == path and _is_interpreter_test(item)}


def _kernel_files(items, test_file: str | None = None) -> tuple[str, ...]:
    """`test_file` and the kernel files whose parent test (`*_in_interpreter`, calling this module's
    `assert_passes_in_interpreter`) is among the session's `items`."""
    files = {str(Path(test_file).resolve())} if test_file else set()
    for item in items:
        module = getattr(item, "module", None)
        if item.name.endswith("_in_interpreter") and module is not None:
            if getattr(module, "assert_passes_in_interpreter", None) is assert_passes_in_interpreter:
                files.add(str(Path(item.path).resolve()))
    return tuple(sorted(files))


def _start_child(files: tuple[str, ...]) -> None:
    folder = tempfile.TemporaryDirectory()
    with (Path(folder.name) / "output.txt").open("w") as output:  # a file: a full pipe would stall the child
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                *files,
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                "not gpu and not slow",
                f"--junitxml={Path(folder.name) / 'junit.xml'}",
            ],
            env={**os.environ, "TRITON_INTERPRET": "1"},
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=PROJECT_ROOT,
        )
    _STARTED[files] = (process, folder, time.monotonic())


def _finish_child(files: tuple[str, ...]) -> ChildRun:
    process, folder, started = _STARTED.pop(files)
    try:
        try:
            process.wait(timeout=max(1.0, started + _TIMEOUT_S - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        report, output = Path(folder.name) / "junit.xml", (Path(folder.name) / "output.txt").read_text()
        outcomes = []
        if report.is_file():
            known = {_module_name(file) for file in files}
            for case in ET.parse(report).getroot().iter("testcase"):
                classname = case.get("classname", "")
                module = next((m for m in known if classname == m or classname.startswith(f"{m}.")), None)
                within = classname[len(module) + 1 :].replace(".", "::") if module else ""
                name = f"{within}::{case.get('name', '')}" if within else case.get("name", "")
                kinds = {child.tag for child in case}
                outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
                marked = any(prop.get("name") == _PROPERTY for prop in case.iter("property"))
                outcomes.append((module, name, outcome, marked))
        return ChildRun(process.returncode, output[-8000:], tuple(outcomes))
    finally:
        folder.cleanup()


def start_for_session(session: pytest.Session) -> None:
    """Start the child pytest of the session's kernel files as soon as they are collected (conftest's
    `pytest_collection_finish`): it runs on its own, beside the tests before the first kernel file's."""
    if INTERPRETING or session.config.option.collectonly:
        return
    files = _kernel_files(session.items)
    if files and files not in _STARTED and files not in _CHILD_RUNS:
        _start_child(files)


def stop_unfinished() -> None:
    """At the session's end: a child started for tests that never ran (an interrupted session) is stopped."""
    for files in list(_STARTED):
        process, folder, _ = _STARTED.pop(files)
        if process.poll() is None:
            process.kill()
            process.wait()
        folder.cleanup()


def assert_passes_in_interpreter(test_file: str, request: pytest.FixtureRequest) -> None:
    """Run `test_file`'s tests (not gpu, not slow) in a child pytest under `TRITON_INTERPRET=1`, in one
    child with the session's other kernel files; `test_file`'s tests must pass, every one of its
    `interpreter` tests must have passed there (not been skipped), at least one of them, and every
    `interpreter` test of this session's file must be among them. A failure pytest does not place in a
    file fails every file's test."""
    files = _kernel_files(request.session.items, test_file)
    if files not in _CHILD_RUNS:
        if files not in _STARTED:
            _start_child(files)
        _CHILD_RUNS[files] = _finish_child(files)
    run = _CHILD_RUNS[files]
    module = _module_name(test_file)
    mine = [(name, outcome, marked) for owner, name, outcome, marked in run.outcomes if owner == module]
    unplaced = [(name, outcome) for owner, name, outcome, _ in run.outcomes if owner is None and outcome == "failed"]
    assert run.returncode in (0, 1), run.output  # 1: tests failed (checked below); others: pytest itself failed
    assert not unplaced, (unplaced, run.output)
    assert not [name for name, outcome, _ in mine if outcome == "failed"], run.output
    marked = {name: outcome for name, outcome, is_marked in mine if is_marked}
    assert marked, f"no interpreter test of {module} ran in the child\n{run.output}"
    not_passed = {name: outcome for name, outcome in marked.items() if outcome != "passed"}
    assert not not_passed, f"interpreter tests that did not pass in the child: {not_passed}\n{run.output}"
    missing = _interpreter_tests_of(request.session.items, test_file) - set(marked)
    assert not missing, f"interpreter tests of this session missing from the child: {sorted(missing)}"
    if run.returncode == 1:  # some test failed: in another file (placed there), never unaccounted for
        assert any(outcome == "failed" for owner, _, outcome, _ in run.outcomes if owner != module), run.output
