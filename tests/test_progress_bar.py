"""The training progress bar (`runs/callbacks.py`, `TrainingProgressBar`): under a time budget it reads
training time against `trainer.max_time`, the time left and the steps done; a real tiny run under a time
budget shows that bar step by step (its training time a clock of steps, `helpers.step_clock`, so the
readings are known on any machine); and a real run started as a user starts it shows the bar and prints
no library warning on stderr (`core/process.py`), stopped by its step count, not by the clock."""

from __future__ import annotations

import os
import re
from types import SimpleNamespace

from helpers import TINY_OVERRIDES, run_in_process, run_module
from helpers.step_clock import install_step_clock

from pola_gnt.core.paths import PROJECT_ROOT
from pola_gnt.runs.callbacks import BudgetTqdm, TrainingProgressBar, budget_text, clock


class FixedTimer:
    """What the bar reads of Lightning's `Timer`: the training time so far."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def time_elapsed(self, stage: str) -> float:
        assert stage == "train"
        return self.seconds


def test_clock_and_budget_text():
    assert [clock(s) for s in (0, 54.7, 120, 3723, -1)] == ["0:00", "0:54", "2:00", "1:02:03", "0:00"]
    assert budget_text(54.0, 120.0, 312) == "0:54 / 2:00, 1:06 left, step 312 (5.78/s)"
    assert budget_text(0.0, 120.0, 0) == "0:00 / 2:00, 2:00 left, step 0"
    assert budget_text(121.5, 120.0, 700) == "2:01 / 2:00, 0:00 left, step 700 (5.76/s)"  # the last step ran over


def test_the_training_bar_reads_time_against_the_budget():
    """`trainer.max_steps=1000000 trainer.max_time=2`: 54 s in, the bar is 45% full (Lightning's read
    "Epoch 0/-2" and days left, counting steps against the million)."""
    progress = TrainingProgressBar(FixedTimer(54.0), max_time=120.0)  # type: ignore[arg-type]
    bar = progress.init_train_tqdm()
    assert isinstance(bar, BudgetTqdm)
    progress.train_progress_bar = bar
    bar.total = 120.0
    bar.set_description("Training", refresh=False)
    bar.set_postfix({"train/psnr": 18.4}, refresh=False)
    progress.show_budget(SimpleNamespace(global_step=312))  # type: ignore[arg-type]
    text = str(bar)
    bar.close()
    assert text.startswith("Training:  45%|")
    assert text.endswith("| 0:54 / 2:00, 1:06 left, step 312 (5.78/s), train/psnr=18.40")


BAR_READING = r"Training: +(\d+)%\|[^|\r\n]*\| (\d+:\d\d) / {budget}, (\d+:\d\d) left, step (\d+)"


def test_a_time_budget_run_reads_its_steps_against_the_budget(tmp_path, monkeypatch):
    """3 s at 1 s a step: the bar reads 0:01, 0:02 and 0:03 of 0:03 at steps 1, 2 and 3, then stops."""
    install_step_clock(monkeypatch, seconds_per_step=1.0)
    result = run_in_process(
        "train",
        *TINY_OVERRIDES,
        "trainer.max_steps=1000000",
        "trainer.max_time=00:00:00:03",
        "trainer.val_check_interval=1000",
        "output.save_images=false",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    readings = re.findall(BAR_READING.format(budget="0:03"), result.stdout)
    after_steps = sorted({reading for reading in readings if reading[3] != "0"}, key=lambda reading: int(reading[3]))
    assert after_steps == [("33", "0:01", "0:02", "1"), ("67", "0:02", "0:01", "2"), ("100", "0:03", "0:00", "3")]


def test_a_time_budget_run_shows_the_budget_bar_and_no_warnings(tmp_path):
    """One real run, as a user starts it (no shape checks, which only the tests switch on): a time
    budget of an hour, which its 2 steps stop well before on any machine."""
    env = {name: value for name, value in os.environ.items() if name != "POLA_GNT_CHECK_SHAPES"}
    result = run_module(
        "train",
        *TINY_OVERRIDES,
        "trainer.max_steps=2",
        "trainer.max_time=00:01:00:00",
        "trainer.val_check_interval=2",
        "output.save_images=false",
        f"hydra.run.dir={tmp_path}",
        env=env,
        cwd=PROJECT_ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    readings = re.findall(BAR_READING.format(budget="1:00:00"), result.stdout)
    assert readings, result.stdout[-2000:]
    assert readings[-1][3] == "2", readings[-1]
    noise = [line for line in result.stderr.splitlines() if re.search(r"warning|deprecated", line, re.IGNORECASE)]
    assert not noise, "\n".join(noise)
    assert "litlogger" not in result.stderr
