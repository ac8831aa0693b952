"""User-facing errors: one line on stderr and a non-zero exit code, never a traceback.

`UserError` (bad input: data, checkpoint, config value, a full disk) prints `error: ...` and exits 2.
`RunStopped` ends a run for another reason the user must act on (a signal, divergence) with its own
line and exit code.
"""

from __future__ import annotations

import functools
import math
import numbers
import sys
from collections.abc import Callable, Sequence
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


# ---- value checks: the one place that words "must be a positive integer" and its kin ---------------
# Each takes the value and the full config key it came from (`data.factor`) and returns the value or
# raises a one-line `UserError` naming the key. `pola_gnt.runs.settings` reads every config value through
# these; library functions that take the same values as arguments use them too.


def is_int(value) -> bool:
    """An integer (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _why(why: str) -> str:
    return f" ({why})" if why else ""


def check_int(value, key: str, minimum: int | None = 1, maximum: int | None = None, why: str = "") -> int:
    """An integer in `[minimum, maximum]` (either bound may be None)."""
    if is_int(value) and (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return int(value)
    if minimum is not None and maximum is not None:
        wanted = f"an integer from {minimum} to {maximum}"
    elif minimum == 1:
        wanted = "a positive integer"
    elif minimum == 0:
        wanted = "a non-negative integer"
    elif minimum is not None:
        wanted = f"an integer of at least {minimum}"
    elif maximum is not None:
        wanted = f"an integer of at most {maximum}"
    else:
        wanted = "an integer"
    raise UserError(f"{key}: must be {wanted}{_why(why)}, got {value!r}")


def check_number(
    value,
    key: str,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = True,
    high_open: bool = False,
    why: str = "",
) -> float:
    """A finite number within the bounds (open or closed; either may be None)."""
    fits = is_number(value)
    if fits and low is not None:
        fits = value > low if low_open else value >= low
    if fits and high is not None:
        fits = value < high if high_open else value <= high
    if fits:
        return float(value)
    if low == 0 and low_open and high is None:
        wanted = "a positive number"
    elif low is not None and high is not None:
        wanted = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        wanted = f"a number {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        wanted = f"a number {'<' if high_open else '<='} {high:g}"
    else:
        wanted = "a number"
    raise UserError(f"{key}: must be {wanted}{_why(why)}, got {value!r}")


def check_choice(value, key: str, allowed: Sequence[str]) -> str:
    """One of `allowed`."""
    if isinstance(value, str) and value in allowed:
        return value
    raise UserError(f"{key}: unknown value {value!r}; expected one of {', '.join(allowed)}")


def check_bool(value, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise UserError(f"{key}: must be true or false, got {value!r}")
