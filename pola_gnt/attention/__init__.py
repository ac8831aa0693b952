"""Attention for Pola-GNT: polarity-aware linear attention (PolaFormer++) and GNT's originals."""

from pola_gnt.attention.features import EPSILON, EXPONENT_CLAMP
from pola_gnt.attention.functional import polarity_attention
from pola_gnt.attention.modules import (
    RAY_ATTENTION_KINDS,
    VIEW_ATTENTION_KINDS,
    build_ray_attention,
    build_view_attention,
)

__all__ = [
    "EPSILON",
    "EXPONENT_CLAMP",
    "RAY_ATTENTION_KINDS",
    "VIEW_ATTENTION_KINDS",
    "build_ray_attention",
    "build_view_attention",
    "polarity_attention",
]
