"""The read-out's consistency prior: what the source views say about each sample before any learning.

The read-out pools the samples of a ray (`model.gnt.PooledReadout`); its scores are lowered by
`readout_consistency_prior` times each sample's spread over the source views, so pooling starts on the
samples the views agree about (surfaces), as a plane sweep of multi-view stereo would. This module is
all of that prior, for both models alike:

    per source image      the colour pyramid (`colour_pyramid`) and AlexNet's unit-length conv features
                          with their moments (`ConsistencyFeatures.image_features`)
    per set of views      the features projected on their principal directions (`ConsistencyFeatures.combine`)
    per sample and view   the colours and features read where the sample projects (`model.gnt`'s gather)
    per sample            the mean colour over the views (optionally weighted by `angle_weights`) and the
                          spread: the colour spread averaged over the pyramid's levels (`colour_spread`,
                          `pyramid_colour_statistics`) plus `readout_consistency_features` times the
                          features' spread (`feature_spread`)

The network's forward (`model.gnt`) and the bf16 render network (`model.inference`) compute the same
statistics; the first in the tokens' layout, the second view-major.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn

from pola_gnt.geometry.projection import pixels_to_grid
from pola_gnt.model.backbone import ALEXNET_CONVS, IMAGENET_MEAN, IMAGENET_STD, alexnet_convs_to_build


def working_images(images: Float[Tensor, "views 3 height width"], factor: int) -> Float[Tensor, "views 3 h w"]:
    """`images` area-reduced by the whole `factor` (`NetSettings.working_factor`): each pixel the mean of
    a factor x factor square, the last cell of a side that `factor` does not divide the mean of what it
    covers; the images themselves at factor 1. An LLFF scene's images_4 reduced by 2 are its images_8, as
    LLFF made them (by area)."""
    if factor == 1:
        return images
    return F.avg_pool2d(images.float(), factor, ceil_mode=True)


def working_pyramid(
    images: Float[Tensor, "views 3 height width"], levels: int, factor: int = 1
) -> Float[Tensor, "views channels height width"]:
    """The blurred colours the prior's spread compares besides the images' own, at the images' size: at
    `factor` 1 `colour_pyramid(images, levels)` (levels 1 .. levels - 1; level 0 is the images); at a
    larger working factor all `levels` levels of the working images (`working_images`; level 0 is the
    working image itself), each upsampled back to the images' size, `3 levels` channels. So the spread
    compares the same patches of a scene whatever the resolution its images come at."""
    if factor == 1:
        return colour_pyramid(images, levels)
    height, width = images.shape[-2:]
    level = working_images(images, factor)
    out = [F.interpolate(level, size=(height, width), mode="bilinear", align_corners=False)]
    for _ in range(levels - 1):
        level = F.avg_pool2d(level, 2, ceil_mode=True)
        out.append(F.interpolate(level, size=(height, width), mode="bilinear", align_corners=False))
    return torch.cat(out, dim=1)


def colour_pyramid(
    images: Float[Tensor, "views 3 height width"], levels: int
) -> Float[Tensor, "views channels height width"]:
    """The blurred colours of `images` for the multi-scale photo-consistency: levels 1 .. levels - 1
    of a box pyramid (each 2 x 2 averages of the one before, the last cell of an odd side averaging
    what it covers) upsampled bilinearly back to the images' size, stacked as `3 (levels - 1)`
    channels (level 0, the images themselves, is not repeated). A pixel of level k is the mean colour
    of about a 2^k-pixel square around it: comparing those across views compares patches, which a
    single pixel's colour cannot (noise, aliasing, a sample a pixel off its surface)."""
    height, width = images.shape[-2:]
    level, out = images.float(), []
    for _ in range(levels - 1):
        level = F.avg_pool2d(level, 2, ceil_mode=True)
        out.append(F.interpolate(level, size=(height, width), mode="bilinear", align_corners=False))
    if not out:
        return images.new_zeros((images.shape[0], 0, height, width), dtype=torch.float32)
    return torch.cat(out, dim=1)


def angle_weights(
    cosines: Float[Tensor, "*batch_views"], visible: Bool[Tensor, "*batch_views"], temperature: float, dim: int
) -> Float[Tensor, "*batch_views"]:
    """Weights over the source views (axis `dim`, summing to 1 over the visible ones, 0 elsewhere and
    where no view sees the point) by how far each view's ray to the point turns from the target ray:
    the unstructured lumigraph's rule that a nearer view's colour is the better guess, since a wrong
    depth shifts it by less parallax and it sees the same side of the surface.

    `cosines` are the cosines of those angles (`relative_directions`' last number). The angles are
    measured from the nearest visible view's and in units of the visible views' mean angle, so the
    rule reads the same for a forward-facing capture (views a few degrees apart) as around an
    object: `softmax(-(angle - nearest) / (temperature x mean angle))`. A small temperature picks the
    nearest view; a large one tends to the plain mean. No gradient: the weights are geometry."""
    angles = torch.arccos(cosines.detach().float().clamp(-1.0, 1.0))
    visible_angles = angles.masked_fill(~visible, float("inf"))
    nearest = visible_angles.amin(dim=dim, keepdim=True)
    count = visible.sum(dim=dim, keepdim=True).clamp(min=1)
    mean_angle = (angles * visible).sum(dim=dim, keepdim=True) / count
    # The scale's floor keeps points the views all see head-on (every angle about 0) finite.
    scores = -(visible_angles - nearest.clamp(max=torch.pi)) / (temperature * mean_angle.clamp(min=1e-6))
    weights = torch.softmax(scores, dim=dim)  # a point no view sees: every score -inf -> nan ...
    return torch.where(visible, weights, torch.zeros_like(weights))  # ... made 0 here


def feature_spread(
    features: Float[Tensor, "*batch channels"], visible: Bool[Tensor, "*batch_views"], dim: int
) -> Float[Tensor, "*points"]:
    """How far the visible views' unit-length feature vectors (`ConsistencyFeatures`; axis `dim`, zero
    where not visible) lie from their mean: the root of the summed variance over the channels, 0 where
    they agree and at most 1 (`sqrt(1 - |mean|^2)` for unit vectors); 1 where fewer than two views see
    the point.

    In one pass, as the mean squared length minus the squared length of the mean: over 192 channels a
    third of the time of subtracting the mean first. Its fp32 rounding leaves about 3e-4 where the
    vectors agree (the root of 1e-7), under a thousandth of the spread's range."""
    weights = visible.to(features.dtype)
    count = weights.sum(dim=dim)
    views = count.clamp(min=1.0)
    mean = features.sum(dim=dim) / views[..., None]
    squared_length = (features.square().sum(dim=-1) * weights).sum(dim=dim) / views
    spread = (squared_length - mean.square().sum(dim=-1)).clamp(min=0.0).sqrt()
    return torch.where(count >= 2, spread, torch.ones_like(spread))


def pyramid_colour_statistics(
    rgb: Float[Tensor, "*batch 3"],
    coarse: Float[Tensor, "*batch coarse"] | None,
    visible: Bool[Tensor, "*batch_views"],
    dim: int,
    image_is_level0: bool = True,
) -> tuple[Float[Tensor, "*points 3"], Float[Tensor, "*points"]]:
    """`colour_spread` of the pixels' colours `rgb`, its spread averaged with the spreads of the blurred
    levels `coarse` (3 channels per level, `working_pyramid`'s; None: the pixels' alone); views along
    `dim`, values zero where not visible. Without `image_is_level0` (a working factor above 1) `coarse`
    holds every level and the spread is theirs alone; the mean colour is the pixels' either way. The
    network's layout and the fast renderer's share it."""
    mean, spread = colour_spread(rgb, visible, dim=dim)
    if coarse is not None:
        levels = coarse.shape[-1] // 3
        if not image_is_level0:
            spread = torch.zeros_like(spread)
        for level in range(levels):
            spread = spread + colour_spread(coarse[..., 3 * level : 3 * level + 3], visible, dim=dim)[1]
        spread = spread / (levels + image_is_level0)
    return mean, spread


def colour_spread(
    rgb: Float[Tensor, "*batch 3"], visible: Bool[Tensor, "*batch_views"], dim: int
) -> tuple[Float[Tensor, "*points 3"], Float[Tensor, "*points"]]:
    """The mean colour over the visible views (axis `dim` of `rgb`, whose values are zero where not
    visible) and the channel-mean standard deviation over them (`source_colour_statistics`; 1 / 2
    where fewer than two views see the point)."""
    weights = visible.to(rgb.dtype)[..., None]
    count = weights.sum(dim=dim)
    views = count.clamp(min=1.0)
    mean = rgb.sum(dim=dim) / views
    variance = ((rgb - mean.unsqueeze(dim)).square() * weights).sum(dim=dim) / views
    spread = variance.clamp(min=0.0).sqrt().mean(dim=-1)
    return mean, torch.where(count[..., 0] >= 2, spread, torch.full_like(spread, 0.5))


class ConsistencyFeatures(nn.Module):
    """What the read-out's feature consistency compares across the source views
    (`model.net.readout_consistency_features`): AlexNet's ImageNet convolutions up to conv `layer` (relu
    after each, max-pools before conv2 and conv3, as `AlexNetEncoder`), fixed, each pixel's feature vector
    scaled to unit length (LPIPS's channel normalisation).

    Colour alone is a weak witness of a surface: flat regions match at every depth, and a pixel's colour
    changes with noise and exposure. ImageNet's filters respond to local structure (edges, textures,
    their orientations) over an 11-pixel (conv1) or 51-pixel (conv2) window, so two views agree about
    a sample's features only where they see the same patch, and unit length keeps brightness out. These
    are not parameters and never train: learned from ImageNet, not from the pretraining scenes, they
    cannot fit those, which is what keeps the prior a prior on scenes no one trained on. They are
    buffers of the state dict, so a checkpoint holds what it rendered with.

    With `dims`, the maps are projected on their `dims` principal directions over every pixel of the
    views at hand (`principal_directions`): conv2's 192 channels are mostly redundant (neighbouring
    filters respond to the same edges), and the prior reads and compares every channel at every sample
    and view, which costs as much as the rest of a render. A projection changes the spread only by what
    the dropped directions held, and these views' own principal directions keep the most of it."""

    mean: Tensor  # ImageNet normalisation, [1, 3, 1, 1] buffers (not in the state dict)
    std: Tensor

    def __init__(self, layer: int, weights: str | None, lpips_weights: str | None = None, dims: int = 0):
        """`layer`: 1 .. 5, the last conv; `weights`: `model.net.encoder.backbone_weights` (None: found as
        the LPIPS weights are, `lpips_weights` first, as `alexnet_weights_path`); `dims`: the principal
        directions kept (0, or at least the layer's channels: all channels, unprojected)."""
        super().__init__()
        self.layer = layer
        convs = alexnet_convs_to_build(weights, lpips_weights)[:layer]
        for i, (weight, bias) in enumerate(convs):
            self.register_buffer(f"weight{i}", torch.from_numpy(weight))
            self.register_buffer(f"bias{i}", torch.from_numpy(bias))
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        layer_channels = ALEXNET_CONVS[layer - 1][2]
        self.dims = dims if 0 < dims < layer_channels else 0
        self.channels = self.dims or layer_channels  # of the maps `forward` returns
        # Where feature pixel j of this layer sits in the image: its receptive field's centre, pixel
        # stride * j + offset. conv1 (11x11, stride 4, padding 2) centres its output j on pixel 4j + 3;
        # each 3/2 max-pool doubles the stride and moves the centre to the middle of its window (2k + 1).
        # Reading the maps as if their corners met the image's (align_corners, as the encoder's learned
        # features are read) would put a view's feature up to 0.75 of its stride off, by an amount that
        # varies across the image, so across the views: the views then agree best a few pixels off the
        # surface. The read goes through `feature_read(...).feature_pixels` instead.
        pools = sum(1 for i in range(layer) if i in (1, 2))
        self.stride = 4 * 2**pools
        self.offset = {0: 3.0, 1: 7.0, 2: 15.0}[pools]

    def feature_read(self, working_factor: int = 1) -> FeatureRead:
        """Where a pixel of an image reads these features when they were extracted from its working image,
        `working_factor` times smaller (`working_images`)."""
        return FeatureRead(float(self.stride), self.offset, float(working_factor))

    def forward(self, images: Float[Tensor, "views 3 h w"]) -> Float[Tensor, "views channels fh fw"]:
        """Source images in [0, 1] -> unit-length features, fp32, without gradients (whatever autocast
        is around: bf16 would round the matching it is for)."""
        per_image = [self.image_features(images[view : view + 1]) for view in range(len(images))]
        return self.combine(per_image)

    def image_features(self, image: Float[Tensor, "1 3 h w"]) -> ImageFeatures:
        """One image's unit-length features and their moments, which `combine` takes. Image by image, so
        that what an image gets does not depend on the batch it came in (CPU convolutions choose their
        algorithm by batch size, and the last bits with it): training keeps them per source image
        (`model.feature_cache`), and a kept image's are then a fresh extraction's exactly."""
        with torch.no_grad(), torch.autocast(image.device.type, enabled=False):
            x = (image.float() - self.mean) / self.std
            for i, (_, _, _, _, stride, padding) in enumerate(ALEXNET_CONVS[: self.layer]):
                if i in (1, 2):
                    x = F.max_pool2d(x, 3, 2)
                x = F.relu(F.conv2d(x, getattr(self, f"weight{i}"), getattr(self, f"bias{i}"), stride, padding))
            x = F.normalize(x, dim=1)
            return ImageFeatures(x, feature_moments(x) if self.dims else None)

    def combine(self, per_image: list[ImageFeatures]) -> Float[Tensor, "views channels fh fw"]:
        """The views' maps from their `image_features`, projected on the principal directions of all their
        pixels together (with `dims`)."""
        maps = torch.cat([image.maps for image in per_image])
        if not self.dims:
            return maps
        moments = [image.moments for image in per_image if image.moments is not None]
        if len(moments) != len(per_image):
            raise ValueError("ConsistencyFeatures.combine: projected maps need every image's moments")
        directions = directions_from_moments(moments, self.dims)
        with torch.autocast(maps.device.type, enabled=False):
            return torch.einsum("vchw,cd->vdhw", maps, directions.to(maps.dtype))


@dataclass(frozen=True)
class FeatureMoments:
    """The sums over a set of feature vectors that their covariance needs, in fp64: how many, their sum
    and the sum of their outer products. Two sets' moments add up to their union's."""

    count: int
    total: Float[Tensor, " channels"]
    outer: Float[Tensor, "channels channels"]

    @property
    def nbytes(self) -> int:
        return self.total.nbytes + self.outer.nbytes


@dataclass(frozen=True)
class ImageFeatures:
    """One image's unit-length feature maps `[1, C, h, w]` (fp32) and, when they are to be projected,
    their `FeatureMoments`: what `ConsistencyFeatures.combine` needs of the image."""

    maps: Float[Tensor, "1 channels h w"]
    moments: FeatureMoments | None

    @property
    def nbytes(self) -> int:
        return self.maps.nbytes + (self.moments.nbytes if self.moments is not None else 0)


@dataclass(frozen=True)
class PriorImage:
    """What the prior computes of one source image alone (`GNT.prior_image`), so once per scene for all
    its renders: its blurred levels at its size (`working_pyramid`, None when the spread reads none) and
    its consistency features with their moments (None without them). A set of views takes these side by
    side (`SourceViews.keep_prior_images`): the same values as computing them for the set."""

    coarse: Float[Tensor, "1 channels height width"] | None
    features: ImageFeatures | None

    @property
    def nbytes(self) -> int:
        return (0 if self.coarse is None else self.coarse.nbytes) + (
            0 if self.features is None else self.features.nbytes
        )


class PriorImageCache:
    """`PriorImage`s by the caller's key for a source image (a scene's view), the least recently used
    leaving first beyond `max_mb` MB: a video or the viewer renders every frame from the training views
    nearest its camera, mostly the last frame's, and a test phase's views share their sources."""

    def __init__(self, max_mb: float = 1024.0):
        self.max_bytes = int(max_mb * 2**20)
        self.entries: OrderedDict[Hashable, PriorImage] = OrderedDict()
        self.bytes = 0

    def get(self, key: Hashable, compute: Callable[[], PriorImage]) -> PriorImage:
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            return entry
        entry = compute()
        self.entries[key] = entry
        self.bytes += entry.nbytes
        while self.bytes > self.max_bytes and len(self.entries) > 1:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= dropped.nbytes
        return entry


def feature_moments(maps: Float[Tensor, "views channels h w"]) -> FeatureMoments:
    """`FeatureMoments` of every pixel's feature vector of `maps`."""
    flat = maps.detach().transpose(0, 1).flatten(1).double()  # [channels, pixels]
    return FeatureMoments(int(flat.shape[1]), flat.sum(dim=1), flat @ flat.T)


def directions_from_moments(moments: list[FeatureMoments], dims: int) -> Float[Tensor, "channels dims"]:
    """The `dims` leading eigenvectors of the covariance of the feature vectors the `moments` sum up, as
    fp64 columns, largest variance first, each signed so that its largest entry is positive.

    The covariance is `outer / n - mean mean^T`, in fp64 (a 192 x 192 eigenproblem costs nothing next
    to the reads it saves, and fp32's rounding would make near-equal eigenvalues swap places between
    machines). Unit vectors have entries at most 1, so the two terms are at most 1 and their difference
    loses at most fp64's 1e-16 of them: under 1e-13 of the covariance's entries (about 1e-3 here).
    `eigh` returns each column with either sign; spreads and distances do not depend on it, but a fixed
    sign makes the projected maps themselves the same wherever they are computed."""
    count = sum(m.count for m in moments)
    total = torch.stack([m.total for m in moments]).sum(dim=0)
    outer = torch.stack([m.outer for m in moments]).sum(dim=0)
    mean = total / max(count, 1)
    covariance = outer / max(count, 1) - torch.outer(mean, mean)
    _, vectors = torch.linalg.eigh(covariance)  # ascending eigenvalues
    vectors = vectors[:, -dims:].flip(-1)
    largest = vectors.gather(0, vectors.abs().argmax(dim=0, keepdim=True))  # [1, dims]
    return vectors * torch.where(largest < 0, -1.0, 1.0)


def principal_directions(maps: Float[Tensor, "views channels h w"], dims: int) -> Float[Tensor, "channels dims"]:
    """The `dims` principal directions of every pixel's feature vector over all the views of `maps`
    (`directions_from_moments`, each view's moments summed as `ConsistencyFeatures.combine` sums them)."""
    moments = [feature_moments(maps[view : view + 1]) for view in range(len(maps))]
    return directions_from_moments(moments, dims).to(maps.dtype)


@dataclass(frozen=True)
class FeatureRead:
    """Where an image pixel `x` reads a view's consistency feature maps (`ConsistencyFeatures.feature_read`):
    at feature pixel `((x + 1/2) / scale - 1/2 - offset) / stride`: the pixel's place in the image the
    features were extracted from, `scale` times smaller than the one rendered, then the feature pixel
    whose receptive field is centred there (`offset`, `stride`: `ConsistencyFeatures`'s)."""

    stride: float
    offset: float
    scale: float = 1.0

    def feature_pixels(self, pixels: Float[Tensor, "*batch 2"]) -> Float[Tensor, "*batch 2"]:
        """Image pixel coordinates -> the same points in the feature maps' pixel coordinates."""
        if self.scale != 1.0:
            pixels = (pixels + 0.5) / self.scale - 0.5
        return (pixels - self.offset) / self.stride


def view_major_statistics(
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
    """The prior's per-sample statistics from the source views as the bf16 render network holds them
    (views first; the PyTorch form of `model.render_kernels.prior_statistics`).

    `colours`: each view's image (channels 0-2) and blurred levels (3 channels each, `colour_pyramid`),
    read bilinearly at `grid` (normalised, `align_corners`, border padding) and zeroed where not
    `visible`; the spread's levels are the 3-channel groups from `first_level` on (0: the image itself is
    level 0). `features`: the consistency feature maps, read at `feature_read`'s pixels (None: none).
    `cosines`: the cosine of each view's angle to the target ray, for `angle_weights` at `temperature`
    (0: the plain mean colour). Returns the mean colour, the spread (the mean of the levels' colour
    spreads plus `feature_weight` times the feature spread) and the colours read `[views, 3, points]`."""
    height, width = colours.shape[-2:]
    weight = visible[:, None, :].to(colours.dtype)
    read = F.grid_sample(colours, grid[:, :, None, :], mode="bilinear", padding_mode="border", align_corners=True)
    read = read[..., 0] * weight  # [views, channels, points]
    rgb = read[:, :3]
    levels = read[:, 3 * first_level :].transpose(1, 2)  # [views, points, 3 levels]
    coarse = levels[..., 3:] if levels.shape[-1] > 3 else None
    mean, spread = pyramid_colour_statistics(levels[..., :3], coarse, visible, dim=0)
    if first_level:
        mean, _ = colour_spread(rgb.transpose(1, 2), visible, dim=0)
    if features is not None:
        scale = torch.tensor([width - 1, height - 1], dtype=grid.dtype, device=grid.device)
        pixels = (grid + 1.0) / 2.0 * scale
        feature_grid = pixels_to_grid(feature_read.feature_pixels(pixels), *features.shape[-2:])
        values = F.grid_sample(
            features, feature_grid[:, :, None, :], mode="bilinear", padding_mode="border", align_corners=True
        )
        values = (values[..., 0] * weight).transpose(1, 2)  # [views, points, feature_channels]
        spread = spread + feature_weight * feature_spread(values, visible, dim=0)
    if temperature and cosines is not None:
        weights = angle_weights(cosines.t(), visible, temperature, dim=0)  # [views, points]
        mean = (weights[:, None, :] * rgb).sum(dim=0).t()
    return mean, spread, rgb
