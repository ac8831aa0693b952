"""Seeded study (`pola_gnt.evaluation.study`, the library behind `python -m pola_gnt.report`): reading
run folders, the report's tables, its grouping over seeds and its paired Pola-GNT - GNT difference,
and one real multirun that the report reads. The t statistics are tests/test_stats.py's, the
budgets tests/test_budget.py's, the command line tests/test_report.py's."""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from pathlib import Path

import pytest
from helpers import TINY_OVERRIDES, run_in_process, run_module

from pola_gnt.core.errors import UserError
from pola_gnt.evaluation.stats import student_t_quantile
from pola_gnt.evaluation.study import (
    LLFF_SCENES,
    build_report,
    find_metrics_files,
    load_run,
    write_full_report,
    write_report,
)

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
                "per_image": [],
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
