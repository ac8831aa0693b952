"""The config of a command run from inside another: the benchmark runs `eval`'s and `train`'s work
scene by scene. Each is composed from its command line exactly as that command composes it
(`hydra.compose` within the running Hydra app, the same config file), then read into what the
command's library takes: `eval_run` a `TrainedRunConfig` (as `pola_gnt.eval`), `training_run` the
settings, stored config and resume point of a training run (as `pola_gnt.train`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra import compose

from pola_gnt.runs.checkpoints import ResumePoint
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import (
    TrainedRunConfig,
    checkpoint_to_resume,
    container_dict,
    inherit_initial_network,
    trained_run_config,
)
from pola_gnt.runs.settings import RunSettings


@dataclass
class TrainingRun:
    """What `runs.training.train` takes for a command line: the checked settings, the config stored in
    the checkpoints, and the checkpoint to resume from (None: start fresh)."""

    settings: RunSettings
    config: dict
    resume: ResumePoint | None


def eval_run(config_name: str, overrides: Sequence[str], run_dir: Path) -> TrainedRunConfig:
    """`python -m pola_gnt.eval OVERRIDES hydra.run.dir=RUN_DIR`'s run config (inside a Hydra app)."""
    cfg = compose(config_name=config_name, overrides=list(overrides))
    read_run_settings(cfg)  # the command line's values checked before the checkpoint is read
    return trained_run_config(cfg, run_dir, overrides)


def training_run(config_name: str, overrides: Sequence[str], run_dir: Path) -> TrainingRun:
    """`python -m pola_gnt.train OVERRIDES hydra.run.dir=RUN_DIR`'s run (inside a Hydra app): with
    `init_from`, the checkpoint's network for the keys the command line does not give."""
    cfg = compose(config_name=config_name, overrides=list(overrides))
    inherit_initial_network(cfg, overrides, run_dir)
    settings = read_run_settings(cfg)
    return TrainingRun(settings, container_dict(cfg), checkpoint_to_resume(cfg, run_dir))
