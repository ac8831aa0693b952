"""`python -m pola_gnt.train [scene=NAME] [model=pola_gnt|gnt] [experiment=quick|paper] ...`

Fits the model with Lightning, then renders every held-out view and writes `metrics.json`,
`metrics.csv` and the view PNGs into the run folder (`hydra.run.dir`).

Reliability (docs/ARCHITECTURE.md, "Runs"): one run per folder (`run.lock`), exact resume from any
step (`ckpt_path=last`), logs appended across resumes, SIGTERM / SIGINT save `last.ckpt` and print
the command that resumes (exit 143 / 130), a NaN or infinity stops training before it is saved
(exit 3), a full or read-only disk is one `error:` line with nothing half-written.
"""

from __future__ import annotations

import os
import signal
import sys


def _stop_during_startup(signum, frame) -> None:
    """SIGTERM / SIGINT while the libraries load, before anything is saved: one line, 128 + signal."""
    name = signal.Signals(signum).name
    print(
        f"stopped: {name} during start-up; nothing was saved; run the same command again", file=sys.stderr, flush=True
    )
    os._exit(128 + signum)


if __name__ == "__main__":  # installed before the slow imports; `train()` installs the real handlers
    for _signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(_signum, _stop_during_startup)

import csv
import io
import shlex
from datetime import timedelta
from pathlib import Path

import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import Callback, LearningRateMonitor, ModelCheckpoint, Timer
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter
from pytorch_lightning.utilities import rank_zero_only
from pytorch_lightning.utilities.exceptions import SIGTERMException

from pola_gnt.core.errors import DIVERGED_EXIT_CODE, RunStopped, UserError
from pola_gnt.core.files import clean_temporaries, disk_error, is_disk_error, write_atomic
from pola_gnt.data.datamodule import SceneDataModule
from pola_gnt.data.scenes import load_scene
from pola_gnt.runs.budget import MAX_TIME_KEY, max_time_seconds
from pola_gnt.runs.checkpoints import (
    CHECKPOINT_DIR,
    check_compatible,
    is_state_dict_mismatch,
    read_checkpoint,
    resolve_checkpoint,
    state_dict_mismatch,
    stored_run_config,
)
from pola_gnt.runs.guards import Interrupted, StopSignals, TrainingGuard
from pola_gnt.runs.hydra_app import announce, entry_point, validate_config
from pola_gnt.runs.run_folder import NonFiniteError, RunLock, SafeCheckpointIO
from pola_gnt.runs.settings import RunSettings
from pola_gnt.runs.system import GNTSystem

LAST = "last.ckpt"


class LastCheckpoint(Callback):
    """Keep `last.ckpt` current: after every validation, at the end of training, and when training
    stops on a signal or an error (not a divergence), so `ckpt_path=last` resumes from the latest
    step. The checkpoint IO writes atomically and refuses non-finite weights."""

    def __init__(self, path: Path):
        self.path = path
        self.saved_step = -1
        self.save_error: BaseException | None = None  # why the save on an exception failed
        self.between_steps = False  # saving on a stop request, raised before a batch starts

    def save(self, trainer: pl.Trainer) -> None:
        if trainer.global_step == self.saved_step or trainer.global_step == 0 or trainer.sanity_checking:
            return
        for logger in trainer.loggers:  # the logs hold every step up to the checkpoint, even after a SIGKILL
            logger.save()
        trainer.save_checkpoint(self.path, weights_only=False)  # collective: all ranks call it, rank 0 writes
        self.saved_step = trainer.global_step

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self.save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.save(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if trainer.state.fn != "fit" or isinstance(exception, NonFiniteError) or is_disk_error(exception):
            return
        if isinstance(exception, UserError) or getattr(exception, "immediate", False):
            return  # a full disk, or a second signal that may have struck mid-step
        self.between_steps = True
        try:
            self.save(trainer)
        except Exception as err:  # a full disk now: keep the previous last.ckpt, report why
            self.save_error = err
        finally:
            self.between_steps = False

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        # A stop request is honoured at the start of the next batch, when Lightning has already
        # counted that batch as "ready" and advanced its logging step. Store the loop state of a
        # checkpoint written at the end of the previous batch (after its validation), the state
        # Lightning's restore expects: the resumed run validates, logs and draws every step exactly
        # as an uninterrupted run does.
        if not self.between_steps:
            return
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        progress, state = fit_loop.get("epoch_loop.batch_progress"), fit_loop.get("epoch_loop.state_dict")
        if not progress or not state:
            return
        for part in ("total", "current"):
            done = progress[part]["completed"]
            progress[part].update(ready=done, started=done, processed=done, completed=done - 1)
        state["_batches_that_stepped"] = state.get("_batches_that_stepped", 1) - 1


class AppendingCSVWriter(ExperimentWriter):
    """Lightning's CSV writer, but a resumed run keeps the rows of the steps before its checkpoint
    (Lightning's deletes the file); rows from after it (an interrupted run's tail) are dropped, as
    the resumed run logs those steps again."""

    resume_step = 0

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        text = path.read_text()
        if not text.endswith("\n"):  # a row cut short by a kill
            text = text[: text.rfind("\n") + 1]
        reader = csv.DictReader(io.StringIO(text, newline=""))
        fields = list(reader.fieldnames or [])
        rows = [row for row in reader if (row.get("step") or "").isdigit() and int(row["step"]) < self.resume_step]
        if not rows:
            path.unlink()
            return
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(path, buffer.getvalue().encode())
        self.metrics_keys = sorted(fields)


class AppendingCSVLogger(CSVLogger):
    def __init__(self, *args, resume_step: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.resume_step = resume_step

    @property
    def experiment(self):
        if self._experiment is None and self._fs is not None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            writer = AppendingCSVWriter.__new__(AppendingCSVWriter)
            writer.resume_step = self.resume_step
            writer.__init__(log_dir=self.log_dir)
            self._experiment = writer
        return self._experiment


def fit_timer(cfg: DictConfig) -> Timer:
    """Our own Timer (Lightning then adds none): it enforces `trainer.max_time` in any of its accepted
    forms (budget.py), times training under a steps budget too, and is saved in the checkpoints."""
    max_time = max_time_seconds(OmegaConf.select(cfg, MAX_TIME_KEY))
    return Timer(duration=None if max_time is None else timedelta(seconds=max_time), interval="step", verbose=False)


def build_trainer(
    cfg: DictConfig,
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
    ]
    loggers = [
        # Events from steps at or after the resumed checkpoint (an interrupted run's tail) are purged.
        TensorBoardLogger(run_dir, name="tensorboard", version="", purge_step=resume_step or None),
        AppendingCSVLogger(run_dir, name="csv", version="", resume_step=resume_step),
    ]
    return instantiate(
        cfg.trainer,
        callbacks=callbacks,
        logger=loggers,
        default_root_dir=str(run_dir),
        plugins=[SafeCheckpointIO()],
        max_time=None,  # enforced by the Timer above
    )


def resume_command(run_dir: Path, resume: bool = True) -> str:
    """The command line that resumes this run: the same overrides, `ckpt_path=last` (unless there is
    nothing to resume from) and the run folder."""
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # called without Hydra (tests)
        overrides = []
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("ckpt_path=", "hydra.run.dir="))]
    return shlex.join(
        ["python", "-m", "pola_gnt.train", *kept, *(["ckpt_path=last"] if resume else []), f"hydra.run.dir={run_dir}"]
    )


def _checkpoint_step(path: Path) -> int | None:
    if not path.is_file():
        return None
    try:
        return int(read_checkpoint(path).get("global_step", 0))
    except UserError:
        return None


def _stopped_by_signal(signum: int, phase: str, trainer: pl.Trainer, run_dir: Path, last: LastCheckpoint) -> RunStopped:
    name = signal.Signals(signum).name
    last_path = run_dir / CHECKPOINT_DIR / LAST
    saved = _checkpoint_step(last_path)
    where = f"during {phase} at step {trainer.global_step}"
    if phase == "test":
        state = f"metrics.json was not written; {LAST} holds the trained model (step {saved})"
    elif saved is None:
        state = "no checkpoint was saved yet"
    else:
        state = f"{last_path} saved at step {saved}"
        if last.save_error is not None:
            state += f" (the save at step {trainer.global_step} failed: {last.save_error})"
    if saved is None:
        return RunStopped(
            f"{name} {where}; {state}; start again with: {resume_command(run_dir, resume=False)}",
            128 + signum,
            prefix="stopped",
        )
    return RunStopped(
        f"{name} {where}; {state}; resume with: {resume_command(run_dir)}", 128 + signum, prefix="stopped"
    )


def _diverged(err: NonFiniteError, run_dir: Path) -> RunStopped:
    last_path = run_dir / CHECKPOINT_DIR / LAST
    saved = _checkpoint_step(last_path)
    good = (
        f"the last good checkpoint is {last_path} (step {saved}); resume from it with "
        f"`{resume_command(run_dir)} trainer.gradient_clip_val=1.0`"
        if saved is not None
        else "no checkpoint was saved before it"
    )
    return RunStopped(
        f"training diverged: {err}; nothing was saved from it; {good}; or start again with lower "
        f"optim.lr_transformer / optim.lr_encoder or a different seed",
        DIVERGED_EXIT_CODE,
    )


def train(cfg: DictConfig, run_dir: Path) -> dict | None:
    """Fit, test on the held-out views, and return the `metrics.json` document (None on the ranks
    other than 0, which do not write it)."""
    settings = validate_config(cfg)  # every value checked before any work
    settings.trainer.check_device()
    checkpoint = resolve_checkpoint(cfg.ckpt_path, run_dir)
    resume_step = 0
    if checkpoint is not None:
        stored = read_checkpoint(checkpoint)
        check_compatible(checkpoint, cfg, stored_run_config(stored, checkpoint))
        resume_step = int(stored.get("global_step", 0))
        del stored
    # The global rank, known before the trainer exists: Lightning keeps it on its `rank_zero_only`.
    rank_zero = getattr(rank_zero_only, "rank", 0) == 0
    lock = RunLock(run_dir)
    if rank_zero:
        lock.acquire()
    try:
        if rank_zero:
            clean_temporaries(run_dir, run_dir / CHECKPOINT_DIR, run_dir / "test_views", run_dir / "csv")
        with StopSignals() as signals:
            return _fit_and_test(cfg, settings, run_dir, checkpoint, resume_step, signals)
    except Interrupted as err:  # a repeated signal before training started
        raise RunStopped(
            f"{signal.Signals(err.signum).name} before training started; nothing was saved; "
            f"start again with: {resume_command(run_dir, resume=checkpoint is not None)}",
            err.exit_code,
            prefix="stopped",
        ) from None
    except OSError as err:
        if is_disk_error(err):
            raise disk_error(Path(err.filename or run_dir), err) from None
        raise
    finally:
        lock.release()


def _fit_and_test(
    cfg: DictConfig,
    settings: RunSettings,
    run_dir: Path,
    checkpoint: Path | None,
    resume_step: int,
    signals: StopSignals,
) -> dict | None:
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    scene = load_scene(cfg.scene, cfg.data)
    settings.check_scene(scene)
    datamodule = SceneDataModule(cfg, scene)
    system = GNTSystem.from_config(cfg)
    system.output_dir, system.scene = run_dir, scene
    last, system.fit_timer = LastCheckpoint(run_dir / CHECKPOINT_DIR / LAST), fit_timer(cfg)
    trainer = build_trainer(cfg, run_dir, last, system.fit_timer, resume_step, signals)
    if trainer.is_global_zero:
        print(scene.summary(), flush=True)
    phase = "training"
    try:
        signals.check()
        trainer.fit(system, datamodule=datamodule, ckpt_path=str(checkpoint) if checkpoint else None)
        phase = "test"  # training is complete from here on: a stop now loses only the metrics
        signals.check()
        trainer.test(system, datamodule=datamodule, verbose=False)
    except Interrupted as err:
        raise _stopped_by_signal(err.signum, phase, trainer, run_dir, last) from None
    except SIGTERMException:  # Lightning's own SIGTERM handling (it would exit 0), and DDP stops
        raise _stopped_by_signal(signals.received or signal.SIGTERM, phase, trainer, run_dir, last) from None
    except NonFiniteError as err:
        raise _diverged(err, run_dir) from None
    except RuntimeError as err:
        if checkpoint is not None and is_state_dict_mismatch(err):
            raise state_dict_mismatch(checkpoint, err) from None
        raise
    return system.test_document


@entry_point
def main(cfg: DictConfig) -> None:
    announce(cfg)
    train(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
