"""The one place where the composed Hydra config becomes typed settings and is checked.

`read_run_settings(cfg)` reads `conf/config.yaml`'s sections into `RunSettings`, and
`read_process_data_settings(cfg)` `conf/process_data.yaml` into `ProcessDataSettings`. Every key is
required: the YAML files are the one place a default lives (a key missing from a checkpoint's older
stored config is filled from today's YAML before it gets here, `run_config_with_overrides`). A bad
value is a `UserError` naming its full key (`model.net.width: ...`), which the entry point prints as
one `error:` line with exit code 2; each kind of message is worded once, in `core.errors`.
`check_scene` adds the checks that need the loaded scene.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from pola_gnt.attention.registry import RAY_ATTENTIONS, VIEW_ATTENTIONS
from pola_gnt.core.errors import UserError, check_bool, check_choice, check_int, check_number, is_int
from pola_gnt.data.collection import FOLDER_KINDS
from pola_gnt.data.colmap import CAMERA_MODELS, CAMERA_MODES, MATCHING
from pola_gnt.data.sampling import CROP_PLACEMENTS, crop_offsets
from pola_gnt.data.scene import Scene
from pola_gnt.data.scenes import SCENE_KINDS
from pola_gnt.data.settings import (
    CollectionFolder,
    CollectionSettings,
    DataSettings,
    ProceduralFamily,
    ProcessDataSettings,
    RandomCrop,
    SceneSettings,
)
from pola_gnt.data.source_views import POOL_FACTORS, RIG_CHOICES
from pola_gnt.evaluation.image_metrics import LPIPS_NETS, PROTOCOL_DEFAULTS, PROTOCOLS
from pola_gnt.evaluation.settings import MetricsSettings, OutputSettings
from pola_gnt.geometry.camera_paths import PATH_KINDS
from pola_gnt.model.inference import PRECISIONS
from pola_gnt.model.settings import BACKBONES, COMPAT_MODES, EncoderSettings, ModelSettings, NetSettings, RenderSettings
from pola_gnt.runs.settings import (
    AnalyzeSettings,
    OptimSettings,
    RunSettings,
    TrainerSettings,
    VideoSettings,
    ViewSettings,
)
from pola_gnt.runs.training_budget import max_time_seconds

MAX_SEED = 2**32 - 1  # numpy's and Lightning's seed range
USAGE_PROCESS_DATA = "python -m pola_gnt.process_data input=PHOTO_DIR|VIDEO out=SCENE_DIR"
# Keys of a stored config that are no settings: Hydra's `_target_` of configs from before the
# settings objects (the network and the trainer are built from their settings now).
IGNORED_KEYS = ("_target_",)
_ABSENT = object()


class ConfigReader:
    """Reads the keys of one config section; every error names the full dotted key. It remembers
    what was read, so that a key nothing reads (a typo given with `+`) is an error too (`check_all_read`)."""

    def __init__(self, node, prefix: str = ""):
        self.node, self.prefix = node, prefix
        self.read: set[str] = set()
        self.sections: list[ConfigReader] = []

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def check_all_read(self, ignored: tuple[str, ...] = ()) -> None:
        """A `UserError` for the first key of this section (or a section read from it) that nothing read."""
        node = self.node
        names = [str(name) for name in node] if isinstance(node, (Mapping, DictConfig)) else []
        for name in names:
            if name not in self.read and name not in ignored and name not in IGNORED_KEYS:
                raise UserError(f"{self.key(name)}: not a config key (nothing reads it; check the name)")
        for section in self.sections:
            section.check_all_read()

    def value(self, name: str, nullable: bool = False) -> Any:
        """The raw value (containers as plain lists / dicts); null is None when `nullable`."""
        self.read.add(name)
        node = self.node
        value = node.get(name, _ABSENT) if isinstance(node, (Mapping, DictConfig)) else _ABSENT
        if value is _ABSENT:
            raise UserError(f"{self.key(name)}: must be set (missing from the config)")
        if value is None:
            if nullable:
                return None
            raise UserError(f"{self.key(name)}: must be set, got null")
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        return value

    def section(self, name: str) -> ConfigReader:
        self.read.add(name)
        node = self.node.get(name) if isinstance(self.node, (Mapping, DictConfig)) else None
        if not isinstance(node, (Mapping, DictConfig)):
            raise UserError(f"{self.key(name)}: must be a config section, got {node!r}")
        section = ConfigReader(node, self.key(name))
        self.sections.append(section)
        return section

    def int(self, name: str, minimum: int | None = 1, maximum: int | None = None, why: str = "") -> int:
        return check_int(self.value(name), self.key(name), minimum, maximum, why)

    def number(self, name: str, low=None, high=None, *, low_open=True, high_open=False, why="") -> float:
        value = self.value(name)
        return check_number(value, self.key(name), low, high, low_open=low_open, high_open=high_open, why=why)

    def choice(self, name: str, allowed: Sequence[str]) -> str:
        return check_choice(self.value(name), self.key(name), allowed)

    def bool(self, name: str) -> bool:
        return check_bool(self.value(name), self.key(name))

    def text(self, name: str, what: str = "a string", nullable: bool = False) -> str | None:
        value = self.value(name, nullable=nullable)
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


# ---- conf/config.yaml -> RunSettings ------------------------------------------------------------


def read_run_settings(cfg: DictConfig | Mapping) -> RunSettings:
    """Check every value of the run config; one `UserError` naming the key for the first bad one."""
    r = ConfigReader(cfg)
    seed = r.int("seed", minimum=0, maximum=MAX_SEED)
    ckpt_path = r.value("ckpt_path", nullable=True)
    if ckpt_path is not None and not isinstance(ckpt_path, str):
        raise UserError(f"ckpt_path: must be last or a checkpoint file, got {ckpt_path!r}")
    init_from = r.text("init_from", "null, a checkpoint file or pretrained:NAME", nullable=True)
    settings = RunSettings(
        seed=seed,
        ckpt_path=ckpt_path,
        init_from=init_from or None,
        collection=_collection(r),
        scene=_scene(r.section("scene")),
        data=_data(r.section("data")),
        render=_render(r.section("render")),
        optim=_optim(r.section("optim")),
        metrics=_metrics(r.section("metrics")),
        output=OutputSettings(save_images=r.section("output").bool("save_images")),
        model=_model(r.section("model")),
        trainer=_trainer(r.section("trainer")),
        analyze=_analyze(r.section("analyze")),
        video=_video(r.section("video")),
        view=_view(r.section("view")),
    )
    r.check_all_read(ignored=("hydra",))
    return settings


def _scene(r: ConfigReader) -> SceneSettings:
    return SceneSettings(
        name=str(r.value("name")),
        kind=r.choice("kind", SCENE_KINDS),
        path=r.text("path", "null or a folder", nullable=True),
        rig=r.choice("rig", RIG_CHOICES),
    )


def _collection(r: ConfigReader) -> CollectionSettings | None:
    if r.value("collection", nullable=True) is None:
        return None
    c = r.section("collection")
    folders = c.value("folders")
    if not isinstance(folders, list):
        raise UserError(f"{c.key('folders')}: must be a list of {{path, kind, rig, weight}} (or []), got {folders!r}")
    entries = []
    for i, folder in enumerate(folders):
        key = f"{c.key('folders')}[{i}]"
        if not isinstance(folder, dict):
            raise UserError(
                f"{key}: must be {{path: DIR, kind: {'|'.join(FOLDER_KINDS)}, rig: auto|forward|object, weight: W}}, "
                f"got {folder!r}"
            )
        entry = ConfigReader(folder, key)
        path = entry.text("path", "a scene folder (absolute, or relative to data.root)")
        if not path:
            raise UserError(f"{entry.key('path')}: must be a scene folder (absolute, or relative to data.root)")
        # The one key a config may leave out: `kind` came after the collections of the shipped checkpoints
        # (their stored configs and conf/collection/cpu_mix.yaml, kept as they were trained), whose
        # folders are all LLFF; `auto` finds that from their files. Collections written since say `kind`.
        kind = entry.choice("kind", FOLDER_KINDS) if "kind" in folder else "auto"
        entries.append(
            CollectionFolder(
                path=path,
                kind=kind,
                rig=entry.choice("rig", RIG_CHOICES),
                weight=entry.number("weight", 0, None, low_open=False),
            )
        )
        entry.check_all_read()
    procedural = None
    if c.value("procedural", nullable=True) is not None:
        p = c.section("procedural")
        procedural = ProceduralFamily(
            seed=p.int("seed", minimum=0, maximum=MAX_SEED),
            count=p.int("count", minimum=0),
            weight=p.number("weight", 0, None, low_open=False),
        )
    collection = CollectionSettings(name=str(c.value("name")), folders=tuple(entries), procedural=procedural)
    total = sum(f.weight for f in entries) + (procedural.weight if procedural and procedural.count else 0.0)
    if not entries and not (procedural and procedural.count):
        raise UserError(f"collection: {collection.name} has no scenes (folders is empty and no procedural scenes)")
    if total <= 0:
        raise UserError(f"collection: every weight of {collection.name} is 0; no scene could be drawn")
    return collection


def _data(r: ConfigReader) -> DataSettings:
    crop = None
    if r.value("crop", nullable=True) is not None:
        height, width = r.int_list("crop", length=2, what="null or [height, width] in pixels")
        crop = (height, width)
    random_crop = _random_crop(r)
    if crop is not None and random_crop is not None:
        raise UserError(f"{r.key('random_crop')}: set together with {r.key('crop')}; choose one (null the other)")
    return DataSettings(
        root=r.text("root", "null or a folder", nullable=True),
        synthetic_root=r.text("synthetic_root", "null or a folder", nullable=True),
        factor=r.int("factor"),
        synthetic_factor=r.int("synthetic_factor", why="NeRF's Blender frames are read at 800 / synthetic_factor px"),
        llffhold=r.int("llffhold", why="every N-th view is held out for testing; 0 would leave nothing to score"),
        test_views=None if r.value("test_views", nullable=True) is None else r.int("test_views"),
        num_source_views=r.int("num_source_views"),
        random_source_views=r.bool("random_source_views"),
        source_pool_weights=_source_pool_weights(r),
        target_as_source_rate=r.number("target_as_source_rate", 0, 1, low_open=False),
        targets_per_step=r.int("targets_per_step"),
        rays_per_step=r.int("rays_per_step"),
        crop=crop,
        random_crop=random_crop,
        crop_placement=r.choice("crop_placement", CROP_PLACEMENTS),
        scale_rays_with_views=r.bool("scale_rays_with_views"),
        val_rays=r.int("val_rays"),
        cache_mb=r.int("cache_mb"),
    )


def _source_pool_weights(r: ConfigReader) -> tuple[float, ...] | None:
    value = r.value("source_pool_weights", nullable=True)
    if value is None:
        return None
    key, size = r.key("source_pool_weights"), len(POOL_FACTORS)
    expected = (
        f"null (uniform) or {size} weights >= 0 of the pool factors {list(POOL_FACTORS)} (GNT: [0.2, 0.45, 0.35])"
    )
    if not (isinstance(value, list) and len(value) == size and all(isinstance(w, (int, float)) for w in value)):
        raise UserError(f"{key}: must be {expected}, got {value!r}")
    if min(value) < 0 or not math.isfinite(sum(value)) or sum(value) <= 0:
        raise UserError(f"{key}: must be {expected}, got {value!r}")
    return tuple(float(w) for w in value)


def _random_crop(r: ConfigReader) -> RandomCrop | None:
    value = r.value("random_crop", nullable=True)
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


def _render(r: ConfigReader) -> RenderSettings:
    n_samples = r.int("n_samples", minimum=2, why="samples per ray")
    max_memory_mb = None if r.value("max_memory_mb", nullable=True) is None else r.number("max_memory_mb", 0)
    return RenderSettings(
        n_samples=n_samples,
        chunk_rays=r.int("chunk_rays"),
        max_memory_mb=max_memory_mb,
        precision=r.choice("precision", PRECISIONS),
    )


def _optim(r: ConfigReader) -> OptimSettings:
    return OptimSettings(
        lr_transformer=r.number("lr_transformer", 0),
        lr_encoder=r.number("lr_encoder", 0),
        decay_steps=r.int("decay_steps"),
        decay_rate=r.number("decay_rate", 0, 1, why="1 = no decay"),
    )


def _metrics(r: ConfigReader) -> MetricsSettings:
    """A null `lpips_net` or `quantize_8bit` is the protocol's own (`PROTOCOL_DEFAULTS`)."""
    protocol = r.choice("protocol", PROTOCOLS)
    defaults = PROTOCOL_DEFAULTS[protocol]
    lpips_net = r.value("lpips_net", nullable=True)
    quantize = r.value("quantize_8bit", nullable=True)
    return MetricsSettings(
        lpips_net=defaults.lpips_net if lpips_net is None else r.choice("lpips_net", LPIPS_NETS),
        lpips_weights=r.text("lpips_weights", "null or an npz file", nullable=True),
        protocol=protocol,
        quantize_8bit=defaults.quantize_8bit if quantize is None else r.bool("quantize_8bit"),
    )


def _encoder(r: ConfigReader) -> EncoderSettings:
    channels = r.int_list("stage_channels", what="a list of positive channel counts")
    blocks = r.int_list("stage_blocks", what="a list of positive block counts")
    if len(channels) != len(blocks) or len(channels) < 2:
        raise UserError(
            f"{r.prefix}: stage_channels {list(channels)} and stage_blocks {list(blocks)} must have "
            f"equal lengths of at least 2"
        )
    return EncoderSettings(
        stage_channels=channels,
        stage_blocks=blocks,
        feature_channels=r.int("feature_channels"),
        backbone=r.choice("backbone", BACKBONES),
        backbone_weights=r.text("backbone_weights", what="a path to alex_v0.1.npz or its folder", nullable=True),
        backbone_trainable_layers=r.int("backbone_trainable_layers", 0, 5),
        feature_cache_mb=r.int("feature_cache_mb", minimum=0, why="0: no cache"),
    )


def _model(r: ConfigReader) -> ModelSettings:
    net = r.section("net")
    width, heads = net.int("width"), net.int("heads")
    if width % (2 * heads):
        raise UserError(f"{net.key('width')}: {width} must be divisible by 2 * {net.key('heads')} ({2 * heads})")
    settings = ModelSettings(
        name=str(r.value("name")),
        compile=r.bool("compile"),
        net=NetSettings(
            view_attention=net.choice("view_attention", tuple(VIEW_ATTENTIONS)),  # the registries' keys, as
            ray_attention=net.choice("ray_attention", tuple(RAY_ATTENTIONS)),  # registered when read
            width=width,
            n_blocks=net.int("n_blocks"),
            heads=heads,
            ffn_mult=net.int("ffn_mult"),
            n_freqs=net.int("n_freqs", minimum=0),
            ray_lepe=net.bool("ray_lepe"),
            dropout=net.number("dropout", 0, 1, low_open=False, high_open=True),
            encoder_input_scale=net.number("encoder_input_scale", 0, 1),
            readout_consistency_prior=net.number("readout_consistency_prior", 0, None, low_open=False),
            readout_source_colour=net.bool("readout_source_colour"),
            compat=net.choice("compat", COMPAT_MODES),
            encoder=_encoder(net.section("encoder")),
        ),
    )
    _check_gnt_compat(net, settings.net)
    return settings


def _check_gnt_compat(net: ConfigReader, settings: NetSettings) -> None:
    """`compat: gnt` is GNT's own network: its attention kinds, its plain mean read-out."""
    if not settings.gnt_compatible:
        return
    if settings.encoder.backbone != "none":
        key = f"{net.key('encoder')}.backbone"
        raise UserError(
            f"{key}: {settings.encoder.backbone!r} with {net.key('compat')}=gnt, GNT's network (set {key}=none)"
        )
    gnt_values = {
        "view_attention": (settings.view_attention, "subtraction"),
        "ray_attention": (settings.ray_attention, "softmax"),
        "readout_consistency_prior": (settings.readout_consistency_prior, 0.0),
        "readout_source_colour": (settings.readout_source_colour, False),
    }
    for name, (value, gnt_value) in gnt_values.items():
        if value != gnt_value:
            raise UserError(
                f"{net.key(name)}: {value!r} with {net.key('compat')}=gnt, which is GNT's network "
                f"(set {net.key(name)}={str(gnt_value).lower()}, or {net.key('compat')}=none)"
            )


def _trainer(r: ConfigReader) -> TrainerSettings:
    max_steps = r.int("max_steps")
    interval = r.value("val_check_interval")
    if not (is_int(interval) and interval >= 1) and not (isinstance(interval, float) and 0 < interval <= 1):
        raise UserError(f"{r.key('val_check_interval')}: must be a positive number of steps, got {interval!r}")
    if is_int(interval) and interval > max_steps:
        raise UserError(
            f"{r.key('val_check_interval')}: {interval} is more than {r.key('max_steps')} ({max_steps}); "
            f"validation would never run"
        )
    clip = r.value("gradient_clip_val", nullable=True)
    if clip is not None:
        clip = check_number(clip, r.key("gradient_clip_val"), 0, low_open=False, why="or null")
    devices = r.value("devices")
    count = is_int(devices) and (int(devices) >= 1 or int(devices) == -1)
    indices = isinstance(devices, list) and all(is_int(d) and int(d) >= 0 for d in devices)
    if not (count or indices or isinstance(devices, str)):
        raise UserError(f"{r.key('devices')}: must be a number of devices, -1, auto or a list, got {devices!r}")
    every_n_epochs = r.value("check_val_every_n_epoch", nullable=True)
    return TrainerSettings(
        accelerator=str(r.value("accelerator")),
        devices=devices,
        num_nodes=r.int("num_nodes"),
        strategy=str(r.value("strategy")),
        precision=str(r.value("precision")),
        max_steps=max_steps,
        max_time=max_time_seconds(r.value("max_time", nullable=True)),
        checkpoint_minutes=_checkpoint_minutes(r),
        val_check_interval=interval,
        check_val_every_n_epoch=None if every_n_epochs is None else r.int("check_val_every_n_epoch"),
        log_every_n_steps=r.int("log_every_n_steps"),
        gradient_clip_val=clip,
        use_distributed_sampler=r.bool("use_distributed_sampler"),
        enable_model_summary=r.bool("enable_model_summary"),
        num_sanity_val_steps=r.int("num_sanity_val_steps", minimum=0),
        fast_dev_run=_fast_dev_run(r),
    )


def _checkpoint_minutes(r: ConfigReader) -> tuple[float, ...]:
    value = r.value("checkpoint_minutes")
    numbers = isinstance(value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in value
    )
    if not numbers:
        raise UserError(
            f"{r.key('checkpoint_minutes')}: must be a list of positive minutes, e.g. [1, 2], got {value!r}"
        )
    return tuple(sorted(float(v) for v in value))


def _fast_dev_run(r: ConfigReader) -> bool | int:
    value = r.value("fast_dev_run")
    if isinstance(value, bool):
        return value
    return r.int("fast_dev_run", why="false, true, or a number of batches of each loop (a quick check of the code)")


def read_analyze_settings(analyze: DictConfig | Mapping) -> AnalyzeSettings:
    """The `analyze` section alone (checked before `analyze` reads the checkpoint)."""
    return _analyze(ConfigReader(analyze, "analyze"))


def _analyze(r: ConfigReader) -> AnalyzeSettings:
    return AnalyzeSettings(n_rays=r.int("n_rays"), test_view=r.int("test_view", minimum=0))


def read_video_settings(video: DictConfig | Mapping) -> VideoSettings:
    """The `video` section alone (render_video's options)."""
    return _video(ConfigReader(video, "video"))


def _video(r: ConfigReader) -> VideoSettings:
    path = r.text("path")
    if not (isinstance(path, str) and path.endswith(".json")):
        check_choice(path, "video.path", (*PATH_KINDS, "FILE.json"))
    save_path = r.text("save_path", "null or a FILE.json", nullable=True)
    if save_path is not None and not save_path.endswith(".json"):
        raise UserError(f"video.save_path: must be null or a FILE.json, got {save_path!r}")
    return VideoSettings(
        path=str(path),
        save_path=save_path,
        frames=r.int("frames"),
        fps=r.number("fps", 0),
        rotations=r.number("rotations"),
        z_rate=r.number("z_rate"),
        radius_scale=r.number("radius_scale", 0),
        closed=r.bool("closed"),
        crf=r.int("crf", minimum=0, maximum=51, why="0 lossless, 51 worst"),
        scale=r.number("scale", 0, 1, why="a fraction of the scene's resolution"),
    )


def read_view_settings(view: DictConfig | Mapping) -> ViewSettings:
    """The `view` section alone (the viewer's options)."""
    return _view(ConfigReader(view, "view"))


def _view(r: ConfigReader) -> ViewSettings:
    height = None if r.value("height", nullable=True) is None else r.int("height", why="pixels")
    return ViewSettings(
        host=str(r.text("host")),
        port=r.int("port", minimum=0, maximum=65535, why="0: any free port"),
        preview_rays=r.int("preview_rays"),
        height=height,
    )


def check_scene(settings: RunSettings, scene: Scene) -> None:
    """Checks against the loaded scene: views requested vs available, crops, ray counts, and the
    encoder's smallest input."""
    data = settings.data
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
        if (
            crop_offsets(crop_h, height, data.crop_placement) is None
            or crop_offsets(crop_w, width, data.crop_placement) is None
        ):
            room = " with data.crop_placement=gnt's margins" if data.crop_placement == "gnt" else ""
            raise UserError(f"data.crop: {crop_h}x{crop_w} does not fit inside the images ({height}x{width}){room}")
        pixels, what, side, key = crop_h * crop_w, f"{crop_h}x{crop_w} crop", min(data.crop), "data.crop"
    elif data.random_crop is not None:
        fitting = [
            (h, w)
            for h, w in data.random_crop.sizes()
            if h < height
            and w < width
            and crop_offsets(h, height, data.crop_placement) is not None
            and crop_offsets(w, width, data.crop_placement) is not None
        ]
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
            raise UserError(f"{key}: {data.rays_per_step}{scaled} is more than the {pixels} pixels of a training image")
        raise UserError(
            f"{key}: a {what} has {pixels} pixels, fewer than data.rays_per_step ({data.rays_per_step}{scaled})"
        )
    if data.val_rays > height * width:
        raise UserError(f"data.val_rays: {data.val_rays} is more than the {height * width} pixels of a view")
    encoder, scale = settings.model.net.encoder, settings.model.net.encoder_input_scale
    if math.floor(side * scale) < encoder.min_input_side:
        if key == "data.rays_per_step":
            key = "model.net.encoder_input_scale"
        raise UserError(
            f"{key}: the smallest side of a training {what} ({side} pixels) at model.net.encoder_input_scale "
            f"{scale:g} gives the encoder fewer than the {encoder.min_input_side} pixels its "
            f"{len(encoder.stage_channels)} stages need"
        )


# ---- conf/process_data.yaml -> ProcessDataSettings ----------------------------------------------


def read_process_data_settings(cfg: DictConfig | Mapping) -> ProcessDataSettings:
    """Check every value of `python -m pola_gnt.process_data`'s config (keys as in the YAML)."""
    r = ConfigReader(cfg)
    paths = {}
    for key in ("input", "out"):
        value = r.value(key, nullable=True)
        if not value:
            raise UserError(f"{key}: required; usage: {USAGE_PROCESS_DATA}")
        paths[key] = str(value)
    settings = ProcessDataSettings(
        input=paths["input"],
        out=paths["out"],
        frames=r.int("frames"),
        camera=r.choice("camera", CAMERA_MODES),
        camera_model=r.choice("camera_model", CAMERA_MODELS),
        matching=r.choice("matching", MATCHING),
        max_image_size=r.int("max_image_size"),
        max_features=r.int("max_features"),
        min_registered=r.number("min_registered", 0, 1, low_open=False, why="a fraction of the images"),
        overwrite=r.bool("overwrite"),
        threads=r.int("threads", minimum=-1, why="-1: every core"),
        seed=r.int("seed", minimum=0, maximum=MAX_SEED),
        deterministic=r.bool("deterministic"),
        progress=r.bool("progress"),
    )
    r.check_all_read(ignored=("hydra",))
    return settings
