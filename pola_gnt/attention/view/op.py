"""The view attention op, `polarity_view_attention`: one query per point over its few keys (GNT's
view attention), heads in place. Its forms compute the same function: the fused Triton kernel on
CUDA (`triton_form`), the fused C++ kernel on the CPU (`cpu_form`), else the PyTorch form
(`pytorch_form`, which also writes out the math); `dispatch` picks one.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from pola_gnt.attention import triton_lookup
from pola_gnt.attention.dispatch import Kernel, dispatch
from pola_gnt.attention.features import check_even_head_dim, compute_precision
from pola_gnt.attention.reference import polarity_attention_reference
from pola_gnt.attention.view.cpu_form import polarity_view_attention_cpu
from pola_gnt.attention.view.pytorch_form import polarity_view_attention_pytorch


def _broadcasts_to(x: Tensor, shape: tuple[int, int]) -> bool:
    """Whether `x.expand(shape)` works (per-point temperatures, say, do not go to the fused kernels)."""
    return x.dim() <= len(shape) and all(size in (1, want) for size, want in zip(x.shape[::-1], shape[::-1]))


def polarity_view_attention(
    q: Float[Tensor, "*batch heads d"],
    k: Float[Tensor, "*batch keys heads d"],
    v: Float[Tensor, "*batch keys heads d"],
    temp_same: Float[Tensor, "*temps 2*d"],
    temp_opp: Float[Tensor, "*temps 2*d"],
    key_mask: Bool[Tensor, "*batch keys"] | None = None,
) -> Float[Tensor, "*batch heads d"]:
    """Polarity attention of one query per point over its keys (`view.pytorch_form` has the math).

    Args:
        q: `[..., heads, d]` one query per point (d even).
        k, v: `[..., keys, heads, d]`.
        temp_same, temp_opp: `[heads, 2d]` temperatures (broadcastable to `[..., heads, 2d]`).
        key_mask: bool `[..., keys]`, True where a key may be attended; a point whose keys are all
            masked gets zeros.

    Returns:
        `[..., heads, d]` in the dtype of `q`, equal to `polarity_attention` with one query:
        channels `[0, d/2)` the same-sign stream, `[d/2, d)` the opposite-sign stream.
    """
    if k.shape != v.shape or k.shape[:-3] + k.shape[-2:] != q.shape:
        raise ValueError(
            f"expected q [..., heads, d], k and v [..., keys, heads, d]; got {q.shape}, {k.shape}, {v.shape}"
        )
    check_even_head_dim(q)
    if key_mask is not None and (key_mask.dtype != torch.bool or key_mask.shape != k.shape[:-2]):
        raise ValueError(f"key_mask must be bool {tuple(k.shape[:-2])}, got {key_mask.dtype} {tuple(key_mask.shape)}")
    heads, d = q.shape[-2:]
    views = k.shape[-3]
    batch = q.shape[:-2]
    temperature_shape = (heads, 2 * d)

    def flat(queries: Tensor, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The kernels' layout: points flattened, `[P, heads, d]` and `[P, keys, heads, d]`."""
        return queries.reshape(-1, heads, d), keys.reshape(-1, views, heads, d), values.reshape(-1, views, heads, d)

    def triton(kernel: Kernel) -> Tensor:  # reads every input dtype, computes in fp32 itself
        visible = None if key_mask is None else key_mask.reshape(-1, views).to(torch.float32)
        temps = (temp_same.expand(temperature_shape), temp_opp.expand(temperature_shape))
        return kernel(*flat(q, k, v), *temps, visible).reshape(q.shape)

    def cpu(q_: Tensor, k_: Tensor, v_: Tensor, temp_same_: Tensor, temp_opp_: Tensor) -> Tensor:
        visible = None if key_mask is None else key_mask.reshape(-1, views).to(q_.dtype)
        temps = (temp_same_.expand(temperature_shape), temp_opp_.expand(temperature_shape))
        return polarity_view_attention_cpu(*flat(q_, k_, v_), *temps, visible).reshape(*batch, heads, d)

    def pytorch() -> Tensor:
        with compute_precision(q, k, v, temp_same, temp_opp) as (q_, k_, v_, temp_same_, temp_opp_):
            visible = None if key_mask is None else key_mask.reshape(-1, views, 1).to(q_.dtype)
            out = polarity_view_attention_pytorch(*flat(q_, k_, v_), temp_same_, temp_opp_, visible)
        return out.reshape(*batch, heads, d).to(q.dtype)

    return dispatch(
        (q, k, v, temp_same, temp_opp),
        triton=triton,
        triton_lookup=lambda: triton_kernel(q),
        cpu=cpu,
        head_dim=d,
        views=views,
        pytorch=pytorch,
        # The fused kernels take one temperature row per head (per-point ones: the PyTorch form).
        fused=all(_broadcasts_to(t, temperature_shape) for t in (temp_same, temp_opp)),
    )


def triton_kernel(q: Tensor) -> Kernel | None:
    """`triton_form.polarity_view_attention_triton` for queries `q` `[..., heads, d]` where it runs
    (`triton_lookup`), or None."""
    kernels = triton_lookup.triton_form("view")
    if kernels is None or not kernels.view_triton_supported(q):
        return None
    passed = triton_lookup.passes_check("view", q, q.shape[-1], _check_triton)
    return kernels.polarity_view_attention_triton if passed else None


def _check_triton(device: torch.device, dtype: torch.dtype, head_dim: int) -> None:
    """The Triton kernel's first-use check: against the fp64 reference, with a key mask."""
    points, views, heads = 37, 5, 2
    shapes = {"q": (points, heads, head_dim), "k": (points, views, heads, head_dim)}
    shapes |= {"v": shapes["k"], "temp_same": (heads, 2 * head_dim), "temp_opp": (heads, 2 * head_dim)}
    exact, leaves = triton_lookup.random_leaves(shapes, device, dtype)
    mask = triton_lookup.check_mask(points, views)
    kernel = triton_lookup.triton_form("view")
    assert kernel is not None
    out = kernel.polarity_view_attention_triton(*leaves.values(), mask.to(device, torch.float32))
    expected = polarity_attention_reference(
        exact["q"].unsqueeze(-2),
        exact["k"].transpose(1, 2),
        exact["v"].transpose(1, 2),
        exact["temp_same"].unsqueeze(-2),
        exact["temp_opp"].unsqueeze(-2),
        mask.unsqueeze(1).expand(points, heads, views),
    ).squeeze(-2)
    triton_lookup.compare(out, leaves, expected, exact)
