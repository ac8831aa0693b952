"""The typed settings of every command: one frozen object per config section, built and checked once
from the composed Hydra config by `pola_gnt.runs.config` and passed whole to the code that uses it.

`RunSettings` mirrors `conf/config.yaml` section by section and key by key (train, eval,
render_video, analyze, check_scene); `data.settings.ProcessDataSettings` mirrors
`conf/process_data.yaml`. The sections that lower layers consume are defined there (`data.settings`, `model.settings`,
`evaluation.settings`); the YAML files are the one place each default lives (tests/test_config.py
keeps the two from drifting).
"""

from __future__ import annotations

from dataclasses import dataclass

from pola_gnt.core.errors import UserError
from pola_gnt.data.settings import CollectionSettings, DataSettings, SceneSettings
from pola_gnt.evaluation.settings import MetricsSettings, OutputSettings
from pola_gnt.model.settings import ModelSettings, RenderSettings

# Lightning accelerators that need a CUDA device.
CUDA_ACCELERATORS = ("gpu", "cuda")


@dataclass(frozen=True)
class OptimSettings:
    lr_transformer: float
    lr_encoder: float
    decay_steps: int  # both learning rates are multiplied by decay_rate every decay_steps
    decay_rate: float


@dataclass(frozen=True)
class TrainerSettings:
    """Lightning's `Trainer` arguments (`conf/trainer/*.yaml`), checked; `max_time` in seconds."""

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


@dataclass(frozen=True)
class ViewSettings:
    """`python -m pola_gnt.view`: where the viewer is served and how it refines."""

    host: str
    port: int  # 0: any free port
    preview_rays: int  # the first image after a camera move has at most this many rays
    height: int | None  # the full-resolution image's height; None: the scene's


@dataclass(frozen=True)
class RunSettings:
    """`conf/config.yaml`, checked: the run of train / eval / render_video / analyze / check_scene."""

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
