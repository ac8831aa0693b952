"""`python -m pola_gnt.report`: the multi-run table, CSV and charts."""

from __future__ import annotations

import csv
import json
import os
import statistics
from pathlib import Path

import imageio.v3 as iio
import pytest
from helpers import CommandResult, assert_one_error_line, run_module

from pola_gnt.core.errors import UserError
from pola_gnt.report import LLFF_SCENES, METRICS, find_metrics_files, load_run, write_report
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
