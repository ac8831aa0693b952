"""Compile the fused Triton attention kernels ahead of time for A100 and H100, on any machine (no GPU):
registers, spills and shared memory of every kernel at the presets' shapes.

    python scripts/triton_aot.py [--matrix presets|full] [--targets sm_80 sm_90] [--out rows.json]

Every launch the attention modules make at a preset's shapes is recorded (`triton_common.
recorded_launches`): the pola view and ray attention modules run forward and backward on `meta`
tensors (no memory, nothing computed), with each op's dispatch taking its CUDA branch. The presets'
sizes come from `conf/` (`experiment=quick`: head dim 8, 4 views, 32 samples; `standard` and `paper`:
head dim 16, 10 views, 192 samples), in fp32, bf16 and fp16. `--matrix full` adds the linear op's
kernels (rays longer than the ray kernel's `MAX_SAMPLES` fall back to it; the attention benchmark's
4 heads of 32) and head dims 32, 64 and 128 for every kernel.

Each distinct specialisation is compiled with `triton.compile` for `GPUTarget("cuda", 80 | 90, 32)`
(`triton_common.compile_launch`: the launcher's own argument specialisation, through Triton's cache),
and its PTX assembled by the `ptxas` that ships in the triton wheel with `-v`, which reports registers,
stack frame and spill bytes per thread (the reports are cached beside Triton's cache, by the PTX's
digest). Shared memory is Triton's (`metadata.shared`), against each GPU's limit per block.

The table (one row per kernel, dtype, head dim and target; the largest figures over its
specialisations) is what `docs/benchmarks.md` shows; `tests/test_triton_aot.py` holds the presets to
it (every kernel compiles, fits the shared memory, no spills).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from pola_gnt.core.errors import UserError, exit_on_user_error

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Target:
    """A GPU the kernels are compiled for: compute capability and shared memory per block (opt-in)."""

    name: str
    gpu: str
    capability: int
    shared_limit: int  # bytes
    multiprocessors: int


TARGETS = {
    "sm_80": Target("sm_80", "A100", 80, 163 * 1024, 108),
    "sm_90": Target("sm_90", "H100", 90, 227 * 1024, 132),
}


@dataclass(frozen=True)
class Case:
    """One set of attention shapes: the modules' (`view`, `ray`) or the linear op's (`linear`)."""

    label: str  # where the shapes come from: a preset, or what else reaches the kernel
    op: str  # "modules" (view + ray attention) or "linear"
    width: int
    heads: int
    views: int
    samples: int  # per ray (modules); sequence length (linear)
    rays: int  # rays (modules); batch (linear)
    dtype: str

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


@dataclass(frozen=True)
class Row:
    """One compiled specialisation of a kernel for one target."""

    kernel: str
    label: str
    dtype: str
    head_dim: int
    target: str
    registers: int
    spill_stores: int  # bytes per thread
    spill_loads: int
    stack: int  # bytes per thread (spills and local arrays)
    shared: int  # bytes per block
    shared_limit: int
    num_warps: int
    dots: str  # how its dots lower: wgmma, mma (tensor cores) or fma

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


def preset_cases(presets: tuple[str, ...] = ("quick", "standard", "paper")) -> list[Case]:
    """The attention shapes of each preset (`conf/experiment/*.yaml` with Pola-GNT's model), each dtype."""
    from pola_gnt.runs.config.app import compose_config
    from pola_gnt.runs.config.read import read_run_settings

    cases = []
    for preset in presets:
        settings = read_run_settings(compose_config(f"experiment={preset}", "model=pola_gnt", "trainer=cpu"))
        net, data = settings.model.net, settings.data
        for dtype in DTYPES:
            shapes = (net.width, net.heads, data.num_source_views, settings.render.n_samples, data.rays_per_step)
            cases.append(Case(preset, "modules", *shapes, dtype))
    return cases


def full_cases(head_dims: tuple[int, ...] = (32, 64, 128), dtypes: tuple[str, ...] = tuple(DTYPES)) -> list[Case]:
    """The presets, plus the linear op (long rays of the presets' heads, the attention benchmark's 4 x
    32 heads) and every kernel at `head_dims`, in `dtypes`."""
    from pola_gnt.attention.ray.triton_form import MAX_SAMPLES

    cases = preset_cases()
    for dtype in dtypes:
        for width in (32, 64):  # quick's and standard's heads on rays too long for the ray kernel
            cases.append(Case(f"long rays d={width // 4}", "linear", width, 4, 1, MAX_SAMPLES + 64, 64, dtype))
        cases.append(Case("bench_attention", "linear", 128, 4, 1, 4096, 1, dtype))
        for head_dim in head_dims:
            cases.append(Case(f"d={head_dim}", "modules", 4 * head_dim, 4, 10, 192, 64, dtype))
            cases.append(Case(f"d={head_dim}", "linear", 4 * head_dim, 4, 1, 1000, 2, dtype))
    return cases


@contextlib.contextmanager
def cuda_dispatch() -> Iterator[None]:
    """Every op's dispatch takes its CUDA branch for `meta` tensors where a Triton lookup finds its
    kernel (the op's limits of dtype, head dim and length hold), and no first-use check runs (nothing
    is computed on `meta`). Ops without a Triton form (the LePE) run their PyTorch form; where an op's
    kernel does not take the inputs, a stand-in of the output's shape (the first input's, on the
    autograd graph) replaces its PyTorch form: only the kernels' launches count."""
    from pola_gnt.attention import triton_lookup
    from pola_gnt.attention.linear import op as linear_op
    from pola_gnt.attention.linear import triton_form as linear_form
    from pola_gnt.attention.ray import op as ray_op
    from pola_gnt.attention.ray import triton_form as ray_form
    from pola_gnt.attention.view import op as view_op
    from pola_gnt.attention.view import triton_form as view_form

    def dispatch(inputs, *, pytorch, triton=None, triton_lookup=None, fused=True, **_):
        if triton is None or triton_lookup is None:
            return pytorch()
        kernel = triton_lookup() if fused else None
        return inputs[0].clone() if kernel is None else triton(kernel)

    replacements = [(op, "dispatch", dispatch) for op in (linear_op, ray_op, view_op)]
    replacements.append((triton_lookup, "passes_check", lambda *args, **kwargs: True))
    on_gpu_or_meta = lambda x: x.is_cuda or x.is_meta  # noqa: E731  (the forms' device test)
    replacements += [(form, "on_kernel_device", on_gpu_or_meta) for form in (linear_form, ray_form, view_form)]
    saved = [(module, name, getattr(module, name)) for module, name, _ in replacements]
    try:
        for module, name, value in replacements:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def record_case(case: Case, target: Target) -> list[Any]:
    """The Triton launches of `case` (forward and backward) as the modules or the linear op make them
    on a GPU like `target` (its SM count sets the linear op's split reductions)."""
    from pola_gnt.attention.linear.triton_form import polarity_attention_triton
    from pola_gnt.attention.modules import PolaRayAttention, PolaViewAttention
    from pola_gnt.attention.triton_common import recorded_launches

    dtype = DTYPES[case.dtype]
    with cuda_dispatch(), recorded_launches() as launches, torch.device("meta"):
        if case.op == "modules":
            points = case.rays * case.samples
            view = PolaViewAttention(case.width, case.heads).to(dtype)
            ray = PolaRayAttention(case.width, case.heads).to(dtype)
            query = torch.empty(points, case.width, dtype=dtype, requires_grad=True)
            tokens = torch.empty(points, case.views, case.width, dtype=dtype, requires_grad=True)
            directions = torch.empty(points, case.views, 4, dtype=dtype)
            view(query, tokens, directions, torch.empty(points, case.views, dtype=torch.bool)).sum().backward()
            samples = torch.empty(case.rays, case.samples, case.width, dtype=dtype, requires_grad=True)
            ray(samples, torch.empty(case.rays, case.samples, dtype=torch.bool)).sum().backward()
        else:
            shape = (case.rays, case.heads, case.samples, case.head_dim)
            q, k, v = (torch.empty(shape, dtype=dtype, requires_grad=True) for _ in range(3))
            temps = [torch.empty(case.heads, 1, 2 * case.head_dim, requires_grad=True) for _ in range(2)]
            mask = torch.empty(shape[:-1], dtype=torch.bool)
            temp_same, temp_opp = temps
            out = polarity_attention_triton(q, k, v, temp_same, temp_opp, mask, multiprocessors=target.multiprocessors)
            out.sum().backward()
    return launches


def specialisation(launch: Any) -> tuple:
    """What Triton compiles a launch for: each argument's dtype and 16-byte alignment (tensors) or
    whether it is 1 or a multiple of 16 (integers), and the options."""

    def key(arg: Any) -> Any:
        if isinstance(arg, torch.Tensor):
            return (str(arg.dtype), arg.data_ptr() % 16 == 0)
        if isinstance(arg, bool) or not isinstance(arg, int):
            return repr(arg)
        return ("int", arg == 1, arg % 16 == 0, -(2**31) <= arg < 2**31)

    return (launch.name, tuple(key(arg) for arg in launch.args), tuple(sorted(map(str, launch.options.items()))))


def ptxas_report(ptx: str, target: Target) -> dict[str, int]:
    """`ptxas -v`'s registers, stack frame and spill bytes per thread for `ptx` on `target`, with the
    flags Triton assembles with (cached beside Triton's cache by the PTX's digest)."""
    from triton import knobs
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(target.capability).path
    arch = sm_arch_from_capability(target.capability)
    flags = ["-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name={arch}"]
    digest = hashlib.sha256("\0".join([ptx, ptxas, *flags]).encode()).hexdigest()
    cached = Path(knobs.cache.dir) / "pola_gnt_ptxas" / f"{digest}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    folder = cached.parent
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{digest}.ptx"
    source.write_text(ptx)
    try:
        result = subprocess.run(
            [ptxas, *flags, str(source), "-o", str(folder / f"{digest}.cubin")], capture_output=True, text=True
        )
    finally:
        source.unlink(missing_ok=True)
        (folder / f"{digest}.cubin").unlink(missing_ok=True)
    if result.returncode != 0:
        raise RuntimeError(f"ptxas failed for {arch}: {result.stderr.strip()}")
    log = result.stderr

    def number(pattern: str) -> int:
        found = re.search(pattern, log)
        return int(found.group(1)) if found else 0

    report = {
        "registers": number(r"Used (\d+) registers"),
        "stack": number(r"(\d+) bytes stack frame"),
        "spill_stores": number(r"(\d+) bytes spill stores"),
        "spill_loads": number(r"(\d+) bytes spill loads"),
    }
    temporary = cached.with_suffix(".tmp")
    temporary.write_text(json.dumps(report))
    temporary.replace(cached)
    return report


def dot_kind(ptx: str) -> str:
    """How the kernel's matrix products lower: `wgmma` (Hopper), `mma` (mma.sync tensor cores) or `fma`."""
    if "wgmma" in ptx:
        return "wgmma"
    if "mma.sync" in ptx:
        return "mma"
    return "fma"


def compile_rows(cases: list[Case], targets: list[Target], progress: bool = False) -> list[Row]:
    """Every distinct specialisation of `cases`' launches compiled for each target, one `Row` each."""
    from triton.backends.compiler import GPUTarget

    from pola_gnt.attention.triton_common import compile_launch

    rows = []
    for target in targets:
        gpu_target = GPUTarget("cuda", target.capability, 32)
        seen: set[tuple] = set()
        for case in cases:
            for launch in record_case(case, target):
                key = specialisation(launch)  # `paper`'s are `standard`'s: compiled once
                if key in seen:
                    continue
                seen.add(key)
                started = time.monotonic()
                compiled = compile_launch(launch, gpu_target)
                ptx = compiled.asm["ptx"]
                report = ptxas_report(ptx, target)
                rows.append(
                    Row(
                        kernel=launch.name,
                        label=case.label,
                        dtype=case.dtype,
                        head_dim=case.head_dim,
                        target=target.name,
                        shared=compiled.metadata.shared,
                        shared_limit=target.shared_limit,
                        num_warps=compiled.metadata.num_warps,
                        dots=dot_kind(ptx),
                        **report,
                    )
                )
                if progress:
                    row = rows[-1]
                    print(
                        f"  {target.name} {row.kernel} {case.label} {case.dtype}: {row.registers} registers, "
                        f"{row.spills} B spills ({time.monotonic() - started:.1f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
    return rows


def table(rows: list[Row]) -> str:
    """A markdown table: one line per kernel, dtype, head dim and target (largest figures over its
    specialisations and the shapes that reach it)."""
    grouped: dict[tuple, list[Row]] = {}
    for row in rows:
        grouped.setdefault((row.kernel, row.dtype, row.head_dim, row.target), []).append(row)
    header = "| kernel | dtype | head dim | target | registers | spill stores / loads (B) | shared (KB) | dots |"
    lines = [header, "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    order = {name: i for i, name in enumerate(DTYPES)}
    for key in sorted(grouped, key=lambda k: (k[2], k[0], order.get(k[1], 9), k[3])):
        group = grouped[key]
        kernel, dtype, head_dim, target = key
        registers = max(r.registers for r in group)
        stores, loads = max(r.spill_stores for r in group), max(r.spill_loads for r in group)
        shared = max(r.shared for r in group)
        over = " (over the limit)" if shared > group[0].shared_limit else ""
        dots = "/".join(sorted({r.dots for r in group}))
        lines.append(
            f"| `{kernel}` | {dtype} | {head_dim} | {target} | {registers} | {stores} / {loads} | "
            f"{shared / 1024:.1f}{over} | {dots} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--matrix", choices=("presets", "full"), default="presets")
    parser.add_argument("--targets", nargs="+", choices=tuple(TARGETS), default=list(TARGETS))
    parser.add_argument("--out", type=Path, help="JSON file for every compiled specialisation")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        import triton  # noqa: F401
    except ImportError as error:
        raise UserError(f"triton does not import ({error}): it comes with the CUDA builds of torch") from error
    started = time.monotonic()
    cases = full_cases() if args.matrix == "full" else preset_cases()
    rows = compile_rows(cases, [TARGETS[name] for name in args.targets], progress=True)
    import triton

    print(f"triton {triton.__version__}, {len(rows)} specialisations, {time.monotonic() - started:.0f} s")
    print(table(rows))
    if args.out is not None:
        from pola_gnt.core.files import write_atomic

        write_atomic(args.out, (json.dumps([asdict(row) for row in rows], indent=1) + "\n").encode())
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
