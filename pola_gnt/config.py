"""Hydra entry-point helper: every command composes `conf/config.yaml` and reports user errors
as one `error:` line with exit code 2."""

from __future__ import annotations

import errno
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import overload

import hydra
from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig, OmegaConf

from pola_gnt.errors import exit_on_user_error
from pola_gnt.paths import PROJECT_ROOT
from pola_gnt.runtime import configure_cpu_allocator

CONFIG_DIR = str(PROJECT_ROOT / "conf")
CONFIG_NAME = "config"


def _folder_name(path: str | None) -> str:
    """`${folder_name:${.path}}` (conf/scene/llff.yaml): a scene's name from its folder. Without a
    path it returns a marker that `load_scene` reports in one line: resolvers must not raise, since
    Hydra resolves `hydra.run.dir` (which holds the scene name) before any entry point runs."""
    from pola_gnt.data.scenes import MISSING_SCENE_NAME

    return Path(str(path)).expanduser().resolve().name if path else MISSING_SCENE_NAME


if not OmegaConf.has_resolver("folder_name"):
    OmegaConf.register_new_resolver("folder_name", _folder_name)


Task = Callable[[DictConfig], object]


@overload
def entry_point(task: Task, *, config_name: str = CONFIG_NAME) -> Callable[[], None]: ...


@overload
def entry_point(task: None = None, *, config_name: str = CONFIG_NAME) -> Callable[[Task], Callable[[], None]]: ...


def entry_point(
    task: Task | None = None, *, config_name: str = CONFIG_NAME
) -> Callable[[], None] | Callable[[Task], Callable[[], None]]:
    """`@entry_point` on `def main(cfg)`: a Hydra app over the project config (or over
    `conf/<config_name>.yaml` with `@entry_point(config_name=...)`); the decorated `main()` takes
    its config from the command line."""
    if task is None:
        return lambda function: entry_point(function, config_name=config_name)
    configure_cpu_allocator()
    return hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)(exit_on_user_error(task))


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
        from pola_gnt.errors import USER_ERROR_EXIT_CODE
        from pola_gnt.runfiles import disk_error

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


def config_choices() -> dict[str, tuple[str, ...]]:
    """Allowed values of the config keys that select behaviour, from the modules that own them."""
    from pola_gnt.attention.modules import RAY_ATTENTION_KINDS, VIEW_ATTENTION_KINDS
    from pola_gnt.data.scenes import SCENE_KINDS
    from pola_gnt.metrics import LPIPS_NETS, PROTOCOLS

    return {
        "model.net.view_attention": VIEW_ATTENTION_KINDS,
        "model.net.ray_attention": RAY_ATTENTION_KINDS,
        "metrics.protocol": PROTOCOLS,
        "metrics.lpips_net": LPIPS_NETS,
        "scene.kind": SCENE_KINDS,
    }


POSITIVE_INTS = (
    "data.factor",
    "data.num_source_views",
    "data.rays_per_step",
    "data.val_rays",
    "render.n_samples",
    "render.chunk_rays",
    "model.net.width",
    "model.net.n_blocks",
    "model.net.heads",
    "optim.decay_steps",
    "trainer.max_steps",
    "trainer.log_every_n_steps",
)
POSITIVE_NUMBERS = ("optim.lr_transformer", "optim.lr_encoder")
BOOLEANS = ("data.random_source_views", "output.save_images", "metrics.quantize_8bit")
REQUIRED = ("seed", "optim.decay_rate", "data.llffhold", "trainer.val_check_interval")
MAX_SEED = 2**32 - 1  # numpy's and Lightning's seed range


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate_config(cfg: DictConfig) -> None:
    """Reject unknown, mistyped, out-of-range or inconsistent values before any work, with one line
    naming the key. (Checks that need the scene: `check_scene_config`.)"""
    from omegaconf import OmegaConf

    from pola_gnt.errors import UserError

    absent = object()
    for key in (*POSITIVE_INTS, *POSITIVE_NUMBERS, *BOOLEANS, *REQUIRED):
        if OmegaConf.select(cfg, key, default=absent) is None:
            raise UserError(f"{key}: must be set, got null")

    def get(key):
        return OmegaConf.select(cfg, key)

    for key, allowed in config_choices().items():
        value = get(key)
        if value is not None and value not in allowed:
            raise UserError(f"{key}: unknown value {value!r}; expected one of {', '.join(allowed)}")
    for key in POSITIVE_INTS:
        value = get(key)
        if value is not None and (not _is_int(value) or value < 1):
            raise UserError(f"{key}: must be a positive integer, got {value!r}")
    if OmegaConf.select(cfg, "render.n_samples", default=2) < 2:
        raise UserError("render.n_samples: must be at least 2")
    width, heads = get("model.net.width"), get("model.net.heads")
    if width and heads and width % (2 * heads):
        raise UserError(f"model.net.width: {width} must be divisible by 2 * model.net.heads ({2 * heads})")
    for key in POSITIVE_NUMBERS:
        value = get(key)
        if value is not None and not (_is_number(value) and value > 0):
            raise UserError(f"{key}: must be a positive number, got {value!r}")
    for key in BOOLEANS:
        value = get(key)
        if value is not None and not isinstance(value, bool):
            raise UserError(f"{key}: must be true or false, got {value!r}")
    seed = get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed <= MAX_SEED):
        raise UserError(f"seed: must be an integer from 0 to {MAX_SEED}, got {seed!r}")
    rate = get("optim.decay_rate")
    if rate is not None and not (_is_number(rate) and 0 < rate <= 1):
        raise UserError(f"optim.decay_rate: must be a number in (0, 1] (1 = no decay), got {rate!r}")
    clip = get("trainer.gradient_clip_val")
    if clip is not None and not (_is_number(clip) and clip >= 0):
        raise UserError(f"trainer.gradient_clip_val: must be null or a number >= 0, got {clip!r}")
    hold = get("data.llffhold")
    if hold is not None and (not _is_int(hold) or hold < 1):
        raise UserError(
            f"data.llffhold: must be a positive integer (every N-th view is held out for testing; "
            f"0 would leave nothing to score), got {hold!r}"
        )
    interval, max_steps = get("trainer.val_check_interval"), get("trainer.max_steps")
    if interval is not None:
        if not (_is_int(interval) and interval >= 1) and not (isinstance(interval, float) and 0 < interval <= 1):
            raise UserError(f"trainer.val_check_interval: must be a positive number of steps, got {interval!r}")
        if _is_int(interval) and _is_int(max_steps) and interval > max_steps:
            raise UserError(
                f"trainer.val_check_interval: {interval} is more than trainer.max_steps ({max_steps}); "
                f"validation would never run"
            )
    crop = get("data.crop")
    if crop is not None and (
        not isinstance(crop, Sequence)
        or isinstance(crop, str)
        or len(crop) != 2
        or not all(_is_int(c) and c >= 1 for c in crop)
    ):
        raise UserError(f"data.crop: must be null or [height, width] in pixels, got {crop!r}")
    ckpt_path = get("ckpt_path")
    if ckpt_path is not None and not isinstance(ckpt_path, str):
        raise UserError(f"ckpt_path: must be last or a checkpoint file, got {ckpt_path!r}")
    from pola_gnt.budget import MAX_TIME_KEY, max_time_seconds

    max_time_seconds(OmegaConf.select(cfg, MAX_TIME_KEY))  # one line naming the key if malformed


def check_scene_config(cfg: DictConfig, scene) -> None:
    """Checks of the config against the loaded scene: views requested vs available, crop and ray counts."""
    from pola_gnt.errors import UserError

    n_train, n_test = len(scene.train_ids), len(scene.test_ids)
    hold = cfg.data.llffhold
    if n_test == 0:
        raise UserError(f"data.llffhold: {hold} holds out no test view of the {len(scene.image_names)} views")
    if n_train < 2:
        raise UserError(
            f"data.llffhold: {hold} leaves {n_train} training view(s) of {len(scene.image_names)}; "
            f"at least 2 are needed (a target and a source view)"
        )
    views = cfg.data.num_source_views
    if views > n_train - 1:
        raise UserError(
            f"data.num_source_views: {views} requested but the scene has {n_train} training views, "
            f"so at most {n_train - 1} can be sources of a training view"
        )
    height, width = scene.resolution
    crop = cfg.data.get("crop")
    if crop is not None and (crop[0] > height or crop[1] > width):
        raise UserError(f"data.crop: {crop[0]}x{crop[1]} is larger than the images ({height}x{width})")
    pixels = crop[0] * crop[1] if crop is not None else height * width
    if cfg.data.rays_per_step > pixels:
        raise UserError(
            f"data.rays_per_step: {cfg.data.rays_per_step} is more than the {pixels} pixels of a "
            f"training {'crop' if crop is not None else 'image'}"
        )
    if cfg.data.val_rays > height * width:
        raise UserError(f"data.val_rays: {cfg.data.val_rays} is more than the {height * width} pixels of a view")
