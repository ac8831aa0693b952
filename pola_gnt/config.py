"""Hydra entry-point helper: every command composes `conf/config.yaml` and reports user errors
as one `error:` line with exit code 2."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import hydra
from omegaconf import DictConfig, OmegaConf

from pola_gnt.errors import exit_on_user_error
from pola_gnt.paths import PROJECT_ROOT
from pola_gnt.runtime import configure_cpu_allocator

CONFIG_DIR = str(PROJECT_ROOT / "conf")
CONFIG_NAME = "config"


def _folder_name(path: str | None) -> str:
    """`${folder_name:${.path}}` (conf/scene/llff.yaml): a scene's name from its folder."""
    if not path:
        raise ValueError("scene=llff needs scene.path=DIR (or scene.name=NAME under data.root)")
    return Path(str(path)).expanduser().resolve().name


if not OmegaConf.has_resolver("folder_name"):
    OmegaConf.register_new_resolver("folder_name", _folder_name)


def entry_point(task: Callable[[DictConfig], object] | None = None, *, config_name: str = CONFIG_NAME):
    """`@entry_point` on `def main(cfg)`: a Hydra app over the project config (or over
    `conf/<config_name>.yaml` with `@entry_point(config_name=...)`)."""
    if task is None:
        return lambda function: entry_point(function, config_name=config_name)
    configure_cpu_allocator()
    return hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)(
        exit_on_user_error(task)
    )


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


POSITIVE_INTS = ("data.factor", "data.num_source_views", "data.rays_per_step", "data.val_rays",
                 "render.n_samples", "render.chunk_rays", "model.net.width", "model.net.n_blocks",
                 "model.net.heads", "optim.decay_steps")


def validate_config(cfg: DictConfig) -> None:
    """Reject unknown or out-of-range values with one line naming the key."""
    from omegaconf import OmegaConf

    from pola_gnt.errors import UserError

    for key, allowed in config_choices().items():
        value = OmegaConf.select(cfg, key)
        if value is not None and value not in allowed:
            raise UserError(f"{key}: unknown value {value!r}; expected one of {', '.join(allowed)}")
    for key in POSITIVE_INTS:
        value = OmegaConf.select(cfg, key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise UserError(f"{key}: must be a positive integer, got {value!r}")
    if OmegaConf.select(cfg, "render.n_samples", default=2) < 2:
        raise UserError("render.n_samples: must be at least 2")
    width, heads = OmegaConf.select(cfg, "model.net.width"), OmegaConf.select(cfg, "model.net.heads")
    if width and heads and width % (2 * heads):
        raise UserError(f"model.net.width: {width} must be divisible by 2 * model.net.heads ({2 * heads})")
    for key in ("optim.lr_transformer", "optim.lr_encoder"):
        value = OmegaConf.select(cfg, key)
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise UserError(f"{key}: must be a positive number, got {value!r}")
