"""`scripts/gpu_checks.py`, the one call that runs every GPU check: its dry run (every part on the CPU at
toy sizes) runs each part's real command and writes a `summary.json` whose figures fit together, so
the script cannot rot between the GPU hours it is written for; bad input is one error line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import assert_one_error_line

from pola_gnt.core.paths import PROJECT_ROOT
from pola_gnt.runs.config.app import compose_config
from pola_gnt.runs.config.read import read_run_settings

SCRIPT = str(PROJECT_ROOT / "scripts" / "gpu_checks.py")


def run_script(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SCRIPT, *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow  # every part at toy sizes: 45-90 s of a 2-core CPU
def test_dry_run_runs_every_part_and_its_figures_fit_together(tmp_path):
    pytest.importorskip("triton", reason="the attention benchmark's and the tests' Triton imports")
    result = run_script(str(tmp_path), "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    parts = summary["parts"]
    assert summary["dry_run"] and list(parts) == ["tests", "attention", "render", "standard", "eval"]
    assert all(entry["status"] == "ok" for entry in parts.values()), parts

    # tests: the gpu tests of the two files, collected and skipped without CUDA (counted from pytest's report).
    assert parts["tests"]["passed"] == parts["tests"]["failed"] == 0 and parts["tests"]["skipped"] >= 2
    # attention: both implementations at the toy length, forward and forward + backward.
    rows = parts["attention"]["rows"]
    assert set(rows) == {"pola@256", "softmax@256"}
    assert all(0 < row["fwd_ms"] and 0 < row["fwd_bwd_ms"] for row in rows.values())
    # render: both models in fp32 and bf16, as the benchmark's JSON has them.
    for precision in ("fp32", "bf16"):
        bench = {row["model"]: row for row in json.loads((tmp_path / f"bench_render_{precision}.json").read_text())}
        assert parts["render"][precision] == {
            model: {key: bench[model][key] for key in ("render_rays_per_s", "train_rays_per_s", "peak_mem_mb")}
            for model in ("gnt", "pola_gnt")
        }
    # standard: both models trained their 2 toy steps; the worker timed the second; the extrapolation
    # is the preset's steps at that rate, and paper's step scaled by rays and the render part's fp32 / bf16 ratio.
    standard = parts["standard"]
    presets = {
        name: read_run_settings(compose_config(f"experiment={name}", "trainer=cpu")) for name in ("standard", "paper")
    }
    rays = {name: s.data.targets_per_step * s.data.rays_per_step for name, s in presets.items()}
    for model in ("gnt", "pola_gnt"):
        row = standard[model]
        assert row["status"] == "ok" and row["steps_per_s"] > 0 and row["peak_memory_mb"] > 100, row
        metrics = json.loads((tmp_path / f"standard_{model}" / "metrics.json").read_text())
        assert metrics["training"]["steps"] == 2 and row["test_psnr"] == metrics["mean"]["psnr"]
        minutes = standard["extrapolated_minutes"]
        standard_steps = presets["standard"].trainer.max_steps
        assert minutes[f"standard/{model}"] == pytest.approx(standard_steps / row["steps_per_s"] / 60)
        fp32, bf16 = (parts["render"][p][model]["train_rays_per_s"] for p in ("fp32", "bf16"))
        paper_step_s = rays["paper"] / rays["standard"] * bf16 / fp32 / row["steps_per_s"]
        assert minutes[f"paper/{model}"] == pytest.approx(presets["paper"].trainer.max_steps * paper_step_s / 60)
    # eval: the shipped checkpoint scored zero-shot on the toy scene.
    assert parts["eval"]["scene"] == "demo" and 10 < parts["eval"]["psnr"] < 60
    # The printed table: one line a part.
    lines = result.stdout.splitlines()
    assert all(any(line.startswith(f"{name} ") and " ok " in line for line in lines) for name in parts)


@pytest.mark.parametrize(
    "args, message",
    [
        (["out", "--parts", "tests,nonsense"], "--parts: must be some of"),
        (["out", "--budget", "0"], "--budget: must be positive"),
        (["--dry-run"], "OUT: required"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path, args, message):
    args = [str(tmp_path / a) if a == "out" else a for a in args]
    result = run_script(*args, timeout=120)
    assert_one_error_line(result, message)
    assert not (tmp_path / "out" / "summary.json").exists()


def test_without_a_gpu_the_real_run_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = run_script(str(tmp_path / "out"), timeout=120)
    assert_one_error_line(result, "no CUDA device")
