"""Training over a collection of scenes (pretraining): weighted scene draws seeded by (seed, rank,
step), a memory-bounded scene cache, one error line per bad collection entry, the held-out scene,
exact resume, zero-shot records in metrics.json, and fine-tuning from a checkpoint (`init_from`)."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY_OVERRIDES, assert_one_error_line, compose_config, run_in_process, train_in_process

from pola_gnt.core.errors import RunStopped, UserError
from pola_gnt.core.files import file_sha256
from pola_gnt.data.collection import CollectionGroup, CollectionScene, TrainingScenes, collection_groups
from pola_gnt.data.datamodule import TrainSteps
from pola_gnt.data.demo_scene import ensure_demo_scene
from pola_gnt.runs.checkpoints import read_checkpoint
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.guards import TrainingGuard

FACTOR = 32  # 126 x 94 demo images


@pytest.fixture(scope="module")
def scene_folders(tmp_path_factory) -> dict[str, Path]:
    """Three LLFF-layout folders (copies of the tiny demo scene under other names) to collect."""
    root = tmp_path_factory.mktemp("collection")
    source = ensure_demo_scene(root / "source", factor=FACTOR)
    folders = {}
    for name in ("alpha", "beta", "gamma"):
        shutil.copytree(source, root / name)
        folders[name] = root / name
    return folders


def folders_override(folders: dict[str, Path], weights: dict[str, float]) -> str:
    entries = ",".join(f"{{path:'{folders[name]}',rig:forward,weight:{weight}}}" for name, weight in weights.items())
    return f"collection.folders=[{entries}]"


def collection_config(folders: dict[str, Path], *overrides: str, weights: dict[str, float] | None = None):
    weights = weights or {"alpha": 1.0, "beta": 1.0}
    return compose_config(
        *TINY_OVERRIDES,
        "collection=procedural10",
        "collection.procedural=null",
        folders_override(folders, weights),
        *overrides,
    )


def fake_scene(name: str) -> CollectionScene:
    return CollectionScene(name=name, path=Path("/nowhere") / name, rig="forward", procedural=None)


def test_scene_draws_follow_the_weights():
    """Folders by their weights, a family's weight shared by its scenes: over 40000 draws every
    frequency is within 4 standard deviations of its probability."""
    family = tuple(fake_scene(f"family{i}") for i in range(4))
    groups = [
        CollectionGroup("a", 1.0, (fake_scene("a"),)),
        CollectionGroup("b", 3.0, (fake_scene("b"),)),
        CollectionGroup("family", 4.0, family),
    ]
    scenes = TrainingScenes(groups, read_run_settings(compose_config()).data)
    draws = 40000
    counts: dict[str, int] = {}
    for step in range(draws):
        name = scenes.draw_scene(np.random.default_rng([0, 0, step])).name
        counts[name] = counts.get(name, 0) + 1
    expected = {"a": 1 / 8, "b": 3 / 8, **{f"family{i}": 1 / 8 for i in range(4)}}
    assert set(counts) == set(expected)
    for name, p in expected.items():
        sigma = np.sqrt(p * (1 - p) / draws)
        assert abs(counts[name] / draws - p) < 4 * sigma, (name, counts[name] / draws, p)


def test_steps_are_a_function_of_seed_rank_and_step(scene_folders):
    """The scene, target, sources and rays of a step are the same whenever it is drawn (resume), and
    the ranks of a DDP run draw differently; both folders are drawn."""
    settings = read_run_settings(collection_config(scene_folders))
    assert settings.collection is not None
    groups = collection_groups(settings.collection, Path("/"))

    def steps(rank: int) -> TrainSteps:
        return TrainSteps(TrainingScenes(groups, settings.data), settings.data, 40, seed=0, rank=rank)

    first, again, other = steps(0), steps(0), steps(1)
    for step in (0, 7, 31):
        a, b = first[step].targets[0], again[step].targets[0]
        assert a.view == b.view and torch.equal(a.rays.origins, b.rays.origins) and torch.equal(a.rgb, b.rgb)
        assert a.sample_seed == b.sample_seed
    assert any(
        not torch.equal(first[s].targets[0].rays.directions, other[s].targets[0].rays.directions) for s in range(5)
    )
    scenes = {first.scenes.draw(np.random.default_rng([0, 0, s])).name for s in range(40)}
    assert scenes == {"alpha", "beta"}


def test_the_cache_holds_at_most_its_bound(scene_folders):
    """One demo copy holds 20 x 94 x 126 x 3 float32 = 2.7 MB: a 4 MB cache keeps one scene at a time
    (each switch reloads), a large one keeps all three (each loaded once)."""
    weights = {"alpha": 1.0, "beta": 1.0, "gamma": 1.0}
    for cache_mb, most, loads in ((4, 1, None), (100, 3, 3)):
        settings = read_run_settings(collection_config(scene_folders, f"data.cache_mb={cache_mb}", weights=weights))
        assert settings.collection is not None
        scenes = TrainingScenes(collection_groups(settings.collection, Path("/")), settings.data)
        for step in range(30):
            scenes.draw(np.random.default_rng([0, 0, step]))
            assert len(scenes.cache) <= most and scenes.cached_mb() <= max(cache_mb, 2.8)
        assert len(scenes.cache) == most
        if loads is not None:
            assert scenes.loads == loads
        else:
            assert scenes.loads > 3


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("missing", "collection.folders[1].path"),
        ("empty", "has no scenes"),
        ("negative", "collection.folders[0].weight: must be a number >= 0"),
        ("held_out", "the scene this run validates and tests on"),
    ],
)
def test_bad_collection_entries_are_one_error_line(scene_folders, tmp_path, case, fragment):
    overrides = {
        "missing": [folders_override({**scene_folders, "beta": tmp_path / "nowhere"}, {"alpha": 1, "beta": 1})],
        "empty": ["collection.folders=[]"],
        "negative": [folders_override(scene_folders, {"alpha": -1.0, "beta": 1.0})],
        # scene=llff scene.path=<alpha>: the validation scene is itself in the collection
        "held_out": [
            folders_override(scene_folders, {"alpha": 1, "beta": 1}),
            "scene=llff",
            f"scene.path={scene_folders['alpha']}",
        ],
    }[case]
    result = run_in_process(
        "train",
        *TINY_OVERRIDES,
        "collection=procedural10",
        "collection.procedural=null",
        *overrides,
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert_one_error_line(result, fragment)


RESUME_OVERRIDES = ["seed=3", "trainer.max_steps=6", "trainer.val_check_interval=3"]


def metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.fixture(scope="module")
def pretrained_run(scene_folders, tmp_path_factory) -> Path:
    """A tiny pretraining run over two folders, validated and tested on the demo scene (held out)."""
    run_dir = tmp_path_factory.mktemp("pretrained")
    train_in_process(collection_config(scene_folders, *RESUME_OVERRIDES), run_dir)
    return run_dir


def test_pretraining_killed_and_resumed_equals_the_uninterrupted_run(
    scene_folders, pretrained_run, tmp_path, monkeypatch
):
    original = TrainingGuard.on_train_batch_start

    def stop_at_step_4(self, trainer, *args, **kwargs):
        if trainer.global_step == 4:
            signal.raise_signal(signal.SIGTERM)
        return original(self, trainer, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(TrainingGuard, "on_train_batch_start", stop_at_step_4)
        with pytest.raises(RunStopped):
            train_in_process(collection_config(scene_folders, *RESUME_OVERRIDES), tmp_path)
    train_in_process(collection_config(scene_folders, *RESUME_OVERRIDES, "ckpt_path=last"), tmp_path)
    first, second = metrics(pretrained_run), metrics(tmp_path)
    assert second["global_step"] == first["global_step"] == 6
    assert second["mean"] == first["mean"] and second["per_image"] == first["per_image"]


def test_zero_shot_records_say_what_the_weights_saw(pretrained_run, tmp_path):
    """The pretraining run's own test and `eval` of its checkpoint on the held-out scene are zero-shot:
    the training scenes are the collection's, the scored scene is not among them."""
    document = metrics(pretrained_run)
    assert document["mode"] == "zero-shot" and document["seen_in_training"] is False
    assert document["training_scenes"] == ["alpha", "beta"] and document["init_from"] is None
    checkpoint = pretrained_run / "checkpoints" / "last.ckpt"
    result = run_in_process("eval", f"ckpt_path={checkpoint}", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    evaluated = metrics(tmp_path)
    assert evaluated["mode"] == "zero-shot" and evaluated["training_scenes"] == ["alpha", "beta"]
    assert evaluated["mean"] == document["mean"]


def test_finetuning_starts_from_the_weights_only(pretrained_run, tmp_path):
    """`init_from` loads the network's weights (a fresh optimiser and schedule: step 0) and records the
    file and its sha256; the fine-tuned run's scenes are the pretraining's plus its own."""
    checkpoint = pretrained_run / "checkpoints" / "last.ckpt"
    cfg = compose_config(
        *TINY_OVERRIDES,
        "experiment=finetune",
        *TINY_OVERRIDES,
        f"init_from={checkpoint}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=1",
    )
    document = train_in_process(cfg, tmp_path)
    assert document is not None and document["global_step"] == 2
    assert document["mode"] == "fine-tuned"
    assert document["init_from"]["sha256"] == file_sha256(checkpoint)
    assert document["init_from"]["global_step"] == 6 and document["init_from"]["training_scenes"] == ["alpha", "beta"]
    assert document["training_scenes"] == ["alpha", "beta", "demo"] and document["seen_in_training"] is True
    tuned = read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert tuned["global_step"] == 2  # not the pretraining's 6: weights only


def test_finetuning_loads_exactly_the_checkpoint_weights(pretrained_run):
    from helpers import system_of

    from pola_gnt.runs.config.stored import initial_weights

    checkpoint = pretrained_run / "checkpoints" / "last.ckpt"
    cfg = compose_config(*TINY_OVERRIDES, f"init_from={checkpoint}")
    system = system_of(cfg)
    system.start_from(
        initial_weights(str(checkpoint), dict(read_checkpoint(checkpoint)["hyper_parameters"]["config"]), Path("."))
    )
    stored = read_checkpoint(checkpoint)["state_dict"]
    assert all(torch.equal(value, stored[name]) for name, value in system.state_dict().items())


def test_finetuning_another_model_or_size_is_one_error_line(pretrained_run, tmp_path):
    checkpoint = pretrained_run / "checkpoints" / "last.ckpt"
    base = [
        *TINY_OVERRIDES,
        "experiment=finetune",
        *TINY_OVERRIDES,
        f"init_from={checkpoint}",
        f"hydra.run.dir={tmp_path}",
    ]
    assert_one_error_line(run_in_process("train", *base, "model=gnt"), "model 'pola_gnt'")
    assert_one_error_line(run_in_process("train", *base, "model.net.width=32"), "model.net.width=16")
    assert_one_error_line(run_in_process("train", *base[:-2], f"hydra.run.dir={tmp_path}"), "experiment=finetune")
    assert_one_error_line(
        run_in_process("train", *base[:-2], "init_from=pretrained:nothing", f"hydra.run.dir={tmp_path}"),
        "pretrained:nothing",
    )


def test_a_collection_folder_must_hold_enough_views(scene_folders):
    settings = read_run_settings(collection_config(scene_folders, "data.num_source_views=25"))
    assert settings.collection is not None
    scenes = TrainingScenes(collection_groups(settings.collection, Path("/")), settings.data)
    with pytest.raises(UserError, match=r"collection.folders\[\d\].path: .* has 20 views, fewer than"):
        scenes.draw(np.random.default_rng([0, 0, 0]))


@pytest.mark.slow
def test_ddp_two_processes_over_a_collection(scene_folders, tmp_path):
    """Lightning's DDP (gloo, 2 CPU processes) pretrains over a collection, each rank drawing its own
    scenes, and tests on the held-out scene."""
    from helpers import run_module

    result = run_module(
        "train",
        *TINY_OVERRIDES,
        "collection=procedural10",
        "collection.procedural=null",
        folders_override(scene_folders, {"alpha": 1.0, "beta": 1.0, "gamma": 1.0}),
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=32-true",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        f"hydra.run.dir={tmp_path}",
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    document = metrics(tmp_path)
    assert document["global_step"] == 4 and document["mode"] == "zero-shot"
    assert document["training_scenes"] == ["alpha", "beta", "gamma"] and len(document["per_image"]) == 3


def test_object_rigs_choose_sources_by_viewing_direction():
    """Cameras around an object: a far camera looking from nearly the target's direction is a better
    source than a near one seen from 90 degrees away. Forward rigs keep the nearest centres."""
    from pola_gnt.data.source_views import nearest_views, selection_points
    from pola_gnt.geometry.cameras import look_at

    angles = torch.tensor([0.0, 10.0, 90.0]).deg2rad()
    radii = torch.tensor([1.0, 5.0, 1.2])
    positions = torch.stack([radii * torch.cos(angles), torch.zeros(3), radii * torch.sin(angles)], dim=-1).double()
    c2w = look_at(positions, torch.zeros(3, 3, dtype=torch.float64), torch.tensor([0.0, 1.0, 0.0]).double())
    by_direction = selection_points(c2w, "object")
    by_centre = selection_points(c2w, "forward")
    assert nearest_views(by_direction[0], by_direction, [1, 2], 1) == [1]
    assert nearest_views(by_centre[0], by_centre, [1, 2], 1) == [2]
    assert torch.allclose(by_direction.norm(dim=-1), torch.ones(3, dtype=torch.float64))


def test_generated_scenes_are_drawn_and_loaded_with_their_rig():
    """A family of 2 generated scenes (factor 32): drawn by the steps, generated on first use, loaded
    with every view a training view and the rig the generator chose."""
    from pola_gnt.data.procedural import procedural_rig

    settings = read_run_settings(
        compose_config(*TINY_OVERRIDES, "collection=procedural10", "collection.procedural.count=2")
    )
    assert settings.collection is not None
    groups = collection_groups(settings.collection, Path("/"))
    scenes = TrainingScenes(groups, settings.data)
    assert scenes.names == ["procedural-0-0000", "procedural-0-0001"]
    steps = TrainSteps(scenes, settings.data, 6, seed=0, rank=0)
    for step in range(6):
        batch = steps[step].targets[0]
        assert batch.rgb.shape == (settings.data.rays_per_step, 3) and torch.isfinite(batch.rays.origins).all()
    for item in groups[0].scenes:
        if item in scenes.cache:
            scene = scenes.cache[item]
            assert scene.rig == procedural_rig(0, int(item.name[-4:])) and scene.test_ids == []
            assert len(scene.train_ids) == len(scene.image_names) >= 20
    assert len(scenes.cache) >= 1
