"""What renders images from a trained GNT, in the precision `render.precision` picks.

    fp32   the GNT itself: training's forward, so today's outputs bit for bit;
    bf16   `FastRenderNetwork`: the same function with work moved out of the per-sample path (exact
           moves, below) and the matmuls, the fused attention kernels and the encoder in bf16.

`auto` picks bf16 on a CPU that reports AVX512-BF16 or AMX (bf16 matmuls run there at 2-6x the
fp32 speed, `docs/benchmarks.md`), fp32 on other CPUs (bf16 would be emulated and slower) and on a CUDA
device (today's behaviour: the trainer's precision, bf16 autocast under `trainer=gpu`).

The moves, each the same function as the GNT's forward (tests hold them to 1e-5 in fp32):
- The view tokens' first layer is linear in `[rgb, feature]`, and a bilinear read with border (or
  zero) padding is a weighted sum whose weights do not depend on the channel: so projecting each
  source view's feature map once, `W_f F` (about 12k feature pixels per view at factor 8), and
  reading the projection equals reading the features and projecting every sample's (6 M per view
  per frame). The colour part `W_rgb rgb` (3 channels) and the bias stay per sample; visibility
  zeroes the input, so it multiplies the projection before the bias.
- The position fusion's input is `[token, code(point), code(direction)]`: its first layer is the sum of
  three products, and the direction is the same for every sample of a ray, so its product is
  computed once per ray instead of once per sample (and no `[rays, samples, width + 126]` tensor is
  concatenated).
- Every block's view keys and values `[x, relu(W1 r + b1)] @ [W_kv | W2; W2]^T + b` come from one
  matmul with the blocks' matrices side by side (`ViewKeysValues`).

Memory passes fused (at width 32 they, not the matmuls, are most of a render's time on a CPU): the
linear layers keep their bias, ReLU and residual add inside the matmul (`fused_linear`), and the view
tokens' first layer, the masked maximum over views, the layer norms of residual sums and GNT's
subtraction attention run in C++ kernels (`render_kernels`), each against its PyTorch form in the tests.

Numerics of bf16: weights of the linear layers (and the LePE's) are converted once per render
network; layer norms keep fp32 weights and normalise in fp32, softmax and the read-out's pooling run in
fp32, the polarity kernels and the render kernels read bf16 and compute in fp32 registers (the
exponential feature maps included), the projections, visibility and sample positions are fp32, and the
outputs (colour, depth, weights) are fp32.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn

from pola_gnt.attention.modules import ViewAttention
from pola_gnt.geometry.rays import RayGrid, Rays, points_along_rays
from pola_gnt.model import render_kernels
from pola_gnt.model.consistency_prior import ConsistencyFeatures, FeatureRead, PriorImage
from pola_gnt.model.fused_linear import FusedLinear, fuse_linear_layers, fused_linear
from pola_gnt.model.gnt import GNT, GNTBlock, RayOutput, SampleAgreement, SourceViews, sinusoidal_encoding
from pola_gnt.model.settings import PRECISIONS, NetSettings
from pola_gnt.model.transformer import RayTransformerBlock, ViewTransformerBlock

CPUINFO = Path("/proc/cpuinfo")


# --------------------------------------------------------------------------------------------------
# Which precision


def cpu_bf16_feature(cpuinfo: Path | None = None) -> str | None:
    """The CPU's bf16 matmul units as the kernel reports them (`amx_bf16` or `avx512_bf16` among the
    flags of /proc/cpuinfo, or of `cpuinfo`), or None (other systems, or a CPU without them)."""
    try:
        text = (cpuinfo or CPUINFO).read_text()
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
            break
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX512-BF16"
    return None


@dataclass(frozen=True)
class RenderPrecision:
    dtype: torch.dtype  # float32: the GNT's own forward; bfloat16: FastRenderNetwork
    reason: str  # why, for the one line each command prints

    @property
    def name(self) -> str:
        return "bf16" if self.dtype == torch.bfloat16 else "fp32"


def resolve_render_precision(setting: str, device: torch.device) -> RenderPrecision:
    """`render.precision` (`auto`, `fp32`, `bf16`) on `device` -> the dtype and why."""
    if setting == "fp32":
        return RenderPrecision(torch.float32, "render.precision=fp32")
    if setting == "bf16":
        return RenderPrecision(torch.bfloat16, "render.precision=bf16")
    if setting != "auto":
        raise ValueError(f"render.precision: one of {PRECISIONS}, got {setting!r}")
    if device.type != "cpu":
        return RenderPrecision(torch.float32, f"auto: a {device.type.upper()} device keeps the trainer's precision")
    feature = cpu_bf16_feature()
    if feature is None:
        return RenderPrecision(torch.float32, "auto: the CPU reports no AVX512-BF16 or AMX (bf16 would be emulated)")
    return RenderPrecision(torch.bfloat16, f"auto: the CPU reports {feature}")


def effective_precision(net: GNT, precision: RenderPrecision) -> RenderPrecision:
    """`precision` as `net` can render it: GNT's converted checkpoints (`model.net.compat=gnt`) keep
    GNT's exact forward in fp32, which the fast network does not reproduce."""
    if precision.dtype != torch.float32 and net.gnt_compatible:
        return RenderPrecision(torch.float32, "model.net.compat=gnt renders with GNT's exact forward")
    return precision


@functools.cache
def _announce(line: str) -> None:
    print(line, flush=True)


def announce_render_precision(net: GNT, precision: RenderPrecision) -> None:
    """Print the one line that says which precision renders and why (once per process and choice)."""
    chosen = effective_precision(net, precision)
    _announce(f"render precision: {chosen.name} ({chosen.reason})")


def render_network(net: GNT, precision: RenderPrecision) -> GNT | FastRenderNetwork:
    """The network that renders images at `precision` (saying which, `announce_render_precision`): the
    GNT itself for fp32, else a `FastRenderNetwork` made from its weights as they are now."""
    announce_render_precision(net, precision)
    chosen = effective_precision(net, precision)
    return net if chosen.dtype == torch.float32 else FastRenderNetwork(net, chosen.dtype)


# --------------------------------------------------------------------------------------------------
# The fast network


@dataclass
class ProjectedSources:
    """Source views whose feature maps are already multiplied by the view tokens' first layer."""

    views: SourceViews
    projected: Float[Tensor, "views width h w"]  # W_f F, fp32, no bias


def _bilinear_channels(
    maps: Float[Tensor, "views channels h w"], grid: Float[Tensor, "views points 2"], padding_mode: str
) -> Float[Tensor, "views channels points"]:
    """`model.gnt`'s bilinear read, channels first (grid_sample's own layout: no transpose)."""
    values = F.grid_sample(maps, grid[:, :, None, :], mode="bilinear", padding_mode=padding_mode, align_corners=True)
    return values[..., 0]


class FastRenderNetwork:
    """The forward of a GNT (`model.gnt`) for rendering, with the exact moves of the module docstring,
    in `dtype` (bf16; fp32 runs the same moves, which is how the tests compare them with the GNT).
    Holds the GNT for its encoder and read-out (fp32) and converted copies of the rest, made once:
    later changes to the GNT's weights do not reach it. Not an `nn.Module`, so that holding one
    (`GNTSystem.rendering_network`) adds nothing to a checkpoint."""

    def __init__(self, net: GNT, dtype: torch.dtype = torch.bfloat16):
        if net.gnt_compatible:
            raise ValueError("FastRenderNetwork: model.net.compat=gnt renders with the GNT itself")
        self.net, self.dtype = net, dtype
        first, _, second = net.view_token_mlp
        assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)
        weight = first.weight.detach()  # [width, 3 + C]
        self.rgb_weight = weight[:, :3].contiguous()  # [width, 3], fp32 (3-channel products per sample)
        self.feature_weight = weight[:, 3:].contiguous()  # [width, C]: projects the feature maps
        self.first_bias = first.bias.detach()
        self.second = _converted(second, dtype)
        self.blocks = nn.ModuleList(_converted(block, dtype) for block in net.blocks)
        self.view_keys_values = ViewKeysValues(net, dtype)
        self.view_blend = None if net.view_blend is None else _converted(net.view_blend, dtype)
        self.agreement_embedding = (
            None if net.agreement_embedding is None else _converted(net.agreement_embedding, dtype)
        )
        # Position fusion's first layer split by input: token | code(point) | code(direction).
        self.fusion_parts: list[tuple[Tensor, Tensor, Tensor, Tensor] | None] = []
        width, half_code = net.settings.width, 3 * (1 + 2 * net.n_freqs)
        for block in net.blocks:
            assert isinstance(block, GNTBlock)
            if block.position_fusion is None:
                self.fusion_parts.append(None)
                continue
            layer = block.position_fusion[0]
            assert isinstance(layer, nn.Linear)
            w = layer.weight.detach()
            self.fusion_parts.append(
                (
                    w[:, :width].to(dtype),
                    w[:, width : width + half_code].to(dtype),
                    w[:, width + half_code :].t().contiguous(),  # fp32: once per ray
                    layer.bias.detach(),
                )
            )
        self._last_projected: ProjectedSources | None = None

    @property
    def settings(self) -> NetSettings:
        return self.net.settings

    @property
    def gnt_compatible(self) -> bool:
        return False

    @property
    def consistency_features(self) -> ConsistencyFeatures | None:
        return self.net.consistency_features

    def working_factor(self, images: Float[Tensor, "views 3 height width"]) -> int:
        return self.net.working_factor(images)

    def prior_image(self, image: Float[Tensor, "1 3 height width"]) -> PriorImage:
        """The GNT's `prior_image` (fp32, whatever autocast is around)."""
        with torch.autocast(image.device.type, enabled=False):
            return self.net.prior_image(image)

    # ---- source views ----------------------------------------------------------------------------

    def encode(self, images: Float[Tensor, "views 3 height width"]) -> Float[Tensor, "views channels h w"]:
        """The GNT's encoder with its convolutions in `dtype` (autocast; its norms in fp32), fp32 out."""
        with torch.autocast(images.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            return self.net.encode(images).float()

    def source_views(
        self,
        images: Float[Tensor, "views 3 height width"],
        c2w: Float[Tensor, "views 4 4"],
        intrinsics: Float[Tensor, "views 3 3"],
    ) -> SourceViews:
        return SourceViews(images=images, features=self.encode(images), c2w=c2w, intrinsics=intrinsics)

    def project(self, sources: SourceViews) -> ProjectedSources:
        """Multiply every feature pixel by the first layer's feature part, once per set of views (fp32,
        whatever autocast is around: a bf16-mixed trainer's test phase)."""
        features = sources.features.float()
        with torch.autocast(features.device.type, enabled=False):
            projected = torch.einsum("wc,vchx->vwhx", self.feature_weight, features)
        # Channels last: grid_sample reads it faster (the same values).
        projected = projected.contiguous(memory_format=torch.channels_last)
        return ProjectedSources(views=sources, projected=projected)

    def _projected(self, sources: SourceViews | ProjectedSources) -> ProjectedSources:
        if isinstance(sources, ProjectedSources):
            return sources
        # The render loops pass the same SourceViews chunk after chunk: project it once.
        cached = self._last_projected
        if cached is None or cached.views is not sources:
            cached = self.project(sources)
            self._last_projected = cached
        return cached

    # ---- rays -----------------------------------------------------------------------------------

    def __call__(
        self,
        rays: Rays,
        depths: Float[Tensor, "rays samples"],
        sources: SourceViews | ProjectedSources,
        grid: RayGrid | None = None,
        agreement: SampleAgreement | None = None,
    ) -> RayOutput:
        """As `GNT.forward`: `rays` (a chunk) at sample `depths` `[rays, samples]` (`grid`, `agreement`: as
        there). The network sets its own precision: an autocast around it (a bf16-mixed trainer's test phase)
        is switched off."""
        with torch.autocast(depths.device.type, enabled=False):
            return self._forward(rays, depths, sources, grid, agreement)

    def sample_agreement(
        self, rays: Rays, depths: Float[Tensor, "rays samples"], sources: SourceViews | ProjectedSources
    ) -> SampleAgreement:
        """As `GNT.sample_agreement`: the prior's statistics of each ray alone, fp32."""
        with torch.autocast(depths.device.type, enabled=False):
            views = self._projected(sources).views
            points = points_along_rays(rays, depths).float()
            grid, visible, _, rel_dirs = self._sample_geometry(points, rays, views)
            mean, spread, _ = self._prior_statistics(views, grid, visible, rel_dirs)
            return mean.unflatten(0, depths.shape), spread.unflatten(0, depths.shape)

    def aggregate(self, agreement: SampleAgreement, grid: RayGrid | None) -> SampleAgreement:
        return self.net.aggregate(agreement, grid)

    def _sample_geometry(
        self, points: Float[Tensor, "rays samples 3"], rays: Rays, views: SourceViews
    ) -> tuple[
        Float[Tensor, "views points 2"],
        Bool[Tensor, "views points"],
        Bool[Tensor, "points views"],
        Float[Tensor, "rays samples views 4"],
    ]:
        """Where each sample falls in each view ([views, points, 2]), whether it is seen there ([views, points]
        and [points, views]), its relative directions ([rays, samples, views, 4])."""
        height, width = views.images.shape[-2:]
        return render_kernels.sample_geometry(points, rays.origins, views.c2w, views.intrinsics, height, width)

    def _forward(
        self,
        rays: Rays,
        depths: Float[Tensor, "rays samples"],
        sources: SourceViews | ProjectedSources,
        ray_grid: RayGrid | None,
        agreement: SampleAgreement | None,
    ) -> RayOutput:
        net, dtype = self.net, self.dtype
        prepared = self._projected(sources)
        views = prepared.views
        n_rays, n_samples = depths.shape
        # fp32 geometry, reads and codes; the bf16 work starts at the second layer of the view tokens.
        points = points_along_rays(rays, depths).float()  # [rays, samples, 3]
        grid, visible, view_mask, rel_dirs = self._sample_geometry(points, rays, views)
        readout = net.readout
        source_colours = agreement
        if readout.needs_source_colours and agreement is None:
            # The prior's statistics, and the colours read on the way: [views, 3, points], zero where unseen.
            mean, spread, rgb = self._prior_statistics(views, grid, visible, rel_dirs)
            source_colours = (mean.unflatten(0, (n_rays, n_samples)), spread.unflatten(0, (n_rays, n_samples)))
            source_colours = net.aggregate(source_colours, ray_grid)
        else:  # the colours, channels first as grid_sample reads them
            rgb = _bilinear_channels(views.images.float(), grid, "border").mul_(visible[:, None, :].float())
        # First layer: relu(visible * (W_f f) + W_rgb rgb + b), in the token layout [points, views, width].
        tokens_in = render_kernels.view_token_inputs(
            prepared.projected, grid, visible, rgb, self.rgb_weight, self.first_bias, dtype
        )
        seen = view_mask.any(dim=-1).unflatten(0, (n_rays, n_samples))  # [rays, samples]
        point_code = sinusoidal_encoding(points, net.n_freqs)  # [rays, samples, 63]
        unit_dirs = F.normalize(rays.directions.float(), dim=-1)
        direction_code = sinusoidal_encoding(unit_dirs, net.n_freqs)  # [rays, 63]: once per ray

        view_tokens = self.second(tokens_in)  # [points, views, width]
        tokens = render_kernels.masked_max_over_views(view_tokens, view_mask).unflatten(0, (n_rays, n_samples))
        if self.agreement_embedding is not None and source_colours is not None:
            tokens = tokens + self.agreement_embedding(source_colours[1][..., None].to(dtype))
        # Every block's keys and values at once (one matmul, `ViewKeysValues`).
        keys_values = self.view_keys_values(view_tokens, rel_dirs.flatten(0, 1).to(dtype))
        point_code = point_code.to(dtype)
        for block, fusion, kv in zip(self.blocks, self.fusion_parts, keys_values):
            assert isinstance(block, GNTBlock)
            tokens = _view_block(block.view_block, tokens.flatten(0, 1), kv, view_mask)
            tokens = tokens.unflatten(0, (n_rays, n_samples))
            if fusion is not None and block.position_fusion is not None:
                token_weight, point_weight, direction_weight, bias = fusion
                per_ray = (direction_code @ direction_weight + bias).to(dtype)  # [rays, width]
                first = fused_linear(tokens, token_weight, residual=fused_linear(point_code, point_weight))
                first = torch.relu_(first.add_(per_ray[:, None, :]))
                tokens = block.position_fusion[2](first)
            tokens = _ray_block(block.ray_block, tokens, seen)
        if self.view_blend is not None and source_colours is not None:
            blended = self.view_blend(
                view_tokens.unflatten(0, (n_rays, n_samples)),
                rel_dirs,
                tokens,
                rgb.permute(2, 0, 1).unflatten(0, (n_rays, n_samples)),  # [rays, samples, views, 3]
                view_mask.unflatten(0, (n_rays, n_samples)),
            )
            source_colours = (blended, source_colours[1])
        return readout(tokens.float(), seen, depths.float(), source_colours)

    def _prior_statistics(
        self,
        views: SourceViews,
        grid: Float[Tensor, "views points 2"],
        visible: Bool[Tensor, "views points"],
        rel_dirs: Float[Tensor, "rays samples views 4"],
    ) -> tuple[Float[Tensor, "points 3"], Float[Tensor, " points"], Float[Tensor, "views 3 points"]]:
        """The read-out's consistency prior of every sample (`render_kernels.prior_statistics`), with the
        source colours it read there."""
        settings = self.net.settings
        factor = self.net.working_factor(views.images)
        extractor = self.net.consistency_features
        features, feature_read = None, FeatureRead(1.0, 0.0)
        if extractor is not None:
            features = views.consistency_maps(extractor, factor)
            feature_read = extractor.feature_read(factor)
        temperature = settings.readout_view_angle_weighting
        mean, spread, rgb = render_kernels.prior_statistics(
            views.prior_colours(settings.readout_consistency_levels, factor),
            grid,
            visible,
            features,
            rel_dirs[..., 3].flatten(0, 1) if temperature else None,
            0 if factor == 1 else 1,  # the spread's first level: the image's own colours, or the working image's
            feature_read,
            settings.readout_consistency_features,
            temperature,
        )
        return mean, spread, rgb


def _converted(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of `module` whose linear and convolution layers hold `dtype` weights, the linear layers
    with their bias and ReLU fused (`fused_linear`); layer norms and the polarity temperatures stay fp32
    (normalisations and the exponential feature maps compute in fp32). Frozen: rendering only."""
    module = copy.deepcopy(module)
    for layer in module.modules():
        if isinstance(layer, nn.Linear | nn.Conv1d):
            layer.to(dtype)
    fused = FusedLinear(module) if isinstance(module, nn.Linear) else fuse_linear_layers(module)
    return fused.requires_grad_(False).eval()


def _feed_forward(ffn: nn.Sequential, normed: Tensor, residual: Tensor) -> Tensor:
    """`residual + ffn(normed)` with the ReLU and the residual add inside the matmuls (`fused_linear`)."""
    first, _, last = ffn
    assert isinstance(first, FusedLinear) and isinstance(last, FusedLinear) and first.relu
    return last(first(normed), residual=residual)


def _view_block(
    block: ViewTransformerBlock,
    tokens: Float[Tensor, "points width"],
    kv: Float[Tensor, "points views 2*width"],
    view_mask: Bool[Tensor, "points views"],
) -> Float[Tensor, "points width"]:
    """`ViewTransformerBlock.forward` (eval) from the attention's keys and values."""
    attention = block.attention
    assert isinstance(attention, ViewAttention)
    normed, _ = render_kernels.layer_norm(block.attention_norm, tokens)
    attended = render_kernels.view_attention(attention, normed, kv, view_mask)
    normed, x = render_kernels.layer_norm(block.ffn_norm, attended, tokens)  # x = tokens + attended
    return _feed_forward(block.ffn, normed, x)


def _ray_block(
    block: RayTransformerBlock, tokens: Float[Tensor, "rays samples width"], seen: Bool[Tensor, "rays samples"]
) -> Float[Tensor, "rays samples width"]:
    """`RayTransformerBlock.forward` (eval)."""
    normed, _ = render_kernels.layer_norm(block.attention_norm, tokens)
    attended = render_kernels.ray_attention(block.attention, normed, seen)
    normed, x = render_kernels.layer_norm(block.ffn_norm, attended, tokens)
    return _feed_forward(block.ffn, normed, x)


class ViewKeysValues:
    """The keys and values `[k + pos, v + pos]` of every block's view attention in one matmul.

    Each block's are `keys_values_with_directions`: `[x, relu(W1 r + b1)] @ [W_kv | W2; W2]^T + b`, with
    its own relative-direction MLP (`pos_fc`). Stacked: the first layers of all the MLPs are one
    `[blocks * dim / 8, 4]` layer, and `[x, hidden_1, ..., hidden_B]` times a block matrix (each block's
    `W2` in its own columns, zeros elsewhere) gives every block's keys and values side by side: one pass
    over the `[points, views, ...]` tensors instead of a concatenation, a matmul and a bias copy per block.
    """

    def __init__(self, net: GNT, dtype: torch.dtype):
        attentions: list[ViewAttention] = []
        for block in net.blocks:
            assert isinstance(block, GNTBlock)
            attention = block.view_block.attention
            assert isinstance(attention, ViewAttention)
            attentions.append(attention)
        firsts, lasts, projections = [], [], []
        for attention in attentions:
            first, _, last = attention.pos_fc
            assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
            firsts.append(first)
            lasts.append(last)
            projections.append(attention.kv_projection())
        hidden = firsts[0].out_features
        width = projections[0][0].shape[1]
        self.pos_weight = torch.cat([f.weight.detach() for f in firsts]).to(dtype)  # [blocks * hidden, 4]
        self.pos_bias = torch.cat([f.bias.detach() for f in firsts]).to(dtype)
        rows, biases = [], []
        for index, ((kv_weight, kv_bias), last) in enumerate(zip(projections, lasts)):
            row = kv_weight.new_zeros(kv_weight.shape[0], width + hidden * len(attentions))
            row[:, :width] = kv_weight.detach()
            row[:, width + index * hidden : width + (index + 1) * hidden] = last.weight.detach().repeat(2, 1)
            rows.append(row)
            pos_bias = last.bias.detach().repeat(2)
            biases.append(pos_bias if kv_bias is None else kv_bias.detach() + pos_bias)
        self.weight = torch.cat(rows).to(dtype)  # [blocks * 2 dim, dim + blocks * hidden]
        self.bias = torch.cat(biases).to(dtype)
        self.n_blocks = len(attentions)

    def __call__(
        self, view_tokens: Float[Tensor, "points views dim"], rel_dirs: Float[Tensor, "points views 4"]
    ) -> list[Float[Tensor, "points views 2*dim"]]:
        """Each block's `[k + pos, v + pos]` (strided views of one tensor)."""
        hidden = fused_linear(rel_dirs, self.pos_weight, self.pos_bias, relu=True)
        keys_values = fused_linear(torch.cat([view_tokens, hidden], dim=-1), self.weight, self.bias)
        return list(keys_values.chunk(self.n_blocks, dim=-1))
