"""Training budgets (`pola_gnt/runs/training_budget.py`): `trainer.max_time`'s forms, the budget label and what
stopped training, and a real run stopped by its time budget."""

from __future__ import annotations

import pytest
from helpers import TINY_OVERRIDES, read_metrics, run_in_process, run_settings

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


def test_time_budget_stops_training_and_is_labelled(tmp_path):
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
    assert training["stopped_by"] == "max_time" and 2.0 <= training["wall_time_s"] < 60
    assert 1 <= training["steps"] == document["global_step"] < 100000


def test_budget_checkpoints_are_the_models_of_shorter_time_budgets(tmp_path):
    """`trainer.checkpoint_minutes`: a 3 s run saves the model at 1 s of training, stored as a run
    with a 1 s budget; `eval` of it reports that budget and its own step and time."""
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
    assert 1.0 <= document["training"]["wall_time_s"] < full["training"]["wall_time_s"]
    assert 1 <= document["global_step"] < full["global_step"]


def test_checkpoint_minutes_must_be_positive():
    with pytest.raises(UserError, match=r"^trainer\.checkpoint_minutes: must be a list of positive minutes"):
        run_settings("trainer.checkpoint_minutes=[0]")
