"""Seeded study: training budgets (steps / wall time), the t statistics, the report's grouping over
seeds and its paired Pola-GNT - GNT difference, and one real multirun that the report reads."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
from helpers import TINY_OVERRIDES
from helpers import run_in_process, run_module
from omegaconf import OmegaConf

from pola_gnt.core.errors import UserError
from pola_gnt.evaluation.stats import student_t_cdf, student_t_quantile, summarize
from pola_gnt.report import build_report, write_full_report
from pola_gnt.runs.budget import budget_document, max_time_seconds, training_document

# Two-sided 95% quantiles t_{0.975, df} (standard tables, 10 digits).
T_975 = {3: 3.182446305, 4: 2.776445105, 5: 2.570581836, 10: 2.228138852, 30: 2.042272456}


# ------------------------------------------------------------------------------------------------
# Student t


@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995, 0.025])
def test_t_quantile_matches_the_closed_forms_for_one_and_two_degrees_of_freedom(p):
    assert student_t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)
    assert student_t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)


@pytest.mark.parametrize("t", [-40.0, -2.0, -1e-5, 0.0, 0.3, 1.0, 7.5])
def test_t_cdf_matches_the_closed_forms(t):
    assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-15)
    assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-15)


def test_t_quantile_matches_tables_and_the_normal_limit():
    for df, expected in T_975.items():
        assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=1e-9)
    assert student_t_quantile(0.975, 1e7) == pytest.approx(1.959963985, abs=1e-6)


def test_t_quantile_agrees_with_scipy_where_installed():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 7, 12.5, 100):
        for p in (0.55, 0.8, 0.975, 0.999):
            assert student_t_quantile(p, df) == pytest.approx(float(stats.t.ppf(p, df)), rel=1e-10)


def test_summary_by_hand():
    summary = summarize([1.0, 2.0, 3.0, 4.0])
    std = math.sqrt(5 / 3)
    half = T_975[3] * std / 2.0
    assert (summary.n, summary.mean, summary.std) == (4, 2.5, pytest.approx(std))
    assert summary.low == pytest.approx(2.5 - half, abs=1e-8) and summary.high == pytest.approx(2.5 + half, abs=1e-8)
    single = summarize([7.0])
    assert single.mean == 7.0 and single.std is None and single.low is None


# ------------------------------------------------------------------------------------------------
# Budgets


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
    steps = budget_document(OmegaConf.create({"trainer": {"max_steps": 600, "max_time": None}}))
    assert steps == {"kind": "steps", "label": "600 steps", "max_steps": 600, "max_time_s": None}
    timed = budget_document(OmegaConf.create({"trainer": {"max_steps": 10**6, "max_time": "00:00:05:00"}}))
    assert timed["kind"] == "time" and timed["label"] == "5 min wall time" and timed["max_time_s"] == 300.0
    assert training_document(steps, 600, 240.0) == {
        "wall_time_s": 240.0,
        "steps": 600,
        "steps_per_s": 2.5,
        "stopped_by": "max_steps",
    }
    assert training_document(timed, 712, 300.4)["stopped_by"] == "max_time"
    assert training_document(steps, 300, 120.0)["stopped_by"] is None  # a checkpoint from mid-run


# ------------------------------------------------------------------------------------------------
# The report's statistics on hand-made metrics files

SETTINGS = {"factor": 8, "n_samples": 32, "num_source_views": 4}
STEPS_BUDGET = {"kind": "steps", "label": "600 steps", "max_steps": 600, "max_time_s": None}
TIME_BUDGET = {"kind": "time", "label": "5 min wall time", "max_steps": 1000000, "max_time_s": 300.0}


def write_run(folder: Path, model: str, seed: int, psnr: float, budget: dict, steps: int, seconds: float, **extra):
    folder.mkdir(parents=True)
    document = {
        "scene": extra.get("scene", "fern"),
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
    assert f"| fern | gnt | {steps_condition} | 3 (0, 1, 2) | 19.80 ± 0.30 |" in markdown
    assert f"| fern | {steps_condition} | 3 | +0.30 [−0.20, +0.80] |" in markdown
    assert f"| fern | pola_gnt | 3 | {time_condition} | 900 | max_steps | 300.0 | 3.000 | 103.0 | 33.00 |" in markdown
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
    old = root / "old" / "metrics.json"  # interface.md's minimal format: no seed, budget or timings
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
# A real multirun (2 models x 1 seed, a few steps on the demo scene) that the report reads


def test_multirun_trains_every_model_and_the_report_pairs_them(tmp_path, tiny_runs):
    sweep = tmp_path / "sweep"
    result = run_module(
        "train",
        "-m",
        "model=gnt,pola_gnt",
        "seed=0",
        *TINY_OVERRIDES,
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for model in ("gnt", "pola_gnt"):
        (metrics_file,) = (sweep / "demo" / model).glob("seed0_job*/metrics.json")
        document = json.loads(metrics_file.read_text())
        assert document["seed"] == 0 and document["global_step"] == 6
        assert document["budget"] == {"kind": "steps", "label": "6 steps", "max_steps": 6, "max_time_s": None}
        training = document["training"]
        assert training["steps"] == 6 and training["stopped_by"] == "max_steps" and training["wall_time_s"] > 0
        assert training["steps_per_s"] == pytest.approx(6 / training["wall_time_s"])
        assert document["test_time_s"] > 0
        # A multirun job is the same run as a single run with the same overrides (tiny_runs).
        single = json.loads((tiny_runs[model] / "metrics.json").read_text())
        assert document["mean"] == single["mean"] and document["per_image"] == single["per_image"]

    out = tmp_path / "report"
    result = run_in_process("report", str(sweep), "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    with (out / "report_study.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    (difference,) = [r for r in rows if r["kind"] == "difference"]
    assert difference["n"] == "1" and difference["seeds"] == "demo:0" and difference["psnr_ci_low"] == ""
    expected = (
        json.loads((tiny_runs["pola_gnt"] / "metrics.json").read_text())["mean"]["psnr"]
        - json.loads((tiny_runs["gnt"] / "metrics.json").read_text())["mean"]["psnr"]
    )
    assert float(difference["psnr_mean"]) == pytest.approx(expected)
    assert "### pola_gnt − gnt, paired by scene and seed" in result.stdout


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
    document = json.loads((tmp_path / "metrics.json").read_text())
    assert document["budget"]["kind"] == "time" and document["budget"]["label"] == "2 s wall time"
    training = document["training"]
    assert training["stopped_by"] == "max_time" and 2.0 <= training["wall_time_s"] < 60
    assert 1 <= training["steps"] == document["global_step"] < 100000
