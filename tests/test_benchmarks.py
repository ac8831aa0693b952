"""The benchmark scripts count what they claim: FLOPs of both models, including softmax attention."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from helpers import assert_one_error_line, load_script

from pola_gnt.attention.modules import PolaRayAttention, PolaViewAttention, SoftmaxRayAttention
from pola_gnt.core.paths import PROJECT_ROOT


def test_softmax_ray_attention_flops_include_the_quadratic_term():
    """GNT's ray attention on the CPU: projections plus 4 S^2 dim per ray (QK^T and AV), forward;
    the CPU SDPA kernel is otherwise invisible to FlopCounterMode."""
    bench = load_script("bench_render")
    dim, rays = 64, 2
    attention = SoftmaxRayAttention(dim, heads=4)
    for samples in (32, 256):
        tokens = torch.randn(rays, samples, dim)
        projections = 2 * rays * samples * dim * (3 * dim + dim)
        quadratic = 4 * rays * samples * samples * dim
        assert bench.counted_gflop(lambda tokens=tokens: attention(tokens)) * 1e9 == projections + quadratic
        tokens.requires_grad_(True)
        assert bench.counted_gflop(lambda tokens=tokens: attention(tokens).sum().backward()) * 1e9 > 3 * (
            projections + quadratic
        )


def test_pola_attention_flops_include_the_fused_kernels():
    """Pola-GNT's attentions on the CPU run in fused C++ kernels that FlopCounterMode cannot look into:
    the benchmark counts them by formula, linear in the samples (ray) and views (view), on top of the
    projections; backward counts 3x the kernels' forward."""
    bench = load_script("bench_render")
    dim, heads, rays, views = 64, 4, 2, 5
    d = dim // heads
    ray_attention = PolaRayAttention(dim, heads, lepe=False)
    view_attention = PolaViewAttention(dim, heads)
    for samples in (32, 256):
        tokens = torch.randn(rays, samples, dim)
        projections = 2 * rays * samples * dim * (4 * dim + dim)
        kernel = 4 * rays * heads * samples * d * d
        assert bench.counted_gflop(lambda tokens=tokens: ray_attention(tokens)) * 1e9 == projections + kernel
        tokens.requires_grad_(True)
        train = bench.counted_gflop(lambda tokens=tokens: ray_attention(tokens).sum().backward()) * 1e9
        assert train == 3 * projections + 4 * kernel

        points = rays * samples
        query, view_tokens = torch.randn(points, dim), torch.randn(points, views, dim)
        rel_dirs, mask = torch.randn(points, views, 4), torch.ones(points, views, dtype=torch.bool)
        inputs = (query, view_tokens, rel_dirs, mask)
        counted = bench.counted_gflop(lambda inputs=inputs: view_attention(*inputs)) * 1e9
        key_values = 2 * points * views * (dim + dim // 8) * 2 * dim + 2 * points * views * 4 * (dim // 8)
        projections = 2 * points * dim * 2 * dim + key_values + 2 * points * dim * dim
        assert counted == projections + 4 * points * views * heads * d


class FakeClock:
    """`time.perf_counter` for the benchmark script: it moves only when a step says it took time."""

    def __init__(self):
        self.now_s = 1000.0

    def perf_counter(self) -> float:
        return self.now_s


PHASES = ("render", "render_bf16", "train")  # the order of `model_steps`' steps


# How long the fake clock says a step took, in units of `_unit`: the warm-up, then the three timed runs;
# the calls after them (FLOP counting, peak memory) are not timed and take nothing.
WARM_UP, TIMED = 10, (3, 1, 2)


def _unit(kind: str, phase: str, n_samples: int) -> float:
    """Seconds per unit: different for each model, phase and sample count, so no field can be another's."""
    return (1 + ("gnt", "pola_gnt").index(kind)) * (1 + PHASES.index(phase)) * n_samples / 1000


def _step_seconds(kind: str, phase: str, n_samples: int, call: int) -> float:
    units = ((WARM_UP, *TIMED)[call]) if call <= len(TIMED) else 0
    return units * _unit(kind, phase, n_samples)


def test_bench_render_rates_are_its_counts_over_its_median_times(tmp_path, monkeypatch, capsys):
    """Each model's steps run for real (both models, two sample counts), under a fake clock that
    gives each step a known duration: every rate in the rows is the test's own count of rays or
    FLOPs over the median of the durations it gave, and the first-call times are the warm-ups'."""
    bench = load_script("bench_render")
    clock = FakeClock()
    monkeypatch.setattr(bench, "time", clock)
    real_steps: dict[tuple[str, int, str], Callable[[], None]] = {}
    model_steps = bench.model_steps

    def timed_model_steps(kind, n_samples, *args):
        model, *steps = model_steps(kind, n_samples, *args)
        calls = dict.fromkeys(PHASES, 0)

        def timed(phase, step):
            def run() -> None:
                clock.now_s += _step_seconds(kind, phase, n_samples, calls[phase])
                calls[phase] += 1
                step()

            return run

        real_steps.update({(kind, n_samples, phase): step for phase, step in zip(PHASES, steps)})
        return (model, *(timed(phase, step) for phase, step in zip(PHASES, steps)))

    monkeypatch.setattr(bench, "model_steps", timed_model_steps)
    out = tmp_path / "bench.json"
    arguments = "--samples 8 24 --rays 2 --views 3 --width 16 --blocks 1 --repeats 3"
    bench.main(["--out", str(out), *arguments.split()])
    rows = json.loads(out.read_text())
    assert {(row["model"], row["n_samples"]) for row in rows} == {
        (kind, samples) for kind in ("gnt", "pola_gnt") for samples in (8, 24)
    }
    for row in rows:
        kind, n_samples, rays = row["model"], row["n_samples"], 2
        assert row["n_rays"] == rays and row["repeats"] == 3
        render_s, bf16_s, train_s = (statistics.median(TIMED) * _unit(kind, phase, n_samples) for phase in PHASES)
        gflop, train_gflop = (bench.counted_gflop(real_steps[kind, n_samples, phase]) for phase in ("render", "train"))
        expected = {
            "render_rays_per_s": rays / render_s,
            "render_bf16_rays_per_s": rays / bf16_s,
            "render_bf16_speedup": render_s / bf16_s,
            "train_rays_per_s": rays / train_s,
            "gflop_per_ray": gflop / rays,
            "train_gflop_per_ray": train_gflop / rays,
            "render_gflop_per_s": gflop / render_s,
            "train_gflop_per_s": train_gflop / train_s,
            "render_first_call_s": WARM_UP * _unit(kind, "render", n_samples),
            "train_first_call_s": WARM_UP * _unit(kind, "train", n_samples),
        }
        assert {key: row[key] for key in expected} == pytest.approx(expected, rel=1e-9), (kind, n_samples)
    gnt = {row["n_samples"]: row["gflop_per_ray"] for row in rows if row["model"] == "gnt"}
    # GNT's ray attention is quadratic in the samples: the FLOPs per ray grow faster than the samples.
    assert gnt[24] / gnt[8] > 3.0
    assert "Pola-GNT / GNT" in capsys.readouterr().out


@pytest.mark.parametrize("phase", [["--phase", "render", "--bf16"], ["--phase", "train"]])
def test_profile_models_ranks_both_models_operators(phase, capsys):
    """The profiler's table for both models: the bf16 render network (what `render.precision=bf16`
    runs) and a training step."""
    profile = load_script("profile_models")
    profile.main(
        ["--samples", "8", "--rays", "4", "--views", "3", "--width", "16", "--blocks", "1", "--steps", "1", *phase]
    )
    out = capsys.readouterr().out
    assert "gnt: top" in out and "pola_gnt: top" in out and "pola_gnt / gnt" in out


def test_bench_shipped_bad_input_is_one_error_line():
    """`scripts/bench_shipped.py`: a bad `--frames`, and a scene no config names (found in the child
    process that measures it: its `error:` line passed on), each one line and exit 2."""
    script = str(PROJECT_ROOT / "scripts" / "bench_shipped.py")
    frames = subprocess.run([sys.executable, script, "--frames", "0"], capture_output=True, text=True)
    assert_one_error_line(frames, "--frames must be at least 1")
    scene = [sys.executable, script, "--scene", "nowhere", "--parts", "frame", "--models", "gnt"]
    assert_one_error_line(subprocess.run(scene, capture_output=True, text=True), "scene/nowhere")
    key = [*scene[:3], "demo", *scene[4:], "--set", "model.net.readout_neighbour_windows=[0.9]"]
    assert_one_error_line(subprocess.run(key, capture_output=True, text=True), "readout_neighbour_windows[0]")


@pytest.mark.slow
def test_bench_attention_layer_rows_and_their_ratios(tmp_path, capsys):
    """`bench_attention.py --suite layers` at a tiny size: the three layers run (one worker process
    each, ~10 s on an idle 2-core machine, so `slow`), every row has its times and peak memory, and
    the table's ratio columns are the baseline's figures over pola_layer's from those very rows."""
    bench = load_script("bench_attention")
    out = tmp_path / "rows.json"
    bench.main(
        ["--suite", "layers", "--lengths", "48", "--heads", "2", "--head-dim", "8", "--repeats", "1", "--out", str(out)]
    )
    rows = {row["impl"]: row for row in json.loads(out.read_text())}
    assert set(rows) == set(bench.LAYER_IMPLS)
    for row in rows.values():
        assert row["seq_len"] == 48 and row["fwd_ms"] > 0 and row["fwd_bwd_ms"] > 0 and row["peak_mem_mb"] >= 0
    table = capsys.readouterr().out.split("\n\n")[-2]
    line = next(line for line in table.splitlines() if line.startswith("48 "))
    for baseline in ("sdpa_layer", "mha_layer"):
        found = bench.ratios(rows["pola_layer"], rows[baseline])
        assert found is not None
        assert ", ".join(f"{found[key]:.2f}x" for key in ("fwd", "fwd_bwd", "memory")) in line
        assert f"{baseline} / pola_layer (fwd, fwd+bwd, memory)" in table


def test_bench_attention_ratios_and_memory_bound():
    """The ratios are the baseline's over the impl's (time and memory); a row that did not run has
    none, and its cell says why. MHA (its N x N weights) is over the default budget of a 23 GB machine
    at 64K tokens, the polarity layer far below it."""
    bench = load_script("bench_attention")
    pola = {"impl": "pola_layer", "seq_len": 8, "fwd_ms": 2.0, "fwd_bwd_ms": 5.0, "peak_mem_mb": 4.0}
    sdpa = {"impl": "sdpa_layer", "seq_len": 8, "fwd_ms": 3.0, "fwd_bwd_ms": 20.0, "peak_mem_mb": 6.0}
    mha = {"impl": "mha_layer", "seq_len": 8, "oom": True, "estimate_mb": 9, "budget_mb": 1}
    assert bench.ratios(pola, sdpa) == {"fwd": 1.5, "fwd_bwd": 4.0, "memory": 1.5}
    assert bench.ratios(pola, mha) is None
    table = bench.format_table([pola, sdpa, mha], list(bench.LAYER_IMPLS))
    assert "1.50x, 4.00x, 1.50x" in table and "oom" in table
    assert table.splitlines()[-1].rstrip().endswith("-")  # no MHA ratio
    fp32 = torch.float32
    assert bench.estimate_bytes("mha_layer", 65536, 4, 32, fp32) > 12 * 2**30
    assert bench.estimate_bytes("pola_layer", 65536, 4, 32, fp32) < 2**30
