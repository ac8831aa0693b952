"""The benchmark scripts count what they claim: FLOPs of both models, including softmax attention."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import load_script

from pola_gnt.attention.modules import PolaRayAttention, PolaViewAttention, SoftmaxRayAttention


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


def test_bench_render_runs_both_models_and_reports_ratios(tmp_path, capsys):
    bench = load_script("bench_render")
    out = tmp_path / "bench.json"
    bench.main(
        [
            "--out",
            str(out),
            "--samples",
            "8",
            "24",
            "--rays",
            "2",
            "--views",
            "3",
            "--width",
            "16",
            "--blocks",
            "1",
            "--repeats",
            "1",
        ]
    )
    rows = json.loads(out.read_text())
    assert {(row["model"], row["n_samples"]) for row in rows} == {
        (kind, samples) for kind in ("gnt", "pola_gnt") for samples in (8, 24)
    }
    gnt = {row["n_samples"]: row["gflop_per_ray"] for row in rows if row["model"] == "gnt"}
    # GNT's ray attention is quadratic in the samples: the FLOPs per ray grow faster than the samples.
    assert gnt[24] / gnt[8] > 3.0
    assert all(row["render_rays_per_s"] > 0 and row["train_gflop_per_s"] > 0 for row in rows)
    # render.precision=bf16 beside fp32, from the same run (the ratio is what docs/benchmarks.md reports).
    for row in rows:
        assert row["render_bf16_rays_per_s"] > 0
        assert row["render_bf16_speedup"] == pytest.approx(row["render_bf16_rays_per_s"] / row["render_rays_per_s"])
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
