"""The attention kinds by role (`pola_gnt.attention.registry`): the built-in kinds, and a kind
registered in one place is listed, built by name and, here, removed again."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor, nn

import pola_gnt.attention as attention
from pola_gnt.attention import modules
from pola_gnt.attention.registry import (
    RAY_ATTENTIONS,
    VIEW_ATTENTIONS,
    register_ray_attention,
    register_view_attention,
)


@contextlib.contextmanager
def registries_restored() -> Iterator[None]:
    """The registries as they were (kinds and order) once the block ends, whatever it registered."""
    saved = [(registry, dict(registry)) for registry in (VIEW_ATTENTIONS, RAY_ATTENTIONS)]
    try:
        yield
    finally:
        for registry, kinds in saved:
            registry.clear()
            registry.update(kinds)


def test_the_built_in_kinds_in_order_through_both_import_paths():
    assert tuple(VIEW_ATTENTIONS) == ("pola", "softmax", "subtraction") == modules.VIEW_ATTENTION_KINDS
    assert tuple(RAY_ATTENTIONS) == ("pola", "softmax") == modules.RAY_ATTENTION_KINDS
    assert attention.VIEW_ATTENTION_KINDS is modules.VIEW_ATTENTION_KINDS
    assert attention.RAY_ATTENTION_KINDS is modules.RAY_ATTENTION_KINDS
    assert attention.build_view_attention is modules.build_view_attention
    assert attention.build_ray_attention is modules.build_ray_attention
    assert VIEW_ATTENTIONS["pola"] is modules.PolaViewAttention
    assert RAY_ATTENTIONS["softmax"] is modules.SoftmaxRayAttention


def test_a_registered_view_kind_is_listed_built_and_removed():
    with registries_restored():

        @register_view_attention("mean_of_views")
        class MeanOfViews(nn.Module):
            """A trivial view attention: the mean of the visible view tokens."""

            def __init__(self, dim: int, heads: int, dropout: float = 0.0):
                super().__init__()
                self.dim, self.heads = dim, heads

            def forward(self, query: Tensor, view_tokens: Tensor, rel_dirs: Tensor, view_mask: Tensor) -> Tensor:
                weights = view_mask.to(view_tokens.dtype).unsqueeze(-1)
                return (view_tokens * weights).sum(dim=-2) / weights.sum(dim=-2).clamp(min=1)

        assert tuple(VIEW_ATTENTIONS)[-1] == "mean_of_views"
        module = modules.build_view_attention("mean_of_views", 16, 2)
        assert isinstance(module, MeanOfViews) and (module.dim, module.heads) == (16, 2)
        tokens = torch.randn(3, 4, 16)
        out = module(torch.randn(3, 16), tokens, torch.randn(3, 4, 4), torch.ones(3, 4, dtype=torch.bool))
        assert torch.allclose(out, tokens.mean(dim=1))
        with pytest.raises(ValueError, match="choose one of pola, softmax, subtraction, mean_of_views"):
            modules.build_view_attention("unknown", 16, 2)
    assert "mean_of_views" not in VIEW_ATTENTIONS
    with pytest.raises(ValueError, match="unknown view attention kind 'mean_of_views'"):
        modules.build_view_attention("mean_of_views", 16, 2)


def test_a_registered_ray_kind_gets_lepe_and_is_removed():
    with registries_restored():

        @register_ray_attention("identity")
        class Identity(nn.Module):
            def __init__(self, dim: int, heads: int, lepe: bool = True, dropout: float = 0.0):
                super().__init__()
                self.lepe = lepe

            def forward(self, tokens: Tensor, sample_mask: Tensor | None = None) -> Tensor:
                return tokens

        assert "identity" in RAY_ATTENTIONS
        assert modules.build_ray_attention("identity", 16, 2).lepe is True
        module = modules.build_ray_attention("identity", 16, 2, lepe=False)
        assert isinstance(module, Identity) and module.lepe is False
    assert tuple(RAY_ATTENTIONS) == modules.RAY_ATTENTION_KINDS


def test_a_taken_name_is_refused():
    with registries_restored():
        with pytest.raises(ValueError, match="view attention kind 'pola' is already registered"):
            register_view_attention("pola")(modules.SoftmaxViewAttention)
        assert VIEW_ATTENTIONS["pola"] is modules.PolaViewAttention
