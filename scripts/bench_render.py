"""Benchmark GNT against Pola-GNT: render / training throughput, peak memory, FLOP per ray.

    python scripts/bench_render.py --out bench.json [--device cpu|cuda] [--samples 64 192]
        [--views 10] [--rays 16] [--width 64 --blocks 4] [--repeats 5] [--bf16] [--compile] [--prior]

Both models see the same synthetic forward-facing rig: `views` source cameras on a small grid
looking down +z, a target camera at the origin, rays through random pixels, samples uniform in
inverse depth over [2, 10] (nearly every sample is seen by most views). The encoder is EXCLUDED
everywhere: source features are a fixed random `[views, 32, H/4, W/4]` tensor, so the figures
measure the transformer part (gathering, view and ray transformers, read-out).

Per model and sample count (timed runs alternate between the models, so a busy spell of a shared
machine slows both alike):
- render rays/s: eval mode, inference mode, one chunk of `rays` rays, median over repeats;
- train rays/s: forward + backward (gradients of all transformer parameters), median over repeats;
- peak memory of the training step above what was allocated before it (parameters, sources):
  CUDA `max_memory_allocated`; on CPU the running total of the CPU allocator's allocations and frees
  recorded by `torch.profiler(profile_memory=True)` during one extra, untimed step;
- GFLOP per ray of the forward pass (and of forward + backward) by
  `torch.utils.flop_counter.FlopCounterMode`: matmuls, convolutions and attention kernels, with
  formulas registered for the CPU flash-attention kernel that SDPA uses on the CPU (otherwise GNT's
  quadratic ray attention counts 0), and for Pola-GNT's fused CPU kernels (which it cannot look
  into). Elementwise work (feature maps, softmax) is not counted for either model. Achieved GFLOP/s
  follow from these counts.

`--prior` gives both models the shipped checkpoints' read-out (`experiment=pretrain`'s: the consistency
prior over a 4-level blur pyramid and 16 directions of AlexNet's conv2 features, the views weighted by
their angle to the ray, the source colour alone; AlexNet's weights found as the LPIPS weights are): the
prior's network, its per-image part computed once before the timed runs, as a scene's renders keep it.

`--compile` runs both models through `torch.compile` (what `model.compile=true` does in training);
each row then also says how long the first render and training calls took (the compilation).

The quick preset's size: `--views 4 --samples 32 --width 32 --blocks 2 --rays 512`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from pola_gnt.core.process import set_openmp_wait_policy

set_openmp_wait_policy()  # before torch loads OpenMP, as every command

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from pola_gnt.attention import cpu_extension
from pola_gnt.core.errors import UserError, exit_on_user_error
from pola_gnt.core.process import configure_cpu_allocator
from pola_gnt.geometry.rays import Rays, pixel_rays
from pola_gnt.model import GNT, SourceViews
from pola_gnt.model.inference import FastRenderNetwork
from pola_gnt.model.sampler import sample_depths
from pola_gnt.runs.config.app import compose_config
from pola_gnt.runs.config.read import read_run_settings

MODELS = ("gnt", "pola_gnt")  # conf/model/<name>.yaml
HEIGHT, WIDTH = 378, 504  # LLFF at factor 8
NEAR, FAR = 2.0, 10.0


def synthetic_rig(n_views: int, n_rays: int, device: torch.device, seed: int = 0) -> tuple[SourceViews, Rays]:
    """Random source images and features on a forward-facing grid of cameras, and target rays."""
    generator = torch.Generator().manual_seed(seed)
    focal = 0.8 * WIDTH
    intrinsics = torch.tensor([[focal, 0.0, WIDTH / 2], [0.0, focal, HEIGHT / 2], [0.0, 0.0, 1.0]])
    c2w = torch.eye(4).repeat(n_views, 1, 1)
    c2w[:, :2, 3] = (torch.rand(n_views, 2, generator=generator) - 0.5) * 0.6  # within +-0.3 of the target
    sources = SourceViews(
        images=torch.rand(n_views, 3, HEIGHT, WIDTH, generator=generator),
        features=torch.randn(n_views, 32, (HEIGHT + 3) // 4, (WIDTH + 3) // 4, generator=generator),
        c2w=c2w,
        intrinsics=intrinsics.expand(n_views, 3, 3).clone(),
    )
    pixels = torch.rand(n_rays, 2, generator=generator) * torch.tensor([WIDTH - 1.0, HEIGHT - 1.0])
    rays = pixel_rays(torch.eye(4), intrinsics, pixels)
    sources = SourceViews(*(t.to(device) for t in (sources.images, sources.features, sources.c2w, sources.intrinsics)))
    return sources, rays.to(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_step_memory_mb(step, device: torch.device) -> float:
    """Peak memory allocated by `step()` beyond what was allocated before it, in MiB."""
    if device.type == "cuda":
        synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - baseline) / 2**20
    # CPU: replay the allocator's allocation (+) and free (-) events in time order.
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        step()
    events = sorted(
        (e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak / 2**20


def _register_cpu_sdpa_flops() -> None:
    """Count the CPU flash-attention kernel that SDPA dispatches to on the CPU: FlopCounterMode has
    formulas for the CUDA kernels only, so GNT's quadratic attention FLOPs would silently be 0."""
    registry = flop_counter.flop_registry
    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    if forward not in registry:

        @flop_counter.register_flop_formula(forward)
        def _forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    if backward not in registry:

        @flop_counter.register_flop_formula(backward)
        def _backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def counted_gflop(step) -> float:
    """GFLOP of `step()`: matmuls, convolutions and attention kernels (both models' elementwise work,
    feature maps and softmax included, is not counted). Pola-GNT's fused CPU kernels are counted by
    their formulas (`cpu_extension.register_flop_formulas`)."""
    _register_cpu_sdpa_flops()
    cpu_extension.register_flop_formulas()
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops() / 1e9


def model_steps(
    kind: str, n_samples: int, args: argparse.Namespace, sources: SourceViews, rays: Rays, device: torch.device
) -> tuple[GNT, Callable[[], None], Callable[[], None], Callable[[], None]]:
    """The model and its render step (eval, inference mode, fp32: the network itself), its bf16 render
    step (`render.precision=bf16`: `FastRenderNetwork`) and its training step (forward + backward)."""
    torch.manual_seed(0)
    # The model's own config (conf/model/<kind>.yaml, no experiment's read-out options; with --prior the
    # shipped read-out of experiment=pretrain) at the benchmark's size.
    experiment = "pretrain" if args.prior else "standard"
    net = read_run_settings(compose_config(f"model={kind}", f"experiment={experiment}", "trainer=cpu")).model.net
    model = GNT(replace(net, width=args.width, n_blocks=args.blocks, heads=args.heads))
    model.encoder = None  # excluded from the benchmark: features are given (frees its 9 M parameters)
    model.to(device)
    if args.prior:  # the prior's per-image part once, as a scene's renders keep it (PriorImageCache)
        sources = SourceViews(sources.images, sources.features, sources.c2w, sources.intrinsics)
        with torch.inference_mode():
            per_image = [model.prior_image(sources.images[i : i + 1]) for i in range(len(sources.images))]
        sources.keep_prior_images(model, per_image)
    if args.compile:
        model.compile(dynamic=False)  # the benchmark's shapes are fixed
    n_rays = len(rays)
    render_depths = sample_depths(NEAR, FAR, n_rays, n_samples, jitter=False, device=device)
    train_depths = sample_depths(NEAR, FAR, n_rays, n_samples, jitter=True, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext()

    def render_step() -> None:
        model.eval()
        with torch.inference_mode(), autocast:
            model(rays, render_depths, sources)

    bf16_network = FastRenderNetwork(model, torch.bfloat16)

    def render_bf16_step() -> None:
        with torch.inference_mode():
            bf16_network(rays, render_depths, sources)

    def train_step() -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        with autocast:
            out = model(rays, train_depths, sources)
        (out.rgb.square().mean() + 1e-3 * out.depth.mean()).backward()

    return model, render_step, render_bf16_step, train_step


def bench_samples(
    n_samples: int, args: argparse.Namespace, sources: SourceViews, rays: Rays, device: torch.device
) -> list[dict]:
    """Every model at one sample count. Timed runs alternate between the models (one of each per
    repeat), so a slow spell of a shared machine hits both alike; figures are medians."""
    steps = {kind: model_steps(kind, n_samples, args, sources, rays, device) for kind in args.models}
    times: dict[tuple[str, str], list[float]] = {}
    first_call_s: dict[tuple[str, str], float] = {}  # with --compile: the compilation
    phases = ("render", "render_bf16", "train")
    for phase in phases:
        for kind, (_, *phase_steps) in steps.items():  # warm-up
            start = time.perf_counter()
            phase_steps[phases.index(phase)]()
            synchronize(device)
            first_call_s[kind, phase] = time.perf_counter() - start
        for _ in range(args.repeats):
            for kind, (_, *phase_steps) in steps.items():
                step = phase_steps[phases.index(phase)]
                synchronize(device)
                start = time.perf_counter()
                step()
                synchronize(device)
                times.setdefault((kind, phase), []).append(time.perf_counter() - start)

    n_rays = len(rays)
    rows = []
    for kind, (model, render_step, _, train_step) in steps.items():
        render_s, render_bf16_s, train_s = (statistics.median(times[kind, phase]) for phase in phases)
        gflop, train_gflop = counted_gflop(render_step), counted_gflop(train_step)
        rows.append(
            {
                "model": kind,
                "n_samples": n_samples,
                "n_views": args.views,
                "render_rays_per_s": n_rays / render_s,
                "render_bf16_rays_per_s": n_rays / render_bf16_s,
                "render_bf16_speedup": render_s / render_bf16_s,
                "train_rays_per_s": n_rays / train_s,
                "peak_mem_mb": peak_step_memory_mb(train_step, device),
                "gflop_per_ray": gflop / n_rays,
                "render_peak_mem_mb": peak_step_memory_mb(render_step, device),
                "train_gflop_per_ray": train_gflop / n_rays,
                "render_gflop_per_s": gflop / render_s,
                "train_gflop_per_s": train_gflop / train_s,
                "n_rays": n_rays,
                "repeats": args.repeats,
                "transformer_params": sum(p.numel() for p in model.parameters()),
                "encoder": "excluded",
                "device": str(device),
                "dtype": "bf16-autocast" if args.bf16 else "fp32",
                "compiled": args.compile,
                "read_out": "shipped prior" if args.prior else "the model's own",
                "render_first_call_s": first_call_s[kind, "render"],
                "train_first_call_s": first_call_s[kind, "train"],
                "threads": torch.get_num_threads(),
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    """One line per sample count, GNT and Pola-GNT side by side."""
    columns = [
        ("render rays/s", "render_rays_per_s", "{:.0f}"),
        ("render bf16 rays/s", "render_bf16_rays_per_s", "{:.0f}"),
        ("bf16 / fp32 render", "render_bf16_speedup", "{:.2f}x"),
        ("train rays/s", "train_rays_per_s", "{:.0f}"),
        ("train peak MB", "peak_mem_mb", "{:.0f}"),
        ("render peak MB", "render_peak_mem_mb", "{:.0f}"),
        ("GFLOP/ray fwd", "gflop_per_ray", "{:.3f}"),
    ]
    by_key = {(row["model"], row["n_samples"]): row for row in rows}
    header = f"{'samples':>7} " + " ".join(f"| {name:^23}" for name, _, _ in columns)
    sub = f"{'':>7} " + " ".join(f"| {'gnt':>10} {'pola_gnt':>12}" for _ in columns)
    print(header)
    print(sub)
    for n_samples in sorted({row["n_samples"] for row in rows}):
        cells = []
        for _, key, fmt in columns:
            gnt, pola = (by_key.get((kind, n_samples)) for kind in MODELS)
            cells.append(f"| {fmt.format(gnt[key]) if gnt else '-':>10} {fmt.format(pola[key]) if pola else '-':>12}")
        print(f"{n_samples:>7} " + " ".join(cells))
    if all(kind in {row["model"] for row in rows} for kind in MODELS):
        print("\nPola-GNT / GNT (above 1: Pola-GNT faster or, for memory, larger)")
        for n_samples in sorted({row["n_samples"] for row in rows}):
            gnt, pola = (by_key[kind, n_samples] for kind in MODELS)
            print(
                f"{n_samples:>7}   render {pola['render_rays_per_s'] / gnt['render_rays_per_s']:.2f}x   "
                f"train {pola['train_rays_per_s'] / gnt['train_rays_per_s']:.2f}x   "
                f"train peak memory {pola['peak_mem_mb'] / gnt['peak_mem_mb']:.2f}x   "
                f"GFLOP/ray {pola['gflop_per_ray'] / gnt['gflop_per_ray']:.2f}x"
            )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the result rows")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--samples", type=int, nargs="+", default=[64, 192])
    parser.add_argument("--views", type=int, default=10)
    parser.add_argument("--rays", type=int, default=16, help="rays per chunk (one forward); raise it on a GPU")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median)")
    parser.add_argument("--models", nargs="+", choices=tuple(MODELS), default=list(MODELS))
    parser.add_argument("--bf16", action="store_true", help="run under bf16 autocast")
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile both models (first-call times include compilation)"
    )
    parser.add_argument(
        "--prior", action="store_true", help="the shipped checkpoints' read-out (experiment=pretrain's prior)"
    )
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for name in ("views", "rays", "width", "blocks", "heads", "repeats"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name}: must be at least 1, got {getattr(args, name)}")
    if min(args.samples) < 1:
        raise UserError(f"--samples: must be at least 1, got {args.samples}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device available")
    configure_cpu_allocator()
    device = torch.device(args.device)
    sources, rays = synthetic_rig(args.views, args.rays, device)

    rows = []
    for n_samples in args.samples:
        for row in bench_samples(n_samples, args, sources, rays, device):
            rows.append(row)
            print(
                f"{row['model']:>9} S={n_samples:<4} render {row['render_rays_per_s']:8.0f} rays/s  "
                f"bf16 {row['render_bf16_rays_per_s']:8.0f} rays/s  "
                f"train {row['train_rays_per_s']:8.0f} rays/s  peak {row['peak_mem_mb']:7.0f} MB  "
                f"{row['gflop_per_ray']:.3f} GFLOP/ray",
                file=sys.stderr,
                flush=True,
            )
    print(
        f"\n{args.device}, {args.views} views, {args.rays} rays per chunk, width {args.width}, "
        f"{args.blocks} blocks, {'bf16 autocast' if args.bf16 else 'fp32'}"
        f"{', torch.compile' if args.compile else ''}{', the shipped prior' if args.prior else ''}; encoder excluded"
    )
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
