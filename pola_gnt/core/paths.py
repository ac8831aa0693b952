"""Where things live: the project, the datasets, the LPIPS weights. Every path can be overridden."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DATA_ENV = "POLA_GNT_DATA"
LPIPS_WEIGHTS_ENV = "POLA_GNT_LPIPS_WEIGHTS"
DEMO_ENV = "POLA_GNT_DEMO"


def default_data_root() -> Path:
    """The folder holding the scene folders.

    `$POLA_GNT_DATA` may name either that folder or its parent (the one holding `nerf_llff_data/`);
    without it, `data/nerf_llff_data` in the project.
    """
    env = os.environ.get(DATA_ENV)
    if env:
        root = Path(env).expanduser()
        return root / "nerf_llff_data" if (root / "nerf_llff_data").is_dir() else root
    return PROJECT_ROOT / "data" / "nerf_llff_data"


SYNTHETIC_ENV = "POLA_GNT_SYNTHETIC"


def default_synthetic_root() -> Path:
    """The folder holding NeRF's synthetic (Blender) scenes: `$POLA_GNT_SYNTHETIC`, else `nerf_synthetic/`
    in `$POLA_GNT_DATA` or beside the LLFF scenes' folder (`data/nerf_synthetic` in the project)."""
    env = os.environ.get(SYNTHETIC_ENV)
    if env:
        return Path(env).expanduser()
    data = os.environ.get(DATA_ENV)
    if data and (Path(data).expanduser() / "nerf_synthetic").is_dir():
        return Path(data).expanduser() / "nerf_synthetic"
    return default_data_root().parent / "nerf_synthetic"


def demo_scene_dir() -> Path:
    """Where the synthetic demo scene is generated on first use: `$POLA_GNT_DEMO`, else `data/demo`
    in the project (git-ignored)."""
    env = os.environ.get(DEMO_ENV)
    return Path(env).expanduser() if env else PROJECT_ROOT / "data" / "demo"


PROCEDURAL_ENV = "POLA_GNT_PROCEDURAL"


def procedural_scenes_dir() -> Path:
    """Where generated scenes (`data.procedural`) are written on first use: `$POLA_GNT_PROCEDURAL`,
    else `data/procedural` in the project (git-ignored)."""
    env = os.environ.get(PROCEDURAL_ENV)
    return Path(env).expanduser() if env else PROJECT_ROOT / "data" / "procedural"


def pretrained_dir() -> Path:
    """The checkpoints shipped inside the package (`pretrained:NAME`), with their manifest."""
    return Path(__file__).resolve().parents[1] / "pretrained"


def lpips_weights_in(setting: str | Path, net: str, nets: tuple[str, ...] = ("alex", "vgg")) -> Path | None:
    """The npz for LPIPS-`net` that `setting` names, or None: a folder holding `<net>_v0.1.npz`
    files, or one npz file. A file named for another network of `nets` (`alex_...` when VGG is
    asked for) stands for its folder: the sibling `<net>_v0.1.npz` is used if it exists, so one
    setting serves both networks."""
    path = Path(setting).expanduser()
    if path.is_dir():
        candidate = path / f"{net}_v0.1.npz"
        return candidate if candidate.is_file() else None
    if any(path.name.startswith(other) for other in nets if other != net):
        sibling = path.with_name(f"{net}_v0.1.npz")
        return sibling if sibling.is_file() else None
    return path


def lpips_env_weights_path(net: str, nets: tuple[str, ...] = ("alex", "vgg")) -> Path | None:
    """The npz for LPIPS-`net` named by `$POLA_GNT_LPIPS_WEIGHTS` (as `lpips_weights_in` reads a
    setting), or None."""
    env = os.environ.get(LPIPS_WEIGHTS_ENV, "")
    return lpips_weights_in(env, net, nets) if env else None
