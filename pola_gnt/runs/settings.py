"""Typed settings: every config value a command uses, checked once, here.

Each command builds its settings from the composed Hydra config before any work: `RunSettings`
(train, eval, render_video, analyze, the data check), `VideoSettings`, `AnalyzeSettings` and
`ProcessDataSettings`. The objects are frozen dataclasses holding checked Python values. A bad value
is a `UserError` naming its full key (`model.net.width: ...`), which the entry point prints as one
`error:` line with exit code 2. `RunSettings.check_scene` adds the checks that need the loaded scene
(views requested against views available, crops and ray counts against the image size).

Every value goes through one of the checks in `pola_gnt.core.errors` (`check_int`, `check_number`,
`check_choice`, `check_bool`), so each kind of message is worded once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from pola_gnt.core.errors import UserError, check_bool, check_choice, check_int, check_number, is_int
from pola_gnt.data.sampling import crop_size, scaled_ray_count

MAX_SEED = 2**32 - 1  # numpy's and Lightning's seed range
_REQUIRED = object()
_ABSENT = object()


class ConfigReader:
    """Reads the keys of one config section; every error names the full dotted key."""

    def __init__(self, node, prefix: str = ""):
        self.node, self.prefix = node, prefix

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def value(self, name: str, default: Any = _REQUIRED, nullable: bool = False) -> Any:
        """The raw value (containers as plain lists / dicts). Absent: `default`, or an error when
        none is given; null: None when `nullable`, else an error."""
        node = self.node
        value = node.get(name, _ABSENT) if isinstance(node, (Mapping, DictConfig)) else _ABSENT
        if value is _ABSENT:
            if default is _REQUIRED:
                raise UserError(f"{self.key(name)}: must be set (missing from the config)")
            return default
        if value is None:
            if nullable:
                return None
            raise UserError(f"{self.key(name)}: must be set, got null")
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        return value

    def section(self, name: str) -> ConfigReader:
        node = self.node.get(name) if isinstance(self.node, (Mapping, DictConfig)) else None
        if not isinstance(node, (Mapping, DictConfig)):
            raise UserError(f"{self.key(name)}: must be a config section, got {node!r}")
        return ConfigReader(node, self.key(name))

    def int(self, name: str, minimum: int | None = 1, maximum: int | None = None, why: str = "", **kw) -> int:
        return check_int(self.value(name, **kw), self.key(name), minimum, maximum, why)

    def number(self, name: str, low=None, high=None, *, low_open=True, high_open=False, why="", **kw) -> float:
        value = self.value(name, **kw)
        return check_number(value, self.key(name), low, high, low_open=low_open, high_open=high_open, why=why)

    def choice(self, name: str, allowed: Sequence[str], **kw) -> str:
        return check_choice(self.value(name, **kw), self.key(name), allowed)

    def bool(self, name: str, **kw) -> bool:
        return check_bool(self.value(name, **kw), self.key(name))

    def text(self, name: str, what: str = "a string", **kw) -> str | None:
        value = self.value(name, **kw)
        if value is None or isinstance(value, str):
            return value
        raise UserError(f"{self.key(name)}: must be {what}, got {value!r}")

    def int_list(self, name: str, length: int | None = None, minimum: int = 1, what: str = "") -> tuple[int, ...]:
        """A list of integers >= `minimum` (of `length` items when given) as a tuple."""
        value = self.value(name)
        if (
            isinstance(value, (list, tuple))
            and (length is None or len(value) == length)
            and all(is_int(v) and v >= minimum for v in value)
        ):
            return tuple(int(v) for v in value)
        raise UserError(f"{self.key(name)}: must be {what or f'a list of integers >= {minimum}'}, got {value!r}")


# ---- the run config (conf/config.yaml): train, eval, render_video, analyze, the data check ---------


def config_choices() -> dict[str, tuple[str, ...]]:
    """Allowed values of the config keys that select behaviour, from the modules that own them."""
    from pola_gnt.attention.modules import RAY_ATTENTION_KINDS, VIEW_ATTENTION_KINDS
    from pola_gnt.data.scenes import SCENE_KINDS
    from pola_gnt.evaluation.metrics import LPIPS_NETS, PROTOCOLS

    return {
        "model.net.view_attention": VIEW_ATTENTION_KINDS,
        "model.net.ray_attention": RAY_ATTENTION_KINDS,
        "metrics.protocol": PROTOCOLS,
        "metrics.lpips_net": LPIPS_NETS,
        "scene.kind": SCENE_KINDS,
    }


@dataclass(frozen=True)
class SceneSettings:
    name: str
    kind: str
    path: str | None

    @classmethod
    def read(cls, r: ConfigReader) -> SceneSettings:
        return cls(
            name=str(r.value("name")),
            kind=r.choice("kind", config_choices()["scene.kind"]),
            path=r.text("path", "null or a folder", nullable=True, default=None),
        )


@dataclass(frozen=True)
class RandomCrop:
    """GNT's training crop of a random size: height drawn from `heights` = [low, high) and made even,
    width = area / height made even; a size that does not fit inside the image uses the whole image."""

    heights: tuple[int, int]
    area: int

    def sizes(self) -> list[tuple[int, int]]:
        """Every (height, width) the draw can give."""
        return sorted({crop_size(height, self.area) for height in range(*self.heights)})


@dataclass(frozen=True)
class DataSettings:
    root: str | None
    factor: int
    llffhold: int
    num_source_views: int
    random_source_views: bool
    rays_per_step: int
    crop: tuple[int, int] | None  # fixed [height, width] training crop
    random_crop: RandomCrop | None  # GNT's random-size training crop
    scale_rays_with_views: bool  # GNT: rays per step x num_source_views / views drawn
    val_rays: int

    @classmethod
    def read(cls, r: ConfigReader) -> DataSettings:
        crop = None
        if r.value("crop", nullable=True, default=None) is not None:
            height, width = r.int_list("crop", length=2, what="null or [height, width] in pixels")
            crop = (height, width)
        random_crop = cls._random_crop(r)
        if crop is not None and random_crop is not None:
            raise UserError(f"{r.key('random_crop')}: set together with {r.key('crop')}; choose one (null the other)")
        return cls(
            root=r.text("root", "null or a folder", nullable=True, default=None),
            factor=r.int("factor"),
            llffhold=r.int("llffhold", why="every N-th view is held out for testing; 0 would leave nothing to score"),
            num_source_views=r.int("num_source_views"),
            random_source_views=r.bool("random_source_views"),
            rays_per_step=r.int("rays_per_step"),
            crop=crop,
            random_crop=random_crop,
            scale_rays_with_views=r.bool("scale_rays_with_views", default=False),
            val_rays=r.int("val_rays"),
        )

    @staticmethod
    def _random_crop(r: ConfigReader) -> RandomCrop | None:
        value = r.value("random_crop", nullable=True, default=None)
        if value is None:
            return None
        key = r.key("random_crop")
        expected = "null or {heights: [low, high], area: pixels} (GNT: {heights: [250, 750], area: 240000})"
        if not isinstance(value, dict) or set(value) != {"heights", "area"}:
            raise UserError(f"{key}: must be {expected}, got {value!r}")
        inner = ConfigReader(value, key)
        low, high = inner.int_list("heights", length=2, what="[low, high] crop heights in pixels, low < high")
        if low >= high:
            raise UserError(f"{key}.heights: must be [low, high] crop heights in pixels, low < high, got {[low, high]}")
        return RandomCrop(heights=(low, high), area=inner.int("area"))

    def max_rays(self) -> int:
        """The most rays a training step can draw: more than `rays_per_step` when the rays scale with
        the views drawn and fewer than `num_source_views` are drawn (at least 1, at most 2 fewer)."""
        if not (self.scale_rays_with_views and self.random_source_views):
            return self.rays_per_step
        fewest = max(1, self.num_source_views - 2)
        return scaled_ray_count(self.rays_per_step, self.num_source_views, fewest)


@dataclass(frozen=True)
class RenderSettings:
    n_samples: int
    chunk_rays: int

    @classmethod
    def read(cls, r: ConfigReader) -> RenderSettings:
        return cls(
            n_samples=r.int("n_samples", minimum=2, why="samples per ray"),
            chunk_rays=r.int("chunk_rays"),
        )


@dataclass(frozen=True)
class OptimSettings:
    lr_transformer: float
    lr_encoder: float
    decay_steps: int
    decay_rate: float

    @classmethod
    def read(cls, r: ConfigReader) -> OptimSettings:
        return cls(
            lr_transformer=r.number("lr_transformer", 0),
            lr_encoder=r.number("lr_encoder", 0),
            decay_steps=r.int("decay_steps"),
            decay_rate=r.number("decay_rate", 0, 1, why="1 = no decay"),
        )


@dataclass(frozen=True)
class MetricsSettings:
    lpips_net: str
    lpips_weights: str | None
    protocol: str
    quantize_8bit: bool

    @classmethod
    def read(cls, r: ConfigReader) -> MetricsSettings:
        choices = config_choices()
        return cls(
            lpips_net=r.choice("lpips_net", choices["metrics.lpips_net"]),
            lpips_weights=r.text("lpips_weights", "null or an npz file", nullable=True, default=None),
            protocol=r.choice("protocol", choices["metrics.protocol"]),
            quantize_8bit=r.bool("quantize_8bit"),
        )


@dataclass(frozen=True)
class EncoderSettings:
    stage_channels: tuple[int, ...]
    stage_blocks: tuple[int, ...]
    feature_channels: int

    @property
    def min_input_side(self) -> int:
        """Reflect padding and InstanceNorm need 2 pixels per side at the deepest stage."""
        return 2 ** (len(self.stage_channels) + 1) + 1

    @classmethod
    def read(cls, r: ConfigReader) -> EncoderSettings:
        channels = r.int_list("stage_channels", what="a list of positive channel counts")
        blocks = r.int_list("stage_blocks", what="a list of positive block counts")
        if len(channels) != len(blocks) or len(channels) < 2:
            raise UserError(
                f"{r.prefix}: stage_channels {list(channels)} and stage_blocks {list(blocks)} must have "
                f"equal lengths of at least 2"
            )
        return cls(stage_channels=channels, stage_blocks=blocks, feature_channels=r.int("feature_channels"))


@dataclass(frozen=True)
class ModelSettings:
    name: str
    view_attention: str
    ray_attention: str
    width: int
    n_blocks: int
    heads: int
    ffn_mult: int
    n_freqs: int
    ray_lepe: bool
    encoder_input_scale: float
    readout_consistency_prior: float
    readout_source_colour: bool
    encoder: EncoderSettings
    compile: bool

    @classmethod
    def read(cls, r: ConfigReader) -> ModelSettings:
        net = r.section("net")
        choices = config_choices()
        width, heads = net.int("width"), net.int("heads")
        if width % (2 * heads):
            raise UserError(f"{net.key('width')}: {width} must be divisible by 2 * {net.key('heads')} ({2 * heads})")
        return cls(
            name=str(r.value("name")),
            view_attention=net.choice("view_attention", choices["model.net.view_attention"]),
            ray_attention=net.choice("ray_attention", choices["model.net.ray_attention"]),
            width=width,
            n_blocks=net.int("n_blocks"),
            heads=heads,
            ffn_mult=net.int("ffn_mult", default=4),
            n_freqs=net.int("n_freqs", minimum=0, default=10),
            ray_lepe=net.bool("ray_lepe", default=True),
            encoder_input_scale=net.number("encoder_input_scale", 0, 1, default=1.0),
            readout_consistency_prior=net.number("readout_consistency_prior", 0, None, low_open=False, default=0.0),
            readout_source_colour=net.bool("readout_source_colour", default=False),
            encoder=EncoderSettings.read(net.section("encoder")),
            compile=r.bool("compile", default=False),
        )


# Lightning accelerators that need a CUDA device.
CUDA_ACCELERATORS = ("gpu", "cuda")


@dataclass(frozen=True)
class TrainerSettings:
    accelerator: str
    precision: str
    max_steps: int
    val_check_interval: int | float
    log_every_n_steps: int
    gradient_clip_val: float | None
    max_time_s: float | None  # an equal-time budget (`trainer.max_time`), in seconds

    @classmethod
    def read(cls, r: ConfigReader) -> TrainerSettings:
        from pola_gnt.runs.budget import max_time_seconds

        max_steps = r.int("max_steps")
        interval = r.value("val_check_interval")
        if not (is_int(interval) and interval >= 1) and not (isinstance(interval, float) and 0 < interval <= 1):
            raise UserError(f"{r.key('val_check_interval')}: must be a positive number of steps, got {interval!r}")
        if is_int(interval) and interval > max_steps:
            raise UserError(
                f"{r.key('val_check_interval')}: {interval} is more than {r.key('max_steps')} ({max_steps}); "
                f"validation would never run"
            )
        clip = r.value("gradient_clip_val", nullable=True, default=None)
        if clip is not None:
            clip = check_number(clip, r.key("gradient_clip_val"), 0, low_open=False, why="or null")
        accelerator = str(r.value("accelerator", default="cpu"))
        return cls(
            accelerator=accelerator,
            precision=str(r.value("precision", default="32-true")),
            max_steps=max_steps,
            val_check_interval=interval,
            log_every_n_steps=r.int("log_every_n_steps"),
            gradient_clip_val=clip,
            max_time_s=max_time_seconds(r.value("max_time", nullable=True, default=None)),
        )

    def check_device(self, key: str = "trainer.accelerator") -> None:
        """A CUDA trainer (`trainer=gpu`, `experiment=paper`) on a machine without one: one line."""
        import torch

        if self.accelerator in CUDA_ACCELERATORS and not torch.cuda.is_available():
            raise UserError(
                f"{key}: {self.accelerator} asked for (trainer=gpu, or experiment=paper which selects it) "
                f"but no CUDA device is available; add trainer=cpu"
            )


@dataclass(frozen=True)
class RunSettings:
    """The checked run config of train / eval / render_video / analyze / the data check."""

    seed: int
    ckpt_path: str | None
    scene: SceneSettings
    data: DataSettings
    render: RenderSettings
    optim: OptimSettings
    metrics: MetricsSettings
    model: ModelSettings
    trainer: TrainerSettings
    save_images: bool

    @classmethod
    def from_config(cls, cfg: DictConfig) -> RunSettings:
        """Check every value of the run config; one `UserError` naming the key for the first bad one."""
        r = ConfigReader(cfg)
        seed = r.int("seed", minimum=0, maximum=MAX_SEED)
        ckpt_path = r.value("ckpt_path", nullable=True, default=None)
        if ckpt_path is not None and not isinstance(ckpt_path, str):
            raise UserError(f"ckpt_path: must be last or a checkpoint file, got {ckpt_path!r}")
        return cls(
            seed=seed,
            ckpt_path=ckpt_path,
            scene=SceneSettings.read(r.section("scene")),
            data=DataSettings.read(r.section("data")),
            render=RenderSettings.read(r.section("render")),
            optim=OptimSettings.read(r.section("optim")),
            metrics=MetricsSettings.read(r.section("metrics")),
            model=ModelSettings.read(r.section("model")),
            trainer=TrainerSettings.read(r.section("trainer")),
            save_images=r.section("output").bool("save_images"),
        )

    def check_scene(self, scene) -> None:
        """Checks against the loaded scene: views requested vs available, crops, ray counts, and the
        encoder's smallest input."""
        data = self.data
        n_train, n_test, n_views = len(scene.train_ids), len(scene.test_ids), len(scene.image_names)
        if n_test == 0:
            raise UserError(f"data.llffhold: {data.llffhold} holds out no test view of the {n_views} views")
        if n_train < 2:
            raise UserError(
                f"data.llffhold: {data.llffhold} leaves {n_train} training view(s) of {n_views}; "
                f"at least 2 are needed (a target and a source view)"
            )
        if data.num_source_views > n_train - 1:
            raise UserError(
                f"data.num_source_views: {data.num_source_views} requested but the scene has {n_train} training "
                f"views, so at most {n_train - 1} can be sources of a training view"
            )
        height, width = scene.resolution
        pixels, what, side, key = height * width, "image", min(height, width), "data.rays_per_step"
        if data.crop is not None:
            crop_h, crop_w = data.crop
            if crop_h > height or crop_w > width:
                raise UserError(f"data.crop: {crop_h}x{crop_w} is larger than the images ({height}x{width})")
            pixels, what, side, key = crop_h * crop_w, f"{crop_h}x{crop_w} crop", min(data.crop), "data.crop"
        elif data.random_crop is not None:
            fitting = [(h, w) for h, w in data.random_crop.sizes() if h < height and w < width]
            if not fitting:
                raise UserError(
                    f"data.random_crop: none of its sizes (heights {list(data.random_crop.heights)}, area "
                    f"{data.random_crop.area}) fits inside the {height}x{width} images; set data.random_crop=null "
                    f"or smaller heights and area"
                )
            smallest = min(fitting, key=lambda size: size[0] * size[1])
            pixels, what = smallest[0] * smallest[1], f"{smallest[0]}x{smallest[1]} random crop"
            side, key = min(min(size) for size in fitting), "data.random_crop"
        max_rays = data.max_rays()
        if max_rays > pixels:
            scaled = f" (up to {max_rays} with data.scale_rays_with_views)" if max_rays != data.rays_per_step else ""
            if key == "data.rays_per_step":
                raise UserError(
                    f"{key}: {data.rays_per_step}{scaled} is more than the {pixels} pixels of a training image"
                )
            raise UserError(
                f"{key}: a {what} has {pixels} pixels, fewer than data.rays_per_step ({data.rays_per_step}{scaled})"
            )
        if data.val_rays > height * width:
            raise UserError(f"data.val_rays: {data.val_rays} is more than the {height * width} pixels of a view")
        encoder, scale = self.model.encoder, self.model.encoder_input_scale
        if math.floor(side * scale) < encoder.min_input_side:
            if key == "data.rays_per_step":
                key = "model.net.encoder_input_scale"
            raise UserError(
                f"{key}: the smallest side of a training {what} ({side} pixels) at model.net.encoder_input_scale "
                f"{scale:g} gives the encoder fewer than the {encoder.min_input_side} pixels its "
                f"{len(encoder.stage_channels)} stages need"
            )


# ---- the `analyze` and `video` sections --------------------------------------------------------


@dataclass(frozen=True)
class AnalyzeSettings:
    n_rays: int
    test_view: int

    @classmethod
    def from_config(cls, cfg: DictConfig) -> AnalyzeSettings:
        r = ConfigReader(cfg).section("analyze")
        return cls(n_rays=r.int("n_rays"), test_view=r.int("test_view", minimum=0))


@dataclass(frozen=True)
class VideoSettings:
    path: str
    frames: int
    fps: float
    rotations: float
    z_rate: float
    radius_scale: float
    closed: bool
    crf: int
    scale: float  # render at this fraction of the scene's resolution (a quick preview: 0.5)

    @classmethod
    def from_config(cls, video: DictConfig) -> VideoSettings:
        """Check the `video` config section; a bad value is a UserError naming its key."""
        from pola_gnt.geometry.camera_paths import PATH_KINDS

        r = ConfigReader(video, "video")
        return cls(
            path=r.choice("path", PATH_KINDS),
            frames=r.int("frames"),
            fps=r.number("fps", 0),
            rotations=r.number("rotations"),
            z_rate=r.number("z_rate"),
            radius_scale=r.number("radius_scale", 0),
            closed=r.bool("closed"),
            crf=r.int("crf", minimum=0, maximum=51, why="0 lossless, 51 worst"),
            scale=r.number("scale", 0, 1, default=1.0, why="a fraction of the scene's resolution"),
        )

    def resolution(self, height: int, width: int) -> tuple[int, int]:
        """The frame size for a scene of `height` x `width` (at least 1 pixel per side)."""
        return max(1, round(height * self.scale)), max(1, round(width * self.scale))


# ---- python -m pola_gnt.process_data (conf/process_data.yaml) ---------------------------------


@dataclass(frozen=True)
class CaptureOptions:
    """How `process_data` reconstructs a capture (keys as in conf/process_data.yaml)."""

    frames: int
    camera: str
    camera_model: str
    matching: str
    max_image_size: int
    max_features: int
    min_registered: float
    deterministic: bool

    KEYS = (
        "frames",
        "camera",
        "camera_model",
        "matching",
        "max_image_size",
        "max_features",
        "min_registered",
        "deterministic",
    )

    @classmethod
    def check(
        cls, *, frames, camera, camera_model, matching, max_image_size, max_features, min_registered, deterministic
    ) -> CaptureOptions:
        """The options from the config or from a direct call of `process_data`."""
        from pola_gnt.data.colmap import CAMERA_MODELS, CAMERA_MODES, MATCHING

        return cls(
            camera=check_choice(camera, "camera", CAMERA_MODES),
            camera_model=check_choice(camera_model, "camera_model", CAMERA_MODELS),
            matching=check_choice(matching, "matching", MATCHING),
            frames=check_int(frames, "frames"),
            max_image_size=check_int(max_image_size, "max_image_size"),
            max_features=check_int(max_features, "max_features"),
            min_registered=check_number(
                min_registered, "min_registered", 0, 1, low_open=False, why="a fraction of the images"
            ),
            deterministic=check_bool(deterministic, "deterministic"),
        )


USAGE_PROCESS_DATA = "python -m pola_gnt.process_data input=PHOTO_DIR|VIDEO out=SCENE_DIR"


@dataclass(frozen=True)
class ProcessDataSettings:
    """`python -m pola_gnt.process_data` (conf/process_data.yaml)."""

    input: str
    out: str
    options: CaptureOptions
    overwrite: bool
    threads: int
    seed: int
    progress: bool

    @classmethod
    def from_config(cls, cfg: DictConfig) -> ProcessDataSettings:
        r = ConfigReader(cfg)
        paths = {}
        for key in ("input", "out"):
            value = r.value(key, nullable=True, default=None)
            if not value:
                raise UserError(f"{key}: required; usage: {USAGE_PROCESS_DATA}")
            paths[key] = str(value)
        options = CaptureOptions.check(**{key: r.value(key) for key in CaptureOptions.KEYS})
        return cls(
            input=paths["input"],
            out=paths["out"],
            options=options,
            overwrite=r.bool("overwrite"),
            threads=r.int("threads", minimum=-1, why="-1: every core"),
            seed=r.int("seed", minimum=0, maximum=MAX_SEED),
            progress=r.bool("progress"),
        )
