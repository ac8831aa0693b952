"""Running the project's commands in tests, and checking their one-line user errors."""

from __future__ import annotations

import contextlib
import importlib
import io
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from pola_gnt.core.errors import USER_ERROR_EXIT_CODE
from pola_gnt.core.paths import PROJECT_ROOT

# Child processes started through `run_module`, by command (the suite's process budget: prefer
# `run_in_process` where only the message matters; keep one child-process test per entry point).
CHILD_PROCESSES: Counter[str] = Counter()


@dataclass
class CommandResult:
    """What a command left behind: exit code and the text it wrote (the shape of `CompletedProcess`)."""

    returncode: int
    stdout: str
    stderr: str


def run_module(
    module: str, *args: str, timeout: float = 600, env: dict | None = None, cwd=PROJECT_ROOT, text: bool = True
) -> subprocess.CompletedProcess:
    """Run `python -m pola_gnt.<module> args...` in a child process, as a user would (`text=False`:
    its output as bytes, carriage returns kept)."""
    CHILD_PROCESSES[module] += 1
    return subprocess.run(
        [sys.executable, "-m", f"pola_gnt.{module}", *args],
        capture_output=True,
        text=text,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def run_modules_at_once(
    commands: dict[str, tuple[str, ...]], timeout: float = 1800, env: dict | None = None, cwd=PROJECT_ROOT
) -> dict[str, subprocess.CompletedProcess]:
    """Run several `python -m pola_gnt.<module> args...` (`{key: (module, *args)}`) as child processes
    at the same time, for long single-threaded commands: on a machine with idle cores they take the
    time of the longest. Their output goes to files (a full pipe would stall a child)."""
    started = {}
    with tempfile.TemporaryDirectory() as folder:
        try:
            for key, (module, *args) in commands.items():
                CHILD_PROCESSES[module] += 1
                out, err = (open(Path(folder) / f"{len(started)}.{kind}", "w+") for kind in ("out", "err"))
                process = subprocess.Popen(
                    [sys.executable, "-m", f"pola_gnt.{module}", *args], stdout=out, stderr=err, cwd=cwd, env=env
                )
                started[key] = (process, out, err)
            deadline = time.monotonic() + timeout
            results = {}
            for key, (process, out, err) in started.items():
                process.wait(timeout=max(1.0, deadline - time.monotonic()))
                out.seek(0), err.seek(0)
                results[key] = subprocess.CompletedProcess(process.args, process.returncode, out.read(), err.read())
            return results
        finally:
            for process, out, err in started.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()
                out.close(), err.close()


# Hydra leaves Python's logging as it is (no log file, no handler bound to the captured streams).
_KEEP_LOGGING = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
ARGPARSE_COMMANDS = ("report", "metrics")  # plain command lines, not Hydra apps
_HYDRA_FLAGS = ("-m", "--multirun")


def run_in_process(module: str, *overrides: str) -> CommandResult:
    """Call the `main()` of entry point `pola_gnt.<module>`
    with these command-line arguments in this process; its exit code (0 when `main` returns, the
    `SystemExit` code otherwise) and what it printed. Hydra apps leave Python's logging alone."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    name = f"pola_gnt.{module}"
    entry = importlib.import_module(name)
    extra = list(getattr(entry, "NO_OUTPUT_OVERRIDES", []))  # as `python -m pola_gnt.check_scene` adds them
    hydra_app = module not in ARGPARSE_COMMANDS
    # Hydra's own flags (`-m`) before the overrides, as on a command line (argparse takes the overrides
    # as one run of positional arguments).
    flags = [o for o in overrides if hydra_app and o in _HYDRA_FLAGS]
    overrides = tuple(o for o in overrides if o not in flags)
    argv = [name, *flags, *extra, *(_KEEP_LOGGING if hydra_app else []), *overrides]
    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    try:
        with (
            mock.patch.object(sys, "argv", argv),
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
        ):
            entry.main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None  # no stale run config for code that asks Hydra later
    return CommandResult(code, stdout.getvalue(), stderr.getvalue())


def assert_one_error_line(result, *fragments: str, code: int = USER_ERROR_EXIT_CODE) -> str:
    """The user-error convention: exit code 2 and exactly one line on stderr, starting `error:` and
    containing every fragment. Returns the line."""
    stderr = result.stderr if isinstance(result.stderr, str) else result.stderr.decode()
    assert result.returncode == code, (result.returncode, stderr[-2000:])
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
