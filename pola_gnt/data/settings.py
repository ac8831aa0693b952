"""The data settings: which scene (`SceneSettings`), how a training step draws its views, crop and
rays (`DataSettings`), and how `process_data` reconstructs a capture (`ProcessDataSettings`). Plain
frozen values; their defaults live in `conf/` only, and they are read and checked from the config in
one place (`pola_gnt.runs.config`)."""

from __future__ import annotations

from dataclasses import dataclass

from pola_gnt.data.sampling import crop_size, scaled_ray_count


@dataclass(frozen=True)
class SceneSettings:
    name: str
    kind: str  # one of pola_gnt.data.scenes.SCENE_KINDS
    path: str | None  # the scene folder; None: data.root / name (blender: data.synthetic_root / name; demo: generated)
    rig: str  # auto (from the cameras) | forward (LLFF-like) | object (around an object): how sources are chosen


@dataclass(frozen=True)
class CollectionFolder:
    """One real scene of a collection: an LLFF folder, a NeRF Blender scene or a transforms.json
    capture (`kind`); the scene's name is the folder's name."""

    path: str  # absolute, or relative to data.root
    kind: str  # auto (from the folder's files) | llff | blender | transforms: pola_gnt.data.collection.FOLDER_KINDS
    rig: str
    weight: float  # relative share of the training steps


@dataclass(frozen=True)
class ProceduralFamily:
    """`count` generated scenes (`data.procedural`), sharing `weight` equally."""

    seed: int  # the family: scene i of family s is the same scene everywhere
    count: int
    weight: float


@dataclass(frozen=True)
class CollectionSettings:
    """The scenes one model trains over (`conf/collection/*.yaml`); null: the run's one scene."""

    name: str
    folders: tuple[CollectionFolder, ...]
    procedural: ProceduralFamily | None


@dataclass(frozen=True)
class RandomCrop:
    """GNT's training crop of a random size: height drawn from `heights` = [low, high) and made even,
    width = area / height made even; a size that does not fit inside the image uses the whole image."""

    heights: tuple[int, int]
    area: int

    def sizes(self) -> list[tuple[int, int]]:
        """Every (height, width) the draw can give."""
        return sorted({crop_size(height, self.area) for height in range(*self.heights)})


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
