"""`pola_gnt.eval`: reproduces a training run's metrics from its checkpoint, the GNT protocol, the
checkpoint config + command-line keys, and bad checkpoints as one `error:` line."""

from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import pytest
import torch
from helpers import (
    CONFIG_DIR,
    TINY_OVERRIDES,
    assert_one_error_line,
    compose_config,
    read_metrics,
    run_in_process,
    run_module,
)

from pola_gnt.apps.evaluation import evaluate
from pola_gnt.apps.trained_runs import load_trained_checkpoint
from pola_gnt.core.errors import UserError
from pola_gnt.runs.checkpoints import read_checkpoint
from pola_gnt.runs.config.stored import run_config_with_overrides, stored_run_config, trained_run_config

METRICS = ("psnr", "ssim", "lpips")


def last_checkpoint(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(
    "model, overrides, child",
    [
        # The training command's keys, all equal to the checkpoint's; as a user runs it (a child process).
        ("pola_gnt", ["model=pola_gnt", *TINY_OVERRIDES], True),
        # Nothing but the checkpoint: its stored config decides everything (the command's `main`, in this process).
        ("gnt", [], False),
    ],
)
def test_eval_reproduces_the_training_metrics(tiny_runs, tmp_path, model, overrides, child):
    run_dir = tiny_runs[model]
    trained = read_metrics(run_dir)
    checkpoint = last_checkpoint(run_dir)
    saved_step = torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"]
    assert saved_step == trained["global_step"], (
        f"{checkpoint} holds step {saved_step} but the run tested step {trained['global_step']}: "
        "training must save last.ckpt with its final weights"
    )
    result = (run_module if child else run_in_process)(
        "eval", *overrides, f"ckpt_path={checkpoint}", f"hydra.run.dir={tmp_path}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = read_metrics(tmp_path)
    keys = ("scene", "model", "protocol", "lpips_net", "resolution", "global_step", "metric_settings", "seed", "budget")
    for key in (*keys, "depth_baseline"):
        assert evaluated[key] == trained[key], key
    # The training record comes from the checkpoint (its config and Lightning's Timer state): the
    # time when last.ckpt was written, just before training ended.
    training, from_checkpoint = trained["training"], evaluated["training"]
    assert training["stopped_by"] == from_checkpoint["stopped_by"] == "max_steps"
    assert training["steps"] == from_checkpoint["steps"] == 6
    assert 0 < from_checkpoint["wall_time_s"] <= training["wall_time_s"]
    assert evaluated["mean"] == trained["mean"]
    assert evaluated["baseline"] == trained["baseline"]
    assert evaluated["per_image"] == trained["per_image"]
    assert (tmp_path / "metrics.csv").read_text() == (run_dir / "metrics.csv").read_text()
    assert "baseline (nearest view)" in result.stdout  # the table is printed
    for kind in ("pred", "gt", "error", "depth", "depth_exact"):
        assert (tmp_path / "test_views" / f"image000_{kind}.png").is_file()


def test_gnt_protocol_is_labelled_and_scores_every_second_pixel(tiny_runs, tmp_path):
    checkpoint = last_checkpoint(tiny_runs["pola_gnt"])
    overrides = ["metrics.protocol=gnt", f"ckpt_path={checkpoint}"]
    document = evaluate(trained_run_config(compose_config(*overrides), tmp_path, overrides), tmp_path)
    stored = stored_run_config(read_checkpoint(checkpoint), checkpoint)
    assert document["protocol"] == "gnt"
    assert document["lpips_net"] == "vgg"  # GNT's network when lpips_net is not given
    assert document["metric_settings"]["ssim_padding"] == "same"
    assert "GNT" in document["metric_settings"]["lpips_input_range"]
    assert document["metric_settings"]["quantize_8bit"] is False  # GNT scored the unquantised predictions
    assert document["resolution"] == [47, 63]  # the 94 x 126 test images, every 2nd pixel
    assert len(document["per_image"]) == 3 and document["n_samples"] == stored.render.n_samples
    assert iio.imread(tmp_path / "test_views" / "image000_pred.png").shape == (47, 63, 3)
    assert read_metrics(tmp_path)["protocol"] == "gnt"


def test_explicit_lpips_net_wins_over_the_gnt_protocol_default(tiny_runs, tmp_path):
    checkpoint = last_checkpoint(tiny_runs["pola_gnt"])
    overrides = ["metrics.protocol=gnt", "metrics.lpips_net=alex", f"ckpt_path={checkpoint}"]
    trained = load_trained_checkpoint(trained_run_config(compose_config(*overrides), tmp_path, overrides))
    assert (trained.settings.metrics.protocol, trained.settings.metrics.lpips_net) == ("gnt", "alex")


def _run_config(checkpoint: Path, *overrides: str):
    """The config `eval` would use for `checkpoint` with these command-line overrides."""
    overrides = [*overrides, f"ckpt_path={checkpoint}"]
    stored = stored_run_config(read_checkpoint(checkpoint), checkpoint)
    return run_config_with_overrides(checkpoint, stored, compose_config(*overrides), overrides, Path(CONFIG_DIR))


def test_run_config_is_the_checkpoints_plus_explicit_keys(tiny_runs):
    checkpoint = last_checkpoint(tiny_runs["pola_gnt"])
    stored = stored_run_config(read_checkpoint(checkpoint), checkpoint)
    plain = _run_config(checkpoint)
    for section in ("data", "metrics", "model", "scene", "optim"):
        assert plain[section] == stored[section], section
    # The run's samples per ray; the rays per pass, memory and render precision are the machine's.
    assert plain.render.n_samples == stored.render.n_samples
    for key in ("chunk_rays", "max_memory_mb", "precision"):
        assert plain.render[key] == compose_config().render[key], key
    # The trainer is the command line's (accelerator of this machine), never the checkpoint's.
    assert plain.trainer.max_steps == compose_config().trainer.max_steps != stored.trainer.max_steps
    changed = _run_config(
        checkpoint,
        "data.factor=16",
        "render.chunk_rays=123",
        "metrics.quantize_8bit=false",
        "scene=fern",
        "trainer.precision=bf16-mixed",
    )
    assert (changed.data.factor, changed.render.chunk_rays, changed.metrics.quantize_8bit) == (16, 123, False)
    assert changed.scene.name == "fern" and changed.trainer.precision == "bf16-mixed"
    assert changed.data.num_source_views == stored.data.num_source_views  # not given: the checkpoint's
    assert changed.render.n_samples == stored.render.n_samples


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["model=gnt"], "'pola_gnt'"),
        (["model.net.width=32"], "model.net.width=16 (asked 32)"),
        (["experiment=quick"], "model.net.width"),  # the quick preset's network is not the tiny one
    ],
)
def test_run_config_refuses_another_network(tiny_runs, overrides, fragment):
    checkpoint = last_checkpoint(tiny_runs["pola_gnt"])
    with pytest.raises(UserError, match=str(checkpoint)) as error:
        _run_config(checkpoint, *overrides)
    assert fragment in str(error.value)


def test_a_checkpoint_renders_under_another_weightless_read_out_setting(tiny_runs):
    """The views' angle weighting and the number of feature directions have no parameters: a trained
    checkpoint evaluates under the values the command line gives (not the stored ones), and a value
    the checkpoint's network cannot take is still one error line."""
    checkpoint = last_checkpoint(tiny_runs["pola_gnt"])
    stored = stored_run_config(read_checkpoint(checkpoint), checkpoint)
    assert (stored.model.net.readout_view_angle_weighting, stored.model.net.readout_consistency_feature_dims) == (0, 0)
    changed = _run_config(
        checkpoint, "model.net.readout_view_angle_weighting=0.25", "model.net.readout_consistency_feature_dims=16"
    )
    assert changed.model.net.readout_view_angle_weighting == 0.25
    assert changed.model.net.readout_consistency_feature_dims == 16
    trained = trained_run_config(
        compose_config(f"ckpt_path={checkpoint}", "model.net.readout_view_angle_weighting=0.25"),
        checkpoint.parent,
        [f"ckpt_path={checkpoint}", "model.net.readout_view_angle_weighting=0.25"],
    )
    assert trained.settings.model.net.readout_view_angle_weighting == 0.25
    bad = [f"ckpt_path={checkpoint}", "model.net.readout_view_angle_weighting=-1"]
    with pytest.raises(UserError, match="model.net.readout_view_angle_weighting"):
        trained_run_config(compose_config(*bad), checkpoint.parent, bad)


def test_bad_checkpoints_are_one_error_line(tiny_runs, tmp_path):
    pola_checkpoint = last_checkpoint(tiny_runs["pola_gnt"])
    result = run_in_process("eval", "model=gnt", f"ckpt_path={pola_checkpoint}", f"hydra.run.dir={tmp_path / 'other'}")
    assert_one_error_line(result, str(pola_checkpoint))
    assert "pola_gnt" in result.stderr and "gnt" in result.stderr
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"PK\x03\x04 not a checkpoint" * 10)
    assert_one_error_line(
        run_in_process("eval", f"ckpt_path={corrupt}", f"hydra.run.dir={tmp_path / 'corrupt'}"), str(corrupt)
    )
    assert not (tmp_path / "other" / "metrics.json").exists()


def test_eval_needs_a_checkpoint(tmp_path):
    with pytest.raises(UserError, match="ckpt_path: required"):
        evaluate(trained_run_config(compose_config(), tmp_path, []), tmp_path)
    with pytest.raises(UserError, match="ckpt_path=last"):  # `last` means a run folder's checkpoint
        evaluate(trained_run_config(compose_config("ckpt_path=last"), tmp_path, ["ckpt_path=last"]), tmp_path)
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"lr": 0.1}}, foreign)
    with pytest.raises(UserError, match="not a Pola-GNT checkpoint"):
        overrides = [f"ckpt_path={foreign}"]
        evaluate(trained_run_config(compose_config(*overrides), tmp_path, overrides), tmp_path)


def test_extra_protocols_score_one_render_by_each(tiny_runs, tmp_path):
    """`metrics.extra_protocols=[gnt]`: one full render, scored by the standard protocol (the file's
    top-level keys, as before) and by GNT's (its every 2nd pixel, under `protocols`): each equal to
    a run of that protocol alone, which renders only its own pixels."""
    checkpoint = last_checkpoint(tiny_runs["pola_gnt"])
    overrides = [f"ckpt_path={checkpoint}", "metrics.extra_protocols=[gnt]"]
    both = evaluate(trained_run_config(compose_config(*overrides), tmp_path / "both", overrides), tmp_path / "both")
    assert both is not None and set(both["protocols"]) == {"standard", "gnt"}
    trained = read_metrics(tiny_runs["pola_gnt"])  # the training run's test phase: standard alone
    for key in ("protocol", "lpips_net", "resolution", "metric_settings", "mean", "baseline", "per_image"):
        assert both[key] == trained[key] == both["protocols"]["standard"][key], key
    gnt_overrides = [f"ckpt_path={checkpoint}", "metrics.protocol=gnt"]
    gnt = evaluate(
        trained_run_config(compose_config(*gnt_overrides), tmp_path / "gnt", gnt_overrides), tmp_path / "gnt"
    )
    assert gnt is not None
    for key in ("lpips_net", "resolution", "metric_settings", "mean", "baseline", "per_image"):
        assert both["protocols"]["gnt"][key] == gnt[key], key
    assert (tmp_path / "both" / "metrics_gnt.csv").read_text() == (tmp_path / "gnt" / "metrics.csv").read_text()
    assert iio.imread(tmp_path / "both" / "test_views" / "image000_pred.png").shape == (94, 126, 3)  # full size
