"""Training guards: stop cleanly on SIGTERM / SIGINT, and stop at once on a NaN or infinity.

- `StopSignals` turns SIGTERM and SIGINT into a request that `TrainingGuard` honours at the next
  batch boundary (never inside an optimiser step or a checkpoint write), so `last.ckpt` is saved in
  a consistent state. A second signal of the same kind stops at once.
- `TrainingGuard` checks the loss before the backward pass, the gradients before the optimiser
  step, the weights after it and the validation score: a non-finite value raises `NonFiniteError`
  before anything is written from it.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback

from pola_gnt.runs.run_folder import NonFiniteError

SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None  # what `signal.signal` takes


class Interrupted(Exception):
    """A SIGTERM or SIGINT asked the run to stop."""

    def __init__(self, signum: int, immediate: bool = False):
        self.signum = signum
        self.immediate = immediate  # raised by a repeated signal, possibly in the middle of a step
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopSignals:
    """Installs SIGTERM and SIGINT handlers that record the signal (and restores the old ones)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, SignalHandler] = {}

    def _handle(self, signum, frame) -> None:
        if self.received == signum:  # asked twice: stop now
            raise Interrupted(signum, immediate=True)
        self.received = signum
        print(
            f"{signal.Signals(signum).name} received: stopping after the current step (send it again to stop at once)",
            flush=True,
        )

    def check(self) -> None:
        """Raise `Interrupted` if a stop was requested."""
        if self.received is not None:
            raise Interrupted(self.received)

    def __enter__(self) -> StopSignals:
        # Lightning logs its own "Received SIGTERM" line; ours says what happens and how to resume.
        logging.getLogger("pytorch_lightning.trainer.connectors.signal_connector").setLevel(logging.WARNING)
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _step(trainer: pl.Trainer) -> int:
    return int(trainer.global_step)


def non_finite_parameters(module: torch.nn.Module, grads: bool = False) -> list[str]:
    names = []
    for name, parameter in module.named_parameters():
        value = parameter.grad if grads else parameter
        if value is not None and not bool(torch.isfinite(value).all()):
            names.append(name)
    return names


class TrainingGuard(Callback):
    """Honours stop requests at batch boundaries and refuses non-finite training values."""

    def __init__(self, signals: StopSignals | None = None):
        self.signals = signals

    def _check_signals(self, trainer=None) -> None:
        if self.signals is None:
            return
        if trainer is not None and trainer.world_size > 1:
            # DDP: every rank must stop at the same step. Lightning broadcasts rank 0's SIGTERM flag
            # at the start of each batch and raises on all ranks; a SIGINT joins that path.
            if self.signals.received is not None:
                trainer._signal_connector.received_sigterm = True
            return
        self.signals.check()

    # stop requests: before a batch starts (the previous step, its validation and checkpoint are done)
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._check_signals(trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._check_signals(trainer)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._check_signals(trainer)

    # non-finite values: the step that produced one is never applied nor saved
    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if not bool(torch.isfinite(loss).all()):
            raise NonFiniteError(_step(trainer) + 1, "loss", f"{loss.item()}")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        bad = non_finite_parameters(pl_module, grads=True)
        if bad:
            raise NonFiniteError(_step(trainer) + 1, "gradient", f"{len(bad)} tensors, e.g. {bad[0]}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bad = non_finite_parameters(pl_module)
        if bad:
            raise NonFiniteError(_step(trainer), "weights", f"{len(bad)} tensors, e.g. {bad[0]}")

    def on_validation_end(self, trainer, pl_module) -> None:
        # runs before ModelCheckpoint (Lightning orders checkpoint callbacks last): no `psnrnan` file
        value = trainer.callback_metrics.get("val/psnr")
        if trainer.state.fn == "fit" and value is not None and not bool(torch.isfinite(value).all()):
            raise NonFiniteError(_step(trainer), "validation PSNR", f"{float(value)}")
