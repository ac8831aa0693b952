"""Every GPU check in one call, within a time budget (one H100: about 6 minutes, so that a lent
machine's 8-minute call holds its start-up too): one `summary.json` and a table.

    python scripts/gpu_checks.py OUT [--parts tests,attention,render,standard,eval] [--budget 360]
    python scripts/gpu_checks.py OUT --dry-run      # every part on the CPU at toy sizes (CI runs it)

Parts, in this order (a part that the budget no longer holds is skipped, with the reason):
    tests      `pytest -m gpu`: the CUDA tests (kernels against the fp64 reference, dispatch counted)
    attention  `bench_attention.py` at 4K, 64K and 200K tokens, bf16: Pola-GNT's linear form (the
               Triton kernels) against SDPA (FlashAttention on an H100), forward and forward + backward
    render     `bench_render.py` at the paper's size (10 views, 192 samples, width 64, 4 blocks), both
               models, fp32 and bf16 autocast: render and training rays/s, peak memory
    standard   200 steps of `experiment=standard` on fern for both models: steps/s over the steps after
               the first 50 (compilation and autotuning), peak GPU memory, the step's loss and PSNR;
               then the extrapolated time of the `standard` preset (its steps at that rate) and of
               `paper` (fp32, twice the rays a step: the standard step scaled by the rays and by the
               fp32 / bf16 training throughput of `render`)
    eval       the zero-shot eval of fern with the shipped checkpoint (`ckpt_path=pretrained:pola_gnt`)

Each part runs in its own processes (a fresh CUDA context and allocator), its output in
`OUT/<part>*.txt`; the script's exit code is 1 when a part failed or timed out. `--dry-run` runs
the same commands on the CPU with toy sizes (the demo scene, a tiny network, 2 steps, 256 tokens):
it checks that the script, the commands and their outputs fit together, not the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PARTS = ("tests", "attention", "render", "standard", "eval")
MODELS = ("gnt", "pola_gnt")
STANDARD_STEPS = 200
WARM_STEPS = 50  # steps/s is measured after these (kernel compilation, cuDNN autotuning)
# The toy network and data of the dry run (as the tests' tiny pipeline).
TOY_RUN = [
    "scene=demo",
    "data.factor=32",
    "data.num_source_views=3",
    "data.targets_per_step=1",
    "data.rays_per_step=32",
    "data.val_rays=64",
    "data.random_crop=null",
    "data.test_views=1",
    "render.n_samples=8",
    "model.net.width=16",
    "model.net.heads=2",
    "model.net.n_blocks=1",
    "model.net.encoder.stage_channels=[8,8,8]",
]


@dataclass
class Context:
    out: Path
    dry_run: bool
    deadline: float  # time.monotonic() by which every part has ended
    summary: dict[str, Any] = field(default_factory=dict)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, command: list[str], log: Path, limit_s: float) -> Run:
        # The dry run leaves the fused C++ CPU kernels out (their first build takes a minute; the
        # PyTorch forms compute the same): it checks the script, not the CPU.
        extra = {"POLA_GNT_CPU_KERNELS": "0"} if self.dry_run else {}
        return run(command, log, limit_s, extra)


@dataclass(frozen=True)
class Run:
    returncode: int | None  # None: stopped at its time limit
    seconds: float
    log: Path

    @property
    def status(self) -> str:
        return "timeout" if self.returncode is None else "ok" if self.returncode == 0 else "failed"


def run(command: list[str], log: Path, limit_s: float, extra_env: dict[str, str] | None = None) -> Run:
    """`command` in the project root with its output in `log`, stopped (its process group) after `limit_s`."""
    started = time.monotonic()
    with log.open("w") as output:
        output.write(f"$ {' '.join(command)}\n")
        output.flush()
        process = subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})},
            start_new_session=True,  # its own process group: a timeout stops its children too
        )
        try:
            returncode: int | None = process.wait(timeout=max(1.0, limit_s))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            returncode = None
            output.write(f"\n[gpu_checks] stopped after {limit_s:.0f} s\n")
    return Run(returncode, time.monotonic() - started, log)


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


# --------------------------------------------------------------------------------------------------
# Parts: each returns its entry of summary.json ("status", "seconds", its figures)


def part_tests(ctx: Context, limit_s: float) -> dict:
    report = ctx.out / "gpu_tests.xml"
    # The dry run: two files' gpu tests (they skip without CUDA), which collects and reports as the real run.
    files = ["tests/test_triton_ray.py", "tests/test_attention_functional.py"] if ctx.dry_run else ["tests"]
    command = python("-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", f"--junitxml={report}", *files)
    result = ctx.run(command, ctx.out / "tests.txt", limit_s)
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    if report.is_file():
        for case in ET.parse(report).getroot().iter("testcase"):
            kinds = {child.tag for child in case}
            counts["failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"] += 1
    status = result.status
    if status == "ok" and not ctx.dry_run and (counts["passed"] == 0 or counts["skipped"]):
        status = "failed"  # on a GPU every gpu test runs
    return {"status": status, "seconds": result.seconds, **counts, "log": result.log.name}


def part_attention(ctx: Context, limit_s: float) -> dict:
    out = ctx.out / "bench_attention.json"
    if ctx.dry_run:
        sizes = ["--device", "cpu", "--dtype", "fp32", "--lengths", "256", "--repeats", "1"]
    else:
        sizes = ["--device", "cuda", "--dtype", "bf16", "--lengths", "4096", "65536", "200000", "--repeats", "3"]
        sizes += ["--repeat-seconds", "5", "--max-seconds", "30"]
    command = python("scripts/bench_attention.py", "--impls", "pola", "softmax", *sizes, "--out", str(out))
    result = ctx.run(command, ctx.out / "attention.txt", limit_s)
    rows = read_json(out) or []
    figures = {
        f"{row['impl']}@{row['seq_len']}": {key: row.get(key) for key in ("fwd_ms", "fwd_bwd_ms", "peak_mem_mb")}
        for row in rows
        if "fwd_ms" in row
    }
    status = result.status if rows else "failed" if result.status == "ok" else result.status
    return {"status": status, "seconds": result.seconds, "rows": figures, "log": result.log.name}


def part_render(ctx: Context, limit_s: float) -> dict:
    if ctx.dry_run:
        sizes = ["--device", "cpu", "--views", "2", "--samples", "8", "--rays", "8", "--width", "16"]
        sizes += ["--blocks", "1", "--heads", "2", "--repeats", "1"]
    else:  # the paper's model and sampling (conf/experiment/paper.yaml, conf/model/*.yaml)
        sizes = ["--device", "cuda", "--views", "10", "--samples", "192", "--rays", "2048", "--width", "64"]
        sizes += ["--blocks", "4", "--heads", "4", "--repeats", "3"]
    entry: dict[str, Any] = {"status": "ok", "seconds": 0.0}
    for precision in ("fp32", "bf16"):
        out = ctx.out / f"bench_render_{precision}.json"
        flags = ["--bf16"] if precision == "bf16" else []
        command = python("scripts/bench_render.py", *sizes, *flags, "--out", str(out))
        result = ctx.run(command, ctx.out / f"render_{precision}.txt", min(limit_s / 2, ctx.remaining()))
        entry["seconds"] += result.seconds
        rows = read_json(out) or []
        entry[precision] = {
            row["model"]: {key: row.get(key) for key in ("render_rays_per_s", "train_rays_per_s", "peak_mem_mb")}
            for row in rows
        }
        if result.status != "ok" or not rows:
            entry["status"] = result.status if result.status != "ok" else "failed"
    return entry


def part_standard(ctx: Context, limit_s: float) -> dict:
    steps = 2 if ctx.dry_run else STANDARD_STEPS

    def train(model: str) -> tuple[Run, dict]:
        run_dir = ctx.out / f"standard_{model}"
        worker = ctx.out / f"standard_{model}_worker.json"
        overrides = [f"model={model}", "experiment=standard", f"trainer.max_steps={steps}"]
        overrides += [f"trainer.val_check_interval={steps}", "data.test_views=1", "output.save_images=false"]
        overrides += [*TOY_RUN, "trainer=cpu"] if ctx.dry_run else ["scene=fern"]
        overrides += [f"hydra.run.dir={run_dir}"]
        command = python(__file__, "--worker", str(worker), "--warm-steps", str(min(WARM_STEPS, steps - 1)))
        result = ctx.run([*command, "--", *overrides], ctx.out / f"standard_{model}.txt", limit_s / len(MODELS))
        measured = read_json(worker) or {}
        metrics = read_json(run_dir / "metrics.json") or {}
        return result, {
            "status": result.status,
            "steps_per_s": measured.get("steps_per_s"),
            "steps_per_s_with_warm_up": (metrics.get("training") or {}).get("steps_per_s"),
            "peak_memory_mb": measured.get("peak_memory_mb"),
            "test_psnr": (metrics.get("mean") or {}).get("psnr"),
        }

    # On a GPU one after the other (each measures alone); the dry run's side by side.
    with ThreadPoolExecutor(max_workers=len(MODELS) if ctx.dry_run else 1) as pool:
        trained = dict(zip(MODELS, pool.map(train, MODELS)))
    entry: dict[str, Any] = {"status": "ok", "seconds": sum(result.seconds for result, _ in trained.values())}
    entry["steps"] = steps
    for model, (result, row) in trained.items():
        entry[model] = row
        if result.status != "ok" or row["steps_per_s"] is None:
            entry["status"] = result.status if result.status != "ok" else "failed"
    return entry


def extrapolate(ctx: Context, standard: dict) -> dict:
    """The `standard` and `paper` presets' training time at the measured rate (training steps only:
    validation, checkpoints and the test renders come on top). `paper`'s step: the standard step
    times the ratio of rays a step (8 targets against 4) and of the render benchmark's bf16 / fp32
    training rays/s (the encoder's share of a step is not in that ratio: an estimate)."""
    from pola_gnt.runs.config.app import compose_config
    from pola_gnt.runs.config.read import read_run_settings

    presets = {}
    for preset in ("standard", "paper"):
        settings = read_run_settings(compose_config(f"experiment={preset}", "trainer=cpu"))
        presets[preset] = (settings.trainer.max_steps, settings.data.targets_per_step * settings.data.rays_per_step)
    render = ctx.summary.get("render") or {}
    estimate: dict[str, Any] = {}
    for model in MODELS:
        rate = (standard.get(model) or {}).get("steps_per_s")
        if not rate:
            continue
        steps, rays = presets["standard"]
        estimate[f"standard/{model}"] = steps / rate / 60
        fp32 = ((render.get("fp32") or {}).get(model) or {}).get("train_rays_per_s")
        bf16 = ((render.get("bf16") or {}).get(model) or {}).get("train_rays_per_s")
        if fp32 and bf16:
            paper_steps, paper_rays = presets["paper"]
            step_s = (1 / rate) * (paper_rays / rays) * (bf16 / fp32)
            estimate[f"paper/{model}"] = paper_steps * step_s / 60
    return estimate


def part_eval(ctx: Context, limit_s: float) -> dict:
    run_dir = ctx.out / "eval_fern"
    scene = [*TOY_RUN[:2], "data.test_views=1"] if ctx.dry_run else ["scene=fern"]
    command = python("-m", "pola_gnt.eval", *scene, "ckpt_path=pretrained:pola_gnt", f"hydra.run.dir={run_dir}")
    if ctx.dry_run:
        command.append("trainer=cpu")
    result = ctx.run(command, ctx.out / "eval.txt", limit_s)
    metrics = read_json(run_dir / "metrics.json") or {}
    mean = metrics.get("mean") or {}
    status = result.status if mean else "failed" if result.status == "ok" else result.status
    figures = {key: mean.get(key) for key in ("psnr", "ssim", "lpips")}
    return {"status": status, "seconds": result.seconds, "scene": scene[0].removeprefix("scene="), **figures}


# The parts' run functions and their share of the budget (of the default 360 s: 70, 50, 50, 150, 40).
PART_RUNS: dict[str, tuple[Callable[[Context, float], dict], float]] = {
    "tests": (part_tests, 70 / 360),
    "attention": (part_attention, 50 / 360),
    "render": (part_render, 50 / 360),
    "standard": (part_standard, 150 / 360),
    "eval": (part_eval, 40 / 360),
}


# --------------------------------------------------------------------------------------------------
# The training worker: `pola_gnt.train` in this process, timed per step


def worker(out: Path, warm_steps: int, overrides: list[str]) -> int:
    """Run `python -m pola_gnt.train OVERRIDES` here, timing the steps after `warm_steps` (a Lightning
    callback added to the trainer) and reading the peak memory: CUDA's peak allocation, or this
    process's peak resident size on the CPU. Writes them to `out`; returns the command's exit code."""
    import runpy

    import pytorch_lightning as pl
    import torch

    marks: dict[int, float] = {}

    class StepClock(pl.Callback):
        def on_train_batch_end(self, trainer, *args, **kwargs) -> None:
            step = trainer.global_step
            if step in (warm_steps, trainer.max_steps):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                marks[step] = time.perf_counter()

    original_init = pl.Trainer.__init__

    def init_with_clock(self, *args, callbacks=None, **kwargs):
        original_init(self, *args, callbacks=[*(callbacks or []), StepClock()], **kwargs)

    pl.Trainer.__init__ = init_with_clock  # type: ignore[method-assign]
    sys.argv = ["pola_gnt.train", *overrides]
    code = 0
    try:
        runpy.run_module("pola_gnt.train", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    last = max(marks, default=None)
    steps_per_s = None
    if last is not None and warm_steps in marks and last > warm_steps:
        steps_per_s = (last - warm_steps) / (marks[last] - marks[warm_steps])
    if torch.cuda.is_available():
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:  # ru_maxrss: kilobytes on Linux
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    document = {"steps_per_s": steps_per_s, "timed_steps": [warm_steps, last], "peak_memory_mb": peak_mb, "code": code}
    out.write_text(json.dumps(document) + "\n")
    return code


# --------------------------------------------------------------------------------------------------
# Summary


def device_line(dry_run: bool) -> dict:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available() and not dry_run:
        properties = torch.cuda.get_device_properties(0)
        info |= {"gpu": properties.name, "memory_gb": round(properties.total_memory / 2**30, 1)}
        info["cuda"] = torch.version.cuda
    else:
        info["gpu"] = None
        info["cpu"] = platform.processor() or platform.machine()
    return info


def number(value: Any, spec: str) -> str:
    """`value` formatted with `spec`, or `-` where a part left it out (None)."""
    return "-" if value is None else format(value, spec)


def table(summary: dict) -> str:
    """One line a part: its status, seconds and main figures."""
    lines = [f"{'part':<10} {'status':<8} {'seconds':>7}  figures", "-" * 78]
    for name in PARTS:
        entry = summary["parts"].get(name)
        if entry is None:
            continue
        figures = ""
        if name == "tests":
            figures = f"{entry['passed']} passed, {entry['failed']} failed, {entry['skipped']} skipped"
        elif name == "attention":
            rows = entry.get("rows") or {}
            figures = ", ".join(f"{key} {number(value['fwd_bwd_ms'], '.1f')} ms" for key, value in rows.items())
        elif name == "render":
            figures = "; ".join(
                f"{precision} {model} train {number(row['train_rays_per_s'], '.0f')} rays/s"
                for precision in ("fp32", "bf16")
                for model, row in (entry.get(precision) or {}).items()
            )
        elif name == "standard":
            cells = []
            for model in MODELS:
                row = entry.get(model) or {}
                steps, memory = number(row.get("steps_per_s"), ".2f"), number(row.get("peak_memory_mb"), ".0f")
                cells.append(f"{model} {steps} steps/s, {memory} MB")
            cells += [f"{key} ~{minutes:.0f} min" for key, minutes in (entry.get("extrapolated_minutes") or {}).items()]
            figures = "; ".join(cells)
        elif name == "eval":
            scores = ", ".join(f"{key.upper()} {number(entry.get(key), '.3f')}" for key in ("psnr", "ssim", "lpips"))
            figures = f"{entry.get('scene')} zero-shot {scores}"
        if entry.get("reason"):
            figures = entry["reason"]
        lines.append(f"{name:<10} {entry['status']:<8} {entry.get('seconds', 0.0):>7.0f}  {figures}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("out", type=Path, nargs="?", help="folder for summary.json and every part's output")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {','.join(PARTS)}")
    parser.add_argument(
        "--budget", type=float, help="seconds for all parts together (default 360; the dry run, timing nothing: 1200)"
    )
    parser.add_argument("--dry-run", action="store_true", help="every part on the CPU at toy sizes")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--warm-steps", type=int, default=WARM_STEPS, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        return worker(args.worker, args.warm_steps, args.overrides)
    from pola_gnt.core.errors import UserError, exit_on_user_error

    @exit_on_user_error
    def checks() -> int:
        parts = [part.strip() for part in args.parts.split(",") if part.strip()]
        unknown = sorted(set(parts) - set(PARTS))
        if args.out is None:
            raise UserError("OUT: required (the folder for summary.json)")
        if unknown or not parts:
            raise UserError(f"--parts: must be some of {','.join(PARTS)}, got {args.parts!r}")
        if args.budget is None:
            args.budget = 1200.0 if args.dry_run else 360.0
        if args.budget <= 0:
            raise UserError(f"--budget: must be positive seconds, got {args.budget}")
        import torch

        if not args.dry_run and not torch.cuda.is_available():
            raise UserError("no CUDA device: run on a GPU machine, or --dry-run for the CPU check of the script")
        args.out.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        ctx = Context(args.out.resolve(), args.dry_run, started + args.budget)
        summary: dict[str, Any] = {
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "dry_run": args.dry_run,
            "budget_s": args.budget,
            "device": device_line(args.dry_run),
            "parts": {},
        }
        ctx.summary = summary["parts"]

        def one(name: str) -> None:
            function, share = PART_RUNS[name]
            limit = share * args.budget
            if ctx.remaining() < min(limit, 20.0):
                summary["parts"][name] = {"status": "skipped", "seconds": 0.0, "reason": "no time left in --budget"}
                return
            summary["parts"][name] = function(ctx, min(limit, ctx.remaining()))

        if args.dry_run:  # nothing is measured: the parts' processes share the CPU
            with ThreadPoolExecutor(max_workers=len(parts)) as pool:
                list(pool.map(one, parts))
        else:
            for name in parts:
                one(name)
        if "standard" in summary["parts"]:  # from the standard part's rate and the render part's figures
            summary["parts"]["standard"]["extrapolated_minutes"] = extrapolate(ctx, summary["parts"]["standard"])
        summary["parts"] = {name: summary["parts"][name] for name in PARTS if name in summary["parts"]}
        summary["seconds"] = time.monotonic() - started
        from pola_gnt.core.files import write_atomic

        write_atomic(ctx.out / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
        print(table(summary))
        print(f"\n{summary['seconds']:.0f} s; wrote {ctx.out / 'summary.json'}")
        return 0 if all(entry["status"] == "ok" for entry in summary["parts"].values()) else 1

    return checks()


if __name__ == "__main__":
    sys.exit(main())
