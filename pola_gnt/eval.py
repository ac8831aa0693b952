"""`python -m pola_gnt.eval scene=NAME ckpt_path=PATH [metrics.lpips_net=alex|vgg] [metrics.protocol=standard|gnt]`

Renders every held-out view of a trained checkpoint and writes `metrics.json`, `metrics.csv` and the
view PNGs into the run folder (`hydra.run.dir`), through the same Lightning test phase as training
(`GNTSystem.test_step` / `on_test_epoch_end`): the same checkpoint under the same protocol gives the
numbers of the training run's own `metrics.json`.

The run config is the one stored in the checkpoint; only keys given on the command line change it
(`runs.config.stored.trained_run_config`). `metrics.protocol=gnt` without an explicit
`metrics.lpips_net` scores LPIPS with VGG, as GNT's published numbers did.
"""

from __future__ import annotations

from pola_gnt.core.process import prepare_process

if __name__ == "__main__":  # before torch loads OpenMP
    prepare_process()

from pathlib import Path

import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pola_gnt.apps.trained_runs import load_trained_checkpoint
from pola_gnt.data.datamodule import SceneDataModule
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.runs.config.app import announce, entry_point, task_overrides
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import TrainedRunConfig, trained_run_config


def evaluate(run: TrainedRunConfig, run_dir: Path) -> dict | None:
    """Test the checkpoint on the held-out views; return the `metrics.json` document (None on the
    ranks other than 0)."""
    trained = load_trained_checkpoint(run)
    settings = trained.settings
    scene = load_scene(settings.scene, settings.data)
    trained.system.prepare_test(scene, run_dir)
    # The machine settings (accelerator, precision, devices) are the command line's; nothing is logged
    # or checkpointed: the results are the files written by the test phase.
    trainer = pl.Trainer(
        **settings.trainer.lightning_arguments(),
        logger=False,
        callbacks=[],
        enable_checkpointing=False,
        default_root_dir=str(run_dir),
    )
    if trainer.is_global_zero:
        print(f"checkpoint  {trained.path} ({settings.model.name}, step {trained.system.checkpoint_step})", flush=True)
        print(scene.summary(), flush=True)
    trainer.test(trained.system, datamodule=SceneDataModule(scene, settings.data, settings.seed), verbose=False)
    if trainer.is_global_zero:
        print(f"wrote {run_dir / 'metrics.json'}, metrics.csv and test_views/", flush=True)
    return trained.system.test_document


@entry_point
def main(cfg: DictConfig) -> None:
    announce(cfg, with_experiment=False)
    read_run_settings(cfg)  # the command line's values checked before the checkpoint is read
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    evaluate(trained_run_config(cfg, run_dir, task_overrides()), run_dir)


if __name__ == "__main__":
    main()
