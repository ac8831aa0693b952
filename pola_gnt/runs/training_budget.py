"""Training budgets: equal steps (`trainer.max_steps`) or equal wall time (`trainer.max_time`).

`trainer.max_time` takes what Lightning's `Trainer(max_time=...)` takes, a `"DD:HH:MM:SS"` string or
a mapping of `datetime.timedelta` keys (`{minutes: 5}`), and also a plain number of minutes
(`trainer.max_time=5`, `=0.5`). Training stops at whichever of `max_steps` and `max_time` comes
first; a run with `max_time` set is labelled a time budget, one without a steps budget.

The training wall time is Lightning's `Timer` for the training stage: from the start of the first
training step to the end of training, periodic validation and checkpoint writes included (start-up,
data loading before the first step and the test render excluded). It is stored in the checkpoint,
so a resumed run counts the time of its earlier parts and stops at the same total budget.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import timedelta

from pola_gnt.core.errors import UserError
from pola_gnt.runs.settings import TrainerSettings

MAX_TIME_KEY = "trainer.max_time"
LIGHTNING_DURATION = re.compile(r"(\d+):(\d\d):(\d\d):(\d\d)")
TIMEDELTA_KEYS = ("weeks", "days", "hours", "minutes", "seconds", "milliseconds")
TIMER_STATE_KEY = "Timer"  # Lightning's Timer callback state in a checkpoint's "callbacks"


def max_time_seconds(value) -> float | None:
    """`trainer.max_time` -> seconds (None: no time budget). Bad values are a `UserError` naming the key."""
    if value is None:
        return None
    expected = 'a number of minutes, "DD:HH:MM:SS" or {minutes: N, ...}'
    if isinstance(value, bool):
        seconds = math.nan
    elif isinstance(value, (int, float)):
        seconds = 60.0 * float(value)
    elif isinstance(value, str):
        match = LIGHTNING_DURATION.fullmatch(value.strip())
        if not match:
            raise UserError(f"{MAX_TIME_KEY}: {value!r} is not {expected}")
        days, hours, minutes, secs = (int(g) for g in match.groups())
        seconds = timedelta(days=days, hours=hours, minutes=minutes, seconds=secs).total_seconds()
    elif isinstance(value, Mapping):
        unknown = [k for k in value if k not in TIMEDELTA_KEYS]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())
        if unknown or not numbers or not value:
            raise UserError(f"{MAX_TIME_KEY}: {value!r} is not {expected} (keys: {', '.join(TIMEDELTA_KEYS)})")
        seconds = timedelta(**{str(k): float(v) for k, v in value.items()}).total_seconds()
    else:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise UserError(f"{MAX_TIME_KEY}: must be a positive duration ({expected}), got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """`300 -> "5 min"`, `90 -> "1.5 min"`, `5400 -> "1.5 h"`, `45 -> "45 s"`."""
    if seconds >= 3600 and seconds % 360 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{round(seconds / 60, 2):g} min"
    return f"{seconds:g} s"


def budget_document(trainer: TrainerSettings) -> dict:
    """`metrics.json` "budget": which limit the run was given, and a label for reports."""
    max_steps, max_time = trainer.max_steps, trainer.max_time
    if max_time is None:
        return {"kind": "steps", "label": f"{max_steps} steps", "max_steps": max_steps, "max_time_s": None}
    return {
        "kind": "time",
        "label": f"{format_duration(max_time)} wall time",
        "max_steps": max_steps,
        "max_time_s": max_time,
    }


def timer_seconds_in_checkpoint(checkpoint: Mapping) -> float | None:
    """The training time stored by Lightning's `Timer` in a checkpoint, if any."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if str(key).startswith(TIMER_STATE_KEY) and isinstance(state, Mapping):
            elapsed = (state.get("time_elapsed") or {}).get("train")
            if isinstance(elapsed, (int, float)) and math.isfinite(elapsed):
                return float(elapsed)
    return None


def training_document(budget: dict, steps: int, wall_time_s: float | None) -> dict:
    """`metrics.json` "training": wall time, steps, steps per second and which limit ended training."""
    if budget["max_time_s"] is not None and wall_time_s is not None and wall_time_s >= budget["max_time_s"]:
        stopped_by = "max_time"
    elif steps >= budget["max_steps"]:
        stopped_by = "max_steps"
    else:
        stopped_by = None  # a checkpoint from before the end of training
    return {
        "wall_time_s": wall_time_s,
        "steps": steps,
        "steps_per_s": steps / wall_time_s if wall_time_s else None,
        "stopped_by": stopped_by,
    }
