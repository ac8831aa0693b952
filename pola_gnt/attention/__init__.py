"""Attention for Pola-GNT: polarity-aware linear attention (PolaFormer++) and GNT's originals.

The attention kinds by role (`registry`, where a new kind is added) and their factories (`modules`);
the polarity attention function (`functional`), whose fused kernels `dispatch` picks.
"""

from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP
from pola_gnt.attention.functional import polarity_attention
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
