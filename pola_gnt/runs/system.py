"""The LightningModule: GNT's optimisation (Adam, two learning rates, step decay, MSE) and the test
phase (render every held-out view, score it, write the results). Training, `eval` and the trained-run
loader build it; it sits above the model and the scoring it joins."""

from __future__ import annotations

import time
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import Timer
from pytorch_lightning.utilities.types import OptimizerLRSchedulerConfig

from pola_gnt.data.batches import RayBatch, SourceBatch, ViewBatch
from pola_gnt.data.scene import Scene
from pola_gnt.data.scenes import exact_depth_source
from pola_gnt.evaluation.metrics import LOGGED_MIN_MSE, mse_to_psnr
from pola_gnt.evaluation.scoring import (
    ViewResult,
    ViewScorer,
    build_image_metrics,
    format_table,
    protocol_stride,
    write_results,
)
from pola_gnt.model.gnt import GNT, RayOutput, SourceViews
from pola_gnt.model.renderer import render_image
from pola_gnt.runs.budget import budget_document, timer_seconds_in_checkpoint, training_document
from pola_gnt.runs.checkpoints import container_dict


class GNTSystem(pl.LightningModule):
    """Trains and evaluates one `GNT` network. The whole run config is saved in the checkpoint."""

    def __init__(self, config: dict):
        super().__init__()
        self.save_hyperparameters({"config": config})
        self.cfg: DictConfig = OmegaConf.create(config)
        self.net: GNT = instantiate(self.cfg.model.net)
        if self.cfg.model.get("compile", False):
            # In place: the parameter names, and so the checkpoints, stay those of the eager network.
            self.net.compile(dynamic=True)
        self.test_results: list[ViewResult] = []
        self.test_document: dict | None = None
        # The test phase renders the held-out views of `scene` and writes into `output_dir` (both set
        # by the command that tests: `train`, `eval`).
        self.scene: Scene | None = None
        self.output_dir: Path | None = None
        self.checkpoint_step = 0  # global step of the loaded checkpoint (trainer.test does not restore it)
        self.checkpoint_train_time_s: float | None = None  # training wall time stored in that checkpoint
        self.checkpoint_config: dict | None = None  # the run config stored in that checkpoint
        self.test_started = 0.0
        self.fit_timer: Timer | None = None  # the Timer of a fit in this process (set by `train`)

    @classmethod
    def from_config(cls, cfg: DictConfig) -> GNTSystem:
        """A system for the run config `cfg` (resolved and stored in the checkpoints)."""
        return cls(container_dict(cfg))

    # ---- training --------------------------------------------------------------------------

    def encode_sources(self, sources: SourceBatch) -> SourceViews:
        return self.net.source_views(sources.images, sources.c2w, sources.intrinsics)

    def render_batch(self, batch: RayBatch) -> RayOutput:
        return self.net(batch.rays, batch.depths, self.encode_sources(batch.sources))

    def training_step(self, batch: RayBatch, batch_idx: int) -> torch.Tensor:
        output = self.render_batch(batch)
        loss = F.mse_loss(output.rgb.float(), batch.rgb)
        n_rays = len(batch.rgb)
        self.log("train/loss", loss, batch_size=n_rays)
        self.log("train/psnr", mse_to_psnr(loss.detach(), LOGGED_MIN_MSE), prog_bar=True, batch_size=n_rays)
        return loss

    def validation_step(self, batch: RayBatch, batch_idx: int) -> None:
        output = self.render_batch(batch)
        mse = F.mse_loss(output.rgb.float().clamp(0, 1), batch.rgb)
        self.log("val/psnr", mse_to_psnr(mse, LOGGED_MIN_MSE), prog_bar=True, sync_dist=True, batch_size=len(batch.rgb))

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        optim = self.cfg.optim
        encoder_params = list(self.net.encoder.parameters())
        encoder_ids = {id(p) for p in encoder_params}
        other_params = [p for p in self.net.parameters() if id(p) not in encoder_ids]
        optimizer = torch.optim.Adam(
            [{"params": other_params, "lr": optim.lr_transformer}, {"params": encoder_params, "lr": optim.lr_encoder}]
        )
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=optim.decay_steps, gamma=optim.decay_rate)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.checkpoint_step = int(checkpoint.get("global_step", 0))
        self.checkpoint_train_time_s = timer_seconds_in_checkpoint(checkpoint)
        self.checkpoint_config = (checkpoint.get("hyper_parameters") or {}).get("config")

    def _fit_timer(self) -> Timer | None:
        """The Timer of a fit in this process (None under eval)."""
        timer = self.fit_timer
        return timer if timer is not None and timer.start_time("train") is not None else None

    def training_summary(self, global_step: int) -> tuple[DictConfig, dict, dict]:
        """The config training ran under, its budget and its `training` record: this process's fit
        (earlier parts of a resumed run included, via the Timer's saved state), or under eval the
        loaded checkpoint's stored config and time (eval takes the machine's `trainer` settings)."""
        timer = self._fit_timer()
        if timer is None and self.checkpoint_config is not None:
            config, seconds = OmegaConf.create(self.checkpoint_config), self.checkpoint_train_time_s
        else:
            config, seconds = self.cfg, timer.time_elapsed("train") if timer is not None else None
        budget = budget_document(config)
        return config, budget, training_document(budget, global_step, seconds)

    # ---- testing: render every held-out view, score it, write the results --------------------

    def _test_scene(self) -> Scene:
        if self.scene is None:
            raise RuntimeError("GNTSystem.scene: set the scene whose held-out views are tested before trainer.test")
        return self.scene

    def on_test_epoch_start(self) -> None:
        scene = self._test_scene()
        self.scorer = ViewScorer(
            scene,
            build_image_metrics(self.cfg.metrics),
            self.cfg.metrics.protocol,
            exact_depth=exact_depth_source(self.cfg.scene, scene),
        )
        self.test_results = []
        self.test_started = time.perf_counter()

    def test_step(self, batch: ViewBatch, batch_idx: int) -> None:
        scene = self._test_scene()
        stride = protocol_stride(self.cfg.metrics.protocol)
        height, width = scene.resolution
        rendered = render_image(
            self.net,
            batch.c2w,
            batch.intrinsics,
            height,
            width,
            self.encode_sources(batch.sources),
            scene.depth_range,
            self.cfg.render.n_samples,
            self.cfg.render.chunk_rays,
            stride=stride,
        )
        self.test_results.append(self.scorer(batch.view, rendered.rgb, rendered.depth, self.cfg.output.save_images))

    def on_test_epoch_end(self) -> None:
        results = self.test_results
        if self.trainer.world_size > 1:
            gathered: list[list[ViewResult]] = [[] for _ in range(self.trainer.world_size)]
            dist.all_gather_object(gathered, results)
            results = [r for part in gathered for r in part]
        if not self.trainer.is_global_zero:
            return
        test_time_s = time.perf_counter() - self.test_started  # rendering and scoring the test views
        scene = self._test_scene()
        if self.output_dir is None:
            raise RuntimeError("GNTSystem.output_dir: set the folder for metrics.json before trainer.test")
        stride = protocol_stride(self.cfg.metrics.protocol)
        global_step = max(int(self.global_step), self.checkpoint_step)
        training_config, budget, training = self.training_summary(global_step)
        height, width = scene.resolution
        header = {
            "scene": self.cfg.scene.name,
            "model": self.cfg.model.name,
            "split": "test",
            "protocol": self.cfg.metrics.protocol,
            "lpips_net": self.cfg.metrics.lpips_net,
            "resolution": [len(range(0, height, stride)), len(range(0, width, stride))],
            "factor": scene.factor,
            "metric_settings": self.scorer.metrics.settings,
            "n_samples": self.cfg.render.n_samples,
            "num_source_views": self.cfg.data.num_source_views,
            "global_step": global_step,
            "seed": int(training_config.seed),
            "budget": budget,
            "training": training,
            "test_time_s": test_time_s,
        }
        self.test_document = write_results(
            self.output_dir, header, results, scene.depth_range, self.cfg.output.save_images
        )
        print(format_table(self.test_document), flush=True)
