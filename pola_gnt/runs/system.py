"""The LightningModule: GNT's optimisation (Adam, two learning rates, step decay, MSE) and the test
phase (render every held-out view, score it, write the results). Training, `eval` and the trained-run
loader build it; it sits above the model and the scoring it joins."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from pytorch_lightning.callbacks import Timer
from pytorch_lightning.utilities.types import OptimizerLRSchedulerConfig

from pola_gnt.data.batches import RayBatch, SourceBatch, TrainingBatch, ViewBatch
from pola_gnt.data.scene import Scene
from pola_gnt.data.scene_loading import exact_depth_source
from pola_gnt.evaluation.image_metrics import LOGGED_MIN_MSE, mse_to_psnr
from pola_gnt.evaluation.scoring import (
    ProtocolResults,
    ViewResult,
    ViewScorer,
    build_image_metrics,
    format_tables,
    protocol_stride,
    render_stride,
    write_results,
)
from pola_gnt.model.backbone import AlexNetEncoder
from pola_gnt.model.consistency_prior import PriorImageCache, working_images
from pola_gnt.model.feature_cache import FrozenFeatureCache
from pola_gnt.model.gnt import GNT, RayOutput, SourceViews
from pola_gnt.model.inference import (
    FastRenderNetwork,
    announce_render_precision,
    render_network,
    resolve_render_precision,
)
from pola_gnt.model.render_memory import budget_chunk_rays, render_workers
from pola_gnt.model.renderer import RenderedImage, chunk_threads, render_image
from pola_gnt.model.sampler import DepthSampler
from pola_gnt.runs.checkpoints import (
    TRAINING_RECORD,
    checkpoint_init_from,
    checkpoint_training_scenes,
    state_dict_mismatch,
)
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import InitialWeights, completed_run_config
from pola_gnt.runs.settings import CUDA_ACCELERATORS, RunSettings
from pola_gnt.runs.training_budget import budget_document, timer_seconds_in_checkpoint, training_document


class GNTSystem(pl.LightningModule):
    """Trains and evaluates one `GNT` network. The whole run config is saved in the checkpoint."""

    def __init__(self, settings: RunSettings, config: dict):
        """`settings`: the checked run config; `config`: the same config as a plain dict, stored in the
        checkpoints (its hyper-parameters), from which `eval` and `render_video` rebuild the run."""
        super().__init__()
        self.save_hyperparameters({"config": config})
        self.settings = settings
        self.config = config
        self.net = GNT(settings.model.net, settings.metrics.lpips_weights)
        # Training's cache of what frozen convs make of each source image, the AlexNet encoder's and the
        # consistency features' (None: nothing to cache, or off); a plain attribute, so in no state dict
        # or checkpoint.
        cache_mb = settings.model.net.encoder.feature_cache_mb
        frozen_encoder = isinstance(self.net.encoder, AlexNetEncoder) and self.net.encoder.n_frozen > 0
        frozen_convs = frozen_encoder or self.net.consistency_features is not None
        self.feature_cache = FrozenFeatureCache(cache_mb) if frozen_convs and cache_mb > 0 else None
        self.sampler = DepthSampler(settings.render.n_samples)
        if settings.model.compile:
            # In place: the parameter names, and so the checkpoints, stay those of the eager network.
            self.net.compile(dynamic=True)
        # The scored test views of each protocol (`metrics.protocol` first, then `metrics.extra_protocols`).
        self.test_results: dict[str, list[ViewResult]] = {}
        self.scorers: dict[str, ViewScorer] = {}
        self.test_document: dict | None = None
        # The test phase renders the held-out views of `scene` and writes into `output_dir`
        # (`prepare_test`, by the command that tests: `train`, `eval`).
        self.scene: Scene | None = None
        self.output_dir: Path | None = None
        self.checkpoint_step = 0  # global step of the loaded checkpoint (trainer.test does not restore it)
        self.checkpoint_train_time_s: float | None = None  # training wall time stored in that checkpoint
        self.checkpoint_config: dict | None = None  # the run config stored in that checkpoint
        self.test_started = 0.0
        # What the weights were trained on, for metrics.json: the run's scenes (`train` sets a
        # collection's) and, when fine-tuning, the checkpoint it started from (`start_from`); a loaded
        # checkpoint's own record replaces both (`on_load_checkpoint`).
        self.training_scenes: list[str] = [settings.scene.name]
        self.init_from: dict | None = None
        self._rendering: GNT | FastRenderNetwork | None = None  # rendering_network's, for one test phase
        self._prior_images = PriorImageCache()  # the test phase's (`test_step`)

    def rendering_network(self, device: torch.device) -> GNT | FastRenderNetwork:
        """What renders full images (test views, videos, the viewer) at `render.precision` on `device`:
        the network itself (fp32) or its bf16 render copy, made from the weights as they are now."""
        return render_network(self.net, resolve_render_precision(self.settings.render.precision, device))

    def start_from(self, weights: InitialWeights) -> None:
        """Fine-tuning: the network's weights from another checkpoint (strict), nothing else of its state."""
        try:
            self.load_state_dict(weights.state_dict, strict=True)
        except RuntimeError as err:
            raise state_dict_mismatch(weights.path, err) from None
        self.init_from = weights.record
        self.training_scenes = list(dict.fromkeys([*weights.record["training_scenes"], *self.training_scenes]))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[TRAINING_RECORD] = {"training_scenes": self.training_scenes, "init_from": self.init_from}

    def prepare_test(self, scene: Scene, output_dir: Path) -> None:
        """The scene whose held-out views the test phase renders, and the folder it writes into; says
        in which precision it will render them (before the test's progress bar starts)."""
        self.scene, self.output_dir = scene, output_dir
        device = torch.device("cuda" if self.settings.trainer.accelerator in CUDA_ACCELERATORS else "cpu")
        announce_render_precision(self.net, resolve_render_precision(self.settings.render.precision, device))

    # ---- training --------------------------------------------------------------------------

    def encode_sources(self, sources: SourceBatch) -> SourceViews:
        """The sources encoded: in a training step through the feature cache (when there is one; it
        encodes afresh wherever it does not apply: validation, no gradients, unnamed images)."""
        cache = self.feature_cache
        if cache is None:
            return self.net.source_views(sources.images, sources.c2w, sources.intrinsics)
        features = cache.encode(self.net, sources.images, sources.image_keys)
        views = SourceViews(images=sources.images, features=features, c2w=sources.c2w, intrinsics=sources.intrinsics)
        if self.net.consistency_features is not None:
            factor = self.net.working_factor(sources.images)
            maps = cache.consistency_maps(self.net, working_images(sources.images, factor), sources.image_keys)
            views.keep_consistency_maps(self.net.consistency_features, maps, factor)
        return views

    def on_train_start(self) -> None:
        if self.feature_cache is not None:  # the frozen weights are the ones loaded by now
            self.feature_cache.clear()

    def on_train_end(self) -> None:
        if self.feature_cache is not None:  # its memory back for the test phase
            self.feature_cache.clear()

    def render_batch(self, batch: RayBatch) -> RayOutput:
        depths = self.sampler(batch.rays, batch.depth_range, batch.sample_seed, batch.grid)
        return self.net(batch.rays, depths, self.encode_sources(batch.sources), batch.grid)

    def training_step(self, batch: TrainingBatch, batch_idx: int) -> torch.Tensor:
        # The mean of the targets' losses: DDP's mean over GPUs that each train one target (GNT).
        losses = [F.mse_loss(self.render_batch(target).rgb.float(), target.rgb) for target in batch.targets]
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        n_rays = batch.n_rays
        self.log("train/loss", loss, batch_size=n_rays)
        self.log("train/psnr", mse_to_psnr(loss.detach(), LOGGED_MIN_MSE), prog_bar=True, batch_size=n_rays)
        return loss

    def validation_step(self, batch: RayBatch, batch_idx: int) -> None:
        output = self.render_batch(batch)
        mse = F.mse_loss(output.rgb.float().clamp(0, 1), batch.rgb)
        self.log("val/psnr", mse_to_psnr(mse, LOGGED_MIN_MSE), prog_bar=True, sync_dist=True, batch_size=len(batch.rgb))

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        optim = self.settings.optim
        # Frozen parameters (a frozen AlexNet backbone's) stay out of the optimiser.
        encoder_params = [p for p in self.net.encoder.parameters() if p.requires_grad]
        encoder_ids = {id(p) for p in self.net.encoder.parameters()}
        other_params = [p for p in self.net.parameters() if id(p) not in encoder_ids and p.requires_grad]
        optimizer = torch.optim.Adam(
            [{"params": other_params, "lr": optim.lr_transformer}, {"params": encoder_params, "lr": optim.lr_encoder}]
        )
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=optim.decay_steps, gamma=optim.decay_rate)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.checkpoint_step = int(checkpoint.get("global_step", 0))
        self.checkpoint_train_time_s = timer_seconds_in_checkpoint(checkpoint)
        self.checkpoint_config = (checkpoint.get("hyper_parameters") or {}).get("config")
        self.training_scenes = checkpoint_training_scenes(checkpoint)
        self.init_from = checkpoint_init_from(checkpoint)

    def _fit_timer(self) -> Timer | None:
        """The Timer of a fit in this process (None under eval, whose trainer has none)."""
        callbacks = getattr(self._trainer, "callbacks", None) or []
        timers = [callback for callback in callbacks if isinstance(callback, Timer)]
        return timers[0] if timers and timers[0].start_time("train") is not None else None

    def training_summary(self, global_step: int) -> tuple[RunSettings, dict, dict]:
        """The settings training ran under, its budget and its `training` record: this process's fit
        (earlier parts of a resumed run included, via the Timer's saved state), or under eval the
        loaded checkpoint's stored config and time (eval takes the machine's `trainer` settings)."""
        timer = self._fit_timer()
        if timer is None and self.checkpoint_config is not None:
            settings = read_run_settings(completed_run_config(self.checkpoint_config, self.config))
            seconds = self.checkpoint_train_time_s
        else:
            settings, seconds = self.settings, timer.time_elapsed("train") if timer is not None else None
        budget = budget_document(settings.trainer)
        return settings, budget, training_document(budget, global_step, seconds)

    def training_record(self) -> dict:
        """metrics.json's account of the weights: the scenes they were trained on, whether the scored
        scene was one of them, the checkpoint fine-tuning started from, and so the mode of the result."""
        seen = self.settings.scene.name in self.training_scenes
        mode = "fine-tuned" if self.init_from is not None else ("per-scene" if seen else "zero-shot")
        return {
            "mode": mode,
            "training_scenes": self.training_scenes,
            "seen_in_training": seen,
            "init_from": self.init_from,
        }

    # ---- testing: render every held-out view, score it, write the results --------------------

    def _test_scene(self) -> Scene:
        if self.scene is None:
            raise RuntimeError("GNTSystem.prepare_test: set the scene whose views are tested before trainer.test")
        return self.scene

    def on_test_epoch_start(self) -> None:
        scene = self._test_scene()
        metrics = self.settings.metrics
        exact_depth = exact_depth_source(self.settings.scene, scene)
        self.scorers = {
            protocol: ViewScorer(
                scene, build_image_metrics(metrics.for_protocol(protocol)), protocol, exact_depth=exact_depth
            )
            for protocol in metrics.protocols
        }
        self.test_results = {protocol: [] for protocol in metrics.protocols}
        self.test_started = time.perf_counter()
        self._rendering = self.rendering_network(self.device)
        self._prior_images = PriorImageCache()  # by the scene's view: what the prior computes of its image

    def render_view(
        self,
        network: GNT | FastRenderNetwork,
        scene: Scene,
        sources: SourceBatch,
        c2w: torch.Tensor,
        intrinsics: torch.Tensor,
        stride: int = 1,
        prior_images: PriorImageCache | None = None,
        cancelled: Callable[[], bool] | None = None,
        progress: Callable[[int, int], None] | None = None,
        peak_weights: list[torch.Tensor] | None = None,
    ) -> RenderedImage:
        """One full image of `scene` from the camera (`c2w`, `intrinsics`) as the test phase renders a
        held-out view: the source batch encoded at once, the read-out prior's part of each source image
        (kept in `prior_images` by the scene's view, when given), every `stride`-th pixel in the chunks
        and workers of `render.*` on this module's device (`render_image`; `cancelled`, `progress`,
        `peak_weights`: its). The test phase and `pola_gnt.api` render through it."""
        settings = self.settings
        height, width = scene.resolution
        views = settings.data.num_source_views
        chunk_rays = budget_chunk_rays(settings.render, settings.model.net, views, self.device)
        workers = render_workers(settings.render, settings.model.net, views, chunk_rays, self.device)
        encoded = network.source_views(sources.images, sources.c2w, sources.intrinsics)
        # The read-out prior's part of each source image, once per test phase (the test views share sources).
        cache = prior_images if prior_images is not None else PriorImageCache()
        images = sources.images
        with chunk_threads(workers):
            prior = [
                cache.get(int(view), lambda i=i: network.prior_image(images[i : i + 1]))
                for i, view in enumerate(sources.ids)
            ]
        encoded.keep_prior_images(network, prior)
        return render_image(
            network,
            c2w,
            intrinsics,
            height,
            width,
            encoded,
            scene.depth_range,
            self.sampler,
            chunk_rays,
            stride=stride,
            workers=workers,
            cancelled=cancelled,
            progress=progress,
            peak_weights=peak_weights,
        )

    def test_step(self, batch: ViewBatch, batch_idx: int) -> None:
        scene = self._test_scene()
        settings = self.settings
        network = self._rendering or self.net
        rendered = self.render_view(
            network,
            scene,
            batch.sources,
            batch.c2w,
            batch.intrinsics,
            stride=render_stride(settings.metrics.protocols),
            prior_images=self._prior_images,
        )
        # One render scored by every protocol: each takes its own pixels of it (every 2nd for GNT's), the
        # first protocol's views are the ones kept for the PNGs.
        rendered_stride = render_stride(settings.metrics.protocols)
        for protocol, scorer in self.scorers.items():
            step = scorer.stride // rendered_stride
            rgb, depth = rendered.rgb[::step, ::step], rendered.depth[::step, ::step]
            keep = settings.output.save_images and protocol == settings.metrics.protocol
            self.test_results[protocol].append(scorer(batch.view, rgb, depth, keep))

    def on_test_epoch_end(self) -> None:
        self._rendering = None
        self._prior_images = PriorImageCache()
        by_protocol = self.test_results
        if self.trainer.world_size > 1:
            gathered: list[dict[str, list[ViewResult]]] = [{} for _ in range(self.trainer.world_size)]
            dist.all_gather_object(gathered, by_protocol)
            by_protocol = {protocol: [r for part in gathered for r in part[protocol]] for protocol in by_protocol}
        if not self.trainer.is_global_zero:
            return
        test_time_s = time.perf_counter() - self.test_started  # rendering and scoring the test views
        scene = self._test_scene()
        if self.output_dir is None:
            raise RuntimeError("GNTSystem.prepare_test: set the folder for metrics.json before trainer.test")
        settings = self.settings
        global_step = max(int(self.global_step), self.checkpoint_step)
        trained_under, budget, training = self.training_summary(global_step)
        primary, *extra_protocols = settings.metrics.protocols
        protocol_header = self._protocol_header(primary)
        metric_settings = protocol_header.pop("metric_settings")  # after `factor`, where it always stood
        header = {
            "scene": settings.scene.name,
            "model": settings.model.name,
            "split": "test",
            **protocol_header,
            "factor": scene.factor,
            "metric_settings": metric_settings,
            "n_samples": settings.render.n_samples,
            "num_source_views": settings.data.num_source_views,
            "global_step": global_step,
            "seed": trained_under.seed,
            "budget": budget,
            "training": training,
            "test_time_s": test_time_s,
            **self.training_record(),
        }
        extra = [ProtocolResults(self._protocol_header(p), by_protocol[p]) for p in extra_protocols]
        self.test_document = write_results(
            self.output_dir, header, by_protocol[primary], scene.depth_range, settings.output.save_images, extra
        )
        print(format_tables(self.test_document), flush=True)

    def _protocol_header(self, protocol: str) -> dict:
        """The keys of metrics.json's header that `protocol` decides: its name, LPIPS network, the scored
        pixels' resolution and how the metrics were computed."""
        height, width = self._test_scene().resolution
        stride = protocol_stride(protocol)
        return {
            "protocol": protocol,
            "lpips_net": self.settings.metrics.for_protocol(protocol).lpips_net,
            "resolution": [len(range(0, height, stride)), len(range(0, width, stride))],
            "metric_settings": self.scorers[protocol].metrics.settings,
        }
