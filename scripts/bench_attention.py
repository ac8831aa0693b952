"""Benchmark attention implementations over sequence length: time and peak memory.

    python scripts/bench_attention.py --out bench.json [--device cpu|cuda] [--lengths 1024 4096 ...]
        [--repeats 3] [--heads 4] [--head-dim 32] [--dtype fp32|bf16|fp16]

Implementations (batch 1, `heads` x `head-dim`, self-attention over N tokens):
    pola         polarity_attention, linear form (on CUDA the fused Triton kernel when available)
    softmax      torch.nn.functional.scaled_dot_product_attention
    vanilla      explicit N x N scores + softmax in plain PyTorch
    relu_linear  plain ReLU linear attention, normalised

Method:
- Every (impl, length) runs in a fresh subprocess, so no allocator cache or earlier peak leaks from
  one row into the next, and an impl that runs out of memory cannot take the benchmark down.
- Before starting a row, its memory need is estimated from the shapes; above `--memory-budget-mb`
  (default: half of the available RAM, or of the free GPU memory) the row is `{"oom": true}` and
  nothing is allocated. A row whose time, extrapolated from the previous length, would exceed
  `--max-seconds`, or that actually exceeds it, is `{"skipped": true, "reason": ...}`.
- Peak memory is measured over one forward+backward, after the inputs (q, k, v, temperatures and
  the output gradient) are allocated, and excludes them. CUDA: `max_memory_allocated` after
  `reset_peak_memory_stats`, minus the allocated baseline. CPU: the peak resident set size (VmHWM,
  reset through /proc/self/clear_refs) minus the resident size at the baseline; for that one pass
  glibc's mmap threshold is fixed at 64 KB, so every freed buffer goes back to the OS at once and the
  peak RSS is the peak of live memory rather than of the allocator's cache. The timed runs then use
  the allocator setting of every command (`pola_gnt.core.process`: freed pages are kept for reuse).
- Times: median over up to `--repeats` runs of the forward alone (under torch.no_grad, i.e.
  inference) and of forward+backward. Warm-up: one run at 256 tokens, then the memory pass at full
  size, which counts as a timed run only when it alone took longer than `--repeat-seconds`; a row
  stops repeating once it has used `--repeat-seconds` (the 64K softmax rows take minutes per run on
  a small CPU). Impls of one length run back to back, so their ratios share the machine's load.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pola_gnt.core.process import set_openmp_wait_policy

set_openmp_wait_policy()  # before torch loads OpenMP, as every command

import torch
import torch.nn.functional as F

from pola_gnt.core.errors import UserError, exit_on_user_error
from pola_gnt.core.process import M_MMAP_THRESHOLD, configure_cpu_allocator, mallopt

IMPLS = ("pola", "softmax", "vanilla", "relu_linear")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CPU_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
CUDA_LENGTHS = CPU_LENGTHS + (131072, 200000)
# Time growth per doubling of the length, used to skip rows that would exceed --max-seconds.
QUADRATIC_IMPLS = ("softmax", "vanilla")
WARMUP_LENGTH = 256
RELU_EPSILON = 1e-6

# --------------------------------------------------------------------------------------------------
# The implementations: (q, k, v, temp_same, temp_opp) -> out, all [1, heads, N, head_dim]


def pola(q, k, v, temp_same, temp_opp):
    from pola_gnt.attention import polarity_attention

    return polarity_attention(q, k, v, temp_same, temp_opp, form="linear")


def softmax(q, k, v, temp_same, temp_opp):
    return F.scaled_dot_product_attention(q, k, v)


def vanilla(q, k, v, temp_same, temp_opp):
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [1, heads, N, N]
    return torch.softmax(scores, dim=-1) @ v


def relu_linear(q, k, v, temp_same, temp_opp):
    q_feat, k_feat = torch.relu(q), torch.relu(k)
    numerator = q_feat @ (k_feat.transpose(-1, -2) @ v)
    denominator = q_feat @ k_feat.sum(dim=-2).unsqueeze(-1)
    return numerator / (denominator + RELU_EPSILON)


IMPL_FUNCTIONS: dict[str, Callable] = {"pola": pola, "softmax": softmax, "vanilla": vanilla, "relu_linear": relu_linear}


def estimate_bytes(impl: str, seq_len: int, heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Memory of one forward+backward, inputs included (deliberately generous)."""
    itemsize = torch.finfo(dtype).bits // 8
    tokens = heads * seq_len * head_dim  # one [1, heads, N, d] tensor
    fp32_tokens = tokens * 4
    # inputs q, k, v, grad_out + their grads + output: 8 tensors; fp32 working copies for pola.
    base = 8 * tokens * itemsize
    if impl == "pola":
        return base + 4 * fp32_tokens + 64 * 2**20  # fp32 copies/grads + chunk buffers
    if impl == "softmax":
        return base + 2 * fp32_tokens + 64 * 2**20
    if impl == "relu_linear":
        return base + 6 * fp32_tokens
    scores = heads * seq_len * seq_len * max(itemsize, 4)
    return base + 4 * scores  # scores, probabilities and both of their gradients


def default_budget_mb(device: str) -> float:
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return free / 2**20 / 2
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024 / 2
    return 4096.0


# --------------------------------------------------------------------------------------------------
# Worker: one (impl, length) in this process


def _proc_status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


class MemoryMeter:
    """Peak memory above a baseline, CUDA allocator or CPU resident set (see module docstring)."""

    def __init__(self, device: str):
        self.device = device

    def start(self) -> None:
        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.baseline = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            self.baseline = _proc_status_kb("VmRSS") * 1024

    def peak_mb(self) -> float:
        if self.device == "cuda":
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - self.baseline) / 2**20
        return (_proc_status_kb("VmHWM") * 1024 - self.baseline) / 2**20


def _inputs(seq_len: int, heads: int, head_dim: int, dtype: torch.dtype, device: str):
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (1, heads, seq_len, head_dim)
    q, k, v = (torch.randn(shape, generator=gen, device=device, dtype=dtype).requires_grad_() for _ in range(3))
    temps = [torch.rand(heads, 1, 2 * head_dim, generator=gen, device=device).requires_grad_() for _ in range(2)]
    grad_out = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    return (q, k, v, *temps), grad_out


def _timed(fn: Callable[[], None], device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def _repeat(fn: Callable[[], None], device: str, repeats: int, seconds: float, first: list[float]) -> float:
    samples = list(first)
    while len(samples) < repeats and sum(samples) < seconds * 1e3:
        samples.append(_timed(fn, device))
    return statistics.median(samples)


def run_worker(args: argparse.Namespace) -> dict:
    impl, seq_len, device, dtype = args.worker_impl, args.worker_len, args.device, DTYPES[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    function = IMPL_FUNCTIONS[impl]
    on_cpu = device == "cpu" and mallopt(M_MMAP_THRESHOLD, 64 * 1024)

    def step(inputs, grad_out, backward: bool) -> None:
        if backward:
            function(*inputs).backward(grad_out)
        else:
            with torch.no_grad():
                function(*inputs)

    warm_inputs, warm_grad = _inputs(WARMUP_LENGTH, args.heads, args.head_dim, dtype, device)
    step(warm_inputs, warm_grad, True)
    step(warm_inputs, warm_grad, False)
    del warm_inputs, warm_grad

    inputs, grad_out = _inputs(seq_len, args.heads, args.head_dim, dtype, device)
    meter = MemoryMeter(device)
    meter.start()
    first_ms = _timed(lambda: step(inputs, grad_out, True), device)
    peak_mb = meter.peak_mb()
    if on_cpu:  # timed runs: freed pages are kept for reuse, as in every command (pola_gnt.core.process)
        configure_cpu_allocator()
    # A run slower than the repeat budget counts as the (only) sample; otherwise it was a warm-up.
    first = [first_ms] if first_ms > args.repeat_seconds * 1e3 else []
    fwd_bwd_ms = _repeat(lambda: step(inputs, grad_out, True), device, args.repeats, args.repeat_seconds, first)
    fwd_ms = _repeat(lambda: step(inputs, grad_out, False), device, args.repeats, args.repeat_seconds, [])
    row = {"impl": impl, "seq_len": seq_len, "fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms, "peak_mem_mb": peak_mb}
    if impl == "pola" and device == "cuda":
        from pola_gnt.attention.linear.op import triton_kernel

        row["kernel"] = "triton" if triton_kernel(inputs[0]) is not None else "pytorch"
    return row


# --------------------------------------------------------------------------------------------------
# Driver


def _worker_command(args: argparse.Namespace, impl: str, seq_len: int) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker-impl", impl, "--worker-len", str(seq_len)]
    for flag in ("device", "dtype", "heads", "head_dim", "repeats", "repeat_seconds", "threads"):
        value = getattr(args, flag)
        if value is not None:
            command += ["--" + flag.replace("_", "-"), str(value)]
    return command


def run_row(args: argparse.Namespace, impl: str, seq_len: int, budget_mb: float, previous: dict | None) -> dict:
    needed_mb = estimate_bytes(impl, seq_len, args.heads, args.head_dim, DTYPES[args.dtype]) / 2**20
    if needed_mb > budget_mb:
        return {
            "impl": impl,
            "seq_len": seq_len,
            "oom": True,
            "estimate_mb": round(needed_mb),
            "budget_mb": round(budget_mb),
        }
    if previous is not None and previous.get("skipped"):
        return {
            "impl": impl,
            "seq_len": seq_len,
            "skipped": True,
            "reason": f"skipped at {previous['seq_len']} already",
        }
    if previous is not None and "fwd_bwd_ms" in previous:
        growth = (seq_len / previous["seq_len"]) ** (2 if impl in QUADRATIC_IMPLS else 1)
        predicted_s = (previous["fwd_bwd_ms"] + previous["fwd_ms"]) * growth / 1e3
        if predicted_s > args.max_seconds:
            reason = (
                f"predicted {predicted_s:.0f} s from {previous['seq_len']} tokens > --max-seconds {args.max_seconds:g}"
            )
            return {"impl": impl, "seq_len": seq_len, "skipped": True, "reason": reason}
    try:
        done = subprocess.run(
            _worker_command(args, impl, seq_len), capture_output=True, text=True, timeout=args.max_seconds
        )
    except subprocess.TimeoutExpired:
        return {"impl": impl, "seq_len": seq_len, "skipped": True, "reason": f"over --max-seconds {args.max_seconds:g}"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        out_of_memory = "out of memory" in done.stderr.lower() or done.returncode == -9
        key = "oom" if out_of_memory else "failed"
        return {"impl": impl, "seq_len": seq_len, key: True, "reason": tail}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row.get("oom"):
        return "oom"
    if row.get("skipped") or row.get("failed"):
        return "skipped" if row.get("skipped") else "failed"
    return f"{_ms(row['fwd_ms'])} / {_ms(row['fwd_bwd_ms'])} ms, {row['peak_mem_mb']:.1f} MB"


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def format_table(rows: list[dict], impls: list[str]) -> str:
    """One line per length: fwd / fwd+bwd time and peak memory per impl, then pola vs softmax."""
    by_key = {(row["impl"], row["seq_len"]): row for row in rows}
    lengths = sorted({row["seq_len"] for row in rows})
    header = ["seq_len", *impls, "pola vs softmax (fwd, fwd+bwd)"]
    lines = []
    for seq_len in lengths:
        cells = [str(seq_len), *(_cell(by_key.get((impl, seq_len))) for impl in impls)]
        pola_row, sdpa_row = by_key.get(("pola", seq_len), {}), by_key.get(("softmax", seq_len), {})
        if "fwd_ms" in pola_row and "fwd_ms" in sdpa_row:
            fwd = sdpa_row["fwd_ms"] / pola_row["fwd_ms"]
            cells.append(f"{fwd:.1f}x, {sdpa_row['fwd_bwd_ms'] / pola_row['fwd_bwd_ms']:.1f}x")
        else:
            cells.append("-")
        lines.append(cells)
    widths = [max(len(str(c)) for c in column) for column in zip(header, *lines)]
    render = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([render(header), render(["-" * w for w in widths]), *(render(cells) for cells in lines)])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="JSON file for the list of rows")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--lengths", type=int, nargs="+", help="sequence lengths (default: 1K..64K, up to 200K on CUDA)"
    )
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per row at most (median)")
    parser.add_argument("--repeat-seconds", type=float, default=20.0, help="stop repeating a row after this long")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="skip a row that would run longer")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument("--memory-budget-mb", type=float, help="default: half the available RAM / free GPU memory")
    parser.add_argument("--worker-impl", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-len", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def validate(args: argparse.Namespace) -> None:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device: cuda requested but no CUDA device is available")
    if args.lengths is not None and any(n < 1 for n in args.lengths):
        raise UserError(f"--lengths: must be positive, got {args.lengths}")
    if args.repeats < 1 or args.heads < 1 or args.head_dim < 2 or args.head_dim % 2:
        raise UserError("--repeats, --heads must be >= 1 and --head-dim even (pola splits v in halves)")
    if args.worker_impl is None and args.out is None:
        raise UserError("--out: required (the JSON file to write)")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    validate(args)
    if args.worker_impl is not None:
        print(json.dumps(run_worker(args)), flush=True)
        return

    lengths = args.lengths or list(CUDA_LENGTHS if args.device == "cuda" else CPU_LENGTHS)
    budget_mb = args.memory_budget_mb or default_budget_mb(args.device)
    print(
        f"device {args.device}, dtype {args.dtype}, batch 1, {args.heads} heads x {args.head_dim}, "
        f"threads {args.threads or torch.get_num_threads()}, memory budget {budget_mb:.0f} MB",
        flush=True,
    )
    rows: list[dict] = []
    previous: dict[str, dict] = {}  # last row of each impl that ran or was skipped
    # Length-major order: the impls of one length run back to back, under the same machine load.
    for seq_len in sorted(lengths):
        for impl in args.impls:
            row = run_row(args, impl, seq_len, budget_mb, previous.get(impl))
            rows.append(row)
            print(
                f"  {impl:12s} {seq_len:7d}  {_cell(row)}" + (f"  ({row['reason']})" if "reason" in row else ""),
                flush=True,
            )
            if not row.get("oom"):
                previous[impl] = row
    print()
    print(format_table(rows, args.impls))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
