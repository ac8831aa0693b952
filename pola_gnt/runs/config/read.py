"""The one place where the composed Hydra config becomes typed settings and is checked.

`read_run_settings(cfg)` reads `conf/config.yaml` into `RunSettings`, `read_process_data_settings(cfg)`
`conf/process_data.yaml` into `ProcessDataSettings`: the settings classes are the schema, read and
checked by `schema.read_settings` (each value's type from its field, then each class's `check`). Every
key is required: the YAML files are the one place a default lives (a key missing from a checkpoint's
older stored config is filled from today's YAML before it gets here, `run_config_with_overrides`). A bad
value is a `UserError` naming its full key (`model.net.width: ...`), which the entry point prints as
one `error:` line with exit code 2; each kind of message is worded once, in `core.errors`.
What is read here beyond the schema: the YAML's shorthands for a few values (`yaml_forms`), and
`check_scene`, the checks that need the loaded scene.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pola_gnt.core.errors import UserError, check_choice, is_number
from pola_gnt.data.sampling import crop_offsets
from pola_gnt.data.scene import Scene
from pola_gnt.data.settings import ProcessDataSettings
from pola_gnt.evaluation.image_metrics import PROTOCOL_DEFAULTS, PROTOCOLS
from pola_gnt.runs.config.schema import plain_config, read_settings
from pola_gnt.runs.settings import AnalyzeSettings, RunSettings, VideoSettings
from pola_gnt.runs.training_budget import max_time_seconds

USAGE_PROCESS_DATA = "python -m pola_gnt.process_data input=PHOTO_DIR|VIDEO out=SCENE_DIR"


# ---- conf/config.yaml -> RunSettings ------------------------------------------------------------


def read_run_settings(cfg: DictConfig | Mapping) -> RunSettings:
    """Check every value of the run config; one `UserError` naming the key for the first bad one."""
    return read_settings(RunSettings, yaml_forms(plain_config(cfg)))


def _replaced(config: dict[str, Any], section: str, **values: Any) -> None:
    config[section] = {**config[section], **values}  # a new mapping: the caller's config is left as it was


def yaml_forms(config: dict[str, Any]) -> dict[str, Any]:
    """The run config (plain, as `plain_config` gives it) with the values the YAML may write in a
    shorter form than their settings hold, written out:
    - `init_from`: empty is null;
    - `metrics.lpips_net`, `metrics.quantize_8bit`: null is the protocol's own (`PROTOCOL_DEFAULTS`);
    - `trainer.max_time`: minutes, "DD:HH:MM:SS" or a mapping -> seconds; `trainer.checkpoint_minutes`
      in order;
    - a folder of `collection.folders` without `kind` is `auto` (the collections of the shipped
      checkpoints, conf/collection/cpu_mix.yaml and their stored configs, predate the key)."""
    if config.get("init_from") == "":
        config["init_from"] = None
    metrics = config.get("metrics")
    if isinstance(metrics, Mapping):
        nulls = [name for name in ("lpips_net", "quantize_8bit") if name in metrics and metrics[name] is None]
        if nulls:
            defaults = PROTOCOL_DEFAULTS[check_choice(metrics.get("protocol"), "metrics.protocol", PROTOCOLS)]
            _replaced(config, "metrics", **{name: getattr(defaults, name) for name in nulls})
    trainer = config.get("trainer")
    if isinstance(trainer, Mapping):
        if "max_time" in trainer:
            _replaced(config, "trainer", max_time=max_time_seconds(trainer["max_time"]))
        minutes = trainer.get("checkpoint_minutes")
        if isinstance(minutes, list) and all(is_number(value) for value in minutes):
            _replaced(config, "trainer", checkpoint_minutes=sorted(minutes))
    collection = config.get("collection")
    folders = collection.get("folders") if isinstance(collection, Mapping) else None
    if isinstance(folders, list):
        kinds = [{"kind": "auto", **f} if isinstance(f, Mapping) else f for f in folders]
        _replaced(config, "collection", folders=kinds)
    return config


def read_analyze_settings(analyze: DictConfig | Mapping) -> AnalyzeSettings:
    """The `analyze` section alone (checked before `analyze` reads the checkpoint)."""
    return read_settings(AnalyzeSettings, analyze, "analyze")


def read_video_settings(video: DictConfig | Mapping) -> VideoSettings:
    """The `video` section alone (render_video's options)."""
    return read_settings(VideoSettings, video, "video")


def check_scene(settings: RunSettings, scene: Scene) -> None:
    """Checks against the loaded scene (before training): views requested vs available, crops (not with a
    working size), ray counts, and the encoder's smallest input."""
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
    if settings.model.net.working_size and key != "data.rays_per_step":
        # A source's working factor comes from its size (NetSettings.working_factor): a crop's is not its image's.
        raise UserError(
            f"{key}: training crops with model.net.working_size {settings.model.net.working_size} (the working "
            f"size follows an image's own size, not its crop's); set {key}=null or model.net.working_size=0"
        )
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
    for key in ("input", "out"):  # the command's arguments, without a default (??? in the YAML)
        given = key in cfg and not (isinstance(cfg, DictConfig) and OmegaConf.is_missing(cfg, key))
        if not (given and cfg[key]):
            raise UserError(f"{key}: required; usage: {USAGE_PROCESS_DATA}")
    return read_settings(ProcessDataSettings, cfg)
