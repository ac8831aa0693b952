"""`python -m pola_gnt.eval scene=NAME ckpt_path=PATH [metrics.lpips_net=alex|vgg] [metrics.protocol=standard|gnt]`

Renders every held-out view of a trained checkpoint and writes `metrics.json`, `metrics.csv` and the
view PNGs into the run folder (`hydra.run.dir`), through the same Lightning test phase as training
(`GNTSystem.test_step` / `on_test_epoch_end`): the same checkpoint under the same protocol gives the
numbers of the training run's own `metrics.json`.

The run config is the one stored in the checkpoint; only keys given on the command line change it
(`trained_runs.load_trained_checkpoint`). `metrics.protocol=gnt` without an explicit
`metrics.lpips_net` scores LPIPS with VGG, as GNT's published numbers did.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig

from pola_gnt.data.datamodule import SceneDataModule
from pola_gnt.data.scenes import load_scene
from pola_gnt.runs.hydra_app import announce, entry_point
from pola_gnt.runs.trained_runs import load_trained_checkpoint, task_overrides


def evaluate(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> dict | None:
    """Test the checkpoint on the held-out views; return the `metrics.json` document (None on the
    ranks other than 0). `overrides`: the command line's keys (`task_overrides()`), the only ones
    that change the checkpoint's config."""
    trained = load_trained_checkpoint(cfg, run_dir, overrides)
    config = trained.config
    scene = load_scene(config.scene, config.data)
    trained.system.output_dir, trained.system.scene = run_dir, scene
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
    announce(cfg, with_experiment=False)
    evaluate(cfg, Path(HydraConfig.get().runtime.output_dir), task_overrides())


if __name__ == "__main__":
    main()
