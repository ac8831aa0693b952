"""The C++ extension of the fused CPU kernels (`csrc/polarity_cpu.cpp`): its build, its operators'
shapes and FLOPs, and which inputs it takes (`usable`, for `dispatch`).

It holds the kernels of GNT's two short polarity attentions and the LePE: the view attention
(`view.cpu_form`), the ray attention and the convolution along the samples of a ray (`ray.cpu_form`),
each point or (ray, head) whole in registers, forward and backward in one pass: no feature tensors,
no elementwise temporaries, one parallel region per call (the PyTorch forms spend most of their time
moving `[points, views, heads, 2d]` tensors through memory and in dozens of short parallel regions,
which also makes them collapse when another process shares the CPU).

The kernels are compiled on first use (`core.cpp_build`: about 20 s, cached per checkout and Python
environment). Without a compiler, or with `POLA_GNT_CPU_KERNELS=0`, `available()` is False and the
callers use the PyTorch forms, which compute the same function.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from pola_gnt.core.cpp_build import build_extension

SOURCE = Path(__file__).resolve().parent / "csrc" / "polarity_cpu.cpp"
_LIBRARY = "pola_gnt_cpu"  # the operators' namespace (TORCH_LIBRARY in the source)


# Whether the extension is built and loaded: None until the first `_load()`. A plain global rather
# than functools.cache, so torch.compile reads it as a constant instead of tracing into the build.
_built: bool | None = None


def _load() -> bool:
    """Compile (or find the cached build of) the extension and register its operators; once per process."""
    global _built
    if _built is None:
        _built = _build()
    return _built


def _build() -> bool:
    if not build_extension(_LIBRARY, SOURCE, "attention"):
        return False
    _register_fake_kernels()
    return True


# Work split of the C++ kernels (`kPointsPerBlock`, `kRaysPerBlock` in csrc/polarity_cpu.cpp): the
# backward kernels return temperature (and LePE weight) gradients as one partial sum per block.
_POINTS_PER_BLOCK = 128
_RAYS_PER_BLOCK = 8


def _blocks(n, per_block: int):
    return torch.sym_max(1, (n + per_block - 1) // per_block)


def _register_fake_kernels() -> None:
    """Shapes of the operators' outputs without running them, so that torch.compile (`model.compile`)
    can trace through the kernels instead of breaking its graph at each call."""
    name = f"{_LIBRARY}::"
    register = torch.library.register_fake

    @register(name + "view_forward")
    def _(q, k, v, temp_same, temp_opp, visible):
        return q.new_empty(q.shape)

    @register(name + "view_backward")
    def _(grad, q, k, v, temp_same, temp_opp, visible):
        temps = q.new_empty(_blocks(q.shape[0], _POINTS_PER_BLOCK), *temp_same.shape)
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), temps, temps.new_empty(temps.shape)

    @register(name + "ray_forward")
    def _(q, k, v, temp_same, temp_opp, visible, heads):
        return q.new_empty(q.shape)

    @register(name + "ray_backward")
    def _(grad, q, k, v, temp_same, temp_opp, visible, heads):
        temps = q.new_empty(_blocks(q.shape[0], _RAYS_PER_BLOCK), *temp_same.shape)
        return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape), temps, temps.new_empty(temps.shape)

    @register(name + "samples_conv_forward")
    def _(x, weight, bias, visible, residual):
        return x.new_empty(x.shape)

    @register(name + "samples_conv_backward")
    def _(grad, x, weight, visible):
        blocks = _blocks(x.shape[0], _RAYS_PER_BLOCK)
        return x.new_empty(x.shape), x.new_empty(blocks, *weight.shape), x.new_empty(blocks, weight.shape[1])


def available() -> bool:
    """Whether the fused CPU kernels can run (compiles them on the first call)."""
    return _load()


# Head dims with a compiled kernel (fixed sizes let the inner loops unroll and vectorise), and the
# most views the view kernel's per-thread buffers hold; other shapes take the PyTorch forms.
HEAD_DIMS = (2, 4, 8, 16, 32, 64)
MAX_VIEWS = 64


def usable(x: Tensor, head_dim: int | None = None, views: int = 1) -> bool:
    """Whether the fused CPU kernels take `x` (already in the compute dtype) with this head dim (the
    attention kernels; None for the LePE convolution, which has none) and, for the view attention,
    this many views. bf16 `x` only without autograd: the forward kernels read bf16 and compute in
    float32 (`render.precision: bf16`), the backward kernels take float32 or float64."""
    dtypes = (
        (torch.float32, torch.float64) if torch.is_grad_enabled() else (torch.float32, torch.float64, torch.bfloat16)
    )
    supported = x.device.type == "cpu" and x.dtype in dtypes
    dims_supported = head_dim is None or head_dim in HEAD_DIMS
    return supported and dims_supported and views <= MAX_VIEWS and available()


def ops():
    """The extension's operators (`torch.ops.pola_gnt_cpu`), built on first use."""
    if not _load():
        raise RuntimeError("pola_gnt: the fused CPU kernels are not available (check `cpu_extension.usable` first)")
    return getattr(torch.ops, _LIBRARY)


# --------------------------------------------------------------------------------------------------
# FLOP counts for `torch.utils.flop_counter.FlopCounterMode` (the benchmarks' GFLOP per ray), which
# cannot look inside a C++ operator. Multiply-adds count 2, as FlopCounterMode counts matmuls;
# elementwise work (the feature maps, sign selections) is not counted, as for every other operator.
# View attention, per (point, view, head, channel): the weight sum and the weighted value, 4 FLOP
# (each channel falls in exactly one stream). Ray attention, per (ray, head, sample): the key
# statistics `[2d, d]` of which each key channel fills one row (2 d^2) and both streams' outputs
# from the d non-zero query features (2 d^2). Backward recomputes the forward and does twice its
# work for the gradients (as a matmul's backward does): 3x the forward. LePE: 2 K per output
# element, its backward (input and weight gradients) twice that.


def view_attention_flops(q_shape, k_shape) -> int:
    """Forward FLOPs of `view_forward` for q `[P, H, d]`, k `[P, V, H, d]`."""
    points, views, heads, d = k_shape
    return 4 * points * views * heads * d


def ray_attention_flops(q_shape, heads: int) -> int:
    """Forward FLOPs of `ray_forward` for q `[R, S, H d]`."""
    rays, samples, dim = q_shape
    d = dim // heads
    return 4 * rays * heads * samples * d * d


def samples_conv_flops(x_shape, weight_shape) -> int:
    """Forward FLOPs of `samples_conv_forward` (the LePE) for x `[R, S, C]`, weight `[K, C]`."""
    rays, samples, channels = x_shape
    return 2 * rays * samples * channels * weight_shape[0]


def register_flop_formulas() -> bool:
    """Teach FlopCounterMode the kernels' FLOPs (see above); False where the kernels are not built."""
    if not available():
        return False
    from torch.utils import flop_counter

    library = ops()
    formulas = {
        library.view_forward: lambda q, k, *args, **kwargs: view_attention_flops(q, k),
        library.view_backward: lambda grad, q, k, *args, **kwargs: 3 * view_attention_flops(q, k),
        library.ray_forward: lambda q, k, v, ts, to, visible, heads, **kwargs: ray_attention_flops(q, heads),
        library.ray_backward: lambda grad, q, k, v, ts, to, visible, heads, **kwargs: 3 * ray_attention_flops(q, heads),
        library.samples_conv_forward: lambda x, weight, *args, **kwargs: samples_conv_flops(x, weight),
        library.samples_conv_backward: lambda grad, x, weight, *args, **kwargs: 2 * samples_conv_flops(x, weight),
    }
    for op, formula in formulas.items():
        if op not in flop_counter.flop_registry:
            flop_counter.register_flop_formula(op)(formula)
    return True
