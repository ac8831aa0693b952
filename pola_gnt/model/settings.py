"""The model's settings: the network (`NetSettings`, with its encoder's) and how rays are sampled and
rendered (`RenderSettings`). Plain frozen values; they are the config's schema
(`pola_gnt.runs.config.schema`): each field is a key of `conf/`, whose YAML files hold every default.
The reader checks each value's type from its annotation; `check(key)` adds the ranges and choices."""

from __future__ import annotations

from dataclasses import dataclass

from pola_gnt.attention.registry import RAY_ATTENTIONS, VIEW_ATTENTIONS
from pola_gnt.core.errors import UserError, check_choice, check_int, check_number

# `render.precision`: what `pola_gnt.model.inference.resolve_render_precision` resolves.
PRECISIONS = ("auto", "fp32", "bf16")

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

    def check(self, key: str) -> None:
        for name, what in (("stage_channels", "channel counts"), ("stage_blocks", "block counts")):
            values = getattr(self, name)
            if min(values, default=1) < 1:
                raise UserError(f"{key}.{name}: must be a list of positive {what}, got {list(values)}")
        if len(self.stage_channels) != len(self.stage_blocks) or len(self.stage_channels) < 2:
            raise UserError(
                f"{key}: stage_channels {list(self.stage_channels)} and stage_blocks {list(self.stage_blocks)} "
                f"must have equal lengths of at least 2"
            )
        check_int(self.feature_channels, f"{key}.feature_channels")
        check_choice(self.backbone, f"{key}.backbone", BACKBONES)
        check_int(self.backbone_trainable_layers, f"{key}.backbone_trainable_layers", 0, 5)
        check_int(self.feature_cache_mb, f"{key}.feature_cache_mb", minimum=0, why="0: no cache")


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
    encoder_input_scale: float  # the encoder sees the sources at this fraction of their (working) size
    # each source image's own work (the encoder's input, the prior's blur pyramid and features) on the image
    # area-reduced by the whole factor that brings its longer side nearest this size (0: at its own size)
    working_size: int
    readout_consistency_prior: float
    # the learned pooling scores bounded to (-this, this) by a tanh (0: unbounded; PooledReadout)
    readout_score_bound: float
    # the prior's colour spread measured on this many levels of a blur pyramid (1: the pixels' alone)
    readout_consistency_levels: int
    # ... plus this times the spread of AlexNet's unit-length features over the views (0: off; ConsistencyFeatures)
    readout_consistency_features: float
    readout_consistency_feature_layer: int  # 1..5: those features are AlexNet's conv `layer` outputs
    # ... projected on their this many principal directions over the source views (0: all channels)
    readout_consistency_feature_dims: int
    readout_source_colour: bool
    # with the source colour: add the learned colour of the pooled token to it (false: the source colour alone)
    readout_colour_residual: bool
    readout_view_blend: bool  # the source colour weighted over the views by learned scores (SourceViewBlend)
    # the source colour weighted over the views by their angle to the target ray (0: plain mean; angle_weights)
    readout_view_angle_weighting: float
    # the prior's spread of each sample averaged over square windows of the neighbouring rays on its depth
    # plane, of these half-widths as fractions of the image's longer side (0: the ray itself), and over the
    # windows (empty: off; model.neighbours)
    readout_neighbour_windows: tuple[float, ...]
    # the pooling weights composited front to back, a consistent sample hiding those behind it (0: off):
    # alpha = exp((score - the ray's best score) / this), weight = alpha x the transmittance before it
    readout_composite_temperature: float
    readout_composite_share: float  # ... that share of the weights, the rest the softmax's (1: composited alone)
    # the point tokens start with a learned embedding (zero-initialised) of the prior's aggregated spread
    # of each sample: what the sweep says reaches the transformer, not the read-out alone
    readout_agreement_input: bool
    compat: str  # one of COMPAT_MODES
    encoder: EncoderSettings

    @property
    def uses_neighbours(self) -> bool:
        """The prior's spread is aggregated over neighbouring rays (`model.neighbours`)."""
        return bool(self.readout_neighbour_windows)

    def working_factor(self, height: int, width: int) -> int:
        """The whole factor by which a source image of `height` x `width` is reduced for its own work
        (`working_size`): the one whose reduced longer side is nearest `working_size`, at least 1."""
        if not self.working_size:
            return 1
        return max(1, round(max(height, width) / self.working_size))

    @property
    def gnt_compatible(self) -> bool:
        """The forward of GNT's official code (`compat: gnt`), not this project's."""
        return self.compat == "gnt"

    def check(self, key: str) -> None:
        check_int(self.width, f"{key}.width")
        check_int(self.heads, f"{key}.heads")
        if self.width % (2 * self.heads):
            raise UserError(f"{key}.width: {self.width} must be divisible by 2 * {key}.heads ({2 * self.heads})")
        # the registries' keys, as registered when read
        check_choice(self.view_attention, f"{key}.view_attention", tuple(VIEW_ATTENTIONS))
        check_choice(self.ray_attention, f"{key}.ray_attention", tuple(RAY_ATTENTIONS))
        check_int(self.n_blocks, f"{key}.n_blocks")
        check_int(self.ffn_mult, f"{key}.ffn_mult")
        check_int(self.n_freqs, f"{key}.n_freqs", minimum=0)
        check_number(self.dropout, f"{key}.dropout", 0, 1, low_open=False, high_open=True)
        check_number(self.encoder_input_scale, f"{key}.encoder_input_scale", 0, 1)
        check_int(self.working_size, f"{key}.working_size", minimum=0, why="0: the images' own size")
        check_number(self.readout_consistency_prior, f"{key}.readout_consistency_prior", 0, None, low_open=False)
        check_number(self.readout_score_bound, f"{key}.readout_score_bound", 0, None, low_open=False)
        check_int(self.readout_consistency_levels, f"{key}.readout_consistency_levels", 1, 6)
        if self.readout_consistency_levels > 1 and not self.readout_consistency_prior:
            raise UserError(
                f"{key}.readout_consistency_levels: {self.readout_consistency_levels} levels of the colour spread "
                f"of the consistency prior, which is off (set {key}.readout_consistency_prior, or "
                f"{key}.readout_consistency_levels=1)"
            )
        check_number(self.readout_consistency_features, f"{key}.readout_consistency_features", 0, None, low_open=False)
        check_int(self.readout_consistency_feature_layer, f"{key}.readout_consistency_feature_layer", 1, 5)
        check_int(self.readout_consistency_feature_dims, f"{key}.readout_consistency_feature_dims", 0, 384)
        if self.readout_consistency_features and not self.readout_consistency_prior:
            raise UserError(
                f"{key}.readout_consistency_features: {self.readout_consistency_features} times the feature spread "
                f"in the consistency prior, which is off (set {key}.readout_consistency_prior, or "
                f"{key}.readout_consistency_features=0)"
            )
        self._check_geometry(key)
        check_choice(self.compat, f"{key}.compat", COMPAT_MODES)
        if not self.readout_colour_residual and not self.readout_source_colour:
            raise UserError(
                f"{key}.readout_colour_residual: false leaves no colour without the source colour "
                f"(set {key}.readout_source_colour=true, or {key}.readout_colour_residual=true)"
            )
        if self.readout_view_blend and not self.readout_source_colour:
            raise UserError(
                f"{key}.readout_view_blend: weighs the source colour of the read-out, which is off "
                f"(set {key}.readout_source_colour=true, or {key}.readout_view_blend=false)"
            )
        angle_key = f"{key}.readout_view_angle_weighting"
        check_number(self.readout_view_angle_weighting, angle_key, 0, None, low_open=False)
        if self.readout_view_angle_weighting and not self.readout_source_colour:
            raise UserError(
                f"{angle_key}: weighs the source colour of the read-out, which is off "
                f"(set {key}.readout_source_colour=true, or {angle_key}=0)"
            )
        if self.readout_view_angle_weighting and self.readout_view_blend:
            raise UserError(
                f"{angle_key}: {key}.readout_view_blend already weighs the source views "
                f"(set {angle_key}=0, or {key}.readout_view_blend=false)"
            )
        if self.gnt_compatible:
            self._check_gnt_compat(key)

    def _check_geometry(self, key: str) -> None:
        """The prior's geometry (neighbours, front to back, its input to the network) works on the
        consistency prior's spread: each needs the prior on."""
        for index, window in enumerate(self.readout_neighbour_windows):
            check_number(window, f"{key}.readout_neighbour_windows[{index}]", 0, 0.5, low_open=False)
        temperature_key = f"{key}.readout_composite_temperature"
        check_number(self.readout_composite_temperature, temperature_key, 0, None, low_open=False)
        check_number(self.readout_composite_share, f"{key}.readout_composite_share", 0, 1, low_open=False)
        asked = {
            "readout_neighbour_windows": self.uses_neighbours,
            "readout_composite_temperature": self.readout_composite_temperature > 0,
            "readout_agreement_input": self.readout_agreement_input,
        }
        for name, on in asked.items():
            if on and not self.readout_consistency_prior:
                raise UserError(
                    f"{key}.{name}: works on the consistency prior's spread, which is off "
                    f"(set {key}.readout_consistency_prior, or turn {key}.{name} off)"
                )

    def _check_gnt_compat(self, key: str) -> None:
        """`compat: gnt` is GNT's own network: its attention kinds, its plain mean read-out."""
        if self.encoder.backbone != "none":
            backbone = f"{key}.encoder.backbone"
            raise UserError(
                f"{backbone}: {self.encoder.backbone!r} with {key}.compat=gnt, GNT's network (set {backbone}=none)"
            )
        gnt_values = {
            "view_attention": (self.view_attention, "subtraction"),
            "ray_attention": (self.ray_attention, "softmax"),
            "readout_consistency_prior": (self.readout_consistency_prior, 0.0),
            "readout_consistency_levels": (self.readout_consistency_levels, 1),
            "readout_score_bound": (self.readout_score_bound, 0.0),
            "readout_consistency_features": (self.readout_consistency_features, 0.0),
            "readout_source_colour": (self.readout_source_colour, False),
            "readout_colour_residual": (self.readout_colour_residual, True),
            "readout_view_blend": (self.readout_view_blend, False),
            "readout_view_angle_weighting": (self.readout_view_angle_weighting, 0.0),
        }
        for name, (value, gnt_value) in gnt_values.items():
            if value != gnt_value:
                raise UserError(
                    f"{key}.{name}: {value!r} with {key}.compat=gnt, which is GNT's network "
                    f"(set {key}.{name}={str(gnt_value).lower()}, or {key}.compat=none)"
                )


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
    workers: int | None  # chunks rendered at once on a CPU, one thread each; None: by threads and memory

    def check(self, key: str) -> None:
        check_int(self.n_samples, f"{key}.n_samples", minimum=2, why="samples per ray")
        check_int(self.chunk_rays, f"{key}.chunk_rays")
        if self.max_memory_mb is not None:
            check_number(self.max_memory_mb, f"{key}.max_memory_mb", 0)
        check_choice(self.precision, f"{key}.precision", PRECISIONS)
        if self.workers is not None:
            check_int(self.workers, f"{key}.workers", why="chunks rendered at once")
