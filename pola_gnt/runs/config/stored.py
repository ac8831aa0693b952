"""The run config stored in a checkpoint, and the config a trained checkpoint is evaluated or rendered
with: its stored run config plus only the keys the user typed on the command line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import Container, DictConfig, OmegaConf

from pola_gnt.core.errors import UserError
from pola_gnt.core.files import file_sha256
from pola_gnt.core.paths import PROJECT_ROOT
from pola_gnt.model.backbone import restore_frozen_convs
from pola_gnt.runs.checkpoints import (
    PRETRAINED_PREFIX,
    ResumePoint,
    checkpoint_training_scenes,
    read_checkpoint,
    resolve_checkpoint,
    stored_config_dict,
)
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.schema import IGNORED_KEYS
from pola_gnt.runs.settings import RunSettings

_ABSENT = object()
CONFIG_DIR = PROJECT_ROOT / "conf"


@dataclass
class TrainedRunConfig:
    """A trained checkpoint and the run it is evaluated, rendered or analysed as."""

    path: Path
    checkpoint: dict  # the whole checkpoint dictionary, on the CPU
    settings: RunSettings  # the stored run config with the command line's explicit keys applied, checked
    config: dict  # the same, as a plain dict (the system's hyper-parameters)


def trained_run_config(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> TrainedRunConfig:
    """Read the checkpoint `cfg.ckpt_path` names and build its run config from the command line's
    `overrides` (Hydra's task overrides; `cfg` is the composed config), checked."""
    path = resolve_checkpoint(cfg.ckpt_path, run_dir)
    if path is None:
        raise UserError(
            "ckpt_path: required, the trained checkpoint to use (e.g. ckpt_path=RUN_DIR/checkpoints/last.ckpt)"
        )
    checkpoint = read_checkpoint(path)
    config = run_config_with_overrides(path, stored_run_config(checkpoint, path), cfg, overrides, CONFIG_DIR)
    _, explicit_keys = command_line_keys(overrides, CONFIG_DIR)
    # Asking for a protocol means its LPIPS network and quantisation (GNT's: VGG, unquantised), unless
    # given too: not those the checkpoint's run stored for the protocol it was tested under.
    if "metrics.protocol" in explicit_keys:
        for key in ("lpips_net", "quantize_8bit"):
            if f"metrics.{key}" not in explicit_keys:
                config.metrics[key] = None
    settings = read_run_settings(config)
    return TrainedRunConfig(path=path, checkpoint=checkpoint, settings=settings, config=container_dict(config))


def container_dict(node: Any, resolve: bool = True) -> dict[str, Any]:
    """`OmegaConf.to_container` of a mapping node (a config or one of its sections): a plain dict."""
    container = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(container, dict):
        raise TypeError(f"expected a config mapping, got {type(container).__name__}")
    return {str(key): value for key, value in container.items()}


def stored_run_config(checkpoint: dict, path: Path) -> DictConfig:
    """The run config saved in a checkpoint dictionary by `GNTSystem` (its hyper-parameters)."""
    return OmegaConf.create(stored_config_dict(checkpoint, path))


# Network keys no weight depends on: a checkpoint evaluates, resumes and fine-tunes under another value.
# Dropout shapes training only; the views' angle weighting and the number of feature directions are
# choices of how the same weights render (no parameters of their own), e.g. on a scene the model never saw.
# The learned scores' bound has no parameters either: a fine-tuning run may lift it (0) to let the scores
# leave the prior where one scene's views call for it. The working size chooses the images the same weights
# see (a network trained at one resolution rendering another).
WEIGHTLESS_NET_KEYS = (
    "dropout",
    "working_size",
    "readout_view_angle_weighting",
    "readout_consistency_feature_dims",
    "readout_score_bound",
    # How the prior reads the same views (issue 49): neighbours, front to back. No parameters.
    "readout_neighbour_windows",
    "readout_composite_temperature",
    "readout_composite_share",
)
# Keys under model.net that are the machine's (COMMAND_SECTIONS), not the network's: never compared.
MACHINE_NET_KEYS = ("encoder.feature_cache_mb",)


def _network(node) -> dict:
    ignored = (*IGNORED_KEYS, *WEIGHTLESS_NET_KEYS)
    network = {k: v for k, v in container_dict(node).items() if k not in ignored}
    for key in MACHINE_NET_KEYS:
        section, _, leaf = key.rpartition(".")
        if isinstance(network.get(section), dict):
            network[section] = {k: v for k, v in network[section].items() if k != leaf}
    return network


def check_compatible(path: Path, cfg: DictConfig, stored: DictConfig) -> DictConfig:
    """Refuse a checkpoint (config `stored`) whose model differs from `cfg.model`; return `stored`."""
    if stored.model.name != cfg.model.name:
        raise UserError(f"{path}: checkpoint of model {stored.model.name!r}, but model={cfg.model.name} was asked for")
    stored_net, wanted_net = _network(stored.model.net), _network(cfg.model.net)
    if stored_net != wanted_net:
        differing = sorted(k for k in set(stored_net) | set(wanted_net) if stored_net.get(k) != wanted_net.get(k))
        details = ", ".join(f"model.net.{k}={stored_net.get(k)!r} (asked {wanted_net.get(k)!r})" for k in differing)
        raise UserError(f"{path}: checkpoint model config differs: {details}")
    return stored


# Sections (and keys) that describe the machine and the command rather than the trained run: always
# taken from the command line's config, so a GPU-trained checkpoint evaluates on a CPU, old checkpoints
# render videos with today's video options, and rays per pass, memory, render precision and the passes
# at once suit the machine at hand (rays per pass and workers change no pixel: tests/test_render_precision.py,
# tests/test_render_kernels.py).
COMMAND_SECTIONS = (
    "trainer",
    "video",
    "view",
    "export",
    "analyze",
    "benchmark",
    "ckpt_path",
    "render.chunk_rays",
    "render.max_memory_mb",
    "render.precision",
    "render.workers",
    *(f"model.net.{key}" for key in MACHINE_NET_KEYS),
)


def config_groups(config_dir: Path) -> set[str]:
    """Hydra's config groups of the project: the folders of the config directory (scene, model, ...)."""
    return {entry.name for entry in config_dir.iterdir() if entry.is_dir()}


def command_line_keys(overrides: Sequence[str], config_dir: Path) -> tuple[dict[str, str], list[str]]:
    """Split Hydra task overrides into the config groups chosen (`{"scene": "fern"}`) and the
    dotted keys set, added or deleted (`["metrics.lpips_net", ...]`), in command-line order."""
    groups = config_groups(config_dir)
    chosen, keys = {}, []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        name = override.key_or_group
        if name in groups:
            chosen[name] = str(override.value())
        else:
            keys.append(name)
    return chosen, keys


def option_keys(config_dir: Path, group: str, option: str) -> list[str]:
    """The config keys that choosing `group=option` sets: the group's own section (`scene`), or for
    an option in the global package (`experiment=quick`) each value its file sets (`data.factor`,
    `model.net.width`, ...; lists count as one value)."""
    file = config_dir / group / f"{option}.yaml"
    if not file.is_file():
        raise UserError(f"{group}={option}: cannot find {file} to tell which keys it sets")
    if "@package _global_" not in file.read_text().split("\n", 1)[0]:
        return [group]
    content = container_dict(OmegaConf.load(file), resolve=False)
    content.pop("defaults", None)
    return leaf_keys(content)


def leaf_keys(node: dict, prefix: str = "") -> list[str]:
    """The dotted keys of a plain nested mapping's leaves (`{"a": {"b": 1}}` -> `["a.b"]`), each after
    `prefix`; an empty mapping and a list are leaves."""
    paths = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        paths += leaf_keys(value, f"{path}.") if isinstance(value, dict) and value else [path]
    return paths


def _copy_key(source: DictConfig, target: DictConfig, key: str) -> None:
    """Make `target[key]` what it is in `source`: set, replaced or deleted."""
    value = OmegaConf.select(source, key, default=_ABSENT)
    if value is _ABSENT:
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(target, parent_key) if parent_key else target
        if isinstance(parent, DictConfig) and leaf in parent:
            del parent[leaf]
        return
    if isinstance(value, Container):
        value = OmegaConf.to_container(value, resolve=True)
    OmegaConf.update(target, key, value, merge=False, force_add=True)


def model_option(name: str, config_dir: Path = CONFIG_DIR) -> DictConfig:
    """`conf/model/<name>.yaml` with the model options it builds on (its `defaults`, `_self_` last
    unless placed): the model section a run of that model starts from. Empty for an unknown name."""
    path = config_dir / "model" / f"{name}.yaml"
    if not path.is_file():
        return OmegaConf.create({})
    own = OmegaConf.load(path)
    if not isinstance(own, DictConfig):
        raise TypeError(f"{path}: not a mapping")
    defaults = list(own.pop("defaults", []))
    if "_self_" not in defaults:
        defaults.append("_self_")
    merged = OmegaConf.create({})
    for entry in defaults:
        merged = OmegaConf.merge(merged, own if entry == "_self_" else model_option(str(entry), config_dir))
    if not isinstance(merged, DictConfig):
        raise TypeError(f"{path}: merging gave a {type(merged).__name__}")
    return merged


def completed_run_config(stored: DictConfig | dict, current: DictConfig | dict) -> DictConfig:
    """A checkpoint's stored run config with the keys it lacks (added to the project after it was
    saved) taken from `current`, today's composed config, and the network's from the stored model's
    own option file (`model_option`: the value that keeps the network as it was trained, e.g.
    `model.net.dropout` 0), never from another model's defaults."""
    completion = container_dict(current if isinstance(current, DictConfig) else OmegaConf.create(current))
    # plain (a composed config is typed by the schema: its sections would refuse being replaced whole)
    stored_node = OmegaConf.create(container_dict(stored, resolve=False) if isinstance(stored, DictConfig) else stored)
    model_name = OmegaConf.select(stored_node, "model.name")
    completion["model"] = container_dict(model_option(str(model_name))) if model_name else {}
    config = OmegaConf.merge(OmegaConf.create(completion), stored_node)
    if not isinstance(config, DictConfig):
        raise TypeError(f"merging two mappings gave a {type(config).__name__}")
    return config


def run_config_with_overrides(
    path: Path, stored: DictConfig, cfg: DictConfig, overrides: Sequence[str], config_dir: Path
) -> DictConfig:
    """The config to evaluate or render checkpoint `path` with.

    Starts from the run config stored in the checkpoint (`stored`) and applies only what the user
    gave on the command line (`overrides`, Hydra's task overrides; `cfg` is the composed config):
    - a dotted key (`metrics.lpips_net=vgg`, `data.factor=8`, `render.chunk_rays=N`) takes `cfg`'s value;
    - `scene=NAME` takes the composed `cfg.scene`; a global group such as `experiment=NAME` counts
      as setting every key its file sets;
    - `model=NAME` must name the checkpoint's model and `model.net.*` keys must equal the
      checkpoint's: a network cannot change after training (UserError naming what differs);
    - `trainer`, `video`, `view`, `analyze`, `benchmark`, `export`, `ckpt_path`, the render keys of the machine
      (`render.chunk_rays`, `render.max_memory_mb`, `render.precision`, `render.workers`) and the training cache's
      size (`model.net.encoder.feature_cache_mb`) always come from `cfg` (`COMMAND_SECTIONS`).
    Keys the checkpoint lacks (added to the project after it was saved) take `cfg`'s defaults.
    """
    chosen, keys = command_line_keys(overrides, config_dir)
    config = completed_run_config(stored, cfg)
    for group, option in chosen.items():
        if group == "model":  # the network is the checkpoint's: only the model's name is compared
            _copy_key(cfg, config, "model.name")
        elif group not in COMMAND_SECTIONS:
            for key in option_keys(config_dir, group, option):
                _copy_key(cfg, config, key)
    for key in keys:
        _copy_key(cfg, config, key)
    for section in COMMAND_SECTIONS:
        _copy_key(cfg, config, section)
    # against the stored network completed as it was trained (keys added since: their neutral values)
    check_compatible(path, config, completed_run_config(stored, cfg))
    return config


def checkpoint_to_resume(cfg: DictConfig, run_dir: Path) -> ResumePoint | None:
    """The checkpoint `ckpt_path` names for training to resume from and its step (None: start
    fresh), refused when it holds another model than `cfg`'s. The file is read once, here."""
    path = resolve_checkpoint(cfg.ckpt_path, run_dir)
    if path is None:
        return None
    checkpoint = read_checkpoint(path)
    check_compatible(path, cfg, completed_run_config(stored_run_config(checkpoint, path), cfg))
    return ResumePoint(path=path, step=int(checkpoint.get("global_step", 0)))


# What a fine-tuning run takes from the checkpoint it starts from, unless the command line sets it: the
# network (its weights' shapes and how they render) and the source views it was trained to read.
# The rays' patches go with the network: they are how its prior's neighbours see rays in training.
INHERITED_BY_FINETUNING = ("model.net", "data.num_source_views", "data.ray_patch_size")


def inherit_initial_network(cfg: DictConfig, overrides: Sequence[str], run_dir: Path) -> None:
    """Fine-tuning continues a network: set `cfg`'s `INHERITED_BY_FINETUNING` keys to the stored run
    config of the checkpoint `cfg.init_from` names, except the keys the command line (`overrides`)
    sets, itself or through the experiment file it names (`experiment=finetune`'s own keys, not those
    of the presets it builds on): they keep their value and are checked against the weights when they
    load. Without `init_from`, nothing changes. So `experiment=finetune init_from=pretrained:NAME`
    fine-tunes a shipped checkpoint of any recipe without its network's keys being repeated."""
    path = resolve_checkpoint(cfg.get("init_from"), run_dir, key="init_from")
    if path is None:
        return
    stored = completed_run_config(stored_run_config(read_checkpoint(path), path), cfg)
    chosen, typed = command_line_keys(overrides, CONFIG_DIR)
    if "experiment" in chosen:
        typed += option_keys(CONFIG_DIR, "experiment", chosen["experiment"])
    machine = {f"model.net.{key}" for key in MACHINE_NET_KEYS}

    def set_by_user(key: str) -> bool:
        return any(key == given or key.startswith(f"{given}.") for given in typed)

    for section in INHERITED_BY_FINETUNING:
        node = OmegaConf.select(stored, section, default=None)
        if node is None:
            continue
        keys = leaf_keys(container_dict(node), f"{section}.") if isinstance(node, DictConfig) else [section]
        for key in keys:
            if key not in machine and not set_by_user(key):
                _copy_key(stored, cfg, key)


@dataclass(frozen=True)
class InitialWeights:
    """The weights a fine-tuning run starts from (`init_from`), and their record for `metrics.json`."""

    path: Path
    state_dict: dict
    record: dict  # {"path", "sha256", "global_step", "training_scenes"}


def initial_weights(init_from: str, config: dict, run_dir: Path) -> InitialWeights:
    """Read the checkpoint `init_from` names (a file or `pretrained:NAME`), refused when it holds
    another model or size than the run's `config` (one line)."""
    path = resolve_checkpoint(init_from, run_dir, key="init_from")
    if path is None:
        raise UserError("init_from: empty; give a checkpoint file or pretrained:NAME")
    checkpoint = read_checkpoint(path)
    check_compatible(path, OmegaConf.create(config), completed_run_config(stored_run_config(checkpoint, path), config))
    shown = init_from if init_from.startswith(PRETRAINED_PREFIX) else str(path.resolve())
    record = {
        "path": shown,
        "sha256": file_sha256(path),
        "global_step": int(checkpoint.get("global_step", 0)),
        "training_scenes": checkpoint_training_scenes(checkpoint),
    }
    encoder, metrics = config["model"]["net"]["encoder"], config["metrics"]
    state_dict = restore_frozen_convs(checkpoint, path, encoder.get("backbone_weights"), metrics.get("lpips_weights"))
    return InitialWeights(path=path, state_dict=state_dict, record=record)
