"""Image encoder: a ResNet-34-style encoder cut after its third stage plus a small U-Net decoder.

Follows the encoder GNT inherits from IBRNet: randomly initialised, InstanceNorm (no running
statistics, so train and eval behave the same), reflect padding, a stride-2 7x7 stem and a stride-2
first stage instead of a max-pool. The decoder upsamples bilinearly x2 back to the first stage's
resolution, concatenating the encoder's skip features on the way, and outputs `feature_channels`
channels at 1/4 of the input resolution.

    input [views, 3, H, W]
      stem (7x7, /2)           -> [views, c0, H/2,  W/2]
      stage 1 (/2)  c0         -> [views, c0, H/4,  W/4]   skip
      stage 2 (/2)  c1         -> [views, c1, H/8,  W/8]   skip
      stage 3 (/2)  c2         -> [views, c2, H/16, W/16]
      up x2, conv c2->c1, cat skip, conv 2c1->c1         -> H/8
      up x2, conv c1->c0, cat skip, conv 2c0->features   -> H/4
      1x1 conv                 -> [views, feature_channels, ceil(H/4), ceil(W/4)]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from pola_gnt.core.errors import UserError
from pola_gnt.model.settings import EncoderSettings


def _instance_norm(channels: int) -> nn.InstanceNorm2d:
    return nn.InstanceNorm2d(channels, affine=True, track_running_stats=False)


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False, padding_mode="reflect")


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with a residual (1x1 projection when the shape changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.norm1 = _instance_norm(out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.norm2 = _instance_norm(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                _instance_norm(out_channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def _stage(in_channels: int, out_channels: int, n_blocks: int) -> nn.Sequential:
    """A ResNet stage; its first block halves the resolution."""
    blocks = [BasicBlock(in_channels, out_channels, stride=2)]
    blocks += [BasicBlock(out_channels, out_channels) for _ in range(n_blocks - 1)]
    return nn.Sequential(*blocks)


class _ConvNormELU(nn.Sequential):
    """Decoder conv: 3x3 conv, InstanceNorm, ELU (as IBRNet/GNT's decoder)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, padding_mode="reflect"),
            _instance_norm(out_channels),
            nn.ELU(inplace=True),
        )


class UpBlock(nn.Module):
    """Bilinear x2 upsampling to the skip's size, conv, concatenation with the skip, conv.

    `gnt_padding`: GNT's decoder instead, which doubles the size and pads the skip with zeros to it
    (half the difference before, the rest after). Where a side is not a multiple of 2 there (LLFF's
    756 rows, most crops), its skip and upsampled maps are misaligned by up to a pixel per level, and
    the feature map comes out larger than the image's quarter, so that reading it in the image's
    normalised coordinates is off by up to 9 image pixels at the far edges. Kept for GNT's checkpoints
    (`model.net.compat: gnt`), not fixed."""

    def __init__(self, in_channels: int, skip_channels: int, out_channels: int, gnt_padding: bool = False):
        super().__init__()
        self.up_conv = _ConvNormELU(in_channels, skip_channels)
        self.merge_conv = _ConvNormELU(2 * skip_channels, out_channels)
        self.gnt_padding = gnt_padding

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        if self.gnt_padding:
            x = self.up_conv(F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True))
            extra_rows, extra_cols = x.shape[-2] - skip.shape[-2], x.shape[-1] - skip.shape[-1]
            padding = (extra_cols // 2, extra_cols - extra_cols // 2, extra_rows // 2, extra_rows - extra_rows // 2)
            return self.merge_conv(torch.cat([F.pad(skip, padding), x], dim=1))
        # Resizing to the skip's exact size is the x2 upsampling, also for odd sizes (ceil division).
        x = F.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=True)
        x = self.up_conv(x)
        return self.merge_conv(torch.cat([skip, x], dim=1))


class ImageEncoder(nn.Module):
    """[views, 3, H, W] images in [0, 1] -> [views, feature_channels, ceil(H/4), ceil(W/4)] features.

    GNT's `stage_channels` / `stage_blocks` are the first three stages of ResNet-34 (about 9 M
    parameters); CPU presets shrink them. The number of stages sets the depth of the U-Net; the
    output is always at the first stage's resolution (1/4). `gnt_compatible` (`model.net.compat: gnt`):
    GNT's code, which reads its [0, 1] input as it is (not centred; halving the stem's weights would
    say the same but for rounding, which the InstanceNorms amplify to 2e-5) and has the zero-padded
    decoder (`UpBlock`), whose output is `2^(stages - 1) ceil(side / 2^(stages + 1))` per side.
    """

    def __init__(self, settings: EncoderSettings, gnt_compatible: bool = False):
        super().__init__()
        stage_channels, stage_blocks = settings.stage_channels, settings.stage_blocks
        feature_channels = self.feature_channels = settings.feature_channels
        self.stem = nn.Sequential(
            nn.Conv2d(3, stage_channels[0], 7, stride=2, padding=3, bias=False, padding_mode="reflect"),
            _instance_norm(stage_channels[0]),
            nn.ReLU(inplace=True),
        )
        in_channels = [stage_channels[0], *stage_channels[:-1]]
        self.stages = nn.ModuleList(
            _stage(c_in, c_out, n) for c_in, c_out, n in zip(in_channels, stage_channels, stage_blocks)
        )
        # Decoder from the deepest stage back to stage 1; the last up block outputs the features.
        self.up_blocks = nn.ModuleList()
        for level in reversed(range(len(stage_channels) - 1)):
            out_channels = stage_channels[level] if level > 0 else feature_channels
            self.up_blocks.append(
                UpBlock(stage_channels[level + 1], stage_channels[level], out_channels, gnt_padding=gnt_compatible)
            )
        self.out_conv = nn.Conv2d(feature_channels, feature_channels, 1)
        self.gnt_compatible = gnt_compatible

    def forward(self, images: Float[Tensor, "views 3 height width"]) -> Float[Tensor, "views channels h w"]:
        # Reflect padding and InstanceNorm need at least 2 pixels per side at the deepest stage,
        # i.e. more than 2 ** (stages + 1) input pixels (each stride-2 conv gives ceil(side / 2)).
        min_side = 2 ** (len(self.stages) + 1) + 1
        if min(images.shape[-2:]) < min_side:
            raise UserError(
                f"model.net.encoder: input {tuple(images.shape[-2:])} too small, needs at least {min_side} "
                f"pixels per side for {len(self.stages)} stages (raise the image size or "
                f"model.net.encoder_input_scale)"
            )
        # Centre the [0, 1] input (GNT's code does not).
        x = self.stem(images if self.gnt_compatible else images * 2.0 - 1.0)
        skips = []
        for stage in self.stages:
            x = stage(x)
            skips.append(x)
        for up_block, skip in zip(self.up_blocks, reversed(skips[:-1])):
            x = up_block(x, skip)
        return self.out_conv(x)
