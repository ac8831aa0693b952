"""The GNT network: colour and depth of target rays from source views.

Data flow for a chunk of rays (all shapes per chunk; the caller picks the chunk size):

    points = o + t d                                   [rays, samples, 3]
    project into every source view, bilinear reads     [rays, samples, views, 3 + C]  (rgb, feature)
      + visibility mask                                [rays, samples, views]
      + relative directions                            [rays, samples, views, 4]
    per-view tokens  MLP(3 + C -> width -> width)      [rays, samples, views, width]   (fixed keys)
    point tokens     max over visible views            [rays, samples, width]
    n_blocks x:
      view block: point token attends over its views   [rays * samples, width]
      even blocks: fuse sin/cos codes of point + dir   [rays, samples, width + 126] -> width
      ray block: self-attention over seen samples      [rays, samples, width]
    read-out: attention pooling over seen samples      rgb [rays, 3], depth [rays]
      (scores minus `readout_consistency_prior` x the colour spread over the views, if set,
      measured on `readout_consistency_levels` levels of a blur pyramid of the source images,
      plus `readout_consistency_features` x the spread of ImageNet features, `ConsistencyFeatures`;
      with `readout_source_colour`, rgb = pooled mean source colour + the learned colour;
      with `readout_view_blend`, that mean weighted by learned per-view scores, `SourceViewBlend`;
      with `readout_view_angle_weighting`, by the views' angles to the target ray, `angle_weights`)

`view_attention="subtraction", ray_attention="softmax"` is GNT; `"pola", "pola"` is Pola-GNT.

Changes from the original GNT code (its bugs, see docs):
- the ray transformer masks samples that no source view sees (`seen`), so they are not keys;
- the initial point token is the max over *visible* views only;
- the read-out pools the normalised tokens with learned per-sample scores, softmaxed over seen
  samples. With zero-initialised scores this starts as GNT's mean over samples, and it gives an
  honest expected depth `sum_s weights_s * depth_s`, replacing GNT's depth taken from the last
  ray-attention row of the first sample;
- a point is inside a source image when it falls on a pixel's area (up to half a pixel beyond the
  outer pixel centres; GNT: only between them) and is read with border padding, so the edge strip
  reads the edge pixels' colours instead of a blend with the zero padding.

`compat: gnt` (`NetSettings.compat`) undoes these changes and every other difference that weights
cannot express, for GNT's converted checkpoints (`pola_gnt.interop.gnt_checkpoints`): GNT's read-out
(LayerNorm, mean over all samples, `Linear`; depth from the first sample's row of the last ray
attention, averaged over heads), no masking in the ray attention, max over all views, uniform view
weights for points no view sees, GNT's edge test and zero padding (values not zeroed where a view does
not see the point; behind the camera GNT reads zeros too), its relative-direction epsilons, its
encoder (input not centred, zero-padded decoder) and LayerNorm eps 1e-6 in the blocks. The rest is in
the converted weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn

from pola_gnt.attention.modules import SubtractionViewAttention
from pola_gnt.geometry.projection import pixels_to_grid, project_points, relative_directions
from pola_gnt.geometry.rays import RayGrid, Rays, points_along_rays
from pola_gnt.model.backbone import AlexNetEncoder
from pola_gnt.model.consistency_prior import (
    ConsistencyFeatures,
    PriorImage,
    angle_weights,
    feature_spread,
    pyramid_colour_statistics,
    working_images,
    working_pyramid,
)
from pola_gnt.model.encoder import ImageEncoder
from pola_gnt.model.neighbours import aggregate_spread
from pola_gnt.model.settings import NetSettings
from pola_gnt.model.transformer import RayTransformerBlock, ViewTransformerBlock


@runtime_checkable
class RenderingNetwork(Protocol):
    """What `SourceViews.keep_prior_images` asks of a network: the GNT's, or its render network's
    (`model.inference.FastRenderNetwork`, which this module cannot import)."""

    @property
    def settings(self) -> NetSettings: ...

    @property
    def consistency_features(self) -> ConsistencyFeatures | None: ...

    def working_factor(self, images: Tensor) -> int: ...


GNT_NORM_EPS = 1e-6  # the epsilon of the LayerNorms in GNT's transformer blocks (its read-out's: 1e-5)


@dataclass
class SourceViews:
    images: Float[Tensor, "views 3 height width"]  # in [0, 1]
    features: Float[Tensor, "views channels h w"]  # encoder output (any resolution: sampled in normalised coordinates)
    c2w: Float[Tensor, "views 4 4"]  # OpenCV camera-to-world
    intrinsics: Float[Tensor, "views 3 3"]  # for the images' (height, width)
    # What the consistency prior computes of these views, once (a render reads the same views chunk after
    # chunk): its colours by (kind, levels, working factor), ConsistencyFeatures' maps by (layer, dims, factor).
    _colours: dict[tuple[str, int, int], Tensor] = field(default_factory=dict, repr=False, compare=False)
    _consistency_maps: dict[tuple[int, int, int], Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def centers(self) -> Float[Tensor, "views 3"]:
        """Camera centres `[views, 3]`."""
        return self.c2w[:, :3, 3]

    def coarse_colours(self, levels: int, factor: int = 1) -> Float[Tensor, "views channels height width"]:
        """`working_pyramid(images, levels, factor)` of these views, computed once."""
        key = ("coarse", levels, factor)
        if key not in self._colours:
            self._colours[key] = working_pyramid(self.images, levels, factor)
        return self._colours[key]

    def prior_colours(self, levels: int, factor: int = 1) -> Float[Tensor, "views channels height width"]:
        """The images and their `coarse_colours(levels, factor)` side by side, fp32, channels last (each
        pixel's colours at every level together, as the prior's kernel reads them), computed once."""
        key = ("prior", levels, factor)
        if key not in self._colours:
            colours = torch.cat([self.images.float(), self.coarse_colours(levels, factor)], dim=1)
            self._colours[key] = colours.contiguous(memory_format=torch.channels_last)
        return self._colours[key]

    def consistency_maps(self, extractor: ConsistencyFeatures, factor: int = 1) -> Float[Tensor, "views channels h w"]:
        """`extractor` of these views' working images (`working_images(images, factor)`), computed once (or
        as `keep_consistency_maps` gave them)."""
        key = (extractor.layer, extractor.dims, factor)
        if key not in self._consistency_maps:
            self._consistency_maps[key] = extractor(working_images(self.images, factor))
        return self._consistency_maps[key]

    def keep_consistency_maps(
        self, extractor: ConsistencyFeatures, maps: Float[Tensor, "views channels h w"], factor: int = 1
    ) -> None:
        """Give `consistency_maps` what it would compute (training's `model.feature_cache`)."""
        self._consistency_maps[(extractor.layer, extractor.dims, factor)] = maps

    def keep_prior_images(self, net: RenderingNetwork, images: list[PriorImage]) -> None:
        """Give `coarse_colours` and `consistency_maps` what they would compute for `net` (the GNT or its
        render network), from each view's `net.prior_image` (kept for a scene's renders: `PriorImageCache`);
        the same values."""
        factor = net.working_factor(self.images)
        if images and images[0].coarse is not None:
            coarse = torch.cat([image.coarse for image in images if image.coarse is not None])
            self._colours[("coarse", net.settings.readout_consistency_levels, factor)] = coarse
        extractor = net.consistency_features
        if extractor is not None:
            features = [image.features for image in images if image.features is not None]
            self.keep_consistency_maps(extractor, extractor.combine(features), factor)


@dataclass
class RayOutput:
    rgb: Float[Tensor, "rays 3"]  # raw, not clipped; callers clip at eval
    depth: Float[Tensor, " rays"]  # expected depth (same units as the sample depths)
    weights: Float[Tensor, "rays samples"]  # read-out weights over samples (sum to 1 over seen samples)
    seen: Bool[Tensor, "rays samples"]  # sample visible in at least one source view


@dataclass
class GatheredSamples:
    values: Float[Tensor, "rays samples views channels"]  # rgb then feature (3 + C), zero where not visible
    visible: Bool[Tensor, "rays samples views"]  # in front of the source camera and inside its image
    rel_dirs: Float[Tensor, "rays samples views 4"]  # GNT's relative direction
    # the blurred colours `SourceViews.coarse_colours` (3 per level), zero where not visible; None when not
    # asked for
    coarse_rgb: Float[Tensor, "rays samples views coarse"] | None = None
    # `SourceViews.consistency_maps` read there, zero where not visible; None when not asked for
    consistency: Float[Tensor, "rays samples views consistency"] | None = None
    # whether the images' own colours are the pyramid's level 0 (`coarse_rgb` the levels above it), or
    # `coarse_rgb` holds every level, of images reduced to their working size (`NetSettings.working_size`)
    image_is_level0: bool = True


def _bilinear_read(
    maps: Float[Tensor, "views channels h w"], grid: Float[Tensor, "views points 2"], padding_mode: str = "border"
) -> Float[Tensor, "views points channels"]:
    """Read `maps` `[views, C, h, w]` at normalised `grid` `[views, points, 2]` -> `[views, points, C]`.

    Border padding: a point up to half a pixel outside the outer pixel centres is inside the image
    (it falls on an edge pixel's area, `project_points`) and reads that edge pixel's value, as a
    point on any other pixel's area reads nearby values; zero padding (GNT's) would blend it with black.
    """
    values = F.grid_sample(
        maps, grid[:, :, None, :], mode="bilinear", padding_mode=padding_mode, align_corners=True
    )  # [views, C, points, 1]
    return values[..., 0].transpose(1, 2)


def gather_source_samples(
    points: Float[Tensor, "rays samples 3"],
    target_centers: Float[Tensor, "rays 3"],
    sources: SourceViews,
    gnt_compatible: bool = False,
    colour_levels: int = 1,
    consistency: ConsistencyFeatures | None = None,
    working_factor: int = 1,
    features: bool = True,
) -> GatheredSamples:
    """Project `points` `[rays, samples, 3]` into every source view and read colour and features
    (`features` False: the colour alone, `values` `[..., 3]`: what the prior's statistics read).

    `target_centers` `[rays, 3]` are the ray origins. Colours are read from the full-resolution
    images; the feature maps at the same normalised coordinates (`align_corners=True`, so an integer
    pixel `(u, v)` of the image reads exactly that pixel). Runs in fp32 even under autocast: bf16
    pixel coordinates would be off by pixels. `gnt_compatible`: GNT's edge test (between the outer
    pixel centres), zero padding, values kept where a view does not see the point in front of it, and
    GNT's relative-direction epsilons (see the module docstring). `colour_levels` (the prior's pyramid
    levels; 0: no prior) > 1, or 1 at a working factor above 1, also reads the
    blurred colours of `SourceViews.coarse_colours` (`GatheredSamples.coarse_rgb`); `consistency` also reads
    its feature maps (`SourceViews.consistency_maps`, `GatheredSamples.consistency`); both of the images
    reduced by `working_factor` (`NetSettings.working_factor`; 1: the images themselves).
    """
    n_rays, n_samples, _ = points.shape
    height, width = sources.images.shape[-2:]
    padding_mode = "zeros" if gnt_compatible else "border"
    with torch.autocast(device_type=points.device.type, enabled=False):
        points = points.float()
        projection = project_points(
            points,
            sources.c2w.float(),
            sources.intrinsics.float(),
            height,
            width,
            edge_margin=0.0 if gnt_compatible else 0.5,
        )
        grid = pixels_to_grid(projection.pixels, height, width).flatten(1, 2)  # [views, rays * samples, 2]
        rgb = _bilinear_read(sources.images.float(), grid, padding_mode)  # [views, rays * samples, 3]
        values = rgb
        if features:
            read = _bilinear_read(sources.features.float(), grid, padding_mode)  # [views, rays * samples, C]
            values = torch.cat([rgb, read], dim=-1)
        # [views, rays * samples, 3 + C] -> [rays, samples, views, 3 + C]
        values = values.unflatten(1, (n_rays, n_samples)).permute(1, 2, 0, 3)
        visible = projection.visible.permute(1, 2, 0)  # [rays, samples, views]
        # Points behind a camera project to a mirrored pixel: zero what is not visible so nothing of
        # it can reach the output, whatever the attention does with masked views. GNT's code zeroes
        # only those behind (its projection sends them a million pixels away), and its values outside
        # an image are what zero padding reads.
        in_front = (projection.depth > 0).permute(1, 2, 0) if gnt_compatible else visible
        values = values * in_front[..., None]
        coarse_rgb = None
        if colour_levels > 1 or (colour_levels and working_factor > 1):
            coarse = _bilinear_read(sources.coarse_colours(colour_levels, working_factor), grid, padding_mode)
            coarse_rgb = coarse.unflatten(1, (n_rays, n_samples)).permute(1, 2, 0, 3) * in_front[..., None]
        consistency_values = None
        if consistency is not None:
            maps = sources.consistency_maps(consistency, working_factor)
            feature_pixels = consistency.feature_read(working_factor).feature_pixels(projection.pixels)
            feature_grid = pixels_to_grid(feature_pixels, *maps.shape[-2:]).flatten(1, 2)
            read = _bilinear_read(maps, feature_grid, padding_mode)
            consistency_values = read.unflatten(1, (n_rays, n_samples)).permute(1, 2, 0, 3) * in_front[..., None]
        rel_dirs = relative_directions(
            points, target_centers[:, None, :].float(), sources.centers.float(), gnt_epsilons=gnt_compatible
        )
    return GatheredSamples(
        values=values,
        visible=visible,
        rel_dirs=rel_dirs,
        coarse_rgb=coarse_rgb,
        consistency=consistency_values,
        image_is_level0=working_factor == 1,
    )


def sinusoidal_encoding(x: Float[Tensor, "*batch dim"], n_freqs: int) -> Float[Tensor, "*batch code"]:
    """NeRF positional code `[x, sin(2^k x), cos(2^k x)]` for k < n_freqs: `[..., d] -> [..., d (1 + 2 n_freqs)]`."""
    freqs = 2.0 ** torch.arange(n_freqs, dtype=x.dtype, device=x.device)
    scaled = (x[..., None, :] * freqs[:, None]).flatten(-2)  # [..., n_freqs * d]
    return torch.cat([x, torch.sin(scaled), torch.cos(scaled)], dim=-1)


def masked_max(
    tokens: Float[Tensor, "*batch views dim"], mask: Bool[Tensor, "*batch views"]
) -> Float[Tensor, "*batch dim"]:
    """Max of `tokens` `[..., views, dim]` over the views where `mask` `[..., views]` is True; 0 if none."""
    masked = tokens.masked_fill(~mask[..., None], float("-inf")).amax(dim=-2)
    return torch.where(mask.any(dim=-1, keepdim=True), masked, torch.zeros_like(masked))


def _mlp(in_dim: int, width: int) -> nn.Sequential:
    """`in_dim -> width -> width` with ReLU in between (GNT's token MLPs)."""
    return nn.Sequential(nn.Linear(in_dim, width), nn.ReLU(inplace=True), nn.Linear(width, width))


class GNTBlock(nn.Module):
    """One view block, an optional fusion with the point's positional code, one ray block."""

    def __init__(
        self,
        view_attention: str,
        ray_attention: str,
        width: int,
        heads: int,
        ffn_mult: int,
        position_dim: int,
        fuse_position: bool,
        ray_lepe: bool,
        dropout: float,
        norm_eps: float = 1e-5,
    ):
        super().__init__()
        self.view_block = ViewTransformerBlock(view_attention, width, heads, ffn_mult, dropout, norm_eps)
        self.position_fusion = _mlp(width + position_dim, width) if fuse_position else None
        self.ray_block = RayTransformerBlock(
            ray_attention, width, heads, ffn_mult, lepe=ray_lepe, dropout=dropout, norm_eps=norm_eps
        )

    def forward(
        self,
        tokens: Float[Tensor, "rays samples width"],
        view_tokens: Float[Tensor, "points views width"],
        rel_dirs: Float[Tensor, "points views 4"],
        view_mask: Bool[Tensor, "points views"],
        position_code: Float[Tensor, "rays samples position"],
        seen: Bool[Tensor, "rays samples"] | None,
    ) -> Float[Tensor, "rays samples width"]:
        """tokens `[rays, samples, width]`; view_tokens `[points, views, width]`, rel_dirs
        `[points, views, 4]`, view_mask `[points, views]` with points = rays * samples;
        position_code `[rays, samples, position_dim]`; seen `[rays, samples]` (None: every sample is a key)."""
        return self.ray_block(self.before_ray_block(tokens, view_tokens, rel_dirs, view_mask, position_code), seen)

    def before_ray_block(
        self,
        tokens: Float[Tensor, "rays samples width"],
        view_tokens: Float[Tensor, "points views width"],
        rel_dirs: Float[Tensor, "points views 4"],
        view_mask: Bool[Tensor, "points views"],
        position_code: Float[Tensor, "rays samples position"],
    ) -> Float[Tensor, "rays samples width"]:
        """The view block and the fusion: the ray block's input (arguments as `forward`)."""
        n_rays, n_samples, _ = tokens.shape
        # The view block treats every (ray, sample) as an independent point: [rays * samples, width].
        tokens = self.view_block(tokens.flatten(0, 1), view_tokens, rel_dirs, view_mask)
        tokens = tokens.unflatten(0, (n_rays, n_samples))  # [rays, samples, width]
        if self.position_fusion is not None:
            tokens = self.position_fusion(torch.cat([tokens, position_code.to(tokens.dtype)], dim=-1))
        return tokens


SampleAgreement = tuple[Float[Tensor, "rays samples 3"], Float[Tensor, "rays samples"]]
"""What the source views say of each sample (`source_colour_statistics`): their mean colour and their spread."""


def source_colour_statistics(
    gathered: GatheredSamples,
    feature_weight: float = 0.0,
    view_angle_weighting: float = 0.0,
) -> SampleAgreement:
    """What the source views say about each sample's colour: the mean RGB over the visible views
    (0 where no view sees the sample), and how much the views disagree about it, the standard
    deviation over the visible views averaged over the channels (the photo-consistency of multi-view
    stereo: near 0 where the sample lies on a surface that the views see alike, large in empty space
    in front of or behind textured surfaces). With `gathered.coarse_rgb` the spread is the mean of
    the spreads at every level of the blur pyramid (`working_pyramid`), level 0 the pixels' own (or,
    at a working size, the reduced image's).
    Samples seen by fewer than two views have no spread to measure and get the largest value any
    sample has, 1 / 2 (colours are in [0, 1]). With `gathered.consistency`, `feature_weight` times the
    spread of those features (`feature_spread`) is added to the spread. A positive
    `view_angle_weighting` weighs the mean by `angle_weights` (the spread stays over all views alike:
    it measures agreement)."""
    rgb = gathered.values[..., :3]  # zero where not visible
    mean, spread = pyramid_colour_statistics(
        rgb, gathered.coarse_rgb, gathered.visible, dim=2, image_is_level0=gathered.image_is_level0
    )
    if gathered.consistency is not None:
        spread = spread + feature_weight * feature_spread(gathered.consistency, gathered.visible, dim=2)
    if view_angle_weighting:
        weights = angle_weights(gathered.rel_dirs[..., 3], gathered.visible, view_angle_weighting, dim=2)
        mean = (weights[..., None] * rgb).sum(dim=2)
    return mean, spread


class SourceViewBlend(nn.Module):
    """Learned weights over the source views for the source-colour read-out (IBRNet's blending).

    The plain mean of the source views' colours blurs (ghosts) wherever the sample's depth or the
    views' agreement is off: a view far from the target ray or one that sees an occluder counts as
    much as the nearest. Each (sample, view) gets a score from the view's token (its colour and
    features there), its relative direction to the target ray (GNT's 4 numbers: how far apart the
    two rays are) and the sample's token after the blocks (what the ray's context says), and the
    colour is the softmax-weighted sum over the visible views. The score layer starts at zero, so
    training starts from the plain mean (`source_colour_statistics`'s, to rounding); both models alike.
    The hidden layer is the sum of three products (no `[.., views, 2 width + 4]` concatenation)."""

    def __init__(self, width: int):
        super().__init__()
        self.view = nn.Linear(width, width)
        self.direction = nn.Linear(4, width, bias=False)
        self.point_norm = nn.LayerNorm(width)
        self.point = nn.Linear(width, width, bias=False)
        self.score = nn.Linear(width, 1)
        nn.init.zeros_(self.score.weight)
        nn.init.zeros_(self.score.bias)

    def forward(
        self,
        view_tokens: Float[Tensor, "rays samples views width"],
        rel_dirs: Float[Tensor, "rays samples views 4"],
        point_tokens: Float[Tensor, "rays samples width"],
        rgb: Float[Tensor, "rays samples views 3"],
        visible: Bool[Tensor, "rays samples views"],
    ) -> Float[Tensor, "rays samples 3"]:
        """The blended source colour of each sample (0 where no view sees it); `rgb` zero where not
        visible. The scores' softmax and the sum run in fp32."""
        point = self.point(self.point_norm(point_tokens.float()).to(view_tokens.dtype))
        hidden = self.view(view_tokens) + self.direction(rel_dirs.to(view_tokens.dtype)) + point[:, :, None, :]
        scores = self.score(torch.relu(hidden))[..., 0].float()  # [rays, samples, views]
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        weights = torch.where(visible.any(dim=-1, keepdim=True), weights, torch.zeros_like(weights))
        return (weights[..., None] * rgb.float()).sum(dim=2)


class PooledReadout(nn.Module):
    """Colour and expected depth from attention pooling over the seen samples of each ray.

    The scores are learned from the tokens, minus `consistency_prior` times the colour spread of the
    sample across the source views (`source_colour_statistics`): with a positive prior the pooling
    starts on the samples the views agree about (surfaces) instead of the mean over the ray, so
    colours come from one depth rather than a blur of every depth, and the expected depth follows
    the scene from the first steps. 0 turns it off (GNT's start: uniform weights). A fixed weight,
    not a parameter.

    A positive `score_bound` B bounds the learned scores to (-B, B) as `B tanh(score / B)` (the score
    itself near 0, so training starts alike): with the prior on, the learned part can only reorder
    samples whose spreads lie within about B / prior of each other, i.e. refine the prior's choice
    near a surface, never move it to a sample the views disagree about. 0: unbounded.

    With `source_colour`, the colour is the pooled mean of the source views' colours plus the
    learned colour of the pooled token, whose layer starts at zero: training starts from the
    image-based render at the pooled depth (sharp where the depth is right, like IBRNet's blending)
    and learns the corrections (occlusions, view-dependent colour), instead of first having to carry
    every colour through the transformer (GNT: the learned colour alone).

    A positive `composite_temperature` T composites the scores front to back (`front_to_back_weights`):
    the first sample the views agree about hides those behind it, as volume rendering's opacity does
    (Soft3D, DeepView), instead of a softmax that weighs every consistent sample of the ray alike;
    `composite_share` of the weights is composited, the rest the softmax's."""

    def __init__(
        self,
        width: int,
        consistency_prior: float = 0.0,
        source_colour: bool = False,
        colour_residual: bool = True,
        score_bound: float = 0.0,
        composite_temperature: float = 0.0,
        composite_share: float = 1.0,
    ):
        super().__init__()
        if not (colour_residual or source_colour):
            raise ValueError("PooledReadout: without the source colour the learned colour is the only colour")
        self.norm = nn.LayerNorm(width)
        self.score = nn.Linear(width, 1)
        # Without the residual the colour is the pooled source colour alone: no layer that nothing trains.
        self.to_rgb = nn.Linear(width, 3) if colour_residual else None
        self.consistency_prior = consistency_prior
        self.source_colour = source_colour
        self.score_bound = score_bound
        self.composite_temperature, self.composite_share = composite_temperature, composite_share
        # Zero scores = uniform weights (without the prior): training starts from GNT's mean over samples.
        nn.init.zeros_(self.score.weight)
        nn.init.zeros_(self.score.bias)
        if source_colour and self.to_rgb is not None:
            nn.init.zeros_(self.to_rgb.weight)
            nn.init.zeros_(self.to_rgb.bias)

    @property
    def needs_source_colours(self) -> bool:
        return bool(self.consistency_prior) or self.source_colour

    def forward(
        self,
        tokens: Float[Tensor, "rays samples width"],
        seen: Bool[Tensor, "rays samples"],
        depths: Float[Tensor, "rays samples"],
        source_colours: tuple[Float[Tensor, "rays samples 3"], Float[Tensor, "rays samples"]] | None = None,
    ) -> RayOutput:
        """tokens `[rays, samples, width]`, seen `[rays, samples]`, depths `[rays, samples]`, and the
        source views' mean colour `[rays, samples, 3]` and colour spread `[rays, samples]`
        (`source_colour_statistics`; needed when `needs_source_colours`)."""
        if self.needs_source_colours and source_colours is None:
            raise ValueError("PooledReadout: a consistency prior or source colours need the source colour statistics")
        tokens = self.norm(tokens)
        scores = self.score(tokens)[..., 0].float()  # [rays, samples]; softmax in fp32
        if self.score_bound:
            scores = self.score_bound * torch.tanh(scores / self.score_bound)
        if self.consistency_prior and source_colours is not None:
            scores = scores - self.consistency_prior * source_colours[1].float()
        # Rays that no source view sees anywhere get uniform weights over all samples (finite output).
        usable = seen | ~seen.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~usable, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if self.composite_temperature:
            composited = front_to_back_weights(scores, self.composite_temperature)
            weights = self.composite_share * composited + (1.0 - self.composite_share) * weights
        rgb = torch.zeros(weights.shape[0], 3, device=weights.device)
        if self.to_rgb is not None:
            pooled = (weights[..., None] * tokens.float()).sum(dim=1)  # [rays, width]
            rgb = self.to_rgb(pooled).float()
        if self.source_colour and source_colours is not None:
            rgb = rgb + (weights[..., None] * source_colours[0].float()).sum(dim=1)
        depth = (weights * depths.float()).sum(dim=-1)
        return RayOutput(rgb=rgb, depth=depth, weights=weights, seen=seen)


def front_to_back_weights(scores: Float[Tensor, "rays samples"], temperature: float) -> Float[Tensor, "rays samples"]:
    """Pooling weights from `scores` (samples near to far, -inf where not usable) composited front to back:
    each sample's opacity `alpha = exp((score - the ray's best score) / temperature)`, its weight alpha times
    the light the samples in front of it let through, `prod (1 - alpha)`. The best sample's alpha is 1, so
    nothing behind it counts and the weights sum to 1 exactly; a lower temperature makes every sample short
    of the best more transparent. fp32."""
    alpha = torch.exp((scores.float() - scores.float().amax(dim=-1, keepdim=True)) / temperature)
    transmittance = torch.cumprod(1.0 - alpha, dim=-1)
    before = torch.cat([torch.ones_like(transmittance[:, :1]), transmittance[:, :-1]], dim=-1)
    return alpha * before


class GNT(nn.Module):
    """Generalizable NeRF Transformer with selectable view / ray attention (see module docstring)."""

    def __init__(self, settings: NetSettings, lpips_weights: str | None = None):
        """`lpips_weights`: the run's `metrics.lpips_weights`, where an AlexNet encoder with a null
        `backbone_weights` looks for its npz first (`model.backbone.alexnet_weights_path`)."""
        super().__init__()
        self.settings = settings
        n_freqs, width = settings.n_freqs, settings.width
        self.n_freqs = n_freqs
        self.encoder_input_scale = settings.encoder_input_scale
        self.gnt_compatible = settings.gnt_compatible
        self.encoder: ImageEncoder | AlexNetEncoder
        if settings.encoder.backbone == "alexnet":
            self.encoder = AlexNetEncoder(settings.encoder, lpips_weights)
        else:
            self.encoder = ImageEncoder(settings.encoder, gnt_compatible=self.gnt_compatible)
        position_dim = 2 * 3 * (1 + 2 * n_freqs)  # codes of the 3D point and the unit ray direction
        self.view_token_mlp = _mlp(3 + self.encoder.feature_channels, width)
        self.blocks = nn.ModuleList(
            GNTBlock(
                settings.view_attention,
                settings.ray_attention,
                width,
                settings.heads,
                settings.ffn_mult,
                position_dim,
                fuse_position=index % 2 == 0,
                ray_lepe=settings.ray_lepe,
                dropout=settings.dropout,
                norm_eps=GNT_NORM_EPS if self.gnt_compatible else 1e-5,
            )
            for index in range(settings.n_blocks)
        )
        if self.gnt_compatible:
            for block in self.blocks:
                assert isinstance(block, GNTBlock) and isinstance(block.view_block.attention, SubtractionViewAttention)
                block.view_block.attention.zero_unseen_points = False
        self.readout = PooledReadout(
            width,
            settings.readout_consistency_prior,
            settings.readout_source_colour,
            settings.readout_colour_residual,
            settings.readout_score_bound,
            settings.readout_composite_temperature,
            settings.readout_composite_share,
        )
        # The prior's aggregated spread as an input of the point tokens, zero-initialised (no change at first).
        self.agreement_embedding = nn.Linear(1, width) if settings.readout_agreement_input else None
        if self.agreement_embedding is not None:
            nn.init.zeros_(self.agreement_embedding.weight)
            nn.init.zeros_(self.agreement_embedding.bias)
        self.view_blend = SourceViewBlend(width) if settings.readout_view_blend else None
        self.consistency_features = (
            ConsistencyFeatures(
                settings.readout_consistency_feature_layer,
                settings.encoder.backbone_weights,
                lpips_weights,
                settings.readout_consistency_feature_dims,
            )
            if settings.readout_consistency_features
            else None
        )

    def prior_image(self, image: Float[Tensor, "1 3 height width"]) -> PriorImage:
        """What the read-out's prior computes of one source image alone, for a scene's renders
        (`SourceViews.keep_prior_images`): none of it where the read-out reads no source colours."""
        coarse, features = None, None
        if self.readout.needs_source_colours:
            factor, levels = self.working_factor(image), self.settings.readout_consistency_levels
            if levels > 1 or factor > 1:
                coarse = working_pyramid(image, levels, factor)
            if self.consistency_features is not None:
                features = self.consistency_features.image_features(working_images(image, factor))
        return PriorImage(coarse, features)

    def working_factor(self, images: Float[Tensor, "views 3 height width"]) -> int:
        """The whole factor by which the source `images` are reduced for their own work
        (`NetSettings.working_size`: the encoder's input, the prior's pyramid and features)."""
        return self.settings.working_factor(*images.shape[-2:])

    def encoder_input(self, images: Float[Tensor, "views 3 height width"]) -> Float[Tensor, "views 3 h w"]:
        """The source images as the encoder sees them: their working images (`working_factor`) at
        `encoder_input_scale` of their size."""
        images = working_images(images, self.working_factor(images))
        if self.encoder_input_scale == 1.0:
            return images
        return F.interpolate(
            images,
            scale_factor=self.encoder_input_scale,
            mode="bilinear",
            align_corners=False,
            antialias=True,
        )

    def encode(self, images: Float[Tensor, "views 3 height width"]) -> Float[Tensor, "views channels h w"]:
        """Source images `[views, 3, H, W]` in [0, 1] -> feature maps `[views, C, h, w]`."""
        return self.encoder(self.encoder_input(images))

    def source_views(
        self,
        images: Float[Tensor, "views 3 height width"],
        c2w: Float[Tensor, "views 4 4"],
        intrinsics: Float[Tensor, "views 3 3"],
    ) -> SourceViews:
        """Encode `images` `[views, 3, H, W]` and bundle them with their cameras."""
        return SourceViews(images=images, features=self.encode(images), c2w=c2w, intrinsics=intrinsics)

    def parameter_counts(self) -> dict[str, int]:
        """Number of parameters of the encoder and of the rest (the transformer)."""
        encoder = sum(p.numel() for p in self.encoder.parameters())
        total = sum(p.numel() for p in self.parameters())
        return {"encoder": encoder, "transformer": total - encoder}

    def gather(
        self,
        rays: Rays,
        depths: Float[Tensor, "rays samples"],
        sources: SourceViews,
        prior: bool = True,
        features: bool = True,
    ) -> GatheredSamples:
        """`gather_source_samples` of `rays` at `depths` as this network reads them (`prior`: with what the
        read-out's prior reads besides the colours and features, where it has one; `features`: the encoder's
        features too)."""
        settings = self.settings
        reads_prior = prior and self.readout.needs_source_colours
        return gather_source_samples(
            points_along_rays(rays, depths),
            rays.origins,
            sources,
            self.gnt_compatible,
            settings.readout_consistency_levels if reads_prior else 0,
            self.consistency_features if reads_prior else None,
            self.working_factor(sources.images),
            features=features,
        )

    def agreement(self, gathered: GatheredSamples) -> SampleAgreement:
        """What the source views say of each gathered sample (`source_colour_statistics` with this network's
        prior), each ray alone."""
        settings = self.settings
        return source_colour_statistics(
            gathered,
            settings.readout_consistency_features,
            settings.readout_view_angle_weighting,
        )

    def sample_agreement(
        self, rays: Rays, depths: Float[Tensor, "rays samples"], sources: SourceViews
    ) -> SampleAgreement:
        """`agreement` of `rays` at `depths`, each ray alone: what a render aggregates over its whole image
        before the network runs (`model.renderer`, `model.neighbours`). The colours alone: the features are
        the network's, read in its own pass."""
        return self.agreement(self.gather(rays, depths, sources, features=False))

    def aggregate(self, agreement: SampleAgreement, grid: RayGrid | None) -> SampleAgreement:
        """The spread of `agreement` averaged over the neighbour windows of its rays' `grid`
        (`model.neighbours`); as it is without the windows or a grid (rays one by one)."""
        windows = self.settings.readout_neighbour_windows
        if not windows or grid is None:
            return agreement
        return agreement[0], aggregate_spread(agreement[1], grid, windows)

    def forward(
        self,
        rays: Rays,
        depths: Float[Tensor, "rays samples"],
        sources: SourceViews,
        grid: RayGrid | None = None,
        agreement: SampleAgreement | None = None,
    ) -> RayOutput:
        """Render `rays` (a chunk) at sample `depths` `[rays, samples]` from `sources`. `grid`: how the rays
        lie in patches of an image, over which the prior's spread is aggregated (`aggregate`); `agreement`:
        the prior's statistics of these rays, already aggregated (a render's, over its whole image)."""
        n_rays, n_samples = depths.shape
        points = points_along_rays(rays, depths)  # [rays, samples, 3]
        gathered = self.gather(rays, depths, sources, prior=agreement is None)
        seen = gathered.visible.any(dim=-1)  # [rays, samples]
        source_colours = agreement
        if source_colours is None and self.readout.needs_source_colours:
            source_colours = self.aggregate(self.agreement(gathered), grid)

        # Keys/values of every view block, computed once: one token per (point, view),
        # flattened to points = rays * samples.
        view_tokens = self.view_token_mlp(gathered.values).flatten(0, 1)  # [points, views, width]
        view_mask = gathered.visible.flatten(0, 1)  # [points, views]
        rel_dirs = gathered.rel_dirs.flatten(0, 1)  # [points, views, 4]
        # GNT's code: the max over all views, seen or not.
        max_mask = torch.ones_like(view_mask) if self.gnt_compatible else view_mask
        tokens = masked_max(view_tokens, max_mask).unflatten(0, (n_rays, n_samples))  # [rays, samples, width]
        if self.agreement_embedding is not None and source_colours is not None:
            tokens = tokens + self.agreement_embedding(source_colours[1][..., None].to(tokens.dtype))

        unit_dirs = F.normalize(rays.directions.float(), dim=-1)[:, None, :].expand(n_rays, n_samples, 3)
        position_code = torch.cat(
            [sinusoidal_encoding(points.float(), self.n_freqs), sinusoidal_encoding(unit_dirs, self.n_freqs)],
            dim=-1,
        )  # [rays, samples, 126] at n_freqs = 10

        if self.gnt_compatible:
            return self._gnt_blocks_and_readout(tokens, view_tokens, rel_dirs, view_mask, position_code, seen, depths)
        for block in self.blocks:
            tokens = block(tokens, view_tokens, rel_dirs, view_mask, position_code, seen)
        if self.view_blend is not None and source_colours is not None:
            blended = self.view_blend(
                view_tokens.unflatten(0, (n_rays, n_samples)),
                gathered.rel_dirs,
                tokens,
                gathered.values[..., :3],
                gathered.visible,
            )
            source_colours = (blended, source_colours[1])
        return self.readout(tokens, seen, depths, source_colours)

    def _gnt_blocks_and_readout(
        self,
        tokens: Float[Tensor, "rays samples width"],
        view_tokens: Float[Tensor, "points views width"],
        rel_dirs: Float[Tensor, "points views 4"],
        view_mask: Bool[Tensor, "points views"],
        position_code: Float[Tensor, "rays samples position"],
        seen: Bool[Tensor, "rays samples"],
        depths: Float[Tensor, "rays samples"],
    ) -> RayOutput:
        """GNT's code from the first block on: every sample a key of the ray attention, the colour from
        the mean of the normalised tokens over all samples, the depth weights from the first sample's
        attention in the last block (GNT's `ret_alpha`)."""
        weights = depths.new_full(depths.shape, 1.0 / depths.shape[-1])  # no blocks: no attention
        for block in self.blocks:
            assert isinstance(block, GNTBlock)
            tokens = block.before_ray_block(tokens, view_tokens, rel_dirs, view_mask, position_code)
            if block is self.blocks[-1]:
                weights = block.ray_block.first_sample_weights(tokens).float()
            tokens = block.ray_block(tokens, None)
        assert self.readout.to_rgb is not None  # compat=gnt: GNT's learned colour (NetSettings.check)
        rgb = self.readout.to_rgb(self.readout.norm(tokens).mean(dim=1)).float()
        depth = (weights * depths.float()).sum(dim=-1)
        return RayOutput(rgb=rgb, depth=depth, weights=weights, seen=seen)
