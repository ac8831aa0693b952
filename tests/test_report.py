"""`python -m pola_gnt.report`: the multi-run table, CSV and charts from the command line, runs of several
modes side by side, bad input as one error line (the library behind it, `pola_gnt.evaluation.study`, is
tests/test_study.py's)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import imageio.v3 as iio
import pytest
from helpers import CommandResult, assert_one_error_line, read_metrics, run_module

from pola_gnt.evaluation.study import METRICS
from pola_gnt.report import main as report_main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _csv_value(cell: str) -> float | None:
    return None if cell == "" else float(cell)


def _read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    image = iio.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_report_of_tiny_runs_matches_their_metrics(tiny_runs, tmp_path):
    out = tmp_path / "report"
    result = run_module("report", str(tiny_runs["gnt"]), str(tiny_runs["pola_gnt"]), "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]

    rows = _read_csv(out / "report.csv")
    markdown = (out / "report.md").read_text()
    for model, run_dir in tiny_runs.items():
        document = read_metrics(run_dir)
        (row,) = [r for r in rows if r["kind"] == "run" and r["model"] == model]
        assert (row["scene"], row["protocol"], row["lpips_net"]) == (
            document["scene"],
            document["protocol"],
            document["lpips_net"],
        )
        for metric in METRICS:
            assert _csv_value(row[metric]) == document["mean"][metric]
            assert _csv_value(row[f"baseline_{metric}"]) == document["baseline"][metric]
        # One scene per model: the group mean is that scene's numbers, labelled as such.
        (mean,) = [r for r in rows if r["kind"] == "mean" and r["model"] == model]
        assert mean["scene"] == "mean (1 scene)"
        assert _csv_value(mean["psnr"]) == document["mean"]["psnr"]
        table_line = next(
            line for line in markdown.splitlines() if line.startswith(f"| {model} | {document['scene']} |")
        )
        assert f"| {document['mean']['psnr']:.2f} | {document['mean']['ssim']:.4f} |" in table_line
        lpips = document["mean"]["lpips"]
        assert (f"| {lpips:.4f} |" if lpips is not None else "| n/a |") in table_line

    references = {r["model"]: r for r in rows if r["kind"] == "reference"}
    assert float(references["GNT (paper, commonly quoted)"]["psnr"]) == 27.24
    assert float(references["Pola-GNT (reproduction)"]["lpips"]) == 0.1009
    assert "| GNT (reproduction) | LLFF 8-scene mean | 27.25 | 0.8868 | 0.1019 |" in markdown
    assert "comparable with them only if the protocol matches" in markdown
    for metric in METRICS:
        _assert_png(out / f"report_{metric}.png")


def test_report_bad_path_is_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path / "missing_run"), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert_one_error_line(CommandResult(exit_info.value.code, captured.out, captured.err), "missing_run")
    assert not (tmp_path / "out").exists()


def _write_run(folder: Path, model: str, seed: int, psnr: float, **fields) -> None:
    """A hand-made metrics.json with a 2-minute budget; `fields` adds the mode fields (or a bad one)."""
    folder.mkdir(parents=True)
    document = {
        "scene": "fern",
        "model": model,
        "protocol": "standard",
        "lpips_net": "alex",
        "seed": seed,
        "budget": {"kind": "time", "label": "2 min wall time", "max_steps": 1000000, "max_time_s": 120.0},
        "mean": {"psnr": psnr, "ssim": 0.5, "lpips": 0.4},
        "baseline": {"psnr": 14.0, "ssim": 0.3, "lpips": 0.5},
        **fields,
    }
    (folder / "metrics.json").write_text(json.dumps(document))


def test_report_keeps_modes_apart_and_prints_fine_tuned_vs_scratch(tmp_path, capsys):
    init = {"path": "pretrain/last.ckpt", "sha256": "0" * 64, "global_step": 5000, "training_scenes": ["trex"]}
    for seed, (scratch, tuned, zero_shot) in enumerate([(20.0, 21.0, 17.0), (20.5, 22.5, 17.5)]):
        _write_run(tmp_path / "runs" / f"scratch{seed}", "pola_gnt", seed, scratch)  # no mode fields: per-scene
        _write_run(tmp_path / "runs" / f"tuned{seed}", "pola_gnt", seed, tuned, init_from=init, seen_in_training=True)
        _write_run(tmp_path / "runs" / f"zero{seed}", "pola_gnt", seed, zero_shot, seen_in_training=False)
    out = tmp_path / "out"
    report_main([str(tmp_path / "runs"), "--out", str(out)])
    stdout = capsys.readouterr().out

    # Three groups, three means: nothing pooled across modes.
    means = {r["mode"]: _csv_value(r["psnr"]) for r in _read_csv(out / "report.csv") if r["kind"] == "mean"}
    assert means == {"per-scene": 20.25, "fine-tuned": 21.75, "zero-shot": 17.25}
    assert "| **pola_gnt** | **mean (1 scene)** | **17.25** |" in stdout
    assert "| **2 runs** | **zero-shot** | **zero-shot** |" in stdout  # no budget on the scene
    # Fine-tuned - scratch: +1.0 and +2.0, mean +1.5, std 0.7071, t_{0.975, 1} = 12.706: 1.5 ± 6.353.
    assert "### Fine-tuned vs from scratch" in stdout
    assert "| pola_gnt | fern | 2 min wall time | 2 | +1.50 [−4.85, +7.85] |" in stdout
    (difference,) = [r for r in _read_csv(out / "report_study.csv") if r["kind"] == "difference"]
    assert (difference["comparison"], difference["model"], difference["mode"]) == (
        "fine-tuned - per-scene",
        "pola_gnt",
        "fine-tuned - per-scene",
    )
    assert _csv_value(difference["psnr_mean"]) == pytest.approx(1.5)
    assert _csv_value(difference["psnr_ci_high"]) == pytest.approx(7.853102, abs=1e-6)


def test_report_unknown_mode_is_one_error_line(tmp_path, capsys):
    _write_run(tmp_path / "runs" / "bad", "gnt", 0, 20.0, mode="few-shot")
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert_one_error_line(CommandResult(exit_info.value.code, captured.out, captured.err), "few-shot")
    assert str(tmp_path / "runs" / "bad" / "metrics.json") in captured.err
    assert not (tmp_path / "out").exists()
