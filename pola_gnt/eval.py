"""`python -m pola_gnt.eval scene=NAME ckpt_path=PATH [metrics.lpips_net=alex|vgg] [metrics.protocol=standard|gnt]`

Renders every held-out view of a trained checkpoint and writes `metrics.json`, `metrics.csv` and the
view PNGs into the run folder (`hydra.run.dir`), through the same Lightning test phase as training
(`GNTSystem.test_step` / `on_test_epoch_end`): the same checkpoint under the same protocol gives the
numbers of the training run's own `metrics.json`.

The run config is the one stored in the checkpoint; only keys given on the command line change it
(`checkpoints.run_config_with_overrides`). `metrics.protocol=gnt` without an explicit
`metrics.lpips_net` scores LPIPS with VGG, as GNT's published numbers did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pola_gnt.checkpoints import (
    command_line_keys,
    read_checkpoint,
    resolve_checkpoint,
    run_config_with_overrides,
    state_dict_mismatch,
    stored_run_config,
)
from pola_gnt.config import CONFIG_DIR, entry_point, validate_config
from pola_gnt.data.datamodule import SceneDataModule
from pola_gnt.data.scenes import load_scene
from pola_gnt.errors import UserError
from pola_gnt.model.lightning import GNTSystem

GNT_PROTOCOL_LPIPS_NET = "vgg"  # GNT (like NeRF and IBRNet) reported LPIPS-VGG


@dataclass
class TrainedCheckpoint:
    path: Path
    config: DictConfig  # the stored run config with the command line's explicit keys applied
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
    validate_config(config)
    system = GNTSystem(OmegaConf.to_container(config, resolve=True))
    try:
        system.load_state_dict(checkpoint["state_dict"], strict=True)
    except RuntimeError as err:
        raise state_dict_mismatch(path, err) from None
    system.on_load_checkpoint(checkpoint)
    return TrainedCheckpoint(path=path, config=config, system=system)


def evaluate(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> dict:
    """Test the checkpoint on the held-out views; return the `metrics.json` document. `overrides`:
    the command line's keys (`task_overrides()`), the only ones that change the checkpoint's config."""
    trained = load_trained_checkpoint(cfg, run_dir, overrides)
    config = trained.config
    scene = load_scene(config.scene, config.data)
    trained.system.output_dir = run_dir
    # The machine settings (accelerator, precision, devices) are the command line's; nothing is logged
    # or checkpointed: the results are the files written by the test phase.
    trainer: pl.Trainer = instantiate(
        config.trainer,
        logger=False,
        callbacks=[],
        enable_checkpointing=False,
        default_root_dir=str(run_dir),
        max_time=None,  # a training budget; the run's own is reported from the checkpoint
    )
    if trainer.is_global_zero:
        print(f"checkpoint  {trained.path} ({config.model.name}, step {trained.system.checkpoint_step})", flush=True)
        print(scene.summary(), flush=True)
    trainer.test(trained.system, datamodule=SceneDataModule(config, scene), verbose=False)
    if trainer.is_global_zero:
        print(f"wrote {run_dir / 'metrics.json'}, metrics.csv and test_views/", flush=True)
    return trained.system.test_document


@entry_point
def main(cfg: DictConfig) -> None:
    evaluate(cfg, Path(HydraConfig.get().runtime.output_dir), task_overrides())


if __name__ == "__main__":
    main()
