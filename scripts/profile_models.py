"""Where the time goes: torch.profiler's top operators by self time, GNT and Pola-GNT side by side.

    python scripts/profile_models.py [--samples 32] [--views 4] [--width 32] [--blocks 2] [--rays 512]
        [--phase train|render] [--top 15] [--steps 3] [--device cpu|cuda] [--bf16]

The same synthetic rig and models as `bench_render.py` (encoder excluded; defaults: the quick
preset's size). Each model runs one warm-up step, then `steps` profiled steps; the table lists each
model's operators with the largest self time (CPU, or CUDA on a GPU), their share of the model's
total and calls per step. Use it before and after a speed change: the ranks say which operators a
change removed, the totals how much it saved.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pola_gnt.core.process import set_openmp_wait_policy

set_openmp_wait_policy()  # before torch loads OpenMP, as every command

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_render import MODELS, model_steps, synthetic_rig

from pola_gnt.core.process import configure_cpu_allocator


def profile_model(kind: str, args: argparse.Namespace, device: torch.device) -> tuple[float, list[tuple]]:
    """(total self time per step in ms, [(operator, self ms per step, calls per step)] sorted)."""
    sources, rays = synthetic_rig(args.views, args.rays, device)
    _, render_step, render_bf16_step, train_step = model_steps(kind, args.samples, args, sources, rays, device)
    if args.phase == "train":
        step = train_step
    else:  # --bf16 renders with the bf16 network (`render.precision=bf16`), as bench_render does
        step = render_bf16_step if args.bf16 else render_step
    step()  # warm-up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        for _ in range(args.steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    rows = []
    for event in profiler.key_averages():
        self_us = event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total
        if self_us > 0:
            rows.append((event.key, self_us / 1e3 / args.steps, event.count / args.steps))
    rows.sort(key=lambda row: -row[1])
    return sum(row[1] for row in rows), rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--views", type=int, default=4)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rays", type=int, default=512)
    parser.add_argument("--phase", choices=("train", "render"), default="train")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args(argv)
    args.models = list(MODELS)
    args.compile = False
    args.prior = False
    device = torch.device(args.device)
    configure_cpu_allocator()
    print(
        f"{args.phase}, {args.rays} rays x {args.samples} samples, {args.views} views, width {args.width}, "
        f"{args.blocks} blocks, {args.heads} heads, {device.type}, threads {torch.get_num_threads()}"
    )
    results = {kind: profile_model(kind, args, device) for kind in MODELS}
    totals = "   ".join(f"{kind} {total:.1f} ms" for kind, (total, _) in results.items())
    print(f"self time per step: {totals}   (pola_gnt / gnt {results['pola_gnt'][0] / results['gnt'][0]:.2f}x)")
    for kind, (total, rows) in results.items():
        print(f"\n{kind}: top {args.top} operators by self time per step")
        print(f"{'operator':<52}{'ms':>9}{'share':>8}{'calls':>8}")
        for name, ms, calls in rows[: args.top]:
            print(f"{name[:51]:<52}{ms:>9.2f}{ms / total:>8.1%}{calls:>8.0f}")


if __name__ == "__main__":
    main()
