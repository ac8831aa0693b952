"""Loading a trained run's checkpoint for `eval`, `render_video` and `analyze`: the checkpoint file
(`ckpt_path=last|PATH`), its stored run config with only the command line's keys applied
(`checkpoints.run_config_with_overrides`), checked, and a `GNTSystem` with its weights."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pola_gnt.core.errors import UserError
from pola_gnt.runs.checkpoints import (
    command_line_keys,
    read_checkpoint,
    resolve_checkpoint,
    run_config_with_overrides,
    state_dict_mismatch,
    stored_run_config,
)
from pola_gnt.runs.hydra_app import CONFIG_DIR, validate_config
from pola_gnt.runs.settings import RunSettings
from pola_gnt.runs.system import GNTSystem

GNT_PROTOCOL_LPIPS_NET = "vgg"  # GNT (like NeRF and IBRNet) reported LPIPS-VGG


@dataclass
class TrainedCheckpoint:
    path: Path
    config: DictConfig  # the stored run config with the command line's explicit keys applied
    settings: RunSettings  # `config`, checked
    system: GNTSystem  # weights loaded, on the CPU


def task_overrides() -> list[str]:
    """What the user typed on the command line of this Hydra run (without `hydra.*` keys)."""
    return list(HydraConfig.get().overrides.task)


def load_trained_checkpoint(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> TrainedCheckpoint:
    """Read `cfg.ckpt_path`, build its run config from the command line's `overrides`, load the weights (strict)."""
    path = resolve_checkpoint(cfg.ckpt_path, run_dir)
    if path is None:
        raise UserError(
            "ckpt_path: required, the trained checkpoint to use (e.g. ckpt_path=RUN_DIR/checkpoints/last.ckpt)"
        )
    checkpoint = read_checkpoint(path)
    config_dir = Path(CONFIG_DIR)
    config = run_config_with_overrides(path, stored_run_config(checkpoint, path), cfg, overrides, config_dir)
    _, explicit_keys = command_line_keys(overrides, config_dir)
    # Asking for GNT's protocol means comparing with GNT's numbers, which used LPIPS-VGG.
    if (
        config.metrics.protocol == "gnt"
        and "metrics.protocol" in explicit_keys
        and "metrics.lpips_net" not in explicit_keys
    ):
        config.metrics.lpips_net = GNT_PROTOCOL_LPIPS_NET
    settings = validate_config(config)
    settings.trainer.check_device()  # the command line's trainer (a GPU checkpoint evaluates on a CPU)
    system = GNTSystem.from_config(config)
    try:
        system.load_state_dict(checkpoint["state_dict"], strict=True)
    except RuntimeError as err:
        raise state_dict_mismatch(path, err) from None
    system.on_load_checkpoint(checkpoint)
    return TrainedCheckpoint(path=path, config=config, settings=settings, system=system)
