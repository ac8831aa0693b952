"""Diagnostics of polarity-aware attention, as plotted in the PolaFormer++ paper.

- `attention_entropy` of explicit weights, with `polarity_attention_weights` (the effective weights
  of both pola streams), `softmax_weights` and `relu_linear_weights` on the same q, k for comparison;
- `learned_temperatures`: per-channel temperatures of every pola module of a model;
- `recording`: what every pola module computes during forwards, through its `recorder`: the gate
  activations ("Gs" / "Go" polarity gating, `split_gates` separates the two streams' channels) and,
  to a callback, the q, k and key mask its attention gets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn

from pola_gnt.attention.features import EPSILON, key_feature_map, query_feature_maps
from pola_gnt.attention.modules import AttentionRecorder, PolaAttentionBase

# --------------------------------------------------------------------------------------------------
# Attention weights and entropy


def _apply_mask(weights: Tensor, key_mask: Tensor | None) -> Tensor:
    if key_mask is None:
        return weights
    return weights * key_mask.unsqueeze(-2).to(weights.dtype)


def _normalise_rows(weights: Tensor) -> Tensor:
    """Rows of non-negative weights scaled to sum 1; an all-zero row stays zero."""
    return weights / (weights.sum(dim=-1, keepdim=True) + EPSILON)


def attention_entropy(
    weights: Float[Tensor, "*batch queries keys"], key_mask: Bool[Tensor, "*#batch keys"] | None = None
) -> Float[Tensor, "*batch queries"]:
    """Entropy (natural log) of each row of non-negative attention weights.

    Args:
        weights: `[..., Nq, Nk]`, >= 0; rows are normalised here (masked keys dropped first).
        key_mask: optional bool `[..., Nk]`, True where a key counts.

    Returns:
        `[..., Nq]`; 0 for a row without weight (0 log 0 = 0).
    """
    weights = _apply_mask(weights.clamp_min(0), key_mask)
    probs = weights / weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
    return -torch.xlogy(probs, probs).sum(dim=-1)


def polarity_attention_weights(
    q: Float[Tensor, "*#batch queries d"],
    k: Float[Tensor, "*#batch keys d"],
    temp_same: Float[Tensor, "*temps 2*d"],
    temp_opp: Float[Tensor, "*temps 2*d"],
    key_mask: Bool[Tensor, "*#batch keys"] | None = None,
) -> tuple[Float[Tensor, "*#batch queries keys"], Float[Tensor, "*#batch queries keys"]]:
    """Effective normalised weights `[..., Nq, Nk]` of the same-sign and opposite-sign streams.

    `w_ij = Q_i . K_j / (sum_j Q_i . K_j + eps)`: `polarity_attention` is `w_same @ v1` and
    `w_opp @ v2` (the quadratic form).
    """
    q_same, q_opp = query_feature_maps(q, temp_same, temp_opp)
    keys_t = key_feature_map(k, key_mask).transpose(-1, -2)
    return _normalise_rows(q_same @ keys_t), _normalise_rows(q_opp @ keys_t)


def softmax_weights(
    q: Float[Tensor, "*#batch queries d"],
    k: Float[Tensor, "*#batch keys d"],
    key_mask: Bool[Tensor, "*#batch keys"] | None = None,
) -> Float[Tensor, "*#batch queries keys"]:
    """Scaled dot-product softmax weights `[..., Nq, Nk]` (all-masked rows are zero)."""
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask.unsqueeze(-2), float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)


def relu_linear_weights(
    q: Float[Tensor, "*#batch queries d"],
    k: Float[Tensor, "*#batch keys d"],
    key_mask: Bool[Tensor, "*#batch keys"] | None = None,
) -> Float[Tensor, "*#batch queries keys"]:
    """Weights `[..., Nq, Nk]` of plain ReLU linear attention: `relu(q) . relu(k)`, normalised."""
    weights = torch.relu(q) @ torch.relu(k).transpose(-1, -2)
    return _normalise_rows(_apply_mask(weights, key_mask))


# --------------------------------------------------------------------------------------------------
# Learned parameters and activations of a model's pola modules


def pola_modules(model: nn.Module) -> Iterator[tuple[str, PolaAttentionBase]]:
    """`(qualified name, module)` of every polarity-attention module in `model`."""
    for name, module in model.named_modules():
        if isinstance(module, PolaAttentionBase):
            yield name, module


@torch.no_grad()
def learned_temperatures(model: nn.Module) -> list[dict]:
    """Per pola module: `{"name", "temp_same", "temp_opp"}`, temperatures `[heads, 2 * head_dim]`.

    Channels `[0, head_dim)` of a temperature act on `x+`, `[head_dim, 2 * head_dim)` on `x-`: the
    paper's scatter plots one half against the other.
    """
    rows = []
    for name, module in pola_modules(model):
        temp_same, temp_opp = module.temperatures()
        rows.append({"name": name, "temp_same": temp_same.detach().cpu(), "temp_opp": temp_opp.detach().cpu()})
    return rows


AttentionInputs = Callable[[str, PolaAttentionBase, Tensor, Tensor, "Tensor | None"], None]


class Recording(AttentionRecorder):
    """What the pola modules of a model computed during the forwards inside `recording(model)`.

    `gates`: module name -> gates `[tokens, dim]` (detached; several forwards, e.g. chunked
    rendering, are concatenated along the tokens). `on_inputs(name, module, q, k, key_mask)`, when
    given, receives the heads-split q `[B, heads, Nq, d]`, k `[B, heads, Nk, d]` and key mask
    `[B, Nk]` of every attention call.
    """

    def __init__(self, names: dict[PolaAttentionBase, str], on_inputs: AttentionInputs | None = None):
        self.names = names
        self.on_inputs = on_inputs
        self.gates: dict[str, Tensor] = {}

    def on_attention(self, module: PolaAttentionBase, q: Tensor, k: Tensor, key_mask: Tensor | None) -> None:
        if self.on_inputs is not None:
            self.on_inputs(self.names[module], module, q, k, key_mask)

    def on_gate(self, module: PolaAttentionBase, gate: Tensor) -> None:
        name = self.names[module]
        self.gates[name] = gate if name not in self.gates else torch.cat([self.gates[name], gate])


@contextlib.contextmanager
def recording(model: nn.Module, on_inputs: AttentionInputs | None = None) -> Iterator[Recording]:
    """Record what every pola module of `model` computes during the forwards inside the block.

    with recording(model) as recorded:
        model(batch)
    same, opp = split_gates(recorded.gates["blocks.0.view_block.attention"], heads=4)
    """
    modules = list(pola_modules(model))
    recorder = Recording({module: name for name, module in modules}, on_inputs)
    try:
        for _, module in modules:
            module.recorder = recorder
        yield recorder
    finally:
        for _, module in modules:
            module.recorder = None


def split_gates(
    gates: Float[Tensor, "tokens dim"], heads: int
) -> tuple[Float[Tensor, "tokens half"], Float[Tensor, "tokens half"]]:
    """Split gates `[tokens, dim]` into the same-sign ("Gs") and opposite-sign ("Go") channels.

    Per head the first half of the channels gates the same-sign stream, the second half the
    opposite-sign stream. Returns two `[tokens, dim / 2]` tensors (heads concatenated).
    """
    per_head = gates.unflatten(-1, (heads, -1))  # [tokens, heads, head_dim]
    half = per_head.shape[-1] // 2
    return per_head[..., :half].flatten(-2), per_head[..., half:].flatten(-2)
