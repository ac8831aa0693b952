"""Scene lookup from the settings: LLFF scenes under `data.root`, NeRF's Blender scenes under
`data.synthetic_root`, transforms.json captures (nerfstudio, instant-ngp), or the generated demo scene."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

from pola_gnt.core.errors import UserError
from pola_gnt.core.paths import default_data_root, default_synthetic_root, demo_scene_dir
from pola_gnt.data.blender import load_blender_scene
from pola_gnt.data.demo_scene import demo_depth, ensure_demo_scene
from pola_gnt.data.llff import load_llff_scene
from pola_gnt.data.scene import Scene, evenly_spaced
from pola_gnt.data.settings import DataSettings, SceneSettings
from pola_gnt.data.transforms import TRANSFORMS_FILE, load_transforms_scene

SCENE_KINDS = ("llff", "demo", "blender", "transforms")
# `scene.name` of `scene=llff` / `scene=transforms` given neither `scene.path` nor `scene.name`
# (the folder_name resolver of conf/scene/llff.yaml, transforms.yaml).
MISSING_SCENE_NAME = "llff"


def data_root(data: DataSettings) -> Path:
    return Path(data.root).expanduser() if data.root else default_data_root()


def synthetic_root(data: DataSettings) -> Path:
    return Path(data.synthetic_root).expanduser() if data.synthetic_root else default_synthetic_root()


def scene_dir(scene_settings: SceneSettings, data: DataSettings) -> Path:
    """`scene.path` if given, else `data.root/scene.name` (Blender scenes: `data.synthetic_root/scene.name`;
    the demo scene lives in `data/demo`)."""
    if scene_settings.path:
        return Path(scene_settings.path).expanduser()
    if scene_settings.kind == "demo":
        return demo_scene_dir()
    if scene_settings.kind == "blender":
        return synthetic_root(data) / scene_settings.name
    if scene_settings.name == MISSING_SCENE_NAME and scene_settings.kind in ("llff", "transforms"):
        raise UserError(f"scene={scene_settings.kind} needs scene.path=DIR (or scene.name=NAME under data.root)")
    return data_root(data) / scene_settings.name


def load_scene(scene_settings: SceneSettings, data: DataSettings) -> Scene:
    """The scene of the settings, its test views cut to `data.test_views` (evenly spaced)."""
    kind = scene_settings.kind
    if kind not in SCENE_KINDS:
        raise UserError(f"scene.kind: unknown value {kind!r}; expected one of {', '.join(SCENE_KINDS)}")
    path = scene_dir(scene_settings, data)
    name, rig = scene_settings.name, scene_settings.rig
    if kind == "blender":  # reads only the test views it keeps
        return load_blender_scene(path, data.synthetic_factor, data.test_views, name=name, rig=rig)
    if kind == "demo":
        ensure_demo_scene(path, factor=data.factor)
    elif not path.is_dir():
        raise UserError(
            f"{path}: scene folder not found (set data.root=DIR or $POLA_GNT_DATA to the folder holding "
            f"the LLFF scenes; see data/README.md)"
        )
    if kind == "transforms":
        if not (path / TRANSFORMS_FILE).is_file():
            raise UserError(f"{path}: no {TRANSFORMS_FILE} (scene=transforms reads nerfstudio / instant-ngp captures)")
        scene = load_transforms_scene(path, factor=data.factor, llffhold=data.llffhold, name=name, rig=rig)
    else:
        scene = load_llff_scene(path, factor=data.factor, llffhold=data.llffhold, name=name, rig=rig)
    return replace(scene, test_ids=evenly_spaced(scene.test_ids, data.test_views))


def exact_depth_source(scene_settings: SceneSettings, scene: Scene) -> Callable[[int], Tensor] | None:
    """For the demo scene, `view -> [H, W]` float64 exact camera z-depth at the pixel centres, in the
    loaded (normalised) scene's units, the renderer's: the demo's own depth times `scene.scale` (the
    normalisation is a similarity: that scale, then a rigid recentring). None for other scenes."""
    if scene_settings.kind != "demo":
        return None

    def exact_depth(view: int) -> Tensor:
        depth = torch.from_numpy(demo_depth(view, scene.factor)) * scene.scale
        if tuple(depth.shape) != scene.resolution:
            raise ValueError(f"demo depth {tuple(depth.shape)} does not match the images {scene.resolution}")
        return depth

    return exact_depth
