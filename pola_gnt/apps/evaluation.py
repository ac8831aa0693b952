"""`eval`'s library: test a trained checkpoint on its scene's held-out views, through the same
Lightning test phase as training (`GNTSystem.test_step` / `on_test_epoch_end`), so the same checkpoint
under the same protocol gives the numbers of the training run's own `metrics.json`. The benchmark
(`apps.benchmark`) scores each scene through it too."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl

from pola_gnt.apps.trained_runs import TrainedCheckpoint, load_trained_checkpoint
from pola_gnt.data.datamodule import SceneDataModule
from pola_gnt.data.scene import Scene
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.runs.config.stored import TrainedRunConfig


def evaluate(run: TrainedRunConfig, run_dir: Path) -> dict | None:
    """Test the checkpoint on the held-out views; return the `metrics.json` document (None on the
    ranks other than 0)."""
    trained = load_trained_checkpoint(run)
    return evaluate_trained(trained, load_scene(trained.settings.scene, trained.settings.data), run_dir)


def evaluate_trained(trained: TrainedCheckpoint, scene: Scene, run_dir: Path) -> dict | None:
    """`evaluate` of a loaded checkpoint on its loaded `scene` (the one its settings name): the test
    phase writes `metrics.json`, `metrics.csv` and `test_views/` into `run_dir` (`pola_gnt.api` too)."""
    settings = trained.settings
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
