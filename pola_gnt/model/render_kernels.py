"""The rendering network's fused CPU kernels (`csrc/render_cpu.cpp`) and the PyTorch form of each.

`FastRenderNetwork` calls the functions here; each runs the C++ kernel where it is built (on the CPU,
bf16 or float32 storage) and otherwise its PyTorch form, which is the function's definition and what
the tests compare the kernels with. The kernels fuse chains of memory passes (at width 32 they, not the
matmuls, are most of a render's time on a CPU); both models use them alike.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn

from pola_gnt.attention.modules import SoftmaxRayAttention, SubtractionViewAttention, ViewAttention
from pola_gnt.core.cpp_build import build_extension
from pola_gnt.geometry.projection import pixels_to_grid, project_points, relative_directions
from pola_gnt.model.consistency_prior import FeatureRead, view_major_statistics

SOURCE = Path(__file__).resolve().parent / "csrc" / "render_cpu.cpp"
_LIBRARY = "pola_gnt_render"
MAX_WIDTH = 512  # kMaxWidth: the most channels a kernel's per-thread row holds
MAX_SUBTRACTION_VIEWS = 64  # kMaxSubtractionViews
MAX_PRIOR_VIEWS = 32  # kMaxPriorViews
MAX_PRIOR_CHANNELS = 64  # kMaxPriorChannels: colour channels (3 per level), feature channels
_built: bool | None = None


def available() -> bool:
    """Whether the kernels run here (compiled on the first call, `core.cpp_build`)."""
    global _built
    if _built is None:
        _built = build_extension(_LIBRARY, SOURCE, "rendering")
    return _built


def _kernels(*tensors: Tensor, width: int) -> bool:
    return (
        all(t.device.type == "cpu" for t in tensors)
        and width <= MAX_WIDTH
        and not torch.is_grad_enabled()
        and available()
    )


def view_token_inputs(
    projected: Float[Tensor, "views width h w"],
    grid: Float[Tensor, "views points 2"],
    visible: Bool[Tensor, "views points"],
    rgb: Float[Tensor, "views 3 points"],
    rgb_weight: Float[Tensor, "width 3"],
    bias: Float[Tensor, " width"],
    dtype: torch.dtype,
) -> Float[Tensor, "points views width"]:
    """The view tokens' first layer, `relu(visible * read(projected) + W_rgb rgb + b)`, in `dtype` and in
    the token layout `[points, views, width]`. `read` is `grid_sample`'s bilinear read with border
    padding and `align_corners=True` at `grid` (normalised coordinates), `rgb` the colours read alike
    (zero where not visible); everything fp32 until the result is stored."""
    width = projected.shape[1]
    if _kernels(projected, grid, rgb, width=width) and dtype in (torch.float32, torch.bfloat16):
        maps = projected.permute(0, 2, 3, 1).contiguous()  # [views, h, w, width]: free for channels_last maps
        return getattr(torch.ops, _LIBRARY).view_token_inputs(
            maps, grid.contiguous(), visible.contiguous(), rgb.contiguous(), rgb_weight.contiguous(), bias, dtype
        )
    read = F.grid_sample(projected, grid[:, :, None, :], mode="bilinear", padding_mode="border", align_corners=True)
    hidden = read[..., 0].mul_(visible[:, None, :].to(read.dtype))  # [views, width, points]
    hidden = torch.baddbmm(hidden, rgb_weight.expand(len(rgb), -1, -1), rgb)
    hidden = torch.relu_(hidden.add_(bias[:, None]))
    tokens = hidden.new_empty((hidden.shape[2], hidden.shape[0], width), dtype=dtype)
    tokens.permute(1, 2, 0).copy_(hidden)  # one pass to the token layout
    return tokens


def masked_max_over_views(
    tokens: Float[Tensor, "points views width"], mask: Bool[Tensor, "points views"]
) -> Float[Tensor, "points width"]:
    """`gnt.masked_max`: the maximum of each point's tokens over the views that see it, 0 where none
    does (exact in any order and either form)."""
    if _kernels(tokens, width=tokens.shape[-1]) and tokens.dtype in (torch.float32, torch.bfloat16):
        return getattr(torch.ops, _LIBRARY).masked_max_views(tokens.contiguous(), mask.contiguous())
    masked = torch.where(mask[..., None], tokens, torch.tensor(float("-inf"), dtype=tokens.dtype))
    out = masked[:, 0]
    for view in range(1, masked.shape[1]):
        out = torch.maximum(out, masked[:, view])
    return torch.where(mask.any(dim=-1, keepdim=True), out, torch.zeros((), dtype=out.dtype))


def layer_norm(
    norm: nn.LayerNorm, x: Float[Tensor, "*batch width"], residual: Float[Tensor, "*batch width"] | None = None
) -> tuple[Float[Tensor, "*batch width"], Float[Tensor, "*batch width"]]:
    """`(norm(x + residual), x + residual)` (the sum in the dtype of `x`, rounded before the norm as a
    separate add would round it; `x` itself without a residual). float32 statistics and weights."""
    width = x.shape[-1]
    if (
        _kernels(x, width=width)
        and x.dtype in (torch.float32, torch.bfloat16)
        and norm.weight is not None
        and norm.weight.dtype == torch.float32
    ):
        flat = x.reshape(-1, width).contiguous()
        other = None if residual is None else residual.reshape(-1, width).contiguous()
        normed, summed = getattr(torch.ops, _LIBRARY).layer_norm_rows(flat, other, norm.weight, norm.bias, norm.eps)
        return normed.view(x.shape), (x if residual is None else summed.view(x.shape))
    summed = x if residual is None else x + residual
    return norm(summed), summed


def view_attention(
    attention: ViewAttention,
    query: Float[Tensor, "points width"],
    kv: Float[Tensor, "points views 2*width"],
    view_mask: Bool[Tensor, "points views"],
) -> Float[Tensor, "points width"]:
    """`attention.attend_with_kv(query, kv, view_mask)` (eval), GNT's subtraction attention through its
    fused kernel (its `[points, views, width]` differences, scores and weights never written). The
    polarity kind has its own fused kernels behind `attend_with_kv` (`attention/view`)."""
    width = query.shape[-1]
    if (
        isinstance(attention, SubtractionViewAttention)
        and attention.zero_unseen_points
        and _kernels(query, kv, width=width)
        and query.dtype in (torch.float32, torch.bfloat16)
        and kv.shape[1] <= MAX_SUBTRACTION_VIEWS
    ):
        first, _, last = attention.attn_fc
        assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
        attended = getattr(torch.ops, _LIBRARY).subtraction_view_attention(
            attention.to_q(query),
            kv,
            view_mask.contiguous(),
            *(t.detach().float().contiguous() for t in (first.weight, first.bias, last.weight, last.bias)),
        )
        return attention.out_fc(attended)
    return attention.attend_with_kv(query, kv, view_mask)


def ray_attention(
    attention: nn.Module, tokens: Float[Tensor, "rays samples width"], sample_mask: Bool[Tensor, "rays samples"]
) -> Float[Tensor, "rays samples width"]:
    """`attention(tokens, sample_mask)` (eval), GNT's softmax ray attention through its fused kernel
    between the projections (`masked_sdpa`'s mask handling, scores and softmax in one pass; a ray whose
    mask keeps no sample gets zeros before the output projection, as there). The polarity kind has its
    own fused kernels (`attention/ray`)."""
    width = tokens.shape[-1]
    if (
        isinstance(attention, SoftmaxRayAttention)
        and _kernels(tokens, width=width)
        and tokens.dtype in (torch.float32, torch.bfloat16)
    ):
        qkv = attention.to_qkv(tokens)
        attended = getattr(torch.ops, _LIBRARY).softmax_ray_attention(qkv, sample_mask.contiguous(), attention.heads)
        return attention.proj(attended)
    return attention(tokens, sample_mask)


def prior_statistics(
    colours: Float[Tensor, "views channels height width"],
    grid: Float[Tensor, "views points 2"],
    visible: Bool[Tensor, "views points"],
    features: Float[Tensor, "views feature_channels h w"] | None,
    cosines: Float[Tensor, "points views"] | None,
    first_level: int,
    feature_read: FeatureRead,
    feature_weight: float,
    temperature: float,
) -> tuple[Float[Tensor, "points 3"], Float[Tensor, " points"], Float[Tensor, "views 3 points"]]:
    """`consistency_prior.view_major_statistics` (its arguments and results): the read-out's prior per
    sample, every view's colours and features of a point read and reduced in one pass of the kernel.
    float32 throughout."""
    channels = max(colours.shape[1], 0 if features is None else features.shape[1])
    if (
        _kernels(colours, grid, width=channels)
        and colours.dtype == grid.dtype == torch.float32
        and (features is None or features.dtype == torch.float32)
        and len(colours) <= MAX_PRIOR_VIEWS
        and channels <= MAX_PRIOR_CHANNELS
    ):
        no_features = colours.new_zeros((len(colours), 1, 1, 0))
        features_last = no_features if features is None else features.permute(0, 2, 3, 1).contiguous()
        weighted = temperature > 0 and cosines is not None
        return getattr(torch.ops, _LIBRARY).prior_statistics(
            colours.permute(0, 2, 3, 1).contiguous(),  # [views, H, W, channels]: free for channels_last maps
            grid.contiguous(),
            visible.contiguous(),
            features_last,
            cosines.contiguous() if weighted and cosines is not None else grid.new_zeros(0),
            first_level,
            feature_read.stride,
            feature_read.offset,
            feature_read.scale,
            feature_weight,
            temperature if weighted else 0.0,
        )
    return view_major_statistics(
        colours, grid, visible, features, cosines, first_level, feature_read, feature_weight, temperature
    )


def sample_geometry(
    points: Float[Tensor, "rays samples 3"],
    origins: Float[Tensor, "rays 3"],
    c2w: Float[Tensor, "views 4 4"],
    intrinsics: Float[Tensor, "views 3 3"],
    height: int,
    width: int,
) -> tuple[
    Float[Tensor, "views points 2"],
    Bool[Tensor, "views points"],
    Bool[Tensor, "points views"],
    Float[Tensor, "rays samples views 4"],
]:
    """Each sample (points = rays x samples) in every source view, float32: where it projects, as
    `grid_sample` coordinates (`project_points`, `pixels_to_grid`; a pixel's area around the outer
    pixel centres inside), whether it is visible there (views first, and points first), and GNT's
    relative directions to the ray's origin (`relative_directions`)."""
    n_rays, n_samples, _ = points.shape
    if _kernels(points, width=1):
        grid, visible, view_mask, rel_dirs = getattr(torch.ops, _LIBRARY).sample_geometry(
            points.float().reshape(-1, 3).contiguous(),
            torch.linalg.inv(c2w.float()).contiguous(),
            intrinsics.float().contiguous(),
            origins.float().contiguous(),
            c2w[:, :3, 3].float().contiguous(),
            height,
            width,
            0.5,
        )
        return grid, visible, view_mask, rel_dirs.unflatten(0, (n_rays, n_samples))
    projection = project_points(points.float(), c2w.float(), intrinsics.float(), height, width)
    grid = pixels_to_grid(projection.pixels, height, width).flatten(1, 2)
    visible = projection.visible.flatten(1)
    rel_dirs = relative_directions(points.float(), origins[:, None, :].float(), c2w[:, :3, 3].float())
    return grid, visible, visible.t().contiguous(), rel_dirs
