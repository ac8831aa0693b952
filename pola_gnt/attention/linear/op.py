"""Polarity-aware attention of queries over keys, any lengths (PolaFormer++ PaCS): `polarity_attention`.

The math, and the two association orders that compute it (quadratic, linear): `pytorch_form`. Its
forms: the fused Triton kernel of the linear form on CUDA (`triton_form`), else the PyTorch forms:
quadratic, linear over whole short sequences (`ray.pytorch_form`, up to `SHORT_SEQUENCE` keys) or
linear in chunks (`pytorch_form`); `dispatch` picks one. The fp64 reference that every form is
tested against: `reference`.
"""

from __future__ import annotations

from typing import Literal

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from pola_gnt.attention import triton_lookup
from pola_gnt.attention.dispatch import Kernel, dispatch
from pola_gnt.attention.features import check_attention_shapes, compute_precision
from pola_gnt.attention.linear.pytorch_form import polarity_attention_linear, polarity_attention_quadratic
from pola_gnt.attention.ray.pytorch_form import polarity_attention_short
from pola_gnt.attention.reference import polarity_attention_reference

# Up to this many keys the linear form runs over whole sequences at once (`ray.pytorch_form`); longer
# sequences walk in chunks (`pytorch_form`) so that no feature tensor is held whole.
SHORT_SEQUENCE = 2048

Form = Literal["linear", "quadratic", "auto"]
FORMS = ("linear", "quadratic", "auto")


def resolve_form(form: str, num_queries: int, num_keys: int, head_dim: int) -> str:
    """`auto` picks the cheaper association: O(Nq Nk 2d) quadratic vs O((Nq + Nk) 2d d) linear."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if form != "auto":
        return form
    return "quadratic" if num_queries * num_keys <= (num_queries + num_keys) * head_dim else "linear"


def polarity_attention(
    q: Float[Tensor, "*#batch queries d"],
    k: Float[Tensor, "*#batch keys d"],
    v: Float[Tensor, "*#batch keys d"],
    temp_same: Float[Tensor, "*temps 2*d"],
    temp_opp: Float[Tensor, "*temps 2*d"],
    key_mask: Bool[Tensor, "*#batch keys"] | None = None,
    form: Form = "auto",
) -> Float[Tensor, "*#batch queries d"]:
    """Polarity-aware attention (PolaFormer++).

    Args:
        q: `[..., Nq, d]` queries (d even; leading dims are batch and heads).
        k, v: `[..., Nk, d]` keys and values.
        temp_same, temp_opp: temperatures in (0, 1], broadcastable to `[..., 1, 2d]`.
        key_mask: bool `[..., Nk]`, True where a key may be attended; masked keys count in neither
            numerator nor denominator. A query with every key masked gets zeros.
        form: "linear", "quadratic" or "auto" (cheaper association order for these shapes).

    Returns:
        `[..., Nq, d]` in the dtype of `q`: channels `[0, d/2)` are the same-sign stream,
        `[d/2, d)` the opposite-sign stream.
    """
    check_attention_shapes(q, k, v, key_mask)
    resolved = resolve_form(form, q.shape[-2], k.shape[-2], q.shape[-1])
    return dispatch(
        (q, k, v, temp_same, temp_opp),
        triton=lambda kernel: kernel(q, k, v, temp_same, temp_opp, key_mask),
        triton_lookup=lambda: triton_kernel(q),
        pytorch=lambda: _polarity_attention_pytorch(q, k, v, temp_same, temp_opp, key_mask, resolved),
        fused=resolved == "linear",  # the one fused kernel (Triton) computes the linear form
    )


def _polarity_attention_pytorch(
    q: Tensor, k: Tensor, v: Tensor, temp_same: Tensor, temp_opp: Tensor, key_mask: Tensor | None, resolved: str
) -> Tensor:
    """`polarity_attention` in PyTorch, in the `resolved` form ("linear" or "quadratic")."""
    with compute_precision(q, k, v, temp_same, temp_opp) as (q_, k_, v_, temp_same_, temp_opp_):
        inputs = (q_, k_, v_, temp_same_, temp_opp_)
        if resolved == "linear" and k.shape[-2] <= SHORT_SEQUENCE:
            out = polarity_attention_short(q_, k_, v_, temp_same_, temp_opp_, key_mask)
        elif resolved == "linear":
            out = polarity_attention_linear(q_, k_, v_, temp_same_, temp_opp_, key_mask)
        elif torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            # Keep only the inputs for backward and recompute the feature maps and weights there:
            # stored, they are several times the size of q, k, v (GNT's view attention over
            # [points, heads, views, 2d] would hold ~2.4x the memory of GNT's own attention).
            out = checkpoint(polarity_attention_quadratic, *inputs, key_mask, use_reentrant=False)
        else:
            out = polarity_attention_quadratic(q_, k_, v_, temp_same_, temp_opp_, key_mask)
    return out.to(q.dtype)


def triton_kernel(q: Tensor) -> Kernel | None:
    """`triton_form.polarity_attention_triton` for queries `q` `[..., Nq, d]` where it runs
    (`triton_lookup`), or None."""
    kernels = triton_lookup.triton_form("linear")
    if kernels is None or not kernels.triton_supported(q):
        return None
    passed = triton_lookup.passes_check("linear", q, q.shape[-1], _check_triton)
    return kernels.polarity_attention_triton if passed else None


def _check_triton(device: torch.device, dtype: torch.dtype, head_dim: int) -> None:
    """The Triton kernel's first-use check: against the fp64 reference, with a key mask."""
    heads, length = 2, 70
    shapes = {name: (1, heads, length, head_dim) for name in ("q", "k", "v")}
    shapes |= {"temp_same": (heads, 2 * head_dim), "temp_opp": (heads, 2 * head_dim)}
    exact, leaves = triton_lookup.random_leaves(shapes, device, dtype)
    mask = triton_lookup.check_mask(1, heads, length)
    kernel = triton_lookup.triton_form("linear")
    assert kernel is not None
    out = kernel.polarity_attention_triton(
        leaves["q"], leaves["k"], leaves["v"], leaves["temp_same"].unsqueeze(-2), leaves["temp_opp"].unsqueeze(-2),
        mask.to(device),
    )  # fmt: skip
    expected = polarity_attention_reference(
        exact["q"], exact["k"], exact["v"], exact["temp_same"].unsqueeze(-2), exact["temp_opp"].unsqueeze(-2), mask
    )
    triton_lookup.compare(out, leaves, expected, exact)
