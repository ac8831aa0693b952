"""Training: config composition, one-step runs per model, overfitting, exact resume, DDP, bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    TINY_OVERRIDES,
    TINY_RUN_OVERRIDES,
    assert_one_error_line,
    compose_config,
    read_metrics,
    run_in_process,
    run_module,
    scene_and_data,
    system_of,
    train_in_process,
)
from lightning_fabric.utilities.apply_func import move_data_to_device
from lightning_utilities.core.apply_func import apply_to_collection

from pola_gnt.data.batches import RayBatch, TrainingBatch
from pola_gnt.data.datamodule import TrainSteps
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.evaluation.image_metrics import mse_to_psnr
from pola_gnt.geometry.rays import Rays
from pola_gnt.runs.config.read import read_run_settings


@pytest.mark.parametrize("experiment", ["quick", "paper"])
@pytest.mark.parametrize("model", ["pola_gnt", "gnt"])
def test_real_configs_compose(model, experiment):
    cfg = compose_config(f"model={model}", f"experiment={experiment}")
    assert cfg.model.name == model
    if experiment == "paper":  # GNT's published single-scene setting
        assert (cfg.data.factor, cfg.data.num_source_views, cfg.render.n_samples) == (4, 10, 192)
        assert (cfg.data.targets_per_step, cfg.data.rays_per_step, cfg.trainer.max_steps) == (8, 512, 250000)
        assert cfg.model.net.width == 64 and cfg.model.net.n_blocks == 4
    expected = {"pola_gnt": ("pola", "pola"), "gnt": ("subtraction", "softmax")}[model]
    assert (cfg.model.net.view_attention, cfg.model.net.ray_attention) == expected
    # The two models differ in their attention only.
    other = compose_config(f"model={'gnt' if model == 'pola_gnt' else 'pola_gnt'}", f"experiment={experiment}")
    differing = {k for k in cfg.model.net if cfg.model.net[k] != other.model.net[k]}
    assert differing <= {"view_attention", "ray_attention", "ray_lepe"}


@pytest.mark.parametrize("model", ["pola_gnt", "gnt"])
def test_one_step_run_per_model(model, tmp_path):
    cfg = compose_config(f"model={model}", *TINY_OVERRIDES, "trainer.fast_dev_run=1")
    document = train_in_process(cfg, tmp_path)
    assert document["model"] == model and len(document["per_image"]) == 1  # fast_dev_run: one test batch
    assert all(isinstance(document["mean"][k], float) for k in ("psnr", "ssim"))
    assert (tmp_path / "metrics.json").is_file() and (tmp_path / "metrics.csv").is_file()


@pytest.mark.parametrize("model", ["pola_gnt", "gnt"])
def test_overfit_one_batch(model):
    """The loss falls and PSNR rises far above the untrained model's on a fixed batch."""
    torch.manual_seed(0)
    cfg = compose_config(f"model={model}", *TINY_OVERRIDES, "data.rays_per_step=256")
    scene = load_scene(*scene_and_data(cfg))
    batch = TrainSteps(scene, read_run_settings(cfg).data, n_steps=1, seed=0, rank=0)[0].targets[0]
    system = system_of(cfg)
    optimizer = system.configure_optimizers()["optimizer"]
    losses = []
    for _ in range(60):  # measured +13 dB for either model at 60 steps (+16-18 dB at 120)
        output = system.render_batch(batch)
        loss = F.mse_loss(output.rgb, batch.rgb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    start, end = mse_to_psnr(torch.tensor(losses[0])), mse_to_psnr(torch.tensor(min(losses[-10:])))
    assert end > start + 8.0, (start, end)


def test_ranks_and_steps_draw_different_rays():
    cfg = compose_config(*TINY_OVERRIDES)
    scene = load_scene(*scene_and_data(cfg))
    steps = {rank: TrainSteps(scene, read_run_settings(cfg).data, 10, seed=0, rank=rank) for rank in (0, 1)}
    rank_0, rank_1 = steps[0][3].targets[0].rays, steps[1][3].targets[0].rays
    assert not torch.equal(rank_0.origins + rank_0.directions, rank_1.origins + rank_1.directions)
    assert not torch.equal(steps[0][3].targets[0].rgb, steps[0][4].targets[0].rgb)
    again = TrainSteps(scene, read_run_settings(cfg).data, 10, seed=0, rank=1)[5].targets[
        0
    ]  # a step's batch is reproducible
    assert (
        torch.equal(steps[1][5].targets[0].rgb, again.rgb) and steps[1][5].targets[0].sample_seed == again.sample_seed
    )
    assert (
        len({steps[rank][step].targets[0].sample_seed for rank in (0, 1) for step in (3, 4)}) == 4
    )  # the model's jitter too


def test_lightning_moves_every_tensor_of_a_typed_batch():
    """Lightning's device transfer walks the batch dataclasses, the `Rays`, the sources and the rays' patch
    grid included (Lightning rebuilds every dataclass of a batch field by field: a frozen one fails)."""
    cfg = compose_config(*TINY_OVERRIDES, "data.crop=[40,60]", "data.ray_patch_size=4")
    scene = load_scene(*scene_and_data(cfg))
    step = TrainSteps(scene, read_run_settings(cfg).data, 2, seed=0, rank=0)[1]
    moved_step = apply_to_collection(step, torch.Tensor, lambda tensor: tensor.double())
    assert isinstance(moved_step, TrainingBatch) and moved_step.step == 1
    batch, moved = step.targets[0], moved_step.targets[0]
    tensors = {
        "rays.origins": moved.rays.origins,
        "rays.directions": moved.rays.directions,
        "rgb": moved.rgb,
        "sources.images": moved.sources.images,
        "sources.c2w": moved.sources.c2w,
        "sources.intrinsics": moved.sources.intrinsics,
    }
    assert all(t.dtype == torch.float64 for t in tensors.values()), {k: t.dtype for k, t in tensors.items()}
    assert isinstance(moved, RayBatch) and isinstance(moved.rays, Rays) and moved.step == 1
    assert batch.grid is not None and moved.grid == batch.grid
    assert batch.rays.origins.dtype == torch.float32  # the loader's batch is left as it was
    assert move_data_to_device(batch, torch.device("cpu")).rays.origins.data_ptr() == batch.rays.origins.data_ptr()
    assert batch.sources.images.shape[-2:] == (40, 60)  # the crop applies to the sources in their dataclass


def test_resume_matches_uninterrupted_run(tmp_path, tiny_runs):
    """3 steps, then resumed to 6: the metrics of the uninterrupted 6-step run (the session's tiny run,
    whose command this is but for `trainer.max_steps`)."""
    common = ["model=pola_gnt", *(o for o in TINY_RUN_OVERRIDES if not o.startswith("trainer.max_steps="))]
    straight, resumed = tiny_runs["pola_gnt"], tmp_path / "resumed"
    result = run_in_process("train", *common, "trainer.max_steps=3", f"hydra.run.dir={resumed}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_metrics(resumed)["global_step"] == 3
    result = run_in_process("train", *common, "trainer.max_steps=6", "ckpt_path=last", f"hydra.run.dir={resumed}")
    assert result.returncode == 0, result.stderr[-2000:]
    first, second = read_metrics(straight), read_metrics(resumed)
    assert second["global_step"] == first["global_step"] == 6
    assert second["mean"] == first["mean"] and second["per_image"] == first["per_image"]
    assert (resumed / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("model.net.view_attention=dot", "model.net.view_attention"),
        ("metrics.protocol=nerf", "metrics.protocol"),
        ("data.rays_per_step=0", "data.rays_per_step"),
        ("render.n_samples=1", "render.n_samples"),
    ],
)
def test_unknown_config_value_is_one_error_line(override, fragment, tmp_path):
    assert_one_error_line(run_in_process("train", override, f"hydra.run.dir={tmp_path}"), fragment)


def test_resume_without_checkpoint_and_from_other_model(tmp_path, tiny_runs):
    assert_one_error_line(run_in_process("train", "ckpt_path=last", f"hydra.run.dir={tmp_path}"), "last.ckpt")
    gnt_checkpoint = tiny_runs["gnt"] / "checkpoints" / "last.ckpt"
    result = run_in_process(
        "train", "model=pola_gnt", *TINY_OVERRIDES, f"ckpt_path={gnt_checkpoint}", f"hydra.run.dir={tmp_path}"
    )
    assert_one_error_line(result, "gnt")
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"\x00" * 100)
    assert_one_error_line(run_in_process("train", f"ckpt_path={corrupt}", f"hydra.run.dir={tmp_path}"), "corrupt.ckpt")


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path):
    """Lightning's DDP (gloo) with 2 processes on the CPU trains a few steps and tests; each rank's
    test views, scored by both protocols, are gathered whole on rank 0."""
    result = run_module(
        "train",
        *TINY_OVERRIDES,
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=32-true",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "metrics.extra_protocols=[gnt]",
        f"hydra.run.dir={tmp_path}",
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    document = read_metrics(tmp_path)
    assert document["global_step"] == 4 and len(document["per_image"]) == 3
    assert [row["index"] for row in document["protocols"]["gnt"]["per_image"]] == [0, 8, 16]


def test_model_compile_compiles_the_network_in_place():
    """`model.compile=true` wraps the network in torch.compile without renaming its parameters, so
    checkpoints load into an eager or a compiled network alike (the compilation itself happens on the
    first call: `test_compiled_network_matches_eager`, slow)."""
    eager = system_of(compose_config(*TINY_OVERRIDES))
    compiled = system_of(compose_config(*TINY_OVERRIDES, "model.compile=true"))
    assert compiled.net._compiled_call_impl is not None and eager.net._compiled_call_impl is None
    assert compiled.state_dict().keys() == eager.state_dict().keys()


@pytest.mark.slow
def test_compiled_network_matches_eager():
    """The compiled Pola-GNT network (the fused CPU kernels traced through their fake implementations)
    gives the eager network's colours and gradients on a training batch. Minutes: the compilation."""
    cfg = compose_config(*cfg_overrides(False))
    scene = load_scene(*scene_and_data(cfg))
    batch = TrainSteps(scene, read_run_settings(cfg).data, n_steps=1, seed=0, rank=0)[0].targets[0]
    results = []
    for compile_network in (False, True):
        torch.manual_seed(0)
        system = system_of(compose_config(*cfg_overrides(compile_network)))
        output = system.render_batch(batch)
        F.mse_loss(output.rgb, batch.rgb).backward()
        results.append((output.rgb.detach(), {n: p.grad for n, p in system.named_parameters() if p.grad is not None}))
    (eager_rgb, eager_grads), (compiled_rgb, compiled_grads) = results
    torch.testing.assert_close(compiled_rgb, eager_rgb, rtol=1e-4, atol=1e-5)
    assert compiled_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-3, atol=1e-5, msg=name)


def cfg_overrides(compile_network: bool) -> list[str]:
    return [*TINY_OVERRIDES, "data.rays_per_step=128", f"model.compile={str(compile_network).lower()}"]
