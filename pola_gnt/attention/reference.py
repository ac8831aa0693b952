"""The fp64 reference of polarity-aware attention, written out as the math (docs/pola_attention.md).

Every fast path (the quadratic and linear forms in `linear.pytorch_form` and `ray.pytorch_form`, the
view form, the Triton and C++ kernels) is tested against `polarity_attention_reference`; it shares only the constants
`EPSILON` and `EXPONENT_CLAMP` with them. Per head, with `phi(z) = expm1(min(z, EXPONENT_CLAMP))`:

    w_same_ij = sum_c  phi(ts[c] q+_ic) phi(k+_jc) + phi(ts[d + c] q-_ic) phi(k-_jc)    (+,+) and (-,-)
    w_opp_ij  = sum_c  phi(to[c] q-_ic) phi(k+_jc) + phi(to[d + c] q+_ic) phi(k-_jc)    (-,+) and (+,-)
    out_i = [sum_j w_same_ij v_j[:d/2], sum_j w_opp_ij v_j[d/2:]] / ([sum_j w_same_ij, sum_j w_opp_ij] + eps)

over the keys `j` that the mask lets through: explicit weights `[..., Nq, Nk]` per stream and
pairing, no association trick, no chunking, no in-place or half-width evaluation. Plain autograd, so
it checks gradients too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP


def spiky_map(z: Tensor) -> Tensor:
    """PolaFormer++'s channel-wise spiky map `phi(z) = exp(min(z, EXPONENT_CLAMP)) - 1` (z >= 0)."""
    return torch.expm1(torch.clamp(z, max=EXPONENT_CLAMP))


def polarity_attention_reference(
    q: Float[Tensor, "*#batch queries d"],
    k: Float[Tensor, "*#batch keys d"],
    v: Float[Tensor, "*#batch keys d"],
    temp_same: Float[Tensor, "*temps 2*d"],
    temp_opp: Float[Tensor, "*temps 2*d"],
    key_mask: Bool[Tensor, "*#batch keys"] | None = None,
    query_map: Callable[[Tensor], Tensor] = spiky_map,
) -> Float[Tensor, "*#batch queries d"]:
    """Polarity attention in fp64, term by term (see the module docstring), any shapes that
    `polarity_attention` takes: temperatures broadcast against `[..., Nq, 2d]`.

    `query_map` replaces `phi` on the query side only (e.g. the identity: the small-temperature limit).
    Returns fp64 `[..., Nq, d]`: channels `[0, d/2)` the same-sign stream, `[d/2, d)` the opposite-sign one.
    """
    q, k, v, temp_same, temp_opp = (t.double() for t in (q, k, v, temp_same, temp_opp))
    d = q.shape[-1]
    half = d // 2
    q_pos, q_neg = q.clamp(min=0.0), (-q).clamp(min=0.0)  # q = q+ - q-
    k_pos, k_neg = spiky_map(k.clamp(min=0.0)), spiky_map((-k).clamp(min=0.0))  # phi(k+), phi(k-)
    pairs = {
        # stream: ((query part, its temperature, the key part it meets), ...)
        "same": ((q_pos, temp_same[..., :d], k_pos), (q_neg, temp_same[..., d:], k_neg)),
        "opp": ((q_neg, temp_opp[..., :d], k_pos), (q_pos, temp_opp[..., d:], k_neg)),
    }
    values = {"same": v[..., :half], "opp": v[..., half:]}
    outputs = []
    for stream in ("same", "opp"):
        # w_ij = sum_c phi(t_c x_ic) phi(k_jc), for each of the stream's two pairings: [..., Nq, Nk]
        first, second = (
            torch.einsum("...ic,...jc->...ij", query_map(temperature * query_part), key_part)
            for query_part, temperature, key_part in pairs[stream]
        )
        weights = first + second
        if key_mask is not None:
            weights = weights * key_mask[..., None, :]
        numerator = torch.einsum("...ij,...jc->...ic", weights, values[stream])  # sum_j w_ij v_j: [..., Nq, d/2]
        denominator = weights.sum(dim=-1, keepdim=True) + EPSILON
        outputs.append(numerator / denominator)
    return torch.cat(outputs, dim=-1)
