"""Test helpers: running an entry point as a user would (a child process) or in this process (its
`main` with command-line overrides, catching `SystemExit`), and the one-`error:`-line assertion.

Import from tests as `from helpers import ...` (pytest puts `tests/` on `sys.path`).
"""

from helpers.commands import CHILD_PROCESSES, CommandResult, assert_one_error_line, run_in_process, run_module

__all__ = ["CHILD_PROCESSES", "CommandResult", "assert_one_error_line", "run_in_process", "run_module"]
