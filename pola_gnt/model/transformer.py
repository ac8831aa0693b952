"""GNT's two transformer blocks around interchangeable attention modules.

Both blocks are pre-LayerNorm with residual connections and a ReLU feed-forward network
`dim -> ffn_mult * dim -> dim`, as GNT. The attention itself (projections, relative-direction
embedding, masking) lives in `pola_gnt.attention.modules`, chosen by `kind`:

- view block: cross-attention of one point token over its source-view tokens
  (`"subtraction"` = GNT's vector attention, `"pola"`, `"softmax"`);
- ray block: self-attention over the samples of one ray (`"softmax"` = GNT, `"pola"`).
"""

from __future__ import annotations

from jaxtyping import Bool, Float
from torch import Tensor, nn

from pola_gnt.attention.modules import build_ray_attention, build_view_attention


class FeedForward(nn.Sequential):
    """`dim -> ffn_mult * dim -> dim` with ReLU."""

    def __init__(self, dim: int, ffn_mult: int = 4):
        super().__init__(nn.Linear(dim, ffn_mult * dim), nn.ReLU(inplace=True), nn.Linear(ffn_mult * dim, dim))


class ViewTransformerBlock(nn.Module):
    """Updates each point token by attending over the source views that see it.

    Only the query (the point token) is normalised: the per-view tokens are the keys/values of every
    block, computed once per forward (GNT).
    """

    def __init__(self, kind: str, dim: int, heads: int, ffn_mult: int = 4):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = build_view_attention(kind, dim, heads)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, ffn_mult)

    def forward(
        self,
        point_tokens: Float[Tensor, "points dim"],
        view_tokens: Float[Tensor, "points views dim"],
        rel_dirs: Float[Tensor, "points views 4"],
        view_mask: Bool[Tensor, "points views"],
    ) -> Float[Tensor, "points dim"]:
        """point_tokens `[points, dim]`, view_tokens `[points, views, dim]`, rel_dirs
        `[points, views, 4]`, view_mask `[points, views]` (True = visible) -> `[points, dim]`."""
        x = point_tokens + self.attention(self.attention_norm(point_tokens), view_tokens, rel_dirs, view_mask)
        return x + self.ffn(self.ffn_norm(x))


class RayTransformerBlock(nn.Module):
    """Self-attention over the samples of each ray; masked samples are excluded as keys."""

    def __init__(self, kind: str, dim: int, heads: int, ffn_mult: int = 4, lepe: bool = True):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = build_ray_attention(kind, dim, heads, lepe=lepe)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, ffn_mult)

    def forward(
        self, tokens: Float[Tensor, "rays samples dim"], sample_mask: Bool[Tensor, "rays samples"] | None = None
    ) -> Float[Tensor, "rays samples dim"]:
        """tokens `[rays, samples, dim]`, sample_mask `[rays, samples]` (True = usable key)."""
        x = tokens + self.attention(self.attention_norm(tokens), sample_mask)
        return x + self.ffn(self.ffn_norm(x))
