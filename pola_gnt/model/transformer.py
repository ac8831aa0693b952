"""GNT's two transformer blocks around interchangeable attention modules.

Both blocks are pre-LayerNorm with residual connections and a ReLU feed-forward network
`dim -> ffn_mult * dim -> dim`, as GNT. `dropout` is GNT's rate (0.1 in its recipe) wherever GNT drops:
on the attention weights (the kinds that form them), on the attention's output and after both layers
of the feed-forward network; dropout modules hold no parameters, so checkpoints do not depend on it.
The attention itself (projections, relative-direction embedding, masking) lives in
`pola_gnt.attention.modules`, chosen by `kind`:

- view block: cross-attention of one point token over its source-view tokens
  (`"subtraction"` = GNT's vector attention, `"pola"`, `"softmax"`);
- ray block: self-attention over the samples of one ray (`"softmax"` = GNT, `"pola"`).

`norm_eps` is the LayerNorms' epsilon: PyTorch's 1e-5 here, GNT's code 1e-6 (`model.net.compat: gnt`).
"""

from __future__ import annotations

from jaxtyping import Bool, Float
from torch import Tensor, nn

from pola_gnt.attention.modules import SoftmaxRayAttention, build_ray_attention, build_view_attention, training_dropout


class FeedForward(nn.Sequential):
    """`dim -> ffn_mult * dim -> dim` with ReLU, dropout after the ReLU and after the output (GNT).
    The dropout is applied in `forward`, not held as layers, so the parameter names stay `0.*`, `2.*`."""

    def __init__(self, dim: int, ffn_mult: int = 4, dropout: float = 0.0):
        super().__init__(nn.Linear(dim, ffn_mult * dim), nn.ReLU(inplace=True), nn.Linear(ffn_mult * dim, dim))
        self.dropout = dropout

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 (nn.Sequential's name)
        if not (self.training and self.dropout > 0):  # nothing to drop: Sequential's own forward
            return super().forward(input)
        first, activation, last = self[0], self[1], self[2]
        hidden = training_dropout(activation(first(input)), self.dropout, self.training)
        return training_dropout(last(hidden), self.dropout, self.training)


class ViewTransformerBlock(nn.Module):
    """Updates each point token by attending over the source views that see it.

    Only the query (the point token) is normalised: the per-view tokens are the keys/values of every
    block, computed once per forward (GNT).
    """

    def __init__(
        self, kind: str, dim: int, heads: int, ffn_mult: int = 4, dropout: float = 0.0, norm_eps: float = 1e-5
    ):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.attention = build_view_attention(kind, dim, heads, dropout)
        self.dropout = dropout
        self.ffn_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.ffn = FeedForward(dim, ffn_mult, dropout)

    def forward(
        self,
        point_tokens: Float[Tensor, "points dim"],
        view_tokens: Float[Tensor, "points views dim"],
        rel_dirs: Float[Tensor, "points views 4"],
        view_mask: Bool[Tensor, "points views"],
    ) -> Float[Tensor, "points dim"]:
        """point_tokens `[points, dim]`, view_tokens `[points, views, dim]`, rel_dirs
        `[points, views, 4]`, view_mask `[points, views]` (True = visible) -> `[points, dim]`."""
        attended = self.attention(self.attention_norm(point_tokens), view_tokens, rel_dirs, view_mask)
        x = point_tokens + training_dropout(attended, self.dropout, self.training)
        return x + self.ffn(self.ffn_norm(x))


class RayTransformerBlock(nn.Module):
    """Self-attention over the samples of each ray; masked samples are excluded as keys."""

    def __init__(
        self,
        kind: str,
        dim: int,
        heads: int,
        ffn_mult: int = 4,
        lepe: bool = True,
        dropout: float = 0.0,
        norm_eps: float = 1e-5,
    ):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.attention = build_ray_attention(kind, dim, heads, lepe=lepe, dropout=dropout)
        self.dropout = dropout
        self.ffn_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.ffn = FeedForward(dim, ffn_mult, dropout)

    def forward(
        self, tokens: Float[Tensor, "rays samples dim"], sample_mask: Bool[Tensor, "rays samples"] | None = None
    ) -> Float[Tensor, "rays samples dim"]:
        """tokens `[rays, samples, dim]`, sample_mask `[rays, samples]` (True = usable key)."""
        attended = self.attention(self.attention_norm(tokens), sample_mask)
        x = tokens + training_dropout(attended, self.dropout, self.training)
        return x + self.ffn(self.ffn_norm(x))

    def first_sample_weights(self, tokens: Float[Tensor, "rays samples dim"]) -> Float[Tensor, "rays samples"]:
        """GNT's depth weights: what the first sample of each ray attends to in this block's softmax
        attention (every sample a key), averaged over the heads; `tokens` are the block's input."""
        attention = self.attention
        if not isinstance(attention, SoftmaxRayAttention):
            raise TypeError(f"first_sample_weights needs softmax ray attention, not {type(attention).__name__}")
        return attention.first_query_weights(self.attention_norm(tokens))
