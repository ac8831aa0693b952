"""The attention kinds, one registry per role: kind name -> constructor.

    VIEW_ATTENTIONS[kind](dim, heads, dropout)        view (cross) attention:
        forward(query [points, dim], view_tokens [points, views, dim], rel_dirs [points, views, 4],
                view_mask bool [points, views]) -> [points, dim]
    RAY_ATTENTIONS[kind](dim, heads, lepe, dropout)   ray (self) attention:
        forward(tokens [rays, samples, dim], sample_mask bool [rays, samples] | None) -> [rays, samples, dim]

The built-in kinds (`modules`) register in this order: view "pola", "softmax", "subtraction"; ray
"pola", "softmax". `modules.build_view_attention` / `build_ray_attention` build a kind by name, and
`modules.VIEW_ATTENTION_KINDS` / `RAY_ATTENTION_KINDS` (the choices of `model.net.view_attention` /
`ray_attention` in the settings and the model) list the kinds registered when `modules` is imported.

Adding a kind, in one place: a module class in `modules` with the constructor and forward of its role
above, decorated with `@register_view_attention("name")` or `@register_ray_attention("name")` (a ray
kind without a LePE accepts `lepe` and ignores it; `dropout` is the rate on the attention weights while
training, GNT's `attn_dp`, which a kind without explicit weights, like pola, accepts and ignores).
Each kind's class is where its parameters, and so its checkpoints, are defined.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import nn

ViewAttentionFactory = Callable[[int, int, float], nn.Module]  # (dim, heads, dropout)
RayAttentionFactory = Callable[[int, int, bool, float], nn.Module]  # (dim, heads, lepe, dropout)

VIEW_ATTENTIONS: dict[str, ViewAttentionFactory] = {}
RAY_ATTENTIONS: dict[str, RayAttentionFactory] = {}

_Factory = TypeVar("_Factory")
_View = TypeVar("_View", bound=ViewAttentionFactory)
_Ray = TypeVar("_Ray", bound=RayAttentionFactory)


def register_view_attention(kind: str) -> Callable[[_View], _View]:
    """Class decorator: register a view attention as `kind` (a name not taken yet)."""

    def register(factory: _View) -> _View:
        _add(VIEW_ATTENTIONS, "view", kind, factory)
        return factory

    return register


def register_ray_attention(kind: str) -> Callable[[_Ray], _Ray]:
    """Class decorator: register a ray attention as `kind` (a name not taken yet)."""

    def register(factory: _Ray) -> _Ray:
        _add(RAY_ATTENTIONS, "ray", kind, factory)
        return factory

    return register


def _add(registry: dict[str, _Factory], role: str, kind: str, factory: _Factory) -> None:
    if kind in registry:  # two kinds under one name: the settings could not tell them apart
        raise ValueError(f"{role} attention kind {kind!r} is already registered")
    registry[kind] = factory


def lookup(registry: dict[str, _Factory], role: str, kind: str) -> _Factory:
    """`registry[kind]`; an unknown kind is a ValueError that lists the registered ones."""
    if kind not in registry:
        raise ValueError(f"unknown {role} attention kind {kind!r}; choose one of {', '.join(registry)}")
    return registry[kind]
