"""Seeded study (`pola_gnt.evaluation.study`, the library behind `python -m pola_gnt.report`): reading
run folders, the report's tables, its grouping over seeds and modes (zero-shot, fine-tuned, per-scene),
its paired Pola-GNT - GNT difference within a mode and its fine-tuned - from scratch difference, and
one real multirun that the report reads. The t statistics are tests/test_stats.py's, the
budgets tests/test_budget.py's, the command line tests/test_report.py's."""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from pathlib import Path

import pytest
from helpers import TINY_RUN_OVERRIDES, read_metrics, run_in_process

from pola_gnt.core.errors import UserError
from pola_gnt.evaluation.stats import student_t_quantile
from pola_gnt.evaluation.study import (
    LLFF_SCENES,
    MODEL_COMPARISON,
    SCRATCH_COMPARISON,
    build_report,
    find_metrics_files,
    load_run,
    model_label,
    write_full_report,
    write_report,
)

# ------------------------------------------------------------------------------------------------
# The report's statistics on hand-made metrics files

SETTINGS = {"factor": 8, "n_samples": 32, "num_source_views": 4}
STEPS_BUDGET = {"kind": "steps", "label": "600 steps", "max_steps": 600, "max_time_s": None}
TIME_BUDGET = {"kind": "time", "label": "5 min wall time", "max_steps": 1000000, "max_time_s": 300.0}


def write_run(folder: Path, model: str, seed: int, psnr: float, budget: dict, steps: int, seconds: float, **extra):
    """A metrics.json as training or eval writes it; `extra` sets `scene` and any further top-level field
    (mode, init_from, seen_in_training, training_scenes)."""
    folder.mkdir(parents=True)
    document = {
        "scene": "fern",
        "model": model,
        "split": "test",
        "protocol": "standard",
        "lpips_net": "alex",
        "resolution": [378, 504],
        **SETTINGS,
        "global_step": steps,
        "seed": seed,
        "budget": budget,
        "training": {"wall_time_s": seconds, "steps": steps, "steps_per_s": steps / seconds, "stopped_by": "max_steps"},
        "test_time_s": 100.0 + seed,
        "mean": {"psnr": psnr, "ssim": psnr / 40.0, "lpips": 1.0 - psnr / 40.0},
        "baseline": {"method": "nearest_train_image", "psnr": 14.8, "ssim": 0.3, "lpips": 0.31},
        "per_image": [],
        **extra,
    }
    (folder / "metrics.json").write_text(json.dumps(document))


# PSNR per seed; Pola-GNT - GNT per seed: +0.5, +0.1, +0.3 (mean 0.3, std 0.2).
GNT_PSNR = {0: 19.5, 1: 20.1, 2: 19.8}
POLA_PSNR = {0: 20.0, 1: 20.2, 2: 20.1}


@pytest.fixture
def study_dir(tmp_path) -> Path:
    root = tmp_path / "multirun"
    for seed in (0, 1, 2):
        write_run(root / f"gnt_{seed}", "gnt", seed, GNT_PSNR[seed], STEPS_BUDGET, 600, 300.0)
        write_run(root / f"pola_{seed}", "pola_gnt", seed, POLA_PSNR[seed], STEPS_BUDGET, 600, 200.0)
        # The equal-time runs: other numbers; they must never be paired with (or averaged into) the above.
        write_run(root / f"gnt_time_{seed}", "gnt", seed, 25.0, TIME_BUDGET, 600, 300.0)
        write_run(root / f"pola_time_{seed}", "pola_gnt", seed, 30.0 + seed, TIME_BUDGET, 900, 300.0)
    write_run(root / "pola_time_3", "pola_gnt", 3, 33.0, TIME_BUDGET, 900, 300.0)  # no GNT partner
    return root


def test_report_groups_seeds_and_pairs_within_one_budget(study_dir, tmp_path, capsys):
    report = write_full_report([study_dir], tmp_path / "out")
    steps_condition = "600 steps; factor 8, 32 samples, 4 views"
    time_condition = "5 min wall time; factor 8, 32 samples, 4 views"

    groups = {(g.model, g.condition): g for g in report.groups}
    assert set(groups) == {(m, c) for m in ("gnt", "pola_gnt") for c in (steps_condition, time_condition)}
    gnt = groups["gnt", steps_condition]
    assert gnt.seeds == [0, 1, 2]
    assert gnt.metrics["psnr"].mean == pytest.approx(statistics.fmean(GNT_PSNR.values()))
    assert gnt.metrics["psnr"].std == pytest.approx(statistics.stdev(GNT_PSNR.values()))
    assert gnt.train_time_s == 300.0 and gnt.steps_per_s == 2.0 and gnt.steps == 600 and gnt.test_time_s == 101.0
    assert groups["pola_gnt", time_condition].seeds == [0, 1, 2, 3]

    differences = {d.condition: d for d in report.differences}
    assert set(differences) == {steps_condition, time_condition}
    steps = differences[steps_condition]
    assert steps.pairs == [("fern", 0), ("fern", 1), ("fern", 2)]
    psnr = steps.metrics["psnr"]
    half = student_t_quantile(0.975, 2) * 0.2 / math.sqrt(3)  # t_{0.975, 2} = 4.303
    assert psnr.mean == pytest.approx(0.3) and psnr.std == pytest.approx(0.2)
    assert (psnr.low, psnr.high) == (pytest.approx(0.3 - half), pytest.approx(0.3 + half))
    assert half == pytest.approx(0.4968, abs=1e-4)
    assert steps.metrics["lpips"].mean == pytest.approx(-0.3 / 40)  # lower LPIPS for the better model
    timed = differences[time_condition]
    assert timed.pairs == [("fern", 0), ("fern", 1), ("fern", 2)]  # seed 3 has no GNT partner
    assert timed.metrics["psnr"].mean == pytest.approx(6.0)

    err = capsys.readouterr().err
    assert "not paired: fern, 5 min wall time; factor 8, 32 samples, 4 views, seed 3 has no gnt run" in err

    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "## Seeded study" in markdown
    assert f"| fern | gnt | per-scene | {steps_condition} | 3 (0, 1, 2) | 19.80 ± 0.30 |" in markdown
    assert f"| fern | per-scene | {steps_condition} | 3 | +0.30 [−0.20, +0.80] |" in markdown
    run_line = (
        f"| fern | pola_gnt | per-scene | 3 | {time_condition} | 900 | max_steps | 300.0 | 3.000 | 103.0 | 33.00 |"
    )
    assert run_line in markdown
    assert "Fine-tuned vs from scratch" not in markdown  # no fine-tuned runs: nothing to pair
    # The main table's group means average within a condition only.
    assert "| **gnt** | **mean (1 scene)** | **19.80** |" in markdown

    with (tmp_path / "out" / "report_study.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    (row,) = [r for r in rows if r["kind"] == "difference" and r["condition"] == steps_condition]
    assert float(row["psnr_mean"]) == pytest.approx(0.3) and float(row["psnr_ci_low"]) == pytest.approx(0.3 - half)
    assert row["n"] == "3" and row["seeds"] == "fern:0 fern:1 fern:2"


def test_pooled_difference_over_scenes_and_older_files_without_seeds(tmp_path):
    root = tmp_path / "runs"
    for scene, offset in (("fern", 0.0), ("trex", 1.0)):
        for seed in (0, 1):
            write_run(root / f"{scene}_g{seed}", "gnt", seed, 20.0 + seed, STEPS_BUDGET, 600, 300.0, scene=scene)
            write_run(
                root / f"{scene}_p{seed}", "pola_gnt", seed, 20.0 + seed + offset, STEPS_BUDGET, 600, 300.0, scene=scene
            )
    old = root / "old" / "metrics.json"  # docs/interface.md's minimal format: no seed, budget or timings
    old.parent.mkdir()
    old.write_text(
        json.dumps(
            {
                "scene": "fern",
                "model": "gnt",
                "protocol": "standard",
                "lpips_net": "alex",
                "mean": {"psnr": 10.0, "ssim": 0.1, "lpips": None},
                "baseline": {"psnr": 9.0, "ssim": 0.1, "lpips": None},
            }
        )
    )
    report, notes = build_report([root])
    by_scene = {d.scene: d for d in report.differences}
    assert set(by_scene) == {"fern", "trex", "all 2 scenes"}
    assert by_scene["fern"].metrics["psnr"].mean == pytest.approx(0.0)
    assert by_scene["fern"].metrics["psnr"].std == pytest.approx(0.0)
    pooled = by_scene["all 2 scenes"]
    assert len(pooled.pairs) == 4 and pooled.metrics["psnr"].mean == pytest.approx(0.5)
    assert any("not paired (no seed" in note and str(old) in note for note in notes)
    (old_group,) = [g for g in report.groups if g.condition == "budget n/a"]
    assert old_group.seeds == [None] and old_group.metrics["lpips"] is None and old_group.train_time_s is None


# ------------------------------------------------------------------------------------------------
# Modes: zero-shot, fine-tuned and per-scene runs, and fine-tuned minus from scratch

FINETUNE_BUDGET = {"kind": "time", "label": "2 min wall time", "max_steps": 1000000, "max_time_s": 120.0}
FINETUNE_CONDITION = "2 min wall time; factor 8, 32 samples, 4 views"
ZERO_SHOT_CONDITION = "zero-shot; factor 8, 32 samples, 4 views"
PRETRAIN_SCENES = ["horns", "room", "trex"]
INIT_FROM = {
    "path": "pretrain/last.ckpt",
    "sha256": "ab" * 32,
    "global_step": 250000,
    "training_scenes": PRETRAIN_SCENES,
}
# PSNR per mode, model and seed on fern. Pola-GNT - GNT: per-scene +0.5, +0.2, +0.5 (mean 0.4), fine-tuned
# +1.0, +0.5, +1.2 (mean 0.9), zero-shot +0.5, +0.9 (mean 0.7). Fine-tuned - per-scene: GNT +2.0, +2.5,
# +2.1 (mean 2.2), Pola-GNT +2.5, +2.8, +2.8 (mean 2.7).
MODE_PSNR = {
    "per-scene": {"gnt": {0: 20.0, 1: 20.4, 2: 20.2}, "pola_gnt": {0: 20.5, 1: 20.6, 2: 20.7}},
    "fine-tuned": {"gnt": {0: 22.0, 1: 22.9, 2: 22.3}, "pola_gnt": {0: 23.0, 1: 23.4, 2: 23.5}},
    "zero-shot": {"gnt": {0: 18.0, 1: 18.2}, "pola_gnt": {0: 18.5, 1: 19.1}},
}


def write_mode_runs(root: Path, scene: str, psnrs: dict, scratch_budget: dict = FINETUNE_BUDGET) -> None:
    """Runs of each mode as the new metrics.json spells them: per-scene in the old format (no mode fields),
    fine-tuned and zero-shot GNT with the mode derived from init_from / seen_in_training, Pola-GNT with it
    given. The per-scene runs had `scratch_budget` (by default the fine-tuning's: their pairs); the
    zero-shot checkpoints had different pretraining budgets (steps vs time)."""
    for mode, per_model in psnrs.items():
        for model, per_seed in per_model.items():
            for seed, psnr in per_seed.items():
                folder = root / f"{scene}_{mode}_{model}_{seed}"
                extra: dict = {"scene": scene}
                if model == "pola_gnt":
                    extra["mode"] = mode
                if mode == "per-scene":
                    write_run(folder, model, seed, psnr, scratch_budget, 400, 120.0, **extra)
                elif mode == "fine-tuned":
                    extra |= {"init_from": INIT_FROM, "seen_in_training": True}
                    extra["training_scenes"] = [*PRETRAIN_SCENES, scene]
                    write_run(folder, model, seed, psnr, FINETUNE_BUDGET, 400, 120.0, **extra)
                else:
                    extra |= {"init_from": None, "seen_in_training": False, "training_scenes": PRETRAIN_SCENES}
                    budget = STEPS_BUDGET if model == "gnt" else TIME_BUDGET
                    write_run(folder, model, seed, psnr, budget, 250000 if model == "gnt" else 180000, 9e4, **extra)


@pytest.fixture
def modes_dir(tmp_path) -> Path:
    root = tmp_path / "modes"
    write_mode_runs(root, "fern", MODE_PSNR)
    return root


def test_modes_are_never_pooled_and_pola_gnt_pairs_stay_within_a_mode(modes_dir, tmp_path, capsys):
    report = write_full_report([modes_dir], tmp_path / "out")
    assert "not paired" not in capsys.readouterr().err

    # The main table: one group per (model, mode), each mean over its own mode's runs only.
    means = {(r.model, r.mode): r for r in report.rows if r.kind == "mean"}
    assert set(means) == {(model, mode) for model in ("gnt", "pola_gnt") for mode in MODE_PSNR}
    for (model, mode), mean in means.items():
        assert mean.scores["psnr"] == pytest.approx(statistics.fmean(MODE_PSNR[mode][model].values()))
        assert mean.n_seeds == len(MODE_PSNR[mode][model])
    conditions = {mode: {r.condition for r in report.rows if r.kind == "run" and r.mode == mode} for mode in MODE_PSNR}
    assert conditions == {
        "per-scene": {FINETUNE_CONDITION},
        "fine-tuned": {FINETUNE_CONDITION},
        "zero-shot": {ZERO_SHOT_CONDITION},  # not its checkpoint's pretraining budget (steps or time)
    }

    # The study: one group per (model, mode), the zero-shot steps the checkpoint's.
    groups = {(g.model, g.mode): g for g in report.groups}
    assert set(groups) == set(means)
    assert groups["gnt", "zero-shot"].condition == ZERO_SHOT_CONDITION and groups["gnt", "zero-shot"].steps == 250000
    assert groups["pola_gnt", "fine-tuned"].metrics["psnr"].mean == pytest.approx(23.3)

    # Pola-GNT - GNT: one difference per mode, each from its own mode's runs.
    differences = {d.mode: d for d in report.differences}
    assert set(differences) == set(MODE_PSNR)
    assert all(d.comparison == MODEL_COMPARISON and d.scene == "fern" for d in report.differences)
    expected = {"per-scene": [0.5, 0.2, 0.5], "fine-tuned": [1.0, 0.5, 1.2], "zero-shot": [0.5, 0.9]}
    for mode, values in expected.items():
        psnr = differences[mode].metrics["psnr"]
        assert differences[mode].pairs == [("fern", seed) for seed in range(len(values))]
        assert psnr.mean == pytest.approx(statistics.fmean(values)) and psnr.std == pytest.approx(
            statistics.stdev(values)
        )
    assert differences["zero-shot"].metrics["psnr"].mean == pytest.approx(0.7)
    assert differences["fine-tuned"].metrics["psnr"].mean == pytest.approx(0.9)
    assert differences["zero-shot"].condition == ZERO_SHOT_CONDITION

    markdown = (tmp_path / "out" / "report.md").read_text()
    assert f"| fern | zero-shot | {ZERO_SHOT_CONDITION} | 2 | +0.70 [−1.84, +3.24] |" in markdown
    assert f"| fern | fine-tuned | {FINETUNE_CONDITION} | 3 | +0.90 [+0.00, +1.80] |" in markdown
    assert f"| fern | pola_gnt | zero-shot | {ZERO_SHOT_CONDITION} | 2 (0, 1) | 18.80 ± 0.42 | " in markdown
    assert f"| **1 run** | **zero-shot** | **{ZERO_SHOT_CONDITION}** |" not in markdown  # two seeds: "2 runs"
    assert f"| **2 runs** | **zero-shot** | **{ZERO_SHOT_CONDITION}** |" in markdown
    with (tmp_path / "out" / "report.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {(r["model"], r["mode"]) for r in rows if r["kind"] == "mean"} == set(means)
    assert {r["mode"] for r in rows if r["kind"] == "reference"} == {""}
    assert model_label("pola_gnt", "zero-shot") == "pola_gnt (zero-shot)" and model_label("gnt", "per-scene") == "gnt"


def test_fine_tuned_minus_scratch_on_a_hand_made_example(modes_dir, tmp_path):
    report = write_full_report([modes_dir], tmp_path / "out")
    scratch = {d.model: d for d in report.scratch_differences}
    assert set(scratch) == {"gnt", "pola_gnt"}  # zero-shot runs are not part of it
    gnt = scratch["gnt"]
    assert (gnt.comparison, gnt.mode, gnt.scene, gnt.condition) == (
        SCRATCH_COMPARISON,
        SCRATCH_COMPARISON,
        "fern",
        FINETUNE_CONDITION,
    )
    assert gnt.pairs == [("fern", 0), ("fern", 1), ("fern", 2)]
    # GNT: 22.0 - 20.0, 22.9 - 20.4, 22.3 - 20.2 = 2.0, 2.5, 2.1: mean 2.2, std sqrt(0.14 / 2) = 0.2646,
    # half-width t_{0.975, 2} * std / sqrt(3) = 4.3027 * 0.1528 = 0.6572.
    psnr = gnt.metrics["psnr"]
    assert psnr.mean == pytest.approx(2.2) and psnr.std == pytest.approx(math.sqrt(0.07))
    assert (psnr.low, psnr.high) == (pytest.approx(1.542759, abs=1e-6), pytest.approx(2.857241, abs=1e-6))
    assert gnt.metrics["lpips"].mean == pytest.approx(-2.2 / 40)
    pola = scratch["pola_gnt"].metrics["psnr"]  # 2.5, 2.8, 2.8: mean 2.7, std 0.1732, half-width 0.4303
    assert (pola.mean, pola.low, pola.high) == (pytest.approx(2.7), pytest.approx(2.269735), pytest.approx(3.130265))

    markdown = (tmp_path / "out" / "report.md").read_text()
    section = markdown.split("### Fine-tuned vs from scratch", 1)[1].split("### Runs", 1)[0]
    assert f"| gnt | fern | {FINETUNE_CONDITION} | 3 | +2.20 [+1.54, +2.86] |" in section
    assert f"| pola_gnt | fern | {FINETUNE_CONDITION} | 3 | +2.70 [+2.27, +3.13] |" in section
    with (tmp_path / "out" / "report_study.csv").open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["kind"] == "difference"]
    assert [r["comparison"] for r in rows] == [MODEL_COMPARISON] * 3 + [SCRATCH_COMPARISON] * 2
    (row,) = [r for r in rows if r["comparison"] == SCRATCH_COMPARISON and r["model"] == "gnt"]
    assert row["mode"] == SCRATCH_COMPARISON and row["n"] == "3" and row["seeds"] == "fern:0 fern:1 fern:2"
    assert float(row["psnr_mean"]) == pytest.approx(2.2) and float(row["psnr_ci_low"]) == pytest.approx(1.542759)
    assert {r["mode"] for r in rows if r["comparison"] == MODEL_COMPARISON} == set(MODE_PSNR)


def test_fine_tuned_vs_scratch_needs_the_same_budget_and_says_when_pairs_are_missing(tmp_path, capsys):
    root = tmp_path / "runs"
    # The per-scene runs had 600 steps, the fine-tuned ones 2 minutes: different conditions, no pairs.
    psnrs = {m: {"gnt": MODE_PSNR[m]["gnt"]} for m in ("per-scene", "fine-tuned")}
    write_mode_runs(root, "fern", psnrs, scratch_budget=STEPS_BUDGET)
    report, _ = build_report([root])
    assert report.scratch_differences == []
    markdown = "\n".join(report.study_lines)
    assert "### Fine-tuned vs from scratch" in markdown
    assert "No pairs: no scene, model and condition has both a fine-tuned and a per-scene run" in markdown
    # A from-scratch run with the fine-tuning's budget, one seed: one pair, no interval; a note per
    # fine-tuned seed without a partner.
    write_run(root / "scratch_2min", "gnt", 1, 20.0, FINETUNE_BUDGET, 300, 120.0)
    report = write_full_report([root], tmp_path / "out")
    (difference,) = report.scratch_differences
    assert difference.pairs == [("fern", 1)] and difference.metrics["psnr"].mean == pytest.approx(2.9)
    assert difference.metrics["psnr"].low is None
    assert f"| gnt | fern | {FINETUNE_CONDITION} | 1 | +2.90 [n/a: one pair] |" in "\n".join(report.study_lines)
    err = capsys.readouterr().err
    assert f"not paired: fern, gnt, {FINETUNE_CONDITION}, seed 0 has no per-scene run" in err
    assert f"not paired: fern, gnt, {FINETUNE_CONDITION}, seed 2 has no per-scene run" in err
    assert "has no fine-tuned run" not in err  # the 600-step per-scene runs have no fine-tuned counterpart


def test_pooled_fine_tuned_minus_scratch_over_scenes(tmp_path):
    root = tmp_path / "runs"
    for scene, offset in (("fern", 0.0), ("trex", 1.0)):
        for seed in (0, 1):
            write_run(root / f"{scene}_s{seed}", "gnt", seed, 20.0, FINETUNE_BUDGET, 300, 120.0, scene=scene)
            ft = {"scene": scene, "init_from": INIT_FROM}
            write_run(root / f"{scene}_f{seed}", "gnt", seed, 21.0 + offset + seed, FINETUNE_BUDGET, 300, 120.0, **ft)
    report, notes = build_report([root])
    by_scene = {d.scene: d for d in report.scratch_differences}
    assert set(by_scene) == {"fern", "trex", "all 2 scenes"}
    pooled = by_scene["all 2 scenes"].metrics["psnr"]  # 1, 2, 2, 3
    assert len(by_scene["all 2 scenes"].pairs) == 4 and pooled.mean == pytest.approx(2.0)
    assert pooled.std == pytest.approx(statistics.stdev([1.0, 2.0, 2.0, 3.0]))
    assert report.differences == []
    assert not any("per-scene run" in note or "fine-tuned run" in note for note in notes)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mode", "few-shot"),
        ("mode", 3),
        ("init_from", "last.ckpt"),
        ("seen_in_training", "yes"),
        ("training_scenes", "fern"),
    ],
)
def test_invalid_mode_fields_are_one_user_error(tmp_path, field, value):
    write_run(tmp_path / "run", "gnt", 0, 20.0, STEPS_BUDGET, 600, 300.0, **{field: value})
    path = tmp_path / "run" / "metrics.json"
    with pytest.raises(UserError) as error:
        build_report([tmp_path])
    message = str(error.value)
    assert str(path) in message and f"{field}:" in message and "\n" not in message


def test_mode_is_read_or_derived_and_older_files_are_per_scene(tmp_path):
    old = tmp_path / "old" / "metrics.json"
    _write_metrics(old, "fern", "gnt", 20.0)  # docs/interface.md's format, without any of the fields
    assert load_run(old).mode == "per-scene"
    cases = {
        "given": ({"mode": "zero-shot", "seen_in_training": True}, "zero-shot"),  # given wins
        "init": ({"init_from": INIT_FROM, "seen_in_training": True}, "fine-tuned"),
        "unseen": ({"init_from": None, "seen_in_training": False}, "zero-shot"),
        "seen": ({"init_from": None, "seen_in_training": True, "mode": None}, "per-scene"),
    }
    for name, (fields, mode) in cases.items():
        write_run(tmp_path / name, "gnt", 0, 20.0, STEPS_BUDGET, 600, 300.0, **fields)
        row = load_run(tmp_path / name / "metrics.json")
        assert row.mode == mode, name
        assert mode in row.key
        assert row.condition.startswith("zero-shot;" if mode == "zero-shot" else "600 steps;")


# ------------------------------------------------------------------------------------------------
# Reading runs and the main table


def test_malformed_or_missing_metrics_are_user_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no metrics.json found"):
        find_metrics_files([tmp_path / "empty"])
    broken = tmp_path / "broken" / "metrics.json"
    broken.parent.mkdir()
    broken.write_text('{"scene": "fern", "model": "gnt"')
    with pytest.raises(UserError, match="malformed metrics.json"):
        load_run(broken)
    broken.write_text(
        json.dumps(
            {
                "scene": "fern",
                "model": "gnt",
                "protocol": "gnt",
                "lpips_net": "vgg",
                "mean": {"psnr": "high", "ssim": 0.8, "lpips": None},
                "baseline": {},
            }
        )
    )
    with pytest.raises(UserError, match="mean.psnr"):
        load_run(broken)


def _write_metrics(
    path: Path,
    scene: str,
    model: str,
    psnr: float,
    protocol: str = "gnt",
    lpips_net: str = "vgg",
    mtime: float | None = None,
    per_image: list[dict] | None = None,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    scores = {"psnr": psnr, "ssim": 0.5 + psnr / 100, "lpips": 0.3 - psnr / 200}
    path.write_text(
        json.dumps(
            {
                "scene": scene,
                "model": model,
                "split": "test",
                "protocol": protocol,
                "lpips_net": lpips_net,
                "resolution": [378, 504],
                "mean": scores,
                "baseline": {"method": "nearest_train_image", "psnr": 15.0, "ssim": 0.4, "lpips": None},
                "per_image": per_image or [],
            }
        )
    )
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def test_eight_scene_mean_duplicates_and_mixed_protocols(tmp_path, capsys):
    runs = tmp_path / "runs"
    psnrs = {scene: 24.0 + i for i, scene in enumerate(LLFF_SCENES)}
    for scene, psnr in psnrs.items():
        _write_metrics(runs / scene / "pola_gnt" / "new" / "metrics.json", scene, "pola_gnt", psnr, mtime=2e9)
    # An older run of the same (scene, model, protocol, LPIPS net): must be ignored.
    _write_metrics(runs / "fern" / "pola_gnt" / "old" / "metrics.json", "fern", "pola_gnt", 10.0, mtime=1e9)
    # Another protocol for one scene: its own group, and a warning.
    _write_metrics(
        runs / "fern" / "gnt" / "std" / "metrics.json", "fern", "gnt", 20.0, protocol="standard", lpips_net="alex"
    )

    rows = write_report([runs], tmp_path / "out")

    pola_runs = [r for r in rows if r.kind == "run" and r.model == "pola_gnt"]
    assert [r.scene for r in pola_runs] == list(LLFF_SCENES)
    assert next(r for r in pola_runs if r.scene == "fern").scores["psnr"] == psnrs["fern"]
    (pola_mean,) = [r for r in rows if r.kind == "mean" and r.model == "pola_gnt"]
    assert pola_mean.scene == "LLFF 8-scene mean" and pola_mean.n_scenes == 8
    assert pola_mean.scores["psnr"] == pytest.approx(statistics.fmean(psnrs.values()))
    assert pola_mean.baseline["lpips"] is None  # a missing value is never averaged over fewer scenes
    (gnt_mean,) = [r for r in rows if r.kind == "mean" and r.model == "gnt"]
    assert gnt_mean.scene == "mean (1 scene)" and gnt_mean.protocol == "standard"

    stderr = capsys.readouterr().err
    assert stderr.count("warning:") == 1 and "protocols (gnt, standard)" in stderr
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "old/metrics.json" in markdown and "(newest)" in markdown
    assert "| **pola_gnt** | **LLFF 8-scene mean** | **27.50** |" in markdown
    assert "| gnt | fern | 20.00 |" in markdown and "| standard | alex |" in markdown


# ------------------------------------------------------------------------------------------------
# A real multirun (2 models x 1 seed, a few steps on the demo scene) that the report reads


def test_multirun_trains_every_model_and_the_report_pairs_them(tmp_path, tiny_runs):
    """`python -m pola_gnt.train -m` over both models (the command's `main`, in this process; the
    train command's child-process tests are in test_reliability.py), read by the report."""
    sweep = tmp_path / "sweep"
    result = run_in_process(
        "train", "-m", "model=gnt,pola_gnt", "seed=0", *TINY_RUN_OVERRIDES, f"hydra.sweep.dir={sweep}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for model in ("gnt", "pola_gnt"):
        (metrics_file,) = (sweep / "demo" / model).glob("seed0_job*/metrics.json")
        document = read_metrics(metrics_file)
        assert document["seed"] == 0 and document["global_step"] == 6
        assert document["budget"] == {"kind": "steps", "label": "6 steps", "max_steps": 6, "max_time_s": None}
        training = document["training"]
        assert training["steps"] == 6 and training["stopped_by"] == "max_steps" and training["wall_time_s"] > 0
        assert training["steps_per_s"] == pytest.approx(6 / training["wall_time_s"])
        assert document["test_time_s"] > 0
        # A multirun job is the same run as a single run with the same overrides (tiny_runs).
        single = read_metrics(tiny_runs[model])
        assert document["mean"] == single["mean"] and document["per_image"] == single["per_image"]

    out = tmp_path / "report"
    result = run_in_process("report", str(sweep), "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    with (out / "report_study.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    (difference,) = [r for r in rows if r["kind"] == "difference"]
    assert difference["n"] == "1" and difference["seeds"] == "demo:0" and difference["psnr_ci_low"] == ""
    expected = read_metrics(tiny_runs["pola_gnt"])["mean"]["psnr"] - read_metrics(tiny_runs["gnt"])["mean"]["psnr"]
    assert float(difference["psnr_mean"]) == pytest.approx(expected)
    assert "### pola_gnt − gnt, paired by scene and seed" in result.stdout


def test_multi_scene_means_both_ways_pooled_images_and_scene_means(tmp_path):
    """GNT's eval.py averaged every image of every scene: a scene with more test views weighs more.
    The report gives that pooled mean and the mean of scene means, each labelled."""
    runs = tmp_path / "runs"
    for scene, psnr, images in (("fern", 20.0, 3), ("room", 30.0, 6)):
        per_image = [{"index": i, "name": f"{i}.png", "psnr": psnr} for i in range(images)]
        _write_metrics(runs / scene / "gnt" / "metrics.json", scene, "gnt", psnr, per_image=per_image)
    rows = write_report([runs], tmp_path / "out")
    (mean,) = [r for r in rows if r.kind == "mean"]
    (pooled,) = [r for r in rows if r.kind == "pooled"]
    assert mean.scores["psnr"] == pytest.approx(25.0) and mean.scene == "mean (2 scenes)"
    assert pooled.scores["psnr"] == pytest.approx((3 * 20.0 + 6 * 30.0) / 9)
    assert pooled.scene == "pooled: 9 images of 2 scenes" and pooled.n_images == 9
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "pooled: 9 images of 2 scenes" in markdown and "mean (2 scenes)" in markdown
    assert "kind" in (tmp_path / "out" / "report.csv").read_text().splitlines()[0]
    assert any(line.startswith("pooled,") for line in (tmp_path / "out" / "report.csv").read_text().splitlines())
