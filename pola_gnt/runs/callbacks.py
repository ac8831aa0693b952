"""The Lightning callbacks and loggers of a training run: `last.ckpt` kept current (and written on a
stop), CSV logs that append across resumes, and a progress bar that counts a time budget. (Stops and
divergence: `runs.guards`.)"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, Timer, TQDMProgressBar
from pytorch_lightning.callbacks.progress.tqdm_progress import Tqdm
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


def clock(seconds: float) -> str:
    """`54.7 -> "0:54"`, `120 -> "2:00"`, `3723 -> "1:02:03"` (whole seconds, rounded down)."""
    minutes, secs = divmod(int(max(seconds, 0.0)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def budget_text(elapsed: float, budget: float, steps: int) -> str:
    """The training bar's reading under a time budget: training time against the budget (the fit
    timer's, as `trainer.max_time` counts it), the time left and the steps done, e.g.
    `"0:54 / 2:00, 1:06 left, step 312 (5.78/s)"`."""
    rate = f" ({steps / elapsed:.3g}/s)" if elapsed > 0 and steps else ""
    return f"{clock(elapsed)} / {clock(budget)}, {clock(budget - min(elapsed, budget))} left, step {steps}{rate}"


class BudgetTqdm(Tqdm):
    """Lightning's tqdm bar with one more field for its `bar_format`: `{budget}` (`budget_text`)."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.budget = ""  # before tqdm's __init__, which may draw the bar
        super().__init__(*args, **kwargs)

    @property
    def format_dict(self) -> dict[str, Any]:
        return {**super().format_dict, "budget": self.budget}


class TrainingProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar, but under a time budget (`trainer.max_time`) the training bar fills with
    training time, not steps: Lightning's counts batches against `max_steps` (a run of `max_steps=
    1000000` and 2 minutes read "Epoch 0/-2 ... 4 days, 12:15:22" left). It shows the fit `timer`'s
    time against `max_time` (seconds), the time left, the steps done and the logged metrics:
    `Training:  45%|████▌     | 0:54 / 2:00, 1:06 left, step 312 (5.78/s), train/psnr=18.40`.
    Without a time budget it is Lightning's bar, steps against `max_steps`. (Lightning's Rich bar,
    its default where `rich` is installed, has the same flaw; tqdm comes with the core install.)"""

    BUDGET_FORMAT = "{desc}{percentage:3.0f}%|{bar}| {budget}{postfix}"  # tqdm's {desc} ends in ": "

    def __init__(self, timer: Timer, max_time: float | None):
        super().__init__()
        self.timer, self.max_time = timer, max_time

    def init_train_tqdm(self) -> Tqdm:
        if self.max_time is None:
            return super().init_train_tqdm()
        return BudgetTqdm(
            desc=f"{self.train_description}: ",  # as set_description writes it
            position=2 * self.process_position,
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            bar_format=self.BUDGET_FORMAT,
        )

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        super().on_train_epoch_start(trainer)
        # The whole run is one epoch: Lightning's "Epoch 0" says nothing.
        self.train_progress_bar.set_description(self.train_description, refresh=self.max_time is None)
        if self.max_time is not None:
            self.train_progress_bar.total = self.max_time
            self.show_budget(trainer)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.max_time is None:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        elif self.is_enabled and (batch_idx + 1) % self.refresh_rate == 0:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            self.show_budget(trainer)

    def on_train_end(self, *args: Any) -> None:
        if self.max_time is not None:
            self.show_budget(self.trainer)  # the final time, whatever the refresh rate skipped
        super().on_train_end(*args)

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        super().on_test_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)
        # The run's score table is printed as testing ends, before Lightning closes this bar: end the
        # bar's line first, or the table's first line runs on after it.
        if batch_idx + 1 == self.test_progress_bar.total:
            self.test_progress_bar.close()

    def show_budget(self, trainer: pl.Trainer) -> None:
        bar = self.train_progress_bar
        if self.max_time is None or bar.disable or not isinstance(bar, BudgetTqdm):
            return
        elapsed = self.timer.time_elapsed("train")
        bar.budget = budget_text(elapsed, self.max_time, trainer.global_step)
        bar.n = min(elapsed, self.max_time)
        bar.refresh()
