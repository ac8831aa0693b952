"""The Lightning callbacks and loggers of a training run: `last.ckpt` kept current (and written on a
stop), and CSV logs that append across resumes. (Stops and divergence: `runs.guards`.)"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, Timer
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter

from pola_gnt.core.errors import UserError
from pola_gnt.core.files import is_disk_error, write_atomic
from pola_gnt.runs.run_folder import NonFiniteError


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


class BudgetCheckpoints(Callback):
    """An equal-time study from one run: when the training wall time (the fit `timer`'s, as `max_time`
    counts it) first reaches each of `minutes`, save `minutes<M>.ckpt` into `folder`, its stored run
    config saying `trainer.max_time: M`. The learning-rate schedule and the batches depend on the step
    only, so this is the model a run given M minutes ends with; `eval` scores it as that budget."""

    def __init__(self, folder: Path, minutes: tuple[float, ...], timer: Timer):
        self.folder = folder
        self.pending = sorted(minutes)
        self.timer = timer

    @staticmethod
    def file_name(minutes: float) -> str:
        return f"minutes{minutes:g}.ckpt"

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        elapsed = self.timer.time_elapsed("train")  # a resumed run: marks it already passed stay as saved
        self.pending = [m for m in self.pending if m * 60 > elapsed]

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        elapsed = self.timer.time_elapsed("train")
        while self.pending and elapsed >= self.pending[0] * 60:
            minutes = self.pending.pop(0)
            path = self.folder / self.file_name(minutes)
            trainer.save_checkpoint(path, weights_only=False)  # collective: all ranks call it, rank 0 writes
            if trainer.is_global_zero:
                checkpoint = torch.load(path, map_location="cpu", weights_only=False)
                checkpoint["hyper_parameters"]["config"]["trainer"]["max_time"] = minutes
                buffer = io.BytesIO()
                torch.save(checkpoint, buffer)
                write_atomic(path, buffer.getbuffer())


class AppendingCSVWriter(ExperimentWriter):
    """Lightning's CSV writer, but a resumed run keeps the rows of the steps before its checkpoint
    (Lightning's deletes the file); rows from after it (an interrupted run's tail) are dropped, as
    the resumed run logs those steps again."""

    def __init__(self, log_dir: str, resume_step: int = 0):
        self.resume_step = resume_step  # before Lightning's __init__, which reads the old file
        super().__init__(log_dir=log_dir)

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
            self._experiment = AppendingCSVWriter(self.log_dir, self.resume_step)
        return self._experiment
