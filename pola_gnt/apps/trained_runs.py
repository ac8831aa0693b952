"""A trained run's `GNTSystem` for `eval`, `render_video` and `analyze`: built from the run config of
its checkpoint (`runs.config.stored.trained_run_config`: the stored config with only the command
line's keys applied), with the checkpoint's weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pola_gnt.model.backbone import restore_frozen_convs, weights_from_checkpoint
from pola_gnt.runs.checkpoints import state_dict_mismatch
from pola_gnt.runs.config.stored import TrainedRunConfig
from pola_gnt.runs.settings import RunSettings
from pola_gnt.runs.system import GNTSystem


@dataclass
class TrainedCheckpoint:
    path: Path
    settings: RunSettings  # the stored run config with the command line's explicit keys applied, checked
    system: GNTSystem  # weights loaded, on the CPU


def load_trained_checkpoint(run: TrainedRunConfig) -> TrainedCheckpoint:
    """The system of `run` with the checkpoint's weights (strict)."""
    run.settings.trainer.check_device()  # the command line's trainer (a GPU checkpoint evaluates on a CPU)
    with weights_from_checkpoint():  # an ImageNet backbone's weights come from the checkpoint too
        system = GNTSystem(run.settings, run.config)
    encoder, lpips_weights = run.settings.model.net.encoder, run.settings.metrics.lpips_weights
    state_dict = restore_frozen_convs(run.checkpoint, run.path, encoder.backbone_weights, lpips_weights)
    try:
        system.load_state_dict(state_dict, strict=True)
    except RuntimeError as err:
        raise state_dict_mismatch(run.path, err) from None
    system.on_load_checkpoint(run.checkpoint)
    return TrainedCheckpoint(path=run.path, settings=run.settings, system=system)
