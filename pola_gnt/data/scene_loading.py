"""Scene settings -> `Scene`: where each kind of scene lives and which loader reads it. The kinds are
one table, `SCENE_KINDS` (its keys are the allowed values of `scene.kind`): LLFF scenes under
`data.root`, NeRF's Blender scenes under `data.synthetic_root`, transforms.json captures
(nerfstudio, instant-ngp), the generated demo scene. A new kind is one loader and one entry there, and its name in
`data.settings.SCENE_KIND_NAMES` (the settings own the allowed values; a test holds the two alike)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
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
from pola_gnt.data.transforms_json import TRANSFORMS_FILE, load_transforms_scene

# `scene.name` of `scene=llff` / `scene=blender` / `scene=transforms` given neither `scene.path` nor
# `scene.name` (the folder_name resolver of conf/scene/llff.yaml, blender.yaml, transforms.yaml).
MISSING_SCENE_NAME = "llff"


def data_root(data: DataSettings) -> Path:
    return Path(data.root).expanduser() if data.root else default_data_root()


def synthetic_root(data: DataSettings) -> Path:
    return Path(data.synthetic_root).expanduser() if data.synthetic_root else default_synthetic_root()


@dataclass(frozen=True)
class SceneKind:
    """One `scene.kind`: where its scene lives without `scene.path`, and how it is read."""

    folder: Callable[[SceneSettings, DataSettings], Path]
    load: Callable[[Path, SceneSettings, DataSettings], Scene]  # the scene in `path` (every test view)


def _named_folder(root: Callable[[DataSettings], Path], root_key: str) -> Callable[[SceneSettings, DataSettings], Path]:
    """A kind's folder of a scene named `scene.name` under `root` (the folder `root_key` names);
    `scene=llff`, `scene=blender`, `scene=transforms` need a name or a path."""

    def folder(scene: SceneSettings, data: DataSettings) -> Path:
        if scene.name == MISSING_SCENE_NAME:
            raise UserError(f"scene={scene.kind} needs scene.path=DIR (or scene.name=NAME under {root_key})")
        return root(data) / scene.name

    return folder


def _existing(path: Path) -> Path:
    if not path.is_dir():
        raise UserError(
            f"{path}: scene folder not found (set data.root=DIR or $POLA_GNT_DATA to the folder holding "
            f"the LLFF scenes; see data/README.md)"
        )
    return path


def _load_llff(path: Path, scene: SceneSettings, data: DataSettings) -> Scene:
    return load_llff_scene(_existing(path), factor=data.factor, llffhold=data.llffhold, name=scene.name, rig=scene.rig)


def _load_demo(path: Path, scene: SceneSettings, data: DataSettings) -> Scene:
    ensure_demo_scene(path, factor=data.factor)
    return load_llff_scene(path, factor=data.factor, llffhold=data.llffhold, name=scene.name, rig=scene.rig)


def _load_transforms(path: Path, scene: SceneSettings, data: DataSettings) -> Scene:
    if not (_existing(path) / TRANSFORMS_FILE).is_file():
        raise UserError(f"{path}: no {TRANSFORMS_FILE} (scene=transforms reads nerfstudio / instant-ngp captures)")
    return load_transforms_scene(path, factor=data.factor, llffhold=data.llffhold, name=scene.name, rig=scene.rig)


def _load_blender(path: Path, scene: SceneSettings, data: DataSettings) -> Scene:
    # reads only the test views it keeps
    return load_blender_scene(path, data.synthetic_factor, data.test_views, name=scene.name, rig=scene.rig)


SCENE_KINDS: dict[str, SceneKind] = {
    "llff": SceneKind(folder=_named_folder(data_root, "data.root"), load=_load_llff),
    "demo": SceneKind(folder=lambda scene, data: demo_scene_dir(), load=_load_demo),
    "blender": SceneKind(folder=_named_folder(synthetic_root, "data.synthetic_root"), load=_load_blender),
    "transforms": SceneKind(folder=_named_folder(data_root, "data.root"), load=_load_transforms),
}


def scene_kind(scene: SceneSettings) -> SceneKind:
    if scene.kind not in SCENE_KINDS:
        raise UserError(f"scene.kind: unknown value {scene.kind!r}; expected one of {', '.join(SCENE_KINDS)}")
    return SCENE_KINDS[scene.kind]


def scene_dir(scene: SceneSettings, data: DataSettings) -> Path:
    """`scene.path` if given, else where its kind keeps a scene of that name: `data.root/scene.name`
    (Blender scenes: `data.synthetic_root/scene.name`; the demo scene lives in `data/demo`)."""
    if scene.path:
        return Path(scene.path).expanduser()
    return scene_kind(scene).folder(scene, data)


def load_scene(scene: SceneSettings, data: DataSettings) -> Scene:
    """The scene of the settings, its test views cut to `data.test_views` (evenly spaced)."""
    loaded = scene_kind(scene).load(scene_dir(scene, data), scene, data)
    return replace(loaded, test_ids=evenly_spaced(loaded.test_ids, data.test_views))


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
