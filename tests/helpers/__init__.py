"""Test helpers: running an entry point as a user would (a child process) or in this process (its
`main` with command-line overrides, catching `SystemExit`), the one-`error:`-line assertion, and the
project's config as typed settings (`compose_config`, `run_settings`, `TINY_OVERRIDES`,
`TINY_RUN_OVERRIDES`), a run's `metrics.json` (`read_metrics`), and the `scripts/` as modules
(`load_script`).

Import from tests as `from helpers import ...` (pytest puts `tests/` on `sys.path`).
"""

from helpers.commands import (
    CHILD_PROCESSES,
    CommandResult,
    assert_one_error_line,
    run_in_process,
    run_module,
    run_modules_at_once,
)
from helpers.config import (
    CONFIG_DIR,
    TINY_OVERRIDES,
    TINY_RUN_OVERRIDES,
    compose_config,
    net_settings,
    process_data_settings,
    run_settings,
    scene_and_data,
    system_of,
    train_in_process,
)
from helpers.metrics import read_metrics
from helpers.scripts import load_script

__all__ = [
    "CHILD_PROCESSES",
    "CONFIG_DIR",
    "TINY_OVERRIDES",
    "TINY_RUN_OVERRIDES",
    "CommandResult",
    "assert_one_error_line",
    "compose_config",
    "net_settings",
    "process_data_settings",
    "read_metrics",
    "load_script",
    "run_in_process",
    "run_module",
    "run_modules_at_once",
    "run_settings",
    "scene_and_data",
    "system_of",
    "train_in_process",
]
