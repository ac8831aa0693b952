"""Training budgets (`pola_gnt/runs/training_budget.py`): `trainer.max_time`'s forms, the budget label and what
stopped training, and a real run stopped by its time budget. The real runs' training time is a clock of
training steps (`helpers.step_clock`: 1 s a step), so they stop after a known number of steps on any machine."""

from __future__ import annotations

import pytest
from helpers import TINY_OVERRIDES, read_metrics, run_in_process, run_settings
from helpers.step_clock import install_step_clock

from pola_gnt.core.errors import UserError
from pola_gnt.runs.training_budget import budget_document, max_time_seconds, training_document


@pytest.mark.parametrize(
    "value, seconds",
    [(None, None), (5, 300.0), (0.5, 30.0), ("00:00:05:00", 300.0), ("01:02:03:04", 93784.0), ({"minutes": 2}, 120.0)],
)
def test_max_time_forms(value, seconds):
    assert max_time_seconds(value) == seconds


@pytest.mark.parametrize("value", [0, -1, True, "5:00", "00:00:5:00", {"minuts": 5}, {}, float("inf"), [5]])
def test_bad_max_time_is_a_user_error_naming_the_key(value):
    with pytest.raises(UserError, match="trainer.max_time"):
        max_time_seconds(value)


def test_budget_label_and_what_stopped_training():
    steps = budget_document(run_settings("trainer.max_steps=600", "trainer.max_time=null").trainer)
    assert steps == {"kind": "steps", "label": "600 steps", "max_steps": 600, "max_time_s": None}
    timed = budget_document(run_settings("trainer.max_steps=1000000", "trainer.max_time=00:00:05:00").trainer)
    assert timed["kind"] == "time" and timed["label"] == "5 min wall time" and timed["max_time_s"] == 300.0
    assert training_document(steps, 600, 240.0) == {
        "wall_time_s": 240.0,
        "steps": 600,
        "steps_per_s": 2.5,
        "stopped_by": "max_steps",
    }
    assert training_document(timed, 712, 300.4)["stopped_by"] == "max_time"
    assert training_document(steps, 300, 120.0)["stopped_by"] is None  # a checkpoint from mid-run


def test_time_budget_stops_training_and_is_labelled(tmp_path, monkeypatch):
    """2 s at 1 s a step: the Timer stops training at the end of step 2."""
    clock = install_step_clock(monkeypatch, seconds_per_step=1.0)
    result = run_in_process(
        "train",
        *TINY_OVERRIDES,
        "trainer.max_steps=100000",
        "trainer.max_time=00:00:00:02",
        "trainer.val_check_interval=1000",
        "output.save_images=false",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    document = read_metrics(tmp_path)
    assert document["budget"]["kind"] == "time" and document["budget"]["label"] == "2 s wall time"
    training = document["training"]
    assert training["stopped_by"] == "max_time" and training["wall_time_s"] == 2.0
    assert training["steps"] == document["global_step"] == clock.steps == 2


def test_budget_checkpoints_are_the_models_of_shorter_time_budgets(tmp_path, monkeypatch):
    """`trainer.checkpoint_minutes`: a 3 s run (3 steps at 1 s a step) saves the model at 1 s of
    training (step 1), stored as a run with a 1 s budget; `eval` of it reports that budget and its own
    step and time."""
    install_step_clock(monkeypatch, seconds_per_step=1.0)
    mark = 1 / 60  # minutes
    result = run_in_process(
        "train",
        *TINY_OVERRIDES,
        "trainer.max_steps=100000",
        "trainer.max_time=0.05",
        f"trainer.checkpoint_minutes=[{mark}]",
        "trainer.val_check_interval=1000",
        "output.save_images=false",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    full = read_metrics(tmp_path)
    marked = tmp_path / "checkpoints" / f"minutes{mark:g}.ckpt"
    evaluated = tmp_path / "eval"
    result = run_in_process("eval", f"ckpt_path={marked}", "output.save_images=false", f"hydra.run.dir={evaluated}")
    assert result.returncode == 0, result.stderr[-3000:]
    document = read_metrics(evaluated)
    assert document["budget"]["label"] == "1 s wall time" and document["training"]["stopped_by"] == "max_time"
    assert full["training"]["wall_time_s"] == 3.0 and full["global_step"] == 3
    assert document["training"]["wall_time_s"] == 1.0 and document["global_step"] == 1


def test_checkpoint_minutes_must_be_positive():
    with pytest.raises(UserError, match=r"^trainer\.checkpoint_minutes: must be a list of positive minutes"):
        run_settings("trainer.checkpoint_minutes=[0]")
