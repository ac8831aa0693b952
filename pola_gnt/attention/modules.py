"""View (cross) and ray (self) attention modules behind one interface: pola | softmax | subtraction.

Each module owns its input projections and its output projection; the transformer block around it
(pre-LayerNorm, residual, FFN) lives in `pola_gnt.model.transformer`. Each class registers its kind
(`registry`, which also says how to add one); `build_view_attention` / `build_ray_attention` build a
kind by name.

    view attention:  forward(query [points, dim], view_tokens [points, views, dim],
                             rel_dirs [points, views, 4], view_mask bool [points, views]) -> [points, dim]
    ray attention:   forward(tokens [rays, samples, dim], sample_mask bool [rays, samples] | None)
                     -> [rays, samples, dim]

Masked views / samples are excluded from every sum; a point (or ray) with nothing visible gets zeros
from the attention itself (never NaN) in every kind.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn

from pola_gnt.attention.ray.op import add_lepe, polarity_ray_attention
from pola_gnt.attention.registry import (
    RAY_ATTENTIONS,
    VIEW_ATTENTIONS,
    lookup,
    register_ray_attention,
    register_view_attention,
)
from pola_gnt.attention.view.op import polarity_view_attention

# --------------------------------------------------------------------------------------------------
# Shared pieces


def relative_direction_mlp(dim: int) -> nn.Sequential:
    """GNT's `pos_fc`: embeds the 4-number relative direction `[normalize(a - b), a . b]`."""
    return nn.Sequential(nn.Linear(4, dim // 8), nn.ReLU(), nn.Linear(dim // 8, dim))


def keys_values_with_directions(
    view_tokens: Float[Tensor, "points views dim"],
    rel_dirs: Float[Tensor, "points views 4"],
    kv_weight: Float[Tensor, "dim2 dim"],
    kv_bias: Float[Tensor, " dim2"] | None,
    pos_fc: nn.Sequential,
) -> Float[Tensor, "points views dim2"]:
    """`[k + pos, v + pos]` `[points, views, 2 dim]`: the keys and values `x W_kv^T + b_kv` of the view
    tokens, each plus the relative-direction embedding `pos = pos_fc(rel_dirs)`, as ONE matmul of
    `[x, relu(W1 r + b1)]` with `[W_kv | W2; W2]`. The same function as projecting, embedding and
    adding separately, but the `[points, views, dim]` tensors of `pos`, `k + pos` and `v + pos` are
    never written and re-read: on the CPU those passes over memory cost more than the matmuls. Used by
    every view attention kind alike (the parameters, and so the checkpoints, are the separate layers')."""
    first, activation, last = pos_fc
    assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
    hidden = activation(first(rel_dirs))  # [points, views, dim / 8]
    weight = torch.cat([kv_weight, last.weight.repeat(2, 1)], dim=1)  # [2 dim, dim + dim / 8]
    bias = last.bias.repeat(2) if kv_bias is None else kv_bias + last.bias.repeat(2)
    return F.linear(torch.cat([view_tokens, hidden], dim=-1), weight, bias)


def split_heads(x: Tensor, heads: int) -> Tensor:
    """`[..., n, heads * d]` -> `[..., heads, n, d]`."""
    return x.unflatten(-1, (heads, -1)).transpose(-2, -3)


def merge_heads(x: Tensor) -> Tensor:
    """`[..., heads, n, d]` -> `[..., n, heads * d]`."""
    return x.transpose(-2, -3).flatten(-2)


def _check_heads(dim: int, heads: int, even_head_dim: bool = False) -> None:
    if heads < 1 or dim % heads:
        raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
    if even_head_dim and (dim // heads) % 2:
        raise ValueError(f"pola attention needs an even head dim, got dim {dim} / heads {heads}")


def training_dropout(x: Tensor, rate: float, training: bool) -> Tensor:
    """`F.dropout` while training at a rate above 0; otherwise `x` itself, with no call at all."""
    return F.dropout(x, rate, True) if training and rate > 0 else x


def masked_sdpa(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, dropout: float = 0.0) -> Tensor:
    """Scaled dot-product attention `[..., heads, Nq, d]` with a key mask `[..., Nk]` and dropout at
    rate `dropout` on the attention weights (pass 0 outside training).

    SDPA gives NaN for a row whose keys are all masked; such rows attend to every key instead (so the
    computation and its gradients stay finite) and their output is then zeroed.
    """
    if key_mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
    any_visible = key_mask.any(dim=-1, keepdim=True)  # [..., 1]
    safe_mask = key_mask | ~any_visible
    attn_mask = safe_mask[..., None, None, :]  # [..., 1 (heads), 1 (queries), Nk]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
    return out * any_visible[..., None, None, :].to(out.dtype)


class AttentionRecorder:
    """Receives what the polarity-attention modules compute while it is set as their `recorder`
    (`diagnostics.recording`): the heads-split q, k and key mask that each attention gets, and its
    gate. Recording reads these tensors only; the model computes exactly as without it."""

    def on_attention(
        self, module: PolaAttentionBase, q: Tensor, k: Tensor, key_mask: Tensor | None
    ) -> None:  # q [B, heads, Nq, d], k [B, heads, Nk, d], key_mask [B, Nk]
        pass

    def on_gate(self, module: PolaAttentionBase, gate: Tensor) -> None:  # [tokens, dim], detached
        pass


class PolaAttentionBase(nn.Module):
    """Shared by the pola view and ray modules: temperatures, gating, output projection.

    The gate `g` multiplies the attention output element-wise without an activation; per head, its
    channels `[0, d/2)` gate the same-sign stream ("Gs") and `[d/2, d)` the opposite-sign one ("Go").
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        _check_heads(dim, heads, even_head_dim=True)
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        # Per-head, per-channel temperatures sigmoid(s): zero-initialised (0.5), one per channel of
        # both halves [x+, x-] of the same-sign (s1) and opposite-sign (s2) query feature maps.
        self.s1 = nn.Parameter(torch.zeros(heads, 2 * self.head_dim))
        self.s2 = nn.Parameter(torch.zeros(heads, 2 * self.head_dim))
        self.proj = nn.Linear(dim, dim)
        self.recorder: AttentionRecorder | None = None  # set by diagnostics.recording

    def temperatures(self) -> tuple[Tensor, Tensor]:
        """`(temp_same, temp_opp)`, each `[heads, 2 * head_dim]`, values in (0, 1)."""
        return torch.sigmoid(self.s1), torch.sigmoid(self.s2)

    def _attend(
        self,
        q: Float[Tensor, "batch heads queries head_dim"],
        k: Float[Tensor, "batch heads keys head_dim"],
        v: Float[Tensor, "batch heads keys head_dim"],
        key_mask: Bool[Tensor, "batch keys"] | None,
    ) -> Float[Tensor, "batch heads queries head_dim"]:
        """Heads-split polarity attention (told to the recorder, if any): q `[B, heads, Nq, d]`,
        k, v `[B, heads, Nk, d]`, key_mask `[B, Nk]`."""
        if self.recorder is not None:
            self.recorder.on_attention(self, q, k, key_mask)
        return self._polarity_attention(q, k, v, key_mask)

    def _polarity_attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        """The attention math for this module's layout (view form or ray form), same shapes as `_attend`."""
        raise NotImplementedError

    def _gated_output(self, attended: Float[Tensor, "*tokens dim"], gate: Float[Tensor, "*tokens dim"]) -> Tensor:
        """`proj(gate * attended)`; both `[..., dim]`."""
        if self.recorder is not None:
            self.recorder.on_gate(self, gate.detach().reshape(-1, self.dim))
        return self.proj(gate * attended)


# --------------------------------------------------------------------------------------------------
# View (cross) attention: one query per point, one key/value per source view


class ViewAttention(nn.Module):
    """What every view attention kind shares: the keys and values `[k + pos, v + pos]` of the view tokens
    with the relative-direction embedding `pos_fc` (`keys_values_with_directions`, from the kind's
    `kv_projection`), then the kind's own attention of the query over them (`attend_with_kv`, which the
    rendering network also calls with every block's keys and values computed at once)."""

    pos_fc: nn.Sequential

    def forward(
        self,
        query: Float[Tensor, "points dim"],
        view_tokens: Float[Tensor, "points views dim"],
        rel_dirs: Float[Tensor, "points views 4"],
        view_mask: Bool[Tensor, "points views"],
    ) -> Float[Tensor, "points dim"]:
        kv = keys_values_with_directions(view_tokens, rel_dirs, *self.kv_projection(), self.pos_fc)
        return self.attend_with_kv(query, kv, view_mask)

    def kv_projection(self) -> tuple[Tensor, Tensor | None]:
        """The weight `[2 dim, dim]` and bias (or None) of the keys and values of the view tokens."""
        raise NotImplementedError

    def attend_with_kv(
        self,
        query: Float[Tensor, "points dim"],
        kv: Float[Tensor, "points views 2*dim"],
        view_mask: Bool[Tensor, "points views"],
    ) -> Float[Tensor, "points dim"]:
        """`forward` from the keys and values `[k + pos, v + pos]` (`keys_values_with_directions`)."""
        raise NotImplementedError


@register_view_attention("pola")
class PolaViewAttention(PolaAttentionBase, ViewAttention):
    """Polarity-aware cross-attention from the point token to its views (no LePE: views are a set).
    Linear attention forms no weight matrix, so it has no weights to drop (`dropout` is ignored)."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__(dim, heads)
        self.to_qg = nn.Linear(dim, 2 * dim)
        self.to_kv = nn.Linear(dim, 2 * dim)
        self.pos_fc = relative_direction_mlp(dim)

    def kv_projection(self) -> tuple[Tensor, Tensor | None]:
        return self.to_kv.weight, self.to_kv.bias

    def attend_with_kv(
        self,
        query: Float[Tensor, "points dim"],
        kv: Float[Tensor, "points views 2*dim"],
        view_mask: Bool[Tensor, "points views"],
    ) -> Float[Tensor, "points dim"]:
        q, gate = self.to_qg(query).chunk(2, dim=-1)  # [points, dim] each
        k, v = kv.chunk(2, dim=-1)  # [points, views, dim] each: k + pos, v + pos
        q = split_heads(q.unsqueeze(-2), self.heads)  # [points, heads, 1, head_dim]
        k, v = split_heads(k, self.heads), split_heads(v, self.heads)  # [points, heads, views, head_dim]
        attended = merge_heads(self._attend(q, k, v, view_mask)).squeeze(-2)  # [points, dim]
        return self._gated_output(attended, gate)

    def _polarity_attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        """One query per point: the channel-wise view form. q `[points, heads, 1, d]`, k, v
        `[points, heads, views, d]` (views of `[points, views, heads, d]`: transposing back copies nothing)."""
        temp_same, temp_opp = self.temperatures()
        k, v = k.transpose(-2, -3), v.transpose(-2, -3)
        return polarity_view_attention(q.squeeze(-2), k, v, temp_same, temp_opp, key_mask).unsqueeze(-2)


@register_view_attention("softmax")
class SoftmaxViewAttention(ViewAttention):
    """Multi-head dot-product cross-attention over views, relative-direction embedding on k and v."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        _check_heads(dim, heads)
        self.heads, self.dropout = heads, dropout
        self.to_q = nn.Linear(dim, dim)
        self.to_kv = nn.Linear(dim, 2 * dim)
        self.pos_fc = relative_direction_mlp(dim)
        self.proj = nn.Linear(dim, dim)

    def kv_projection(self) -> tuple[Tensor, Tensor | None]:
        return self.to_kv.weight, self.to_kv.bias

    def attend_with_kv(
        self,
        query: Float[Tensor, "points dim"],
        kv: Float[Tensor, "points views 2*dim"],
        view_mask: Bool[Tensor, "points views"],
    ) -> Float[Tensor, "points dim"]:
        q = split_heads(self.to_q(query).unsqueeze(-2), self.heads)  # [points, heads, 1, head_dim]
        k, v = (split_heads(x, self.heads) for x in kv.chunk(2, dim=-1))  # k + pos, v + pos
        dropout = self.dropout if self.training else 0.0
        attended = merge_heads(masked_sdpa(q, k, v, view_mask, dropout)).squeeze(-2)
        return self.proj(attended)


@register_view_attention("subtraction")
class SubtractionViewAttention(ViewAttention):
    """GNT's original view attention: per-channel *subtraction* vector attention over views.

    `A = softmax_views(attn_fc(k - q + pos))`, `out = out_fc(sum_v (v + pos) * A)`. The original
    computes the values from the already-projected keys (`V = Wv(Wk x)`); here `V = Wv(x)`.
    Per-channel attention has no heads; `heads` is accepted for a uniform constructor only.
    `dropout` drops attention weights while training (GNT's `dp` after the softmax).

    A point that no view sees gets zero from the attention. With `zero_unseen_points` False it gets
    GNT's uniform weights over all its views instead (GNT's code masks with -1e9, so when every view is
    masked the softmax is uniform); the model sets that for GNT's checkpoints (`model.net.compat: gnt`).
    """

    def __init__(self, dim: int, heads: int = 1, dropout: float = 0.0):
        super().__init__()
        _check_heads(dim, heads)
        self.zero_unseen_points = True
        self.dropout = dropout
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(dim, dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)
        self.pos_fc = relative_direction_mlp(dim)
        self.attn_fc = nn.Sequential(nn.Linear(dim, dim // 8), nn.ReLU(), nn.Linear(dim // 8, dim))
        self.out_fc = nn.Linear(dim, dim)

    def kv_projection(self) -> tuple[Tensor, Tensor | None]:
        return torch.cat([self.to_k.weight, self.to_v.weight]), None

    def attend_with_kv(
        self,
        query: Float[Tensor, "points dim"],
        kv: Float[Tensor, "points views 2*dim"],
        view_mask: Bool[Tensor, "points views"],
    ) -> Float[Tensor, "points dim"]:
        q = self.to_q(query).unsqueeze(-2)  # [points, 1, dim]
        k_pos, v_pos = kv.chunk(2, dim=-1)  # k + pos, v + pos: [points, views, dim]
        scores = self.attn_fc(k_pos - q)  # attn_fc(k - q + pos)
        # Masked views get -inf; a point with no visible view keeps finite scores (uniform softmax,
        # finite gradients) and is zeroed by multiplying with the mask afterwards.
        any_visible = view_mask.any(dim=-1, keepdim=True)  # [points, 1]
        excluded = (~view_mask & any_visible).unsqueeze(-1)
        weights = torch.softmax(scores.masked_fill(excluded, float("-inf")), dim=-2)
        if self.zero_unseen_points:
            weights = weights * view_mask.unsqueeze(-1).to(weights.dtype)
        else:  # GNT: uniform over all views where none is visible
            weights = torch.where(any_visible.unsqueeze(-1), weights, torch.full_like(weights, 1 / weights.shape[-2]))
        weights = training_dropout(weights, self.dropout, self.training)
        return self.out_fc((v_pos * weights).sum(dim=-2))


# --------------------------------------------------------------------------------------------------
# Ray (self) attention: the samples along one ray


@register_ray_attention("pola")
class PolaRayAttention(PolaAttentionBase):
    """Polarity-aware self-attention over the samples of a ray, with an optional 1-D LePE (no weight
    matrix, so no weights to drop: `dropout` is ignored)."""

    def __init__(self, dim: int, heads: int, lepe: bool = True, dropout: float = 0.0):
        super().__init__(dim, heads)
        self.to_qkvg = nn.Linear(dim, 4 * dim)
        # Locally-enhanced positional encoding: depthwise conv of v along the samples.
        self.lepe = nn.Conv1d(dim, dim, kernel_size=5, padding=2, groups=dim) if lepe else None

    def forward(
        self, tokens: Float[Tensor, "rays samples dim"], sample_mask: Bool[Tensor, "rays samples"] | None = None
    ) -> Float[Tensor, "rays samples dim"]:
        q, k, v, gate = self.to_qkvg(tokens).chunk(4, dim=-1)  # [rays, samples, dim] each
        q_heads, k_heads, v_heads = (split_heads(x, self.heads) for x in (q, k, v))  # [rays, heads, samples, head_dim]
        attended = merge_heads(self._attend(q_heads, k_heads, v_heads, sample_mask))  # [rays, samples, dim]
        if self.lepe is not None:
            attended = add_lepe(attended, v, sample_mask, self.lepe)
        return self._gated_output(attended, gate)

    def _polarity_attention(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        """Heads back in place (views of the projection's chunks, no copies) for the ray form:
        q, k, v `[rays, heads, samples, d]`, key_mask `[rays, samples]`."""
        temp_same, temp_opp = self.temperatures()
        q, k, v = (merge_heads(x) for x in (q, k, v))  # [rays, samples, dim]
        return split_heads(polarity_ray_attention(q, k, v, temp_same, temp_opp, key_mask, self.heads), self.heads)


@register_ray_attention("softmax")
class SoftmaxRayAttention(nn.Module):
    """GNT's original ray attention: multi-head dot-product softmax self-attention over samples.
    It has no LePE; `lepe` is accepted for a uniform constructor only. `dropout`: GNT's `attn_dp`."""

    def __init__(self, dim: int, heads: int, lepe: bool = True, dropout: float = 0.0):
        super().__init__()
        _check_heads(dim, heads)
        self.heads, self.dropout = heads, dropout
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(
        self, tokens: Float[Tensor, "rays samples dim"], sample_mask: Bool[Tensor, "rays samples"] | None = None
    ) -> Float[Tensor, "rays samples dim"]:
        q, k, v = (split_heads(x, self.heads) for x in self.to_qkv(tokens).chunk(3, dim=-1))
        dropout = self.dropout if self.training else 0.0
        return self.proj(merge_heads(masked_sdpa(q, k, v, sample_mask, dropout)))

    def first_query_weights(self, tokens: Float[Tensor, "rays samples dim"]) -> Float[Tensor, "rays samples"]:
        """The attention weights of the first sample over all samples, averaged over the heads (GNT's
        `ret_alpha` depth weights, without dropout): `tokens` `[rays, samples, dim]` -> `[rays, samples]`."""
        q, k, _ = self.to_qkv(tokens).chunk(3, dim=-1)
        q, k = split_heads(q[:, :1], self.heads), split_heads(k, self.heads)  # [rays, heads, 1 | samples, d]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # [rays, heads, 1, samples]
        return torch.softmax(scores, dim=-1).mean(dim=1)[:, 0]


# --------------------------------------------------------------------------------------------------
# Factories


VIEW_ATTENTION_KINDS = tuple(VIEW_ATTENTIONS)  # ("pola", "softmax", "subtraction")
RAY_ATTENTION_KINDS = tuple(RAY_ATTENTIONS)  # ("pola", "softmax")


def build_view_attention(kind: str, dim: int, heads: int, dropout: float = 0.0) -> nn.Module:
    """View (cross) attention of a registered kind (`registry.VIEW_ATTENTIONS`): "pola", "softmax" or
    "subtraction", dropping attention weights at rate `dropout` while training (kinds that form them)."""
    return lookup(VIEW_ATTENTIONS, "view", kind)(dim, heads, dropout)


def build_ray_attention(kind: str, dim: int, heads: int, lepe: bool = True, dropout: float = 0.0) -> nn.Module:
    """Ray (self) attention of a registered kind (`registry.RAY_ATTENTIONS`): "pola" or "softmax"
    (`lepe` applies to pola only; `dropout` as `build_view_attention`)."""
    return lookup(RAY_ATTENTIONS, "ray", kind)(dim, heads, lepe, dropout)
