"""The model's settings: the network (`NetSettings`, with its encoder's) and how rays are sampled and
rendered (`RenderSettings`). Plain frozen values; their defaults live in `conf/` only, and they are
read and checked from the config in one place (`pola_gnt.runs.config`)."""

from __future__ import annotations

from dataclasses import dataclass

# `model.net.compat`: "none" is this project's network; "gnt" reproduces the forward of GNT's official
# code exactly, for its converted checkpoints (`python -m pola_gnt.convert_gnt`; see `model.gnt`).
COMPAT_MODES = ("none", "gnt")
# `model.net.encoder.backbone`: none is the ResNet-style encoder; alexnet starts from ImageNet weights.
BACKBONES = ("none", "alexnet")


@dataclass(frozen=True)
class EncoderSettings:
    """The ResNet-style encoder: `stage_channels` / `stage_blocks` per stage (GNT: the first three
    stages of ResNet-34), `feature_channels` out at 1/4 resolution."""

    stage_channels: tuple[int, ...]
    stage_blocks: tuple[int, ...]
    feature_channels: int
    backbone: str  # one of BACKBONES: none (the ResNet-style encoder) | alexnet (model.backbone)
    backbone_weights: str | None  # alex_v0.1.npz (file or folder); None: $POLA_GNT_LPIPS_WEIGHTS
    backbone_trainable_layers: int  # 0..5: the last n AlexNet convolutions train, the rest frozen
    # Training keeps the frozen AlexNet convs' outputs of each source image up to this many MB (0: off;
    # model.feature_cache). The machine's setting, not the network's (runs.config.stored.COMMAND_SECTIONS).
    feature_cache_mb: int

    @property
    def min_input_side(self) -> int:
        """Reflect padding and InstanceNorm need 2 pixels per side at the deepest stage; AlexNet's
        two max-pools need 31 pixels."""
        if self.backbone == "alexnet":
            return 31
        return 2 ** (len(self.stage_channels) + 1) + 1


@dataclass(frozen=True)
class NetSettings:
    """The GNT network (`model.net`): attention kinds, sizes, read-out options, encoder."""

    view_attention: str  # a key of pola_gnt.attention's view-attention registry
    ray_attention: str  # a key of its ray-attention registry
    width: int
    n_blocks: int
    heads: int
    ffn_mult: int
    n_freqs: int
    ray_lepe: bool
    dropout: float  # GNT's dropout rate in the transformer blocks while training (model.transformer)
    encoder_input_scale: float  # the encoder sees the sources at this fraction of their size
    readout_consistency_prior: float
    readout_source_colour: bool
    compat: str  # one of COMPAT_MODES
    encoder: EncoderSettings

    @property
    def gnt_compatible(self) -> bool:
        """The forward of GNT's official code (`compat: gnt`), not this project's."""
        return self.compat == "gnt"


@dataclass(frozen=True)
class ModelSettings:
    name: str  # pola_gnt | gnt: names the run folder and refuses another model's checkpoint
    compile: bool  # torch.compile the network in place
    net: NetSettings


@dataclass(frozen=True)
class RenderSettings:
    n_samples: int  # depth samples per ray (uniform in inverse depth)
    chunk_rays: int  # rays per forward pass when rendering whole images
    max_memory_mb: float | None  # fewer rays per pass when chunk_rays would need more; None: by device
    precision: str  # auto | fp32 | bf16 of full-image renders (test views, videos, viewer): model.inference
