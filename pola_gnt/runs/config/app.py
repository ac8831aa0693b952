"""Hydra entry-point helper: every command composes the project config for the machine it runs on
(`conf/config.yaml`, or `conf/config_gpu.yaml` when a CUDA device is present), says which device and
preset it chose, and reports user errors as one `error:` line with exit code 2, a key that is no
setting included (Hydra's schema refuses it while composing). The values themselves are read and
checked in `pola_gnt.runs.config`."""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import overload

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pola_gnt.core.errors import USER_ERROR_EXIT_CODE, UserError, exit_on_user_error
from pola_gnt.core.paths import PROJECT_ROOT
from pola_gnt.data.scene_loading import MISSING_SCENE_NAME
from pola_gnt.data.settings import ProcessDataSettings
from pola_gnt.runs.config.schema import composition_error, register_schemas
from pola_gnt.runs.settings import RunSettings

CONFIG_DIR = str(PROJECT_ROOT / "conf")
CONFIG_NAME = "config"
GPU_CONFIG_NAME = "config_gpu"  # conf/config_gpu.yaml: the GPU defaults (see `default_config_name`)
PROCESS_DATA_CONFIG_NAME = "process_data"
# Hydra's switch that raises an error in composing the config instead of printing it (`entry_point`).
HYDRA_FULL_ERROR = "HYDRA_FULL_ERROR"


def _folder_name(path: str | None) -> str:
    """`${folder_name:${.path}}` (conf/scene/llff.yaml): a scene's name from its folder. Without a
    path it returns a marker that `load_scene` reports in one line: resolvers must not raise, since
    Hydra resolves `hydra.run.dir` (which holds the scene name) before any entry point runs."""
    return Path(str(path)).expanduser().resolve().name if path else MISSING_SCENE_NAME


def register_config() -> None:
    """The project's OmegaConf resolvers and Hydra schemas (called by the entry points and
    `compose_config` before Hydra composes)."""
    if not OmegaConf.has_resolver("folder_name"):
        OmegaConf.register_new_resolver("folder_name", _folder_name)
    register_schemas()


def settings_class(config_name: str) -> type:
    """The settings class that is the schema of `conf/<config_name>.yaml`."""
    return ProcessDataSettings if config_name == PROCESS_DATA_CONFIG_NAME else RunSettings


def report_composition_error(error: Exception, config_name: str) -> None:
    """Hydra could not compose the config: one `error:` line and exit 2 for a bad key (see
    `schema.composition_error`); any other error as Hydra prints it (and exit 1)."""
    user_error = composition_error(error, settings_class(config_name))
    if user_error is not None:
        print(f"error: {user_error}", file=sys.stderr, flush=True)
        sys.exit(USER_ERROR_EXIT_CODE)
    if not isinstance(error, CompactHydraException):
        raise error
    print(error, file=sys.stderr)
    if isinstance(error.__cause__, OmegaConfBaseException):
        print(error.__cause__, file=sys.stderr)
    print(f"\nSet the environment variable {HYDRA_FULL_ERROR}=1 for a complete stack trace.", file=sys.stderr)
    sys.exit(1)


def default_config_name() -> str:
    """The project config with this machine's defaults: `config_gpu` (trainer=gpu with bf16,
    experiment=standard) when a CUDA device is present, else `config` (trainer=cpu,
    experiment=quick). Choices given on the command line (or by an experiment) always win."""
    import torch

    return GPU_CONFIG_NAME if torch.cuda.is_available() else CONFIG_NAME


Task = Callable[[DictConfig], object]


@overload
def entry_point(task: Task, *, config_name: str | None = None) -> Callable[[], None]: ...


@overload
def entry_point(task: None = None, *, config_name: str | None = None) -> Callable[[Task], Callable[[], None]]: ...


def entry_point(
    task: Task | None = None, *, config_name: str | None = None
) -> Callable[[], None] | Callable[[Task], Callable[[], None]]:
    """`@entry_point` on `def main(cfg)`: a Hydra app over the project config, chosen for the machine
    when it runs (`default_config_name`), or over `conf/<config_name>.yaml` with
    `@entry_point(config_name=...)`; the decorated `main()` takes its config from the command line.
    A `UserError` becomes one `error:` line and exit code 2, and so does a key Hydra's schema refuses
    while composing: Hydra raises errors in composing under `HYDRA_FULL_ERROR` (set while it composes,
    as the user had it once the task runs) instead of printing them in several lines."""
    if task is None:
        return lambda function: entry_point(function, config_name=config_name)
    wrapped = exit_on_user_error(task)

    @functools.wraps(task)
    def main(cfg_passthrough: DictConfig | None = None):
        register_config()  # before Hydra composes (`hydra.run.dir` holds the scene's name)
        name = config_name or default_config_name()
        users_setting, composing = os.environ.get(HYDRA_FULL_ERROR), True

        def restore_setting() -> None:
            if users_setting is None:
                os.environ.pop(HYDRA_FULL_ERROR, None)
            else:
                os.environ[HYDRA_FULL_ERROR] = users_setting

        @functools.wraps(task)  # Hydra names the job after the task's module
        def run_task(cfg: DictConfig):
            nonlocal composing
            composing = False
            restore_setting()  # the command's own errors: reported as Hydra and the user would have them
            return wrapped(cfg)

        app = hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=name)(run_task)
        os.environ[HYDRA_FULL_ERROR] = "1"
        try:
            return app(cfg_passthrough)
        except Exception as error:
            restore_setting()
            if composing and users_setting is None:
                report_composition_error(error, name)
            raise
        finally:
            restore_setting()

    return main


def task_overrides() -> list[str]:
    """What the user typed on the command line of this Hydra run (without `hydra.*` keys)."""
    return list(HydraConfig.get().overrides.task)


def check_finetuning(settings: RunSettings) -> None:
    """`experiment=finetune` is a recipe for pretrained weights: without `init_from` it would silently
    train from random weights at fine-tuning rates."""
    try:
        experiment = HydraConfig.get().runtime.choices.get("experiment")
    except ValueError:  # no Hydra run (called from Python)
        return
    if experiment == "finetune" and settings.init_from is None:
        raise UserError(
            "init_from: experiment=finetune starts from pretrained weights; give init_from=CKPT or "
            "init_from=pretrained:pola_gnt (pretrained:gnt with model=gnt)"
        )


PRECISION_NAMES = {"bf16-mixed": "bf16", "16-mixed": "fp16", "32-true": "fp32", "32": "fp32", "64-true": "fp64"}


def device_line(cfg: DictConfig, *, with_experiment: bool = True) -> str:
    """One line saying where the command runs and why, e.g. `device: cuda (bf16; auto: GPU present),
    experiment: standard (auto: GPU present)`: the trainer and the experiment are chosen for the
    machine unless the command line (or, for the trainer, the experiment) names them."""
    import torch

    cuda = torch.cuda.is_available()
    try:
        hydra_cfg = HydraConfig.get()
        choices, overrides = dict(hydra_cfg.runtime.choices), list(hydra_cfg.overrides.task)
    except ValueError:  # no Hydra run (called from Python)
        choices, overrides = {}, []
    given = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    machine = "GPU present" if cuda else "no GPU"
    accelerator = str(cfg.trainer.get("accelerator", "cpu"))
    device = "cuda" if accelerator in ("gpu", "cuda") or (accelerator == "auto" and cuda) else accelerator
    if "trainer" in given or any(key.startswith("trainer.accelerator") for key in given):
        why = "given"
    elif choices.get("trainer") not in (None, "gpu" if cuda else "cpu"):
        why = f"selected by experiment={choices.get('experiment')}"
    else:
        why = f"auto: {machine}"
    precision = str(cfg.trainer.get("precision", "32-true"))
    line = f"device: {device} ({PRECISION_NAMES.get(precision, precision)}; {why})"
    if with_experiment and "experiment" in choices:
        line += f", experiment: {choices['experiment']} ({'given' if 'experiment' in given else f'auto: {machine}'})"
    return line


def announce(cfg: DictConfig, *, with_experiment: bool = True) -> None:
    """Print `device_line` once (rank 0 of a multi-process run), before the config is checked: a
    bad value then stops the command after the line."""
    if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0":
        print(device_line(cfg, with_experiment=with_experiment), flush=True)


class RunFolderCheck(HydraCallback):
    """Hydra callback (conf/config.yaml `hydra.callbacks`): before Hydra creates the run folder and
    writes its `.hydra/` files, check that the folder can be written, so a read-only or full disk
    gives one `error:` line (exit 2) instead of Hydra's traceback."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        self._check(Path(str(config.hydra.run.dir)).expanduser())

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self._check(Path(str(config.hydra.sweep.dir)).expanduser())

    @staticmethod
    def _check(folder: Path) -> None:
        from pola_gnt.core.errors import USER_ERROR_EXIT_CODE
        from pola_gnt.core.files import disk_error

        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not os.access(folder, os.W_OK):
                raise OSError(
                    errno.EROFS if _read_only(folder) else errno.EACCES,
                    os.strerror(errno.EROFS if _read_only(folder) else errno.EACCES),
                    str(folder),
                )
        except OSError as err:
            print(f"error: {disk_error(Path(err.filename or folder), err)}", file=sys.stderr, flush=True)
            sys.exit(USER_ERROR_EXIT_CODE)


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def compose_config(*overrides: str, config_name: str = CONFIG_NAME) -> DictConfig:
    """`conf/<config_name>.yaml` with these command-line overrides, composed as a command composes it,
    for code that runs outside an entry point (scripts, notebooks, tests)."""
    from hydra import compose, initialize_config_dir

    register_config()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        try:
            return compose(config_name=config_name, overrides=list(overrides))
        except Exception as error:
            user_error = composition_error(error, settings_class(config_name))
            if user_error is None and isinstance(error, CompactHydraException):
                # A config group option that does not exist or an override Hydra cannot parse: outside
                # an entry point nobody prints Hydra's report, so its first line is the user's error.
                user_error = UserError(str(error).splitlines()[0])
            if user_error is None:
                raise
            raise user_error from None
