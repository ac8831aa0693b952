"""The Lightning `Trainer` of a training run, built from its settings: the guard against stops and
divergence, the time budget (and a progress bar that counts it), the best and the last checkpoint,
the loggers, safe checkpoint writes."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytorch_lightning as pl
from pytorch_lightning.callbacks import LearningRateMonitor, ModelCheckpoint, Timer
from pytorch_lightning.loggers import TensorBoardLogger

from pola_gnt.runs.callbacks import AppendingCSVLogger, BudgetCheckpoints, LastCheckpoint, TrainingProgressBar
from pola_gnt.runs.checkpoints import CHECKPOINT_DIR
from pola_gnt.runs.guards import StopSignals, TrainingGuard
from pola_gnt.runs.run_folder import SafeCheckpointIO
from pola_gnt.runs.settings import TrainerSettings


def fit_timer(trainer: TrainerSettings) -> Timer:
    """Our own Timer (Lightning then adds none): it enforces `trainer.max_time` in any of its accepted
    forms (training_budget.py), times training under a steps budget too, and is saved in the checkpoints."""
    max_time = trainer.max_time
    return Timer(duration=None if max_time is None else timedelta(seconds=max_time), interval="step", verbose=False)


def build_trainer(
    settings: TrainerSettings,
    run_dir: Path,
    last: LastCheckpoint,
    timer: Timer,
    resume_step: int = 0,
    signals: StopSignals | None = None,
) -> pl.Trainer:
    checkpoint_dir = run_dir / CHECKPOINT_DIR
    callbacks = [
        TrainingGuard(signals),
        timer,
        ModelCheckpoint(
            dirpath=checkpoint_dir,
            filename="best-step{step}-psnr{val/psnr:.2f}",
            monitor="val/psnr",
            mode="max",
            save_top_k=1,
            save_last=False,
            auto_insert_metric_name=False,
        ),
        last,
        LearningRateMonitor(logging_interval="step"),
        TrainingProgressBar(timer, settings.max_time),
    ]
    if settings.checkpoint_minutes:
        callbacks.append(BudgetCheckpoints(checkpoint_dir, settings.checkpoint_minutes, timer))
    loggers = [
        # Events from steps at or after the resumed checkpoint (an interrupted run's tail) are purged.
        TensorBoardLogger(run_dir, name="tensorboard", version="", purge_step=resume_step or None),
        AppendingCSVLogger(run_dir, name="csv", version="", resume_step=resume_step),
    ]
    return pl.Trainer(
        **settings.lightning_arguments(),
        callbacks=callbacks,
        logger=loggers,
        default_root_dir=str(run_dir),
        plugins=[SafeCheckpointIO()],
    )
