"""The typed settings of every command: one frozen object per config section, built and checked once
from the composed Hydra config by `pola_gnt.runs.config` and passed whole to the code that uses it.

The settings classes are the config's schema (`pola_gnt.runs.config.schema`): `RunSettings` is
`conf/config.yaml` section by section and key by key (train, eval, render_video, analyze,
check_scene), `data.settings.ProcessDataSettings` is `conf/process_data.yaml`. The sections that
lower layers consume are defined there (`data.settings`, `model.settings`, `evaluation.settings`).
A field has no default: the YAML files are the one place each default lives. The reader checks each
value's type from its annotation; a class's `check(key)` adds its ranges and choices, naming the full
key (`key` is the section's own: `trainer`, or empty for the whole config).
"""

from __future__ import annotations

from dataclasses import dataclass

from pola_gnt.core.errors import UserError, check_choice, check_int, check_number, is_int
from pola_gnt.data.settings import MAX_SEED, CollectionSettings, DataSettings, SceneSettings
from pola_gnt.evaluation.settings import MetricsSettings, OutputSettings
from pola_gnt.geometry.camera_paths import PATH_KINDS
from pola_gnt.model.settings import ModelSettings, RenderSettings

# Lightning accelerators that need a CUDA device.
CUDA_ACCELERATORS = ("gpu", "cuda")


@dataclass(frozen=True)
class OptimSettings:
    lr_transformer: float
    lr_encoder: float
    decay_steps: int  # both learning rates are multiplied by decay_rate every decay_steps
    decay_rate: float

    def check(self, key: str) -> None:
        check_number(self.lr_transformer, f"{key}.lr_transformer", 0)
        check_number(self.lr_encoder, f"{key}.lr_encoder", 0)
        check_int(self.decay_steps, f"{key}.decay_steps")
        check_number(self.decay_rate, f"{key}.decay_rate", 0, 1, why="1 = no decay")


@dataclass(frozen=True)
class TrainerSettings:
    """Lightning's `Trainer` arguments (`conf/trainer/*.yaml`), checked; `max_time` in seconds (the
    YAML's minutes, "DD:HH:MM:SS" or mapping: `runs.config.read`)."""

    accelerator: str
    devices: int | str | list[int]  # a count, -1 or auto, or the device indices
    num_nodes: int
    strategy: str
    precision: str
    max_steps: int
    max_time: float | None  # an equal-time budget, in seconds (given as minutes, "DD:HH:MM:SS" or a mapping)
    checkpoint_minutes: tuple[float, ...]  # training wall times (minutes) at which a budget checkpoint is saved
    val_check_interval: int | float
    check_val_every_n_epoch: int | None
    log_every_n_steps: int
    gradient_clip_val: float | None
    use_distributed_sampler: bool
    enable_model_summary: bool
    num_sanity_val_steps: int
    fast_dev_run: bool | int  # a quick check of the code: that many batches of each loop, nothing saved

    def check(self, key: str) -> None:
        max_steps, interval = check_int(self.max_steps, f"{key}.max_steps"), self.val_check_interval
        if not (is_int(interval) and interval >= 1) and not (isinstance(interval, float) and 0 < interval <= 1):
            raise UserError(f"{key}.val_check_interval: must be a positive number of steps, got {interval!r}")
        if is_int(interval) and interval > max_steps:
            raise UserError(
                f"{key}.val_check_interval: {interval} is more than {key}.max_steps ({max_steps}); "
                f"validation would never run"
            )
        if self.gradient_clip_val is not None:
            check_number(self.gradient_clip_val, f"{key}.gradient_clip_val", 0, low_open=False, why="or null")
        devices = self.devices  # the reader gave an integer, a string or a list of integers
        count = isinstance(devices, int) and (devices >= 1 or devices == -1)
        if not (count or isinstance(devices, str) or (isinstance(devices, list) and min(devices, default=0) >= 0)):
            raise UserError(f"{key}.devices: must be a number of devices, -1, auto or a list, got {devices!r}")
        check_int(self.num_nodes, f"{key}.num_nodes")
        if not all(minutes > 0 for minutes in self.checkpoint_minutes):
            raise UserError(
                f"{key}.checkpoint_minutes: must be a list of positive minutes, e.g. [1, 2], "
                f"got {list(self.checkpoint_minutes)}"
            )
        if self.check_val_every_n_epoch is not None:
            check_int(self.check_val_every_n_epoch, f"{key}.check_val_every_n_epoch")
        check_int(self.log_every_n_steps, f"{key}.log_every_n_steps")
        check_int(self.num_sanity_val_steps, f"{key}.num_sanity_val_steps", minimum=0)
        if not isinstance(self.fast_dev_run, bool):
            why = "false, true, or a number of batches of each loop (a quick check of the code)"
            check_int(self.fast_dev_run, f"{key}.fast_dev_run", why=why)

    def check_device(self, key: str = "trainer.accelerator") -> None:
        """A CUDA trainer (`trainer=gpu`, `experiment=paper`) on a machine without one: one line."""
        import torch

        if self.accelerator in CUDA_ACCELERATORS and not torch.cuda.is_available():
            raise UserError(
                f"{key}: {self.accelerator} asked for (trainer=gpu, or experiment=paper which selects it) "
                f"but no CUDA device is available; add trainer=cpu"
            )

    def lightning_arguments(self) -> dict:
        """Keyword arguments of `pytorch_lightning.Trainer` (the time budget is the caller's Timer)."""
        return {
            "accelerator": self.accelerator,
            "devices": self.devices,
            "num_nodes": self.num_nodes,
            "strategy": self.strategy,
            "precision": self.precision,
            "max_steps": self.max_steps,
            "val_check_interval": self.val_check_interval,
            "check_val_every_n_epoch": self.check_val_every_n_epoch,
            "log_every_n_steps": self.log_every_n_steps,
            "gradient_clip_val": self.gradient_clip_val,
            "use_distributed_sampler": self.use_distributed_sampler,
            "enable_model_summary": self.enable_model_summary,
            "num_sanity_val_steps": self.num_sanity_val_steps,
            "fast_dev_run": self.fast_dev_run,
        }


@dataclass(frozen=True)
class AnalyzeSettings:
    n_rays: int
    test_view: int

    def check(self, key: str) -> None:
        check_int(self.n_rays, f"{key}.n_rays")
        check_int(self.test_view, f"{key}.test_view", minimum=0)


@dataclass(frozen=True)
class VideoSettings:
    path: str  # spiral | interpolate | a camera_path.json file
    save_path: str | None  # also save the rendered camera path there (camera_path.json)
    frames: int
    fps: float
    rotations: float
    z_rate: float
    radius_scale: float
    closed: bool
    crf: int
    scale: float  # render at this fraction of the scene's resolution (a quick preview: 0.5)

    def resolution(self, height: int, width: int) -> tuple[int, int]:
        """The frame size for a scene of `height` x `width` (at least 1 pixel per side)."""
        return max(1, round(height * self.scale)), max(1, round(width * self.scale))

    def check(self, key: str) -> None:
        if not self.path.endswith(".json"):
            check_choice(self.path, f"{key}.path", (*PATH_KINDS, "FILE.json"))
        if self.save_path is not None and not self.save_path.endswith(".json"):
            raise UserError(f"{key}.save_path: must be null or a FILE.json, got {self.save_path!r}")
        check_int(self.frames, f"{key}.frames")
        check_number(self.fps, f"{key}.fps", 0)
        check_number(self.radius_scale, f"{key}.radius_scale", 0)
        check_int(self.crf, f"{key}.crf", minimum=0, maximum=51, why="0 lossless, 51 worst")
        check_number(self.scale, f"{key}.scale", 0, 1, why="a fraction of the scene's resolution")


@dataclass(frozen=True)
class ViewSettings:
    """`python -m pola_gnt.view`: where the viewer is served and how it refines."""

    host: str
    port: int  # 0: any free port
    preview_rays: int  # the first image after a camera move has at most this many rays
    height: int | None  # the full-resolution image's height; None: the scene's
    point_cloud: str | None  # a PLY file shown in the page (toggled there); None: the live cloud only

    def check(self, key: str) -> None:
        check_int(self.port, f"{key}.port", minimum=0, maximum=65535, why="0: any free port")
        check_int(self.preview_rays, f"{key}.preview_rays")
        if self.height is not None:
            check_int(self.height, f"{key}.height", why="pixels")
        if self.point_cloud is not None and not self.point_cloud.endswith(".ply"):
            raise UserError(f"{key}.point_cloud: must be null or a FILE.ply, got {self.point_cloud!r}")


# `python -m pola_gnt.export`: what it writes, and the camera sets it renders.
EXPORT_OUTPUTS = ("pointcloud", "mesh", "depth", "cameras")
EXPORT_CAMERAS = ("train", "test", "spiral")
EXPORT_CONFIDENCES = ("peak", "agreement", "both")
MESH_FORMATS = ("ply", "obj")


@dataclass(frozen=True)
class ExportSettings:
    """`python -m pola_gnt.export`: geometry out of a checkpoint (point cloud, mesh, depth, cameras)."""

    outputs: tuple[str, ...]  # any of EXPORT_OUTPUTS
    cameras: str  # the rendered camera set: train | test | spiral
    views: int | None  # at most this many of the set, evenly spaced (spiral: its frames); None: all (video.frames)
    scale: float  # render at this fraction of the scene's width and height
    confidence: str  # peak (the read-out's largest weight) | agreement (the source views') | both (their product)
    min_confidence: float  # points and depth pixels below it are dropped (0: none)
    agreement_tolerance: float  # a source view agrees when its colour is within this of the views' median
    consistent_views: int  # a point is kept where at least this many other rendered views agree (0: off)
    consistency_tolerance: float  # ... within this fraction of the point's depth
    voxel_size: float | None  # one point per voxel of this side (the scene's normalised units); None: every point
    max_points: int  # at most this many points (a seeded random subset)
    mesh_format: str  # ply | obj
    mesh_resolution: int  # TSDF voxels along the longest side of the fused points' box
    mesh_truncation: float  # TSDF truncation, in voxels

    def check(self, key: str) -> None:
        if not self.outputs:
            raise UserError(f"{key}.outputs: must name at least one of {', '.join(EXPORT_OUTPUTS)}")
        for output in self.outputs:
            check_choice(output, f"{key}.outputs", EXPORT_OUTPUTS)
        check_choice(self.cameras, f"{key}.cameras", EXPORT_CAMERAS)
        if self.views is not None:
            check_int(self.views, f"{key}.views", why="or null: all")
        check_number(self.scale, f"{key}.scale", 0, 1, why="a fraction of the scene's resolution")
        check_choice(self.confidence, f"{key}.confidence", EXPORT_CONFIDENCES)
        check_number(self.min_confidence, f"{key}.min_confidence", 0, 1, low_open=False, why="0: keep all")
        check_number(self.agreement_tolerance, f"{key}.agreement_tolerance", 0, why="colour in [0, 1]")
        check_int(self.consistent_views, f"{key}.consistent_views", minimum=0, why="0: no consistency filter")
        check_number(self.consistency_tolerance, f"{key}.consistency_tolerance", 0, why="a fraction of the depth")
        if self.voxel_size is not None:
            check_number(self.voxel_size, f"{key}.voxel_size", 0, why="or null: no voxel grid")
        check_int(self.max_points, f"{key}.max_points")
        check_choice(self.mesh_format, f"{key}.mesh_format", MESH_FORMATS)
        check_int(self.mesh_resolution, f"{key}.mesh_resolution", minimum=8, maximum=1024, why="voxels")
        check_number(self.mesh_truncation, f"{key}.mesh_truncation", 0, why="voxels")


BENCHMARK_MODES = ("zero_shot", "finetune", "per_scene")


@dataclass(frozen=True)
class BenchmarkSettings:
    """`python -m pola_gnt.benchmark`: LLFF at the published protocol, scene by scene."""

    mode: str  # zero_shot (the checkpoint as is) | finetune (init_from the checkpoint) | per_scene (from scratch)
    scenes: tuple[str, ...] | None  # the scene folders under data.root to run; None: every LLFF scene found
    budget_minutes: float | None  # finetune / per_scene: training time per scene; None: the preset's steps

    def check(self, key: str) -> None:
        check_choice(self.mode, f"{key}.mode", BENCHMARK_MODES)
        if self.scenes is not None and (not self.scenes or len(set(self.scenes)) < len(self.scenes)):
            raise UserError(f"{key}.scenes: must be null or a list of different scene names, got {list(self.scenes)}")
        if self.budget_minutes is not None:
            check_number(self.budget_minutes, f"{key}.budget_minutes", 0, why="minutes of training per scene")


@dataclass(frozen=True)
class RunSettings:
    """`conf/config.yaml`, checked: the run of train / eval / render_video / analyze / check_scene / benchmark."""

    seed: int
    ckpt_path: str | None
    init_from: str | None  # fine-tuning: the checkpoint whose weights training starts from
    collection: CollectionSettings | None  # the scenes trained over; `scene` is then held out
    scene: SceneSettings
    data: DataSettings
    render: RenderSettings
    optim: OptimSettings
    metrics: MetricsSettings
    output: OutputSettings
    model: ModelSettings
    trainer: TrainerSettings
    analyze: AnalyzeSettings
    video: VideoSettings
    view: ViewSettings
    benchmark: BenchmarkSettings
    export: ExportSettings

    def check(self, key: str) -> None:
        """The keys are bare: this is the whole of conf/config.yaml (`key` is empty)."""
        check_int(self.seed, "seed", minimum=0, maximum=MAX_SEED)
