"""Finding and checking checkpoints: `ckpt_path=last|PATH`, refusing one from another model, and the
config a trained checkpoint is evaluated or rendered with (its stored run config plus only the keys
the user typed on the command line)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import Container, DictConfig, OmegaConf

from pola_gnt.core.errors import UserError

CHECKPOINT_DIR = "checkpoints"


def container_dict(node: Any, resolve: bool = True) -> dict[str, Any]:
    """`OmegaConf.to_container` of a mapping node (a config or one of its sections): a plain dict."""
    container = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(container, dict):
        raise TypeError(f"expected a config mapping, got {type(container).__name__}")
    return {str(key): value for key, value in container.items()}


def resolve_checkpoint(ckpt_path: str | None, run_dir: Path) -> Path | None:
    """`None` -> None; `last` -> `<run_dir>/checkpoints/last.ckpt`; otherwise the given file."""
    if not ckpt_path:
        return None
    if str(ckpt_path) == "last":
        path = run_dir / CHECKPOINT_DIR / "last.ckpt"
        if not path.is_file():
            raise UserError(f"ckpt_path=last: no checkpoint at {path} (pass hydra.run.dir=RUN_DIR of the training run)")
        return path
    path = Path(ckpt_path).expanduser()
    if path.is_dir():
        hint = path / CHECKPOINT_DIR / "last.ckpt" if (path / CHECKPOINT_DIR).is_dir() else path / "last.ckpt"
        raise UserError(
            f"ckpt_path: {path} is a folder, not a checkpoint file"
            f"{f' (did you mean {hint}?)' if hint.is_file() else ''}"
        )
    if not path.is_file():
        raise UserError(f"ckpt_path: {path}: not found")
    return path


def is_state_dict_mismatch(err: BaseException) -> bool:
    return isinstance(err, RuntimeError) and str(err).startswith("Error(s) in loading state_dict")


def state_dict_mismatch(path: Path, err: BaseException) -> UserError:
    """One line for weights that do not fit the model: PyTorch's whole multi-line message, joined."""
    details = " ".join(line.strip() for line in str(err).splitlines()[1:] if line.strip()) or type(err).__name__
    if len(details) > 400:
        details = details[:397] + "..."
    return UserError(f"{path}: weights do not fit the model of its run config ({details})")


def read_checkpoint(path: Path) -> dict:
    """The whole checkpoint dictionary (on the CPU) of a Pola-GNT checkpoint file."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        raise UserError(f"{path}: cannot read checkpoint ({type(err).__name__}: {err})") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise UserError(f"{path}: not a Pola-GNT checkpoint (no model weights inside)")
    stored_run_config(checkpoint, path)  # refuse a checkpoint without our run config up front
    return checkpoint


def stored_run_config(checkpoint: dict, path: Path) -> DictConfig:
    """The run config saved in a checkpoint dictionary by `GNTSystem` (its hyper-parameters)."""
    hyper_parameters = checkpoint.get("hyper_parameters")
    config = hyper_parameters.get("config") if isinstance(hyper_parameters, dict) else None
    if not isinstance(config, dict) or "model" not in config:
        raise UserError(f"{path}: not a Pola-GNT checkpoint (no run config inside)")
    return OmegaConf.create(config)


def checkpoint_config(path: Path) -> DictConfig:
    """The run config stored in a Pola-GNT checkpoint."""
    return stored_run_config(read_checkpoint(path), path)


def check_compatible(path: Path, cfg: DictConfig, stored: DictConfig | None = None) -> DictConfig:
    """Refuse a checkpoint whose model differs from `cfg.model`; return its config (`stored`, when
    the caller has already read it, saves loading the file again)."""
    stored = checkpoint_config(path) if stored is None else stored
    if stored.model.name != cfg.model.name:
        raise UserError(f"{path}: checkpoint of model {stored.model.name!r}, but model={cfg.model.name} was asked for")
    stored_net = container_dict(stored.model.net)
    wanted_net = container_dict(cfg.model.net)
    if stored_net != wanted_net:
        differing = sorted(k for k in set(stored_net) | set(wanted_net) if stored_net.get(k) != wanted_net.get(k))
        details = ", ".join(f"model.net.{k}={stored_net.get(k)!r} (asked {wanted_net.get(k)!r})" for k in differing)
        raise UserError(f"{path}: checkpoint model config differs: {details}")
    return stored


# ---- the config a trained checkpoint runs with (eval, render_video) ---------------------------

# Sections that describe the machine and the command rather than the trained run: always taken from
# the command line's config, so a GPU-trained checkpoint evaluates on a CPU and old checkpoints
# render videos with today's video options.
COMMAND_SECTIONS = ("trainer", "video", "analyze", "ckpt_path")
_ABSENT = object()


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

    def leaves(node: dict, prefix: str) -> list[str]:
        paths = []
        for key, value in node.items():
            path = f"{prefix}{key}"
            paths += leaves(value, f"{path}.") if isinstance(value, dict) and value else [path]
        return paths

    return leaves(content, "")


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
    - `trainer`, `video`, `analyze` and `ckpt_path` always come from `cfg` (`COMMAND_SECTIONS`).
    Keys the checkpoint lacks (added to the project after it was saved) take `cfg`'s defaults.
    """
    chosen, keys = command_line_keys(overrides, config_dir)
    current = container_dict(cfg)
    current.pop("model", None)  # a network is never completed from another model's defaults
    config = OmegaConf.merge(OmegaConf.create(current), stored)
    if not isinstance(config, DictConfig):
        raise TypeError(f"merging two mappings gave a {type(config).__name__}")
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
    check_compatible(path, config, stored)
    return config
