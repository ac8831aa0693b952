"""A training run: fit, then test on the held-out views, in one run folder.

Reliability (docs/ARCHITECTURE.md, "Runs"): one run per folder (`run.lock`), exact resume from any
step (`ckpt_path=last`), logs appended across resumes, SIGTERM / SIGINT save `last.ckpt` and print
the command that resumes (exit 143 / 130), a NaN or infinity stops training before it is saved
(exit 3), a full or read-only disk is one `error:` line with nothing half-written.
"""

from __future__ import annotations

import shlex
import signal
from collections.abc import Sequence
from pathlib import Path

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_only
from pytorch_lightning.utilities.exceptions import SIGTERMException

from pola_gnt.core.errors import DIVERGED_EXIT_CODE, RunStopped, UserError
from pola_gnt.core.files import clean_temporaries, disk_error, is_disk_error
from pola_gnt.data.collection import CollectionGroup, TrainingScenes, collection_groups
from pola_gnt.data.datamodule import SceneDataModule
from pola_gnt.data.scene_loading import data_root, load_scene, scene_dir
from pola_gnt.runs.callbacks import LastCheckpoint
from pola_gnt.runs.checkpoints import (
    CHECKPOINT_DIR,
    ResumePoint,
    is_state_dict_mismatch,
    read_checkpoint,
    state_dict_mismatch,
)
from pola_gnt.runs.config.read import check_scene
from pola_gnt.runs.config.stored import initial_weights
from pola_gnt.runs.guards import Interrupted, StopSignals
from pola_gnt.runs.run_folder import NonFiniteError, RunLock
from pola_gnt.runs.settings import RunSettings
from pola_gnt.runs.system import GNTSystem
from pola_gnt.runs.trainer import build_trainer, fit_timer

LAST = "last.ckpt"


def resume_command(run_dir: Path, overrides: Sequence[str], resume: bool = True) -> str:
    """The command line that resumes this run: the same `overrides` (the command line's), `ckpt_path=last`
    (unless there is nothing to resume from) and the run folder."""
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


def _stopped_by_signal(
    signum: int, phase: str, trainer: pl.Trainer, run_dir: Path, last: LastCheckpoint, overrides: Sequence[str]
) -> RunStopped:
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
            f"{name} {where}; {state}; start again with: {resume_command(run_dir, overrides, resume=False)}",
            128 + signum,
            prefix="stopped",
        )
    return RunStopped(
        f"{name} {where}; {state}; resume with: {resume_command(run_dir, overrides)}", 128 + signum, prefix="stopped"
    )


def _diverged(err: NonFiniteError, run_dir: Path, overrides: Sequence[str]) -> RunStopped:
    last_path = run_dir / CHECKPOINT_DIR / LAST
    saved = _checkpoint_step(last_path)
    good = (
        f"the last good checkpoint is {last_path} (step {saved}); resume from it with "
        f"`{resume_command(run_dir, overrides)} trainer.gradient_clip_val=1.0`"
        if saved is not None
        else "no checkpoint was saved before it"
    )
    return RunStopped(
        f"training diverged: {err}; nothing was saved from it; {good}; or start again with lower "
        f"optim.lr_transformer / optim.lr_encoder or a different seed",
        DIVERGED_EXIT_CODE,
    )


def held_out_collection(settings: RunSettings) -> list[CollectionGroup]:
    """The collection's scenes (none without one), refused when the run's `scene`, which validates and
    tests it, is among them: a pretrained model is judged on a scene it never trained on."""
    if settings.collection is None:
        return []
    groups = collection_groups(settings.collection, data_root(settings.data))
    held_out = scene_dir(settings.scene, settings.data).resolve()
    for group in groups:
        for item in group.scenes:
            if item.procedural is None and (item.path.resolve() == held_out or item.name == settings.scene.name):
                raise UserError(
                    f"{group.key}: {item.path} is scene={settings.scene.name}, the scene this run validates and tests "
                    f"on; pretraining must hold it out (remove it from collection {settings.collection.name} or "
                    f"choose another scene=)"
                )
    return groups


def collection_summary(settings: RunSettings, groups: list[CollectionGroup]) -> str:
    total = sum(group.weight for group in groups)
    parts = [
        f"{group.scenes[0].name if len(group.scenes) == 1 else f'{len(group.scenes)} generated'} "
        f"{group.weight / total:.0%}"
        for group in groups
    ]
    name = settings.collection.name if settings.collection else ""
    return f"collection  {name}: {', '.join(parts)} (cache {settings.data.cache_mb} MB)"


def train(
    settings: RunSettings, config: dict, run_dir: Path, resume: ResumePoint | None, overrides: Sequence[str]
) -> dict | None:
    """Fit, test on the held-out views, and return the `metrics.json` document (None on the ranks
    other than 0, which do not write it). `config`: the run config as a plain dict, stored in the
    checkpoints; `resume`: the checkpoint to resume from (checked against the run's model), or None;
    `overrides`: the command line's, for the line that says how to resume."""
    settings.trainer.check_device()
    checkpoint, resume_step = (None, 0) if resume is None else (resume.path, resume.step)
    # The global rank, known before the trainer exists: Lightning keeps it on its `rank_zero_only`.
    rank_zero = getattr(rank_zero_only, "rank", 0) == 0
    lock = RunLock(run_dir)
    if rank_zero:
        lock.acquire()
    try:
        if rank_zero:
            clean_temporaries(run_dir, run_dir / CHECKPOINT_DIR, run_dir / "test_views", run_dir / "csv")
        with StopSignals() as signals:
            return _fit_and_test(settings, config, run_dir, checkpoint, resume_step, signals, overrides)
    except Interrupted as err:  # a repeated signal before training started
        raise RunStopped(
            f"{signal.Signals(err.signum).name} before training started; nothing was saved; "
            f"start again with: {resume_command(run_dir, overrides, resume=checkpoint is not None)}",
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
    settings: RunSettings,
    config: dict,
    run_dir: Path,
    checkpoint: Path | None,
    resume_step: int,
    signals: StopSignals,
    overrides: Sequence[str],
) -> dict | None:
    pl.seed_everything(settings.seed, workers=True, verbose=False)
    groups = held_out_collection(settings)
    scene = load_scene(settings.scene, settings.data)
    check_scene(settings, scene)
    training_scenes = TrainingScenes(groups, settings.data) if groups else None
    datamodule = SceneDataModule(scene, settings.data, settings.seed, training_scenes)
    system = GNTSystem(settings, config)
    if training_scenes is not None:
        system.training_scenes = training_scenes.names
    if settings.init_from and checkpoint is None:  # a resumed run's weights are its own checkpoint's
        system.start_from(initial_weights(settings.init_from, config, run_dir))
    system.prepare_test(scene, run_dir)
    last = LastCheckpoint(run_dir / CHECKPOINT_DIR / LAST)
    trainer = build_trainer(settings.trainer, run_dir, last, fit_timer(settings.trainer), resume_step, signals)
    if trainer.is_global_zero:
        if training_scenes is not None and settings.collection is not None:
            print(collection_summary(settings, groups), flush=True)
        print(scene.summary(), flush=True)
        if system.init_from is not None:
            init = system.init_from
            print(f"init_from   {init['path']} (step {init['global_step']}, sha256 {init['sha256'][:12]})", flush=True)
    phase = "training"
    try:
        signals.check()
        trainer.fit(system, datamodule=datamodule, ckpt_path=str(checkpoint) if checkpoint else None)
        phase = "test"  # training is complete from here on: a stop now loses only the metrics
        signals.check()
        trainer.test(system, datamodule=datamodule, verbose=False)
    except Interrupted as err:
        raise _stopped_by_signal(err.signum, phase, trainer, run_dir, last, overrides) from None
    except SIGTERMException:  # Lightning's own SIGTERM handling (it would exit 0), and DDP stops
        raise _stopped_by_signal(signals.received or signal.SIGTERM, phase, trainer, run_dir, last, overrides) from None
    except NonFiniteError as err:
        raise _diverged(err, run_dir, overrides) from None
    except RuntimeError as err:
        if checkpoint is not None and is_state_dict_mismatch(err):
            raise state_dict_mismatch(checkpoint, err) from None
        raise
    return system.test_document
