"""Benchmark attention implementations over sequence length: time and peak memory.

    python scripts/bench_attention.py --out bench.json [--device cpu|cuda] [--lengths 1024 4096 ...]
        [--suite ops|layers] [--impls ...] [--repeats 3] [--heads 4] [--head-dim 32] [--dtype fp32|bf16|fp16]

Implementations, `--suite ops` (the default; batch 1, `heads` x `head-dim`, self-attention over N
tokens, the attention alone on given q, k, v):
    pola         polarity_attention, linear form (on CUDA the fused Triton kernel when available)
    softmax      torch.nn.functional.scaled_dot_product_attention
    vanilla      explicit N x N scores + softmax in plain PyTorch
    relu_linear  plain ReLU linear attention, normalised
`--suite layers` (whole attention layers on tokens x `[1, N, heads * head-dim]`, projections included;
default lengths 1K, 4K, 16K, 64K, and 200K on CUDA):
    pola_layer   pola_gnt.attention.PolarityAttention (q, gate, k, v projections, the polarity attention
                 through its dispatch, 1-D LePE, output projection)
    sdpa_layer   the same multi-head layout with F.scaled_dot_product_attention: a `Linear(dim, 3 dim)`
                 q, k, v projection and a `Linear(dim, dim)` output projection (nn.MultiheadAttention's
                 parameters; pola_layer has one dim x dim projection more, its gate, and the LePE)
    mha_layer    torch.nn.MultiheadAttention(dim, heads, batch_first=True) called as `mha(x, x, x)`,
                 i.e. with its default `need_weights=True`: it forms the N x N weights (averaged over
                 heads) and so takes the explicit path, quadratic in memory (past the memory budget its
                 rows are `oom` by estimate, with the estimate printed)

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
from torch import nn

from pola_gnt.core.errors import UserError, exit_on_user_error
from pola_gnt.core.process import M_MMAP_THRESHOLD, configure_cpu_allocator, mallopt

OP_IMPLS = ("pola", "softmax", "vanilla", "relu_linear")
LAYER_IMPLS = ("pola_layer", "sdpa_layer", "mha_layer")
IMPLS = OP_IMPLS + LAYER_IMPLS
SUITES = {"ops": OP_IMPLS, "layers": LAYER_IMPLS}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CPU_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
CUDA_LENGTHS = CPU_LENGTHS + (131072, 200000)
LAYER_CPU_LENGTHS = (1024, 4096, 16384, 65536)
LAYER_CUDA_LENGTHS = LAYER_CPU_LENGTHS + (200000,)
# The ratio columns of the table: (impl, baseline), the baseline's time and memory over the impl's.
RATIOS = (("pola", "softmax"), ("pola_layer", "sdpa_layer"), ("pola_layer", "mha_layer"))
# Time growth per doubling of the length, used to skip rows that would exceed --max-seconds.
QUADRATIC_IMPLS = ("softmax", "vanilla", "sdpa_layer", "mha_layer")
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


# --------------------------------------------------------------------------------------------------
# The layers (`--suite layers`): modules over x [1, N, dim] -> [1, N, dim]


class SdpaAttention(nn.Module):
    """Multi-head self-attention with nn.MultiheadAttention's projections (`Linear(dim, 3 dim)` for q,
    k, v, `Linear(dim, dim)` out) around `F.scaled_dot_product_attention` (on the CPU its flash
    kernel, on CUDA FlashAttention where it applies)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2))


class MultiheadAttention(nn.Module):
    """`nn.MultiheadAttention` as it is usually called, `mha(x, x, x)` (need_weights=True)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x)[0]


def build_layer(impl: str, dim: int, heads: int) -> nn.Module:
    if impl == "pola_layer":
        from pola_gnt.attention import PolarityAttention

        return PolarityAttention(dim, heads)
    return {"sdpa_layer": SdpaAttention, "mha_layer": MultiheadAttention}[impl](dim, heads)


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
    if impl in LAYER_IMPLS:  # x and its gradient, the projections' outputs and gradients, fp32 copies
        layer = 16 * tokens * itemsize + 8 * fp32_tokens + 64 * 2**20
        # MHA's explicit path: scores, probabilities, their gradients and the head-averaged weights.
        return layer + (4 * scores + scores // heads if impl == "mha_layer" else 0)
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


def _layer_inputs(seq_len: int, dim: int, dtype: torch.dtype, device: str):
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(1, seq_len, dim, generator=gen, device=device, dtype=dtype).requires_grad_()
    return (x,), torch.randn(1, seq_len, dim, generator=gen, device=device, dtype=dtype)


def run_worker(args: argparse.Namespace) -> dict:
    impl, seq_len, device, dtype = args.worker_impl, args.worker_len, args.device, DTYPES[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    if impl in LAYER_IMPLS:
        dim = args.heads * args.head_dim
        torch.manual_seed(0)
        function: Callable = build_layer(impl, dim, args.heads).to(device=device, dtype=dtype)
        make_inputs = lambda n: _layer_inputs(n, dim, dtype, device)  # noqa: E731
    else:
        function = IMPL_FUNCTIONS[impl]
        make_inputs = lambda n: _inputs(n, args.heads, args.head_dim, dtype, device)  # noqa: E731
    on_cpu = device == "cpu" and mallopt(M_MMAP_THRESHOLD, 64 * 1024)

    def step(inputs, grad_out, backward: bool) -> None:
        if backward:
            function(*inputs).backward(grad_out)
        else:
            with torch.no_grad():
                function(*inputs)

    warm_inputs, warm_grad = make_inputs(WARMUP_LENGTH)
    step(warm_inputs, warm_grad, True)
    step(warm_inputs, warm_grad, False)
    del warm_inputs, warm_grad

    # Peak memory excludes what exists before the pass: the inputs, the output gradient and a
    # layer's parameters (not their gradients, which the pass allocates).
    inputs, grad_out = make_inputs(seq_len)
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
    if impl in ("pola", "pola_layer") and device == "cuda":
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
            "reason": f"not run: estimated {needed_mb:.0f} MB > memory budget {budget_mb:.0f} MB",
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


def ratios(row: dict | None, baseline: dict | None) -> dict[str, float] | None:
    """The baseline's fwd time, fwd+bwd time and peak memory over the row's (above 1: the row's impl
    is faster / smaller), or None where either did not run."""
    if not row or not baseline or "fwd_ms" not in row or "fwd_ms" not in baseline:
        return None
    return {
        "fwd": baseline["fwd_ms"] / row["fwd_ms"],
        "fwd_bwd": baseline["fwd_bwd_ms"] / row["fwd_bwd_ms"],
        "memory": baseline["peak_mem_mb"] / row["peak_mem_mb"] if row["peak_mem_mb"] > 0 else float("nan"),
    }


def format_table(rows: list[dict], impls: list[str]) -> str:
    """One line per length: fwd / fwd+bwd time and peak memory per impl, then for each pair of
    `RATIOS` among `impls` the baseline's over the impl's (fwd, fwd+bwd, memory)."""
    by_key = {(row["impl"], row["seq_len"]): row for row in rows}
    lengths = sorted({row["seq_len"] for row in rows})
    pairs = [(impl, baseline) for impl, baseline in RATIOS if impl in impls and baseline in impls]
    header = ["seq_len", *impls, *(f"{baseline} / {impl} (fwd, fwd+bwd, memory)" for impl, baseline in pairs)]
    lines = []
    for seq_len in lengths:
        cells = [str(seq_len), *(_cell(by_key.get((impl, seq_len))) for impl in impls)]
        for impl, baseline in pairs:
            found = ratios(by_key.get((impl, seq_len)), by_key.get((baseline, seq_len)))
            cells.append(
                "-" if found is None else ", ".join(f"{found[key]:.2f}x" for key in ("fwd", "fwd_bwd", "memory"))
            )
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
    parser.add_argument("--suite", choices=tuple(SUITES), default="ops", help="the default impls and lengths")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, help="default: the suite's")
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

    if args.impls is None:
        args.impls = list(SUITES[args.suite])
    if args.suite == "layers":
        default_lengths = LAYER_CUDA_LENGTHS if args.device == "cuda" else LAYER_CPU_LENGTHS
    else:
        default_lengths = CUDA_LENGTHS if args.device == "cuda" else CPU_LENGTHS
    lengths = args.lengths or list(default_lengths)
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
