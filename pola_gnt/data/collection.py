"""The scenes a training run draws its steps from: the run's one scene, or a collection (pretraining).

A collection (`CollectionSettings`) lists real scenes and a family of generated scenes, each with a
weight. A real scene is a folder of any kind a one-scene run reads (`kind`, or `auto` from its files):
an LLFF folder, a NeRF Blender scene (every frame of its train, val and test splits) or a
transforms.json capture (nerfstudio, instant-ngp); its name, the folder's, is unique in the
collection. Each step first draws its scene by weight from the step's own random stream (so resume
stays exact and DDP ranks differ), then its target, sources and rays as a one-scene run does. Every
view of a collection scene is a training view: the held-out scene is the run's `scene`, never one of
these.

Scenes load when first drawn and stay in a least-recently-drawn cache of at most `data.cache_mb` MB,
so a collection of any size trains in bounded memory (a scene larger than the bound is still loaded,
alone).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pola_gnt.core.errors import UserError
from pola_gnt.core.paths import procedural_scenes_dir
from pola_gnt.data.blender import ALL_SPLITS, load_blender_scene
from pola_gnt.data.llff import load_llff_scene
from pola_gnt.data.procedural import ensure_procedural_scene, procedural_rig
from pola_gnt.data.scene import Scene
from pola_gnt.data.settings import CollectionFolder, CollectionSettings, DataSettings
from pola_gnt.data.transforms_json import TRANSFORMS_FILE, load_transforms_scene

MB = 2**20
# The file each kind's folder holds, in the order `auto` looks for them (a Blender scene first: its
# folder may hold other JSON files, never a transforms.json capture's).
KIND_FILES = {"blender": "transforms_train.json", "transforms": TRANSFORMS_FILE, "llff": "poses_bounds.npy"}


@dataclass(frozen=True)
class CollectionScene:
    """One scene of a collection, not yet loaded: an existing folder of `kind` (llff, blender or
    transforms), or generated scene `index` of family `family_seed` (LLFF, written into `path` on first
    use). Loaded, every view is a training view."""

    name: str
    path: Path
    kind: str  # llff | blender | transforms (resolved: never auto)
    rig: str
    procedural: tuple[int, int] | None  # (family seed, index); None: an existing folder

    def load(self, data: DataSettings) -> Scene:
        if self.procedural is not None:
            ensure_procedural_scene(self.path, *self.procedural, factor=data.factor)
        if self.kind == "blender":
            # Every frame of the train, val and test splits is a training view (a collection scene is never
            # tested), at the size a one-scene run reads them: data.synthetic_factor.
            scene = load_blender_scene(
                self.path, data.synthetic_factor, None, name=self.name, rig=self.rig, splits=ALL_SPLITS
            )
            return replace(scene, train_ids=list(range(len(scene.image_names))), test_ids=[])
        if self.kind == "transforms":
            return load_transforms_scene(self.path, factor=data.factor, llffhold=0, name=self.name, rig=self.rig)
        return load_llff_scene(self.path, factor=data.factor, llffhold=0, name=self.name, rig=self.rig)


@dataclass(frozen=True)
class CollectionGroup:
    """Scenes that share one weight: a folder alone, or a generated family."""

    key: str  # the config key it came from, for messages
    weight: float
    scenes: tuple[CollectionScene, ...]


def procedural_scene(family_seed: int, index: int) -> CollectionScene:
    return CollectionScene(
        name=f"procedural-{family_seed}-{index:04d}",
        path=procedural_scenes_dir() / f"family{family_seed}" / f"scene{index:04d}",
        kind="llff",
        rig=procedural_rig(family_seed, index),
        procedural=(family_seed, index),
    )


def collection_groups(collection: CollectionSettings, data_root: Path) -> list[CollectionGroup]:
    """The collection's scenes by weight group; a folder that does not exist, holds no scene of its
    kind, or has the name of an earlier one is a `UserError` naming its entry. Folders of weight 0 and
    an empty family are left out."""
    groups = []
    names: dict[str, str] = {}  # scene name -> the entry that has it
    for i, folder in enumerate(collection.folders):
        path = Path(folder.path).expanduser()
        path = path if path.is_absolute() else data_root / path
        key = f"collection.folders[{i}].path"
        if not path.is_dir():
            raise UserError(f"{key}: {path}: scene folder not found (relative paths start at data.root)")
        kind = folder_kind(folder, path, key)
        name = path.resolve().name
        if name in names:
            raise UserError(
                f"{key}: {path}: scene name {name!r} is {names[name]}'s too; the scenes of a collection are named "
                f"by their folders and the names must differ (rename one of them)"
            )
        names[name] = key
        if folder.weight > 0:
            scene = CollectionScene(name=name, path=path, kind=kind, rig=folder.rig, procedural=None)
            groups.append(CollectionGroup(key, folder.weight, (scene,)))
    family = collection.procedural
    if family is not None and family.count and family.weight > 0:
        scenes = tuple(procedural_scene(family.seed, i) for i in range(family.count))
        clash = next((scene.name for scene in scenes if scene.name in names), None)
        if clash is not None:
            raise UserError(f"{names[clash]}: scene name {clash!r} is a generated scene's (collection.procedural)")
        groups.append(CollectionGroup("collection.procedural", family.weight, scenes))
    return groups


def folder_kind(folder: CollectionFolder, path: Path, key: str) -> str:
    """The kind of scene `path` holds: `folder.kind` when its file is there, or for `auto` the first
    kind whose file is (`KIND_FILES`); otherwise a `UserError` naming the entry `key`."""
    if folder.kind == "auto":
        kind = next((kind for kind, file in KIND_FILES.items() if (path / file).is_file()), None)
        if kind is None:
            raise UserError(
                f"{key}: {path}: no scene files (none of {', '.join(KIND_FILES.values())}); a collection folder "
                f"is an LLFF scene, a NeRF Blender scene or a transforms.json capture"
            )
        return kind
    file = KIND_FILES[folder.kind]
    if not (path / file).is_file():
        kind_key = key.removesuffix(".path") + ".kind"
        raise UserError(f"{key}: {path}: no {file}, which a {folder.kind} scene has ({kind_key}: {folder.kind})")
    return folder.kind


def scene_names(groups: list[CollectionGroup]) -> list[str]:
    return [scene.name for group in groups for scene in group.scenes]


def check_training_scene(scene: Scene, data: DataSettings, where: str) -> None:
    """A collection scene must give a target and its source views, and enough pixels for a step's rays."""
    if len(scene.train_ids) < data.num_source_views + 1:
        raise UserError(
            f"{where}: {scene.path} has {len(scene.train_ids)} views, fewer than data.num_source_views + 1 "
            f"({data.num_source_views + 1})"
        )
    height, width = scene.resolution
    if data.max_rays() > height * width:
        raise UserError(f"{where}: {scene.path}: its {width}x{height} images have fewer pixels than data.rays_per_step")


class TrainingScenes:
    """Where a training step's scene comes from: `draw(rng)`. One scene (`single`) consumes nothing
    from the step's stream, so a one-scene run draws exactly as before collections existed."""

    def __init__(self, groups: list[CollectionGroup], data: DataSettings, fixed: Scene | None = None):
        if not groups and fixed is None:
            raise ValueError("TrainingScenes: no scenes")
        self.groups = groups
        self.data = data
        self.fixed = fixed
        weights = np.array([group.weight for group in groups], dtype=np.float64)
        self.probabilities = weights / weights.sum() if len(groups) else weights
        self.cache: OrderedDict[CollectionScene, Scene] = OrderedDict()
        self.loads = 0  # scenes loaded so far (a scene dropped from the cache and drawn again counts again)

    @classmethod
    def single(cls, scene: Scene, data: DataSettings) -> TrainingScenes:
        return cls([], data, fixed=scene)

    @property
    def names(self) -> list[str]:
        return [self.fixed.name] if self.fixed is not None else scene_names(self.groups)

    def draw_scene(self, rng: np.random.Generator) -> CollectionScene:
        """The scene of a step: a group by weight, then one of its scenes uniformly."""
        group = self.groups[int(rng.choice(len(self.groups), p=self.probabilities))]
        index = int(rng.integers(len(group.scenes))) if len(group.scenes) > 1 else 0  # a folder: no draw
        return group.scenes[index]

    def draw(self, rng: np.random.Generator) -> Scene:
        if self.fixed is not None:
            return self.fixed
        return self.scene(self.draw_scene(rng))

    def scene(self, item: CollectionScene) -> Scene:
        """`item` loaded: from the cache (now the most recently drawn), or from disk, dropping the least
        recently drawn scenes while the cache holds more than `data.cache_mb` MB."""
        scene = self.cache.get(item)
        if scene is not None:
            self.cache.move_to_end(item)
            return scene
        scene = item.load(self.data)
        group = next(g for g in self.groups if item in g.scenes)
        check_training_scene(scene, self.data, group.key if len(group.scenes) == 1 else f"{group.key} ({item.name})")
        self.loads += 1
        self.cache[item] = scene
        while len(self.cache) > 1 and self.cached_mb() > self.data.cache_mb:
            self.cache.popitem(last=False)
        return scene

    def cached_mb(self) -> float:
        return sum(scene_bytes(scene) for scene in self.cache.values()) / MB


def scene_bytes(scene: Scene) -> int:
    """Memory a loaded scene holds: its images (the cameras and bounds are a few KB)."""
    return scene.images.nbytes
