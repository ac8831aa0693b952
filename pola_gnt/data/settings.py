"""The data settings: which scene (`SceneSettings`), how a training step draws its views, crop and
rays (`DataSettings`), and how `process_data` reconstructs a capture (`ProcessDataSettings`). Plain
frozen values; they are the config's schema (`pola_gnt.runs.config.schema`): each field is a key of
`conf/`, whose YAML files hold every default. The reader checks each value's type from its annotation;
`check(key)` adds the ranges and choices, naming the full key (`key` is the section's)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pola_gnt.core.errors import UserError, check_choice, check_int, check_number
from pola_gnt.data.sampling import CROP_PLACEMENTS, crop_size, scaled_ray_count
from pola_gnt.data.source_views import POOL_FACTORS, RIG_CHOICES

MAX_SEED = 2**32 - 1  # numpy's and Lightning's seed range
# `scene.kind`: the kinds of scene folder `pola_gnt.data.scene_loading.SCENE_KINDS` loads (one entry each).
SCENE_KIND_NAMES = ("llff", "demo", "blender", "transforms")
# `collection.folders[i].kind`: auto (from the folder's files), or the kind of scene the folder holds.
FOLDER_KINDS = ("auto", "llff", "blender", "transforms")
# `process_data`'s COLMAP choices (`pola_gnt.data.colmap`).
CAMERA_MODELS = ("SIMPLE_RADIAL", "RADIAL", "SIMPLE_PINHOLE")  # one focal length: fx = fy, as LLFF
CAMERA_MODES = ("single", "per_image")
MATCHING = ("auto", "exhaustive", "sequential")


@dataclass(frozen=True)
class SceneSettings:
    name: str
    kind: str  # one of SCENE_KIND_NAMES
    path: str | None  # the scene folder; None: data.root / name (blender: data.synthetic_root / name; demo: generated)
    rig: str  # auto (from the cameras) | forward (LLFF-like) | object (around an object): how sources are chosen

    def check(self, key: str) -> None:
        check_choice(self.kind, f"{key}.kind", SCENE_KIND_NAMES)
        check_choice(self.rig, f"{key}.rig", RIG_CHOICES)


@dataclass(frozen=True)
class CollectionFolder:
    """One real scene of a collection: an LLFF folder, a NeRF Blender scene or a transforms.json
    capture (`kind`); the scene's name is the folder's name."""

    path: str  # absolute, or relative to data.root
    kind: str  # auto (from the folder's files) | llff | blender | transforms: FOLDER_KINDS
    rig: str
    weight: float  # relative share of the training steps

    def check(self, key: str) -> None:
        if not self.path:
            raise UserError(f"{key}.path: must be a scene folder (absolute, or relative to data.root)")
        check_choice(self.kind, f"{key}.kind", FOLDER_KINDS)
        check_choice(self.rig, f"{key}.rig", RIG_CHOICES)
        check_number(self.weight, f"{key}.weight", 0, None, low_open=False)


@dataclass(frozen=True)
class ProceduralFamily:
    """`count` generated scenes (`data.procedural`), sharing `weight` equally."""

    seed: int  # the family: scene i of family s is the same scene everywhere
    count: int
    weight: float

    def check(self, key: str) -> None:
        check_int(self.seed, f"{key}.seed", minimum=0, maximum=MAX_SEED)
        check_int(self.count, f"{key}.count", minimum=0)
        check_number(self.weight, f"{key}.weight", 0, None, low_open=False)


@dataclass(frozen=True)
class CollectionSettings:
    """The scenes one model trains over (`conf/collection/*.yaml`); null: the run's one scene."""

    name: str
    folders: tuple[CollectionFolder, ...]
    procedural: ProceduralFamily | None

    def check(self, key: str) -> None:
        procedural = self.procedural if self.procedural and self.procedural.count else None
        if not self.folders and not procedural:
            raise UserError(f"{key}: {self.name} has no scenes (folders is empty and no procedural scenes)")
        if sum(f.weight for f in self.folders) + (procedural.weight if procedural else 0.0) <= 0:
            raise UserError(f"{key}: every weight of {self.name} is 0; no scene could be drawn")


@dataclass(frozen=True)
class RandomCrop:
    """GNT's training crop of a random size: height drawn from `heights` = [low, high) and made even,
    width = area / height made even; a size that does not fit inside the image uses the whole image."""

    heights: tuple[int, int]
    area: int

    def sizes(self) -> list[tuple[int, int]]:
        """Every (height, width) the draw can give."""
        return sorted({crop_size(height, self.area) for height in range(*self.heights)})

    def check(self, key: str) -> None:
        low, high = self.heights
        if not 1 <= low < high:
            raise UserError(f"{key}.heights: must be [low, high] crop heights in pixels, low < high, got {[low, high]}")
        check_int(self.area, f"{key}.area")


@dataclass(frozen=True)
class DataSettings:
    root: str | None  # folder of the scene folders; None: $POLA_GNT_DATA or data/nerf_llff_data
    synthetic_root: str | None  # NeRF's Blender scenes; None: $POLA_GNT_SYNTHETIC or nerf_synthetic/ by data.root
    factor: int
    synthetic_factor: int  # NeRF's Blender scenes: frames at 800 / synthetic_factor px
    llffhold: int
    test_views: int | None  # test views scored, evenly spaced over the scene's; None: all
    num_source_views: int
    random_source_views: bool
    source_pool_weights: tuple[float, ...] | None  # weights of the pool factor k in {1, 2, 3}; None: uniform
    target_as_source_rate: float  # GNT: the share of steps in which the target replaces one of its source views
    targets_per_step: int  # target views per step, each with its own sources, crop and rays (GNT: 1 per GPU)
    rays_per_step: int  # per target view
    # training and validation rays as square patches of this side (their rays a grid the prior's neighbours
    # aggregate over, model.neighbours): rays_per_step / side^2 patches a target; 0: rays drawn one by one
    ray_patch_size: int
    crop: tuple[int, int] | None  # fixed [height, width] training crop
    random_crop: RandomCrop | None  # GNT's random-size training crop
    crop_placement: str  # anywhere | gnt (GNT's: 1 px from the top and left edges, 2 from the far ones)
    scale_rays_with_views: bool  # GNT: rays per step x num_source_views / views drawn
    val_rays: int
    cache_mb: int  # collections: loaded scenes kept in memory up to this many MB (least recently drawn dropped)

    def max_rays(self) -> int:
        """The most rays one target of a training step can draw: more than `rays_per_step` when the rays
        scale with the views drawn and fewer than `num_source_views` are drawn (at least 1, at most 2 fewer)."""
        if not (self.scale_rays_with_views and self.random_source_views):
            return self.rays_per_step
        fewest = max(1, self.num_source_views - 2)
        return scaled_ray_count(self.rays_per_step, self.num_source_views, fewest)

    def check(self, key: str) -> None:
        if self.crop is not None and min(self.crop) < 1:
            raise UserError(f"{key}.crop: must be null or [height, width] in pixels, got {list(self.crop)}")
        if self.crop is not None and self.random_crop is not None:
            raise UserError(f"{key}.random_crop: set together with {key}.crop; choose one (null the other)")
        check_int(self.factor, f"{key}.factor")
        why = "NeRF's Blender frames are read at 800 / synthetic_factor px"
        check_int(self.synthetic_factor, f"{key}.synthetic_factor", why=why)
        why = "every N-th view is held out for testing; 0 would leave nothing to score"
        check_int(self.llffhold, f"{key}.llffhold", why=why)
        if self.test_views is not None:
            check_int(self.test_views, f"{key}.test_views")
        check_int(self.num_source_views, f"{key}.num_source_views")
        weights = self.source_pool_weights
        if weights is not None and not (
            len(weights) == len(POOL_FACTORS) and min(weights) >= 0 and math.isfinite(sum(weights)) and sum(weights) > 0
        ):
            raise UserError(
                f"{key}.source_pool_weights: must be null (uniform) or {len(POOL_FACTORS)} weights >= 0 of the "
                f"pool factors {list(POOL_FACTORS)} (GNT: [0.2, 0.45, 0.35]), got {list(weights)}"
            )
        check_number(self.target_as_source_rate, f"{key}.target_as_source_rate", 0, 1, low_open=False)
        check_int(self.targets_per_step, f"{key}.targets_per_step")
        check_int(self.rays_per_step, f"{key}.rays_per_step")
        check_int(self.ray_patch_size, f"{key}.ray_patch_size", minimum=0, why="0: rays one by one")
        if self.ray_patch_size:
            side, area = self.ray_patch_size, self.ray_patch_size**2
            for name, rays in (("rays_per_step", self.rays_per_step), ("val_rays", self.val_rays)):
                if rays < area:
                    raise UserError(
                        f"{key}.{name}: {rays} rays hold no {side} x {side} patch ({key}.ray_patch_size={side}); "
                        f"give at least {area}, or a smaller {key}.ray_patch_size"
                    )
        check_choice(self.crop_placement, f"{key}.crop_placement", CROP_PLACEMENTS)
        check_int(self.val_rays, f"{key}.val_rays")
        check_int(self.cache_mb, f"{key}.cache_mb")


@dataclass(frozen=True)
class ProcessDataSettings:
    """`python -m pola_gnt.process_data` (conf/process_data.yaml): a capture -> an LLFF scene folder."""

    input: str  # a folder of photos or a video file
    out: str  # the scene folder to write
    frames: int  # video: frames kept, the sharpest of each stretch
    camera: str  # single | per_image
    camera_model: str  # COLMAP's camera model, undistorted to a pinhole camera
    matching: str  # auto | exhaustive | sequential (`run_sfm` takes it resolved)
    max_image_size: int  # SIFT on images downscaled to at most this size
    max_features: int  # SIFT features kept per image
    min_registered: float  # fewer registered images than this fraction (and than 3) is an error
    overwrite: bool
    threads: int  # -1: every core
    seed: int  # COLMAP's random seed
    deterministic: bool  # mapping on one thread: the same capture gives the same model (up to rounding)
    progress: bool

    def check(self, key: str) -> None:
        """The keys are bare: this is the whole of conf/process_data.yaml (`key` is empty)."""
        check_int(self.frames, "frames")
        check_choice(self.camera, "camera", CAMERA_MODES)
        check_choice(self.camera_model, "camera_model", CAMERA_MODELS)
        check_choice(self.matching, "matching", MATCHING)
        check_int(self.max_image_size, "max_image_size")
        check_int(self.max_features, "max_features")
        check_number(self.min_registered, "min_registered", 0, 1, low_open=False, why="a fraction of the images")
        check_int(self.threads, "threads", minimum=-1, why="-1: every core")
        check_int(self.seed, "seed", minimum=0, maximum=MAX_SEED)
