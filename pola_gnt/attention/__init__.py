"""Attention for Pola-GNT: polarity-aware linear attention (PolaFormer++) and GNT's originals.

The attention kinds by role (`registry`, where a new kind is added) and their factories (`modules`).
`PolarityAttention` (`layer`): the polarity attention as a drop-in `nn.Module` over token sequences
(self- and cross-attention, gate, LePE). The polarity attention ops, one folder each with its forms
(PyTorch, C++, Triton) and its dispatch (`op`): `linear` (queries over keys of any length), `view`
(GNT's view attention) and `ray` (GNT's ray attention and its LePE). What they share: the feature
maps and numerics (`features`), the fp64 reference every form is tested against (`reference`), the
one fallback order (`dispatch`), the C++ extension (`cpu_extension`, `csrc/`) and the Triton kernels'
common parts (`triton_common`, `triton_lookup`).
"""

from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP
from pola_gnt.attention.layer import PolarityAttention
from pola_gnt.attention.linear.op import polarity_attention
from pola_gnt.attention.modules import (
    RAY_ATTENTION_KINDS,
    VIEW_ATTENTION_KINDS,
    build_ray_attention,
    build_view_attention,
)
from pola_gnt.attention.registry import (
    RAY_ATTENTIONS,
    VIEW_ATTENTIONS,
    register_ray_attention,
    register_view_attention,
)

__all__ = [
    "EPSILON",
    "EXPONENT_CLAMP",
    "PolarityAttention",
    "RAY_ATTENTIONS",
    "RAY_ATTENTION_KINDS",
    "VIEW_ATTENTIONS",
    "VIEW_ATTENTION_KINDS",
    "build_ray_attention",
    "build_view_attention",
    "polarity_attention",
    "register_ray_attention",
    "register_view_attention",
]
