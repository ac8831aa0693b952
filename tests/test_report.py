"""`python -m pola_gnt.report`: the multi-run table, CSV and charts, from the command line (the library
behind it, `pola_gnt.evaluation.study`, is tests/test_study.py's)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import imageio.v3 as iio
import pytest
from helpers import CommandResult, assert_one_error_line, run_module

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
        document = json.loads((run_dir / "metrics.json").read_text())
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
