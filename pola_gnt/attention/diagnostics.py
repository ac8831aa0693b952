"""Diagnostics of polarity-aware attention, as plotted in the PolaFormer++ paper.

- `attention_entropy` of explicit weights, with `polarity_attention_weights` (the effective weights
  of both pola streams), `softmax_weights` and `relu_linear_weights` on the same q, k for comparison;
- `learned_temperatures`: per-channel temperatures of every pola module of a model;
- `capture_gates`: the gate activations ("Gs" / "Go" polarity gating) of every pola module during a
  forward, and `split_gates` to separate the two streams' channels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from pola_gnt.attention.functional import EPSILON, key_features, query_features
from pola_gnt.attention.modules import PolaAttentionBase

# --------------------------------------------------------------------------------------------------
# Attention weights and entropy


def _apply_mask(weights: Tensor, key_mask: Tensor | None) -> Tensor:
    if key_mask is None:
        return weights
    return weights * key_mask.unsqueeze(-2).to(weights.dtype)


def _normalise_rows(weights: Tensor) -> Tensor:
    """Rows of non-negative weights scaled to sum 1; an all-zero row stays zero."""
    return weights / (weights.sum(dim=-1, keepdim=True) + EPSILON)


def attention_entropy(weights: Tensor, key_mask: Tensor | None = None) -> Tensor:
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
    q: Tensor, k: Tensor, temp_same: Tensor, temp_opp: Tensor, key_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Effective normalised weights `[..., Nq, Nk]` of the same-sign and opposite-sign streams.

    `w_ij = Q_i . K_j / (sum_j Q_i . K_j + eps)`: `polarity_attention` is `w_same @ v1` and
    `w_opp @ v2` (the quadratic form).
    """
    q_same, q_opp = query_features(q, temp_same, temp_opp)
    keys_t = key_features(k, key_mask).transpose(-1, -2)
    return _normalise_rows(q_same @ keys_t), _normalise_rows(q_opp @ keys_t)


def softmax_weights(q: Tensor, k: Tensor, key_mask: Tensor | None = None) -> Tensor:
    """Scaled dot-product softmax weights `[..., Nq, Nk]` (all-masked rows are zero)."""
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask.unsqueeze(-2), float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)


def relu_linear_weights(q: Tensor, k: Tensor, key_mask: Tensor | None = None) -> Tensor:
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


@contextlib.contextmanager
def capture_gates(model: nn.Module) -> Iterator[dict[str, Tensor]]:
    """Record the gate activations of every pola module during forwards inside the block.

    Yields a dict filled as the model runs: module name -> gates `[tokens, dim]` (detached; several
    forwards, e.g. chunked rendering, are concatenated along the tokens).

        with capture_gates(model) as gates:
            model(batch)
        same, opp = split_gates(gates["view_blocks.0.attn"], heads=4)
    """
    gates: dict[str, Tensor] = {}
    handles = []

    def store(name: str):
        def hook(module: PolaAttentionBase, _inputs, _output) -> None:
            gate = module.last_gate
            module.last_gate = None
            gates[name] = gate if name not in gates else torch.cat([gates[name], gate])

        return hook

    modules = list(pola_modules(model))
    try:
        for name, module in modules:
            module.record_gates = True
            handles.append(module.register_forward_hook(store(name)))
        yield gates
    finally:
        for handle in handles:
            handle.remove()
        for _, module in modules:
            module.record_gates = False
            module.last_gate = None


def split_gates(gates: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """Split gates `[tokens, dim]` into the same-sign ("Gs") and opposite-sign ("Go") channels.

    Per head the first half of the channels gates the same-sign stream, the second half the
    opposite-sign stream. Returns two `[tokens, dim / 2]` tensors (heads concatenated).
    """
    per_head = gates.unflatten(-1, (heads, -1))  # [tokens, heads, head_dim]
    half = per_head.shape[-1] // 2
    return per_head[..., :half].flatten(-2), per_head[..., half:].flatten(-2)
