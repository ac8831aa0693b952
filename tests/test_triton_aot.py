"""The fused Triton kernels compiled ahead of time for the GPUs they are meant for, on this CPU: every
launch the attention modules make at the presets' shapes (`scripts/triton_aot.py`: recorded on `meta`
tensors, compiled for A100 (sm_80) and H100 (sm_90) with `triton.compile`, assembled by the wheel's
`ptxas -v`) compiles, fits the GPU's shared memory and spills nothing; a kernel a GPU cannot launch is
refused by its lookup with the reason, before its first-use check.

No GPU is needed. Triton's cache keeps the compiled kernels (and `triton_aot` the ptxas reports), so
a second run takes seconds; the first about two minutes on two cores. `-m slow` compiles the linear
op's kernels and every kernel at head dims 32 and 64 too.
"""

from __future__ import annotations

import re
import subprocess
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "triton", reason="triton comes with the CUDA builds of torch; without it there is nothing to compile"
)

from helpers import load_script  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402

from pola_gnt.attention import triton_lookup  # noqa: E402
from pola_gnt.attention.ray import op as ray_op  # noqa: E402
from pola_gnt.attention.ray import triton_form as ray_form  # noqa: E402
from pola_gnt.attention.triton_common import compile_launch  # noqa: E402

if not Path(get_ptxas(90).path).is_file():
    pytest.skip("the triton wheel ships no ptxas here: registers and spills cannot be read", allow_module_level=True)

aot = load_script("triton_aot")

# Spill bytes (stores + loads, per thread) allowed at the presets, every kernel, both GPUs.
PRESET_SPILL_BUDGET = 0
PRESET_KERNELS = {
    "_view_forward_kernel",
    "_view_backward_kernel",
    "_ray_forward_kernel",
    "_ray_query_grad_kernel",
    "_ray_key_grad_kernel",
}


@pytest.fixture(scope="module")
def preset_rows() -> list:
    return aot.compile_rows(aot.preset_cases(), list(aot.TARGETS.values()))


def test_every_preset_launch_is_recorded_and_narrow_heads_fill_the_dots():
    """Each preset's forward and backward launch all five kernels, at head dim 8 (quick) and 16
    (standard, paper); the ray kernels pack quick's heads two by two into 16-wide tiles (half the
    programs of one head each), standard's one per program, with no padding lane either way."""
    cases = aot.preset_cases()
    assert {(case.label, case.head_dim) for case in cases} == {("quick", 8), ("standard", 16), ("paper", 16)}
    assert {case.dtype for case in cases} == {"fp32", "bf16", "fp16"}
    for case in cases:
        launches = aot.record_case(case, aot.TARGETS["sm_90"])
        assert {launch.name for launch in launches} == PRESET_KERNELS, case
        for launch in launches:
            if launch.name.startswith("_ray"):
                group = 16 // case.head_dim
                assert launch.grid == (case.rays, case.heads // group), (case, launch.grid)
                assert launch.options["BLOCK_D"] == group * case.head_dim == 16
                assert launch.options["GROUP"] == group


def test_preset_kernels_compile_fit_and_do_not_spill(preset_rows):
    """sm_80 and sm_90, fp32 / bf16 / fp16, forward and backward: shared memory within each GPU's
    limit, no spills (the table in docs/benchmarks.md)."""
    compiled = {(row.kernel, row.dtype, row.head_dim, row.target) for row in preset_rows}
    expected = {
        (kernel, dtype, head_dim, target)
        for kernel in PRESET_KERNELS
        for dtype in aot.DTYPES
        for head_dim in (8, 16)
        for target in aot.TARGETS
    }
    assert compiled == expected
    for row in preset_rows:
        assert row.shared <= aot.TARGETS[row.target].shared_limit, row
        assert row.spills <= PRESET_SPILL_BUDGET and row.stack == 0, row
        assert 0 < row.registers <= 255, row
    print()
    print(aot.table(preset_rows))


def _signature(ttir: str, kernel: str) -> str:
    """The parameter list of `kernel`'s `tt.func` in Triton's TTIR."""
    found = re.search(rf"tt\.func public @{kernel}\((.*?)\) attributes", ttir, re.DOTALL)
    assert found is not None, kernel
    return found.group(1)


def test_compiled_variants_are_the_jits_specialisations(preset_rows):
    """The AOT compiles are the variants a GPU's JIT makes at the presets' shapes: every integer
    argument divisible by 16 carries `tt.divisibility = 16`, one equal to 1 is a constant (gone from
    the signature), any other integer has no attribute, and every pointer is 16-byte aligned; worked
    out here from the recorded arguments' values, and read from the compiled TTIR. (`preset_rows`:
    the compiles are in Triton's cache.)"""
    checked = 0
    for name, target in aot.TARGETS.items():
        seen: set[tuple] = set()
        for case in aot.preset_cases():
            for launch in aot.record_case(case, target):
                if aot.specialisation(launch) in seen:  # `paper`'s launches are `standard`'s
                    continue
                seen.add(aot.specialisation(launch))
                ttir = compile_launch(launch, GPUTarget("cuda", target.capability, 32)).asm["ttir"]
                signature = _signature(ttir, launch.name)
                params = [param for param in launch.kernel.params if not param.is_constexpr]
                for param, value in zip(params, launch.args):
                    declared = re.search(rf"%{param.name}: ([^ ]+)( \{{[^}}]*\}})? loc", signature)
                    if isinstance(value, torch.Tensor):
                        assert declared and "tt.divisibility = 16" in (declared.group(2) or ""), (
                            launch.name,
                            param.name,
                        )
                    elif isinstance(value, int) and value == 1:
                        assert declared is None, (name, launch.name, param.name)
                    elif isinstance(value, int):
                        divisible = "tt.divisibility = 16" in ((declared and declared.group(2)) or "")
                        assert declared and divisible == (value % 16 == 0), (name, launch.name, param.name, value)
                        checked += value % 16 == 0
    assert checked > 0


def test_the_fp32_ray_kernels_keep_headroom_under_a_128_register_cap():
    """The fp32 ray forward and query-gradient kernels at the presets (8 warps at 16-wide tiles) fit
    in 128 registers a thread without spilling on either GPU (`maxnreg=128`, a cap no launch sets:
    the margin below the edge where, with 4 warps, the H100's query-gradient kernel spilled)."""
    for target in aot.TARGETS.values():
        for case in aot.preset_cases(("quick", "standard")):
            if case.dtype != "fp32":
                continue
            for launch in aot.record_case(case, target):
                if launch.name not in ("_ray_forward_kernel", "_ray_query_grad_kernel"):
                    continue
                assert launch.options["num_warps"] == 8, launch.name
                capped = replace(launch, options={**launch.options, "maxnreg": 128})
                report = aot.ptxas_report(
                    compile_launch(capped, GPUTarget("cuda", target.capability, 32)).asm["ptx"], target
                )
                assert report["spill_stores"] + report["spill_loads"] == 0 and report["registers"] <= 128, (
                    target.name,
                    case.label,
                    launch.name,
                    report,
                )


def test_ptxas_reports_on_the_code_triton_assembled(tmp_path):
    """The registers `triton_aot` reads from its own `ptxas -v` run are those of the cubin Triton
    built (cuobjdump's resource usage): same PTX, same flags."""
    cuobjdump = Path(get_ptxas(90).path).with_name("cuobjdump")
    if not cuobjdump.is_file():
        pytest.skip("the triton wheel ships no cuobjdump")
    case = next(case for case in aot.preset_cases(("standard",)) if case.dtype == "bf16")
    target = aot.TARGETS["sm_90"]
    for launch in aot.record_case(case, target):
        compiled = compile_launch(launch, GPUTarget("cuda", 90, 32))
        report = aot.ptxas_report(compiled.asm["ptx"], target)
        cubin = tmp_path / f"{launch.name}.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
        registers = int(re.search(r"REG:(\d+)", usage).group(1))  # type: ignore[union-attr]
        assert registers == report["registers"], (launch.name, usage)


def test_the_spill_check_sees_spills():
    """Control: the ray query-gradient kernel with the tensor cores' TF32 layouts, 32-row tiles and 4
    warps (the configuration it left because it spilled) does spill, so the preset test's zero is measured."""
    case = next(case for case in aot.preset_cases(("standard",)) if case.dtype == "bf16")
    target = aot.TARGETS["sm_80"]
    launch = next(launch for launch in aot.record_case(case, target) if launch.name == "_ray_query_grad_kernel")
    assert launch.options["DOT_PRECISION"] == "ieee" and launch.options["BLOCK_S"] == 16
    assert launch.options["num_warps"] == 8
    spilling = replace(launch, options={**launch.options, "DOT_PRECISION": "tf32", "BLOCK_S": 32, "num_warps": 4})
    report = aot.ptxas_report(compile_launch(spilling, GPUTarget("cuda", 80, 32)).asm["ptx"], target)
    assert report["spill_stores"] > PRESET_SPILL_BUDGET and report["registers"] == 255, report


def test_a_kernel_the_gpu_cannot_launch_is_refused_before_its_check(monkeypatch):
    """The ray kernel at fp32, head dim 128 needs more shared memory than an A100's 163 KB: its lookup
    refuses it with the reason and runs no first-use check; at head dim 16 it fits and goes on to it."""
    checks = []
    monkeypatch.setattr(triton_lookup, "_checked", {})
    monkeypatch.delenv(triton_lookup.DISABLE_VARIABLE, raising=False)
    monkeypatch.setattr(ray_form, "ray_triton_supported", lambda *args: True)  # CPU tensors stand in for CUDA ones
    real_check = ray_op._check_triton

    def check(device, *args):
        if device.type != "meta":  # the real check would run the kernel; here only whether it is reached
            checks.append(args)
            return
        real_check(device, *args)

    monkeypatch.setattr(ray_op, "_check_triton", check)
    q = torch.zeros(3, 9, 2 * 128)

    monkeypatch.setattr(triton_lookup, "device_limits", lambda device: (GPUTarget("cuda", 80, 32), 163 * 1024))
    reason = "cannot run on cpu .*head dim 128.*: its kernel _ray_.* needs .* KB of shared memory per block"
    with pytest.warns(RuntimeWarning, match=reason + ", the GPU has 163 KB"):
        assert ray_op.triton_kernel(q, 2) is None
    assert checks == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused once: remembered
        assert ray_op.triton_kernel(q, 2) is None

    assert ray_op.triton_kernel(torch.zeros(3, 9, 2 * 16), 2) is ray_form.polarity_ray_attention_triton
    assert checks == [(torch.float32, 16, 2)]


@pytest.mark.slow
def test_wider_heads_and_the_linear_op_compile_and_fit_or_are_refused():
    """Beyond the presets: the linear op's kernels (long rays, the attention benchmark's heads) and
    every kernel at head dims 32 and 64, fp32 and bf16 (fp16 lowers as bf16), compile for both GPUs;
    where one needs more shared memory than a GPU has, its op's lookup refuses that (dtype, head dim).
    Head dim 128 (minutes a kernel to compile, spilling everywhere): `scripts/triton_aot.py --matrix
    full` and the A100 refusal above."""
    from pola_gnt.attention.linear import op as linear_op
    from pola_gnt.attention.view import op as view_op

    rows = aot.compile_rows(aot.full_cases(head_dims=(32, 64), dtypes=("fp32", "bf16")), list(aot.TARGETS.values()))
    print()
    print(aot.table(rows))
    kernels = {row.kernel for row in rows}
    assert kernels >= PRESET_KERNELS | {
        "_key_state_kernel",
        "_output_kernel",
        "_query_state_grad_kernel",
        "_query_grad_kernel",
        "_key_grad_kernel",
    }

    def record(kernel: str, dtype: torch.dtype, head_dim: int):
        if kernel.startswith("_ray"):
            return lambda device: ray_op._check_triton(device, dtype, head_dim, 2)
        if kernel.startswith("_view"):
            return lambda device: view_op._check_triton(device, dtype, head_dim)
        return lambda device: linear_op._check_triton(device, dtype, head_dim)

    for row in rows:
        if row.shared > row.shared_limit:
            target = aot.TARGETS[row.target]
            refusal = triton_lookup.launch_refusal(
                record(row.kernel, aot.DTYPES[row.dtype], row.head_dim),
                GPUTarget("cuda", target.capability, 32),
                target.shared_limit,
            )
            assert refusal is not None, row
