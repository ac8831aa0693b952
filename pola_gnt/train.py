"""`python -m pola_gnt.train [scene=NAME] [model=pola_gnt|gnt] [experiment=quick|paper] ...`

Fits the model with Lightning, then renders every held-out view and writes `metrics.json`,
`metrics.csv` and the view PNGs into the run folder (`hydra.run.dir`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import Callback, LearningRateMonitor, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

from pola_gnt.checkpoints import CHECKPOINT_DIR, check_compatible, resolve_checkpoint
from pola_gnt.config import entry_point, validate_config
from pola_gnt.data.datamodule import SceneDataModule
from pola_gnt.data.scenes import load_scene
from pola_gnt.model.lightning import GNTSystem


class LastCheckpoint(Callback):
    """Keep `last.ckpt` current: after every validation, at the end of training, and when training
    stops on an exception (Ctrl-C, SIGTERM), so `ckpt_path=last` resumes from the latest step.
    Written to a temporary file and renamed, so an interruption never leaves half a checkpoint."""

    def __init__(self, path: Path):
        self.path = path
        self.saved_step = -1

    def save(self, trainer: pl.Trainer) -> None:
        if trainer.global_step == self.saved_step or trainer.global_step == 0 or trainer.sanity_checking:
            return
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        trainer.save_checkpoint(temporary, weights_only=False)  # collective: all ranks call it, rank 0 writes
        if trainer.is_global_zero:
            os.replace(temporary, self.path)
        self.saved_step = trainer.global_step

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self.save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.save(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if trainer.state.fn == "fit":
            self.save(trainer)


def build_trainer(cfg: DictConfig, run_dir: Path) -> pl.Trainer:
    checkpoint_dir = run_dir / CHECKPOINT_DIR
    callbacks = [
        ModelCheckpoint(dirpath=checkpoint_dir, filename="best-step{step}-psnr{val/psnr:.2f}", monitor="val/psnr",
                        mode="max", save_top_k=1, save_last=False, auto_insert_metric_name=False),
        LastCheckpoint(checkpoint_dir / "last.ckpt"),
        LearningRateMonitor(logging_interval="step"),
    ]
    loggers = [TensorBoardLogger(run_dir, name="tensorboard", version=""), CSVLogger(run_dir, name="csv", version="")]
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers, default_root_dir=str(run_dir))


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Fit, test on the held-out views, and return the `metrics.json` document."""
    validate_config(cfg)
    checkpoint = resolve_checkpoint(cfg.ckpt_path, run_dir)
    if checkpoint is not None:
        check_compatible(checkpoint, cfg)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    scene = load_scene(cfg.scene, cfg.data)
    datamodule = SceneDataModule(cfg, scene)
    system = GNTSystem(OmegaConf.to_container(cfg, resolve=True))
    system.output_dir = run_dir
    trainer = build_trainer(cfg, run_dir)
    if trainer.is_global_zero:
        print(scene.summary(), flush=True)
    trainer.fit(system, datamodule=datamodule, ckpt_path=str(checkpoint) if checkpoint else None)
    trainer.test(system, datamodule=datamodule, verbose=False)
    return system.test_document


@entry_point
def main(cfg: DictConfig) -> None:
    train(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
