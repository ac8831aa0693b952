"""User-facing errors: one `error:` line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import functools
import sys
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """Bad input from the user (data, checkpoint, config value). The message names the file or key."""


def exit_on_user_error(main: F) -> F:
    """Wrap an entry point so a `UserError` prints `error: ...` and exits 2 instead of a traceback."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(USER_ERROR_EXIT_CODE)

    return wrapper  # type: ignore[return-value]
