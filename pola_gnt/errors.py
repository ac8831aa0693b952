"""User-facing errors: one line on stderr and a non-zero exit code, never a traceback.

`UserError` (bad input: data, checkpoint, config value, a full disk) prints `error: ...` and exits 2.
`RunStopped` ends a run for another reason the user must act on (a signal, divergence) with its own
line and exit code.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

USER_ERROR_EXIT_CODE = 2
DIVERGED_EXIT_CODE = 3


class UserError(Exception):
    """Bad input from the user (data, checkpoint, config value). The message names the file or key."""


class RunStopped(Exception):
    """A run ended early: one line `PREFIX: message` on stderr and `exit_code`."""

    def __init__(self, message: str, exit_code: int, prefix: str = "error"):
        super().__init__(message)
        self.exit_code, self.prefix = exit_code, prefix


def exit_on_user_error(main: F) -> F:
    """Wrap an entry point so a `UserError` prints `error: ...` and exits 2 (a `RunStopped`: its own
    line and code) instead of a traceback."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(USER_ERROR_EXIT_CODE)
        except RunStopped as err:
            print(f"{err.prefix}: {err}", file=sys.stderr, flush=True)
            sys.exit(err.exit_code)

    return wrapper  # type: ignore[return-value]
