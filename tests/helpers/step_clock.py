"""A clock of training steps for tests of time budgets: Lightning's `Timer` (what `trainer.max_time`,
the budget checkpoints, the progress bar and `metrics.json`'s wall time read) sees each training step
take exactly `seconds_per_step` and nothing else take any time, so a run under a time budget stops
after a known number of steps on any machine, however loaded.

    clock = install_step_clock(monkeypatch, seconds_per_step=1.0)
    run_in_process("train", ..., "trainer.max_time=00:00:00:02")  # exactly 2 steps

In this process only (train in process, `helpers.run_in_process`). A child process (`run_module`)
keeps the real clock.
"""

from __future__ import annotations

import pytest


class StepClock:
    """Stands in for the `time` module in Lightning's timer module (only `monotonic` is read there)."""

    def __init__(self, seconds_per_step: float):
        self.seconds_per_step = seconds_per_step
        self.now_s = 1000.0  # any start: the Timer counts differences
        self.steps = 0

    def monotonic(self) -> float:
        return self.now_s

    def step(self) -> None:
        self.now_s += self.seconds_per_step
        self.steps += 1


def install_step_clock(monkeypatch: pytest.MonkeyPatch, seconds_per_step: float = 1.0) -> StepClock:
    """From now until the test ends, every training step (`GNTSystem.training_step`) advances the
    Timer's clock by `seconds_per_step`, after the step and before the step's end hooks read it."""
    from pytorch_lightning.callbacks import timer

    from pola_gnt.runs.system import GNTSystem

    clock = StepClock(seconds_per_step)
    monkeypatch.setattr(timer, "time", clock)
    training_step = GNTSystem.training_step

    def timed_training_step(self, *args, **kwargs):
        loss = training_step(self, *args, **kwargs)
        clock.step()
        return loss

    monkeypatch.setattr(GNTSystem, "training_step", timed_training_step)
    return clock
