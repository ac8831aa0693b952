"""Training over a collection of scenes (pretraining): weighted scene draws seeded by (seed, rank,
step), a memory-bounded scene cache, one error line per bad collection entry, the held-out scene,
exact resume, zero-shot records in metrics.json, fine-tuning from a checkpoint (`init_from`), and
collection folders of every real kind (LLFF, NeRF Blender, transforms.json; `auto` from the files)."""

from __future__ import annotations

import json
import math
import shutil
import signal
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from helpers import (
    TINY_OVERRIDES,
    assert_one_error_line,
    compose_config,
    read_metrics,
    run_in_process,
    train_in_process,
)

from pola_gnt.core.errors import RunStopped, UserError
from pola_gnt.core.files import file_sha256
from pola_gnt.data.collection import CollectionGroup, CollectionScene, TrainingScenes, collection_groups
from pola_gnt.data.datamodule import TrainSteps
from pola_gnt.data.demo_scene import ensure_demo_scene
from pola_gnt.data.llff import load_llff_scene, read_poses_bounds
from pola_gnt.data.scene_loading import data_root
from pola_gnt.data.settings import CollectionFolder, CollectionSettings
from pola_gnt.data.transforms_json import opengl_to_opencv
from pola_gnt.geometry.cameras import llff_to_opencv, look_at
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


def folders_override(
    folders: dict[str, Path], weights: dict[str, float], kinds: dict[str, str] | None = None, rig: str = "forward"
) -> str:
    """`collection.folders=[...]`: the named folders with these weights (and kinds; a folder without one
    has no `kind` key, as in the collections written before kinds: auto)."""
    kinds = kinds or {}
    entries = ",".join(
        f"{{path:'{folders[name]}',{f'kind:{kinds[name]},' if name in kinds else ''}rig:{rig},weight:{weight}}}"
        for name, weight in weights.items()
    )
    return f"collection.folders=[{entries}]"


def collection_config(
    folders: dict[str, Path],
    *overrides: str,
    weights: dict[str, float] | None = None,
    kinds: dict[str, str] | None = None,
):
    weights = weights or {"alpha": 1.0, "beta": 1.0}
    return compose_config(
        *TINY_OVERRIDES,
        "collection=procedural10",
        "collection.procedural=null",
        folders_override(folders, weights, kinds),
        *overrides,
    )


def fake_scene(name: str) -> CollectionScene:
    return CollectionScene(name=name, path=Path("/nowhere") / name, kind="llff", rig="forward", procedural=None)


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
    "case, fragments",
    [
        ("missing", ["collection.folders[1].path"]),
        ("empty", ["has no scenes"]),
        ("negative", ["collection.folders[0].weight: must be a number >= 0"]),
        ("held_out", ["the scene this run validates and tests on"]),
        ("unknown_kind", ["collection.folders[0].kind: unknown value 'colmap'", "auto, llff, blender, transforms"]),
        ("no_scene_files", ["collection.folders[1].path: ", "no scene files", "poses_bounds.npy"]),
        ("wrong_kind", ["collection.folders[0].path: ", "no transforms_train.json", "kind: blender"]),
        ("same_name", ["collection.folders[1].path: ", "scene name 'alpha'", "collection.folders[0].path"]),
    ],
)
def test_bad_collection_entries_are_one_error_line(scene_folders, tmp_path, case, fragments):
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "alpha").symlink_to(scene_folders["alpha"], target_is_directory=True)
    both = {"alpha": 1, "beta": 1}
    overrides = {
        "missing": [folders_override({**scene_folders, "beta": tmp_path / "nowhere"}, both)],
        "empty": ["collection.folders=[]"],
        "negative": [folders_override(scene_folders, {"alpha": -1.0, "beta": 1.0})],
        # scene=llff scene.path=<alpha>: the validation scene is itself in the collection
        "held_out": [
            folders_override(scene_folders, {"alpha": 1, "beta": 1}),
            "scene=llff",
            f"scene.path={scene_folders['alpha']}",
        ],
        "unknown_kind": [folders_override(scene_folders, both, kinds={"alpha": "colmap"})],
        "no_scene_files": [folders_override({**scene_folders, "beta": tmp_path / "empty"}, both)],
        "wrong_kind": [folders_override(scene_folders, both, kinds={"alpha": "blender"})],
        # two folders that resolve to one name (here: a link to alpha, and alpha)
        "same_name": [folders_override({"alpha": scene_folders["alpha"], "beta": tmp_path / "other" / "alpha"}, both)],
    }[case]
    result = run_in_process(
        "train",
        *TINY_OVERRIDES,
        "collection=procedural10",
        "collection.procedural=null",
        *overrides,
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert_one_error_line(result, *fragments)


# ---- real scenes of every kind ---------------------------------------------------------------------------

BLENDER_SIZE = 50  # px: data.synthetic_factor=16 reads the frames as stored


def write_blender_scene(folder: Path, counts: dict[str, int] | None = None) -> None:
    """A NeRF Blender scene of random RGBA frames, its cameras on a ring 4.5 units around the origin
    looking at it, in the train, val and test splits (`counts` frames each)."""
    counts = counts or {"train": 6, "val": 2, "test": 3}
    total = sum(counts.values())
    angles = torch.linspace(0, 2 * math.pi, total + 1)[:-1].double()
    centres = torch.stack([4 * angles.cos(), 4 * angles.sin(), torch.full_like(angles, 2.0)], -1)
    down = torch.tensor([0.0, 0.0, -1.0], dtype=torch.float64)
    # OpenCV cameras -> Blender's OpenGL axes (the same negation)
    c2w = opengl_to_opencv(look_at(centres, torch.zeros(3, dtype=torch.float64), down).numpy())
    rng = np.random.default_rng(0)
    first = 0
    for split, count in counts.items():
        (folder / split).mkdir(parents=True)
        frames = []
        for i in range(count):
            image = rng.integers(0, 256, (BLENDER_SIZE, BLENDER_SIZE, 4), dtype=np.uint8)
            iio.imwrite(folder / split / f"r_{i}.png", image)
            frames.append({"file_path": f"./{split}/r_{i}", "transform_matrix": c2w[first + i].tolist()})
        first += count
        (folder / f"transforms_{split}.json").write_text(json.dumps({"camera_angle_x": 0.69, "frames": frames}))


def write_capture(folder: Path, source: Path) -> None:
    """The LLFF scene `source` (its images_32/) as a nerfstudio capture: transforms.json with its cameras
    at full size, and its photos as nerfstudio's downscaled copies (images_32/)."""
    poses, _ = read_poses_bounds(source / "poses_bounds.npy")
    c2w = opengl_to_opencv(llff_to_opencv(poses[:, :, :4]))  # OpenCV -> OpenGL axes (the same negation)
    height, width, focal = (float(v) for v in poses[0, :, 4])
    (folder / f"images_{FACTOR}").mkdir(parents=True)
    frames = []
    for i, photo in enumerate(sorted((source / f"images_{FACTOR}").iterdir())):
        shutil.copy(photo, folder / f"images_{FACTOR}" / f"frame_{i:05d}.png")
        frames.append({"file_path": f"images/frame_{i:05d}.png", "transform_matrix": c2w[i].tolist()})
    document = {
        "camera_model": "PINHOLE",
        **{"fl_x": focal, "fl_y": focal, "cx": width / 2, "cy": height / 2, "w": round(width), "h": round(height)},
        "frames": frames,
    }
    (folder / "transforms.json").write_text(json.dumps(document))


@pytest.fixture(scope="module")
def kind_folders(scene_folders, tmp_path_factory) -> dict[str, Path]:
    """A folder of each real kind: `toy` (NeRF Blender, 6 + 2 + 3 frames), `capture` (transforms.json:
    the demo scene's 20 views) and `alpha` (LLFF)."""
    root = tmp_path_factory.mktemp("kinds")
    write_blender_scene(root / "toy")
    write_capture(root / "capture", scene_folders["alpha"])
    return {"toy": root / "toy", "capture": root / "capture", "alpha": scene_folders["alpha"]}


def test_auto_tells_each_kind_from_its_files(kind_folders, tmp_path):
    """`kind` left out is auto: a Blender scene (all of its splits: every frame a training view), a
    transforms.json capture and an LLFF folder (every view a training view); a folder holding several
    kinds' files is the first of transforms_train.json, transforms.json, poses_bounds.npy."""
    weights = {"toy": 1.0, "capture": 1.0, "alpha": 1.0}
    settings = read_run_settings(collection_config(kind_folders, "data.synthetic_factor=16", weights=weights))
    assert settings.collection is not None and {f.kind for f in settings.collection.folders} == {"auto"}
    groups = collection_groups(settings.collection, Path("/"))
    assert [(g.scenes[0].name, g.scenes[0].kind) for g in groups] == [
        ("toy", "blender"),
        ("capture", "transforms"),
        ("alpha", "llff"),
    ]
    scenes = TrainingScenes(groups, settings.data)
    toy, capture, alpha = (scenes.scene(group.scenes[0]) for group in groups)
    assert toy.resolution == (BLENDER_SIZE, BLENDER_SIZE) and toy.test_ids == []
    assert toy.train_ids == list(range(11)) and [toy.image_names[i] for i in (0, 6, 8)] == [
        "train/r_0.png",
        "val/r_0.png",
        "test/r_0.png",
    ]
    assert capture.resolution == alpha.resolution == (94, 126)
    assert capture.train_ids == alpha.train_ids == list(range(20)) and capture.test_ids == alpha.test_ids == []
    assert torch.equal(capture.images, alpha.images)

    def detected(folder: Path) -> str:
        entry = CollectionFolder(path=str(folder), kind="auto", rig="auto", weight=1.0)
        return collection_groups(CollectionSettings("kinds", (entry,), None), Path("/"))[0].scenes[0].kind

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "poses_bounds.npy").touch()
    assert detected(mixed) == "llff"
    (mixed / "transforms.json").touch()
    assert detected(mixed) == "transforms"
    (mixed / "transforms_train.json").touch()
    assert detected(mixed) == "blender"


def test_blender_and_transforms_scenes_train_in_a_collection(kind_folders, tmp_path):
    """A tiny pretraining run over a NeRF Blender scene and a transforms.json capture (kinds given),
    validated and tested on the held-out demo scene: both are drawn, and the run's record names them."""
    cfg = collection_config(
        kind_folders,
        "data.synthetic_factor=16",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        weights={"toy": 1.0, "capture": 1.0},
        kinds={"toy": "blender", "capture": "transforms"},
    )
    settings = read_run_settings(cfg)
    assert settings.collection is not None
    scenes = TrainingScenes(collection_groups(settings.collection, Path("/")), settings.data)
    drawn = [scenes.draw_scene(np.random.default_rng([settings.seed, 0, step])).name for step in range(4)]
    assert set(drawn) == {"toy", "capture"}
    document = train_in_process(cfg, tmp_path)
    assert document is not None and document["global_step"] == 4 and document["mode"] == "zero-shot"
    assert document["training_scenes"] == ["toy", "capture"] and math.isfinite(document["mean"]["psnr"])


# The scenes the first 20 steps of experiment=pretrain (collection cpu_mix, seed 0, rank 0) draw, as drawn
# before collection folders had kinds.
CPU_MIX_DRAWS = [
    "dtu_scan24",
    "ollie",
    "dtu_scan24",
    "procedural-0-0037",
    "procedural-0-0031",
    "procedural-0-0005",
    "dtu_scan24",
    "fortress",
    "fortress",
    "procedural-0-0026",
    "ollie",
    "dtu_scan24",
    "procedural-0-0037",
    "fortress",
    "ollie",
    "procedural-0-0012",
    "fortress",
    "room",
    "procedural-0-0005",
    "procedural-0-0018",
]


def test_existing_collections_draw_and_load_as_before(llff_root):
    """cpu_mix (the first shipped checkpoints' collection; its folders have no `kind`: auto, all LLFF) draws
    the same scenes as before and loads them as before; the generated collections list the same scenes."""
    settings = read_run_settings(compose_config("experiment=pretrain", "collection=cpu_mix", f"data.root={llff_root}"))
    assert settings.collection is not None and settings.collection.name == "cpu_mix"
    assert [folder.kind for folder in settings.collection.folders] == ["auto"] * 5
    groups = collection_groups(settings.collection, llff_root)
    assert [(g.scenes[0].name, g.scenes[0].kind, g.scenes[0].rig) for g in groups[:5]] == [
        ("fortress", "llff", "forward"),
        ("room", "llff", "forward"),
        ("canclip", "llff", "forward"),
        ("ollie", "llff", "forward"),
        ("dtu_scan24", "llff", "object"),
    ]
    assert len(groups) == 6 and len(groups[5].scenes) == 40 and {s.kind for s in groups[5].scenes} == {"llff"}
    scenes = TrainingScenes(groups, settings.data)
    assert [scenes.draw_scene(np.random.default_rng([0, 0, step])).name for step in range(20)] == CPU_MIX_DRAWS
    item = groups[4].scenes[0]
    loaded = item.load(settings.data)
    before = load_llff_scene(item.path, factor=8, llffhold=0, name="dtu_scan24", rig="object")
    assert torch.equal(loaded.images, before.images) and torch.equal(loaded.cameras.c2w, before.cameras.c2w)
    assert loaded.train_ids == before.train_ids == list(range(49)) and loaded.test_ids == []
    for name, count in (("procedural10", 10), ("procedural100", 100)):
        collection = read_run_settings(compose_config(f"collection={name}")).collection
        assert collection is not None
        names = [s.name for g in collection_groups(collection, llff_root) for s in g.scenes]
        assert names == [f"procedural-0-{i:04d}" for i in range(count)]


def test_real_all_holds_every_real_scene_but_fern_and_room(llff_root):
    """experiment=pretrain's collection, real_all: fortress, the 13 captures, lego and chair (Blender) and
    cpu_mix's generated family (at weight 6); fern and room, the held-out scenes, are not in it. Every
    folder is where it says, of its kind."""
    settings = read_run_settings(compose_config("experiment=pretrain", f"data.root={llff_root}"))
    assert settings.collection is not None and settings.collection.name == "real_all"
    groups = collection_groups(settings.collection, data_root(settings.data))
    real = {g.scenes[0].name: g.scenes[0].kind for g in groups if len(g.scenes) == 1}
    assert len(real) == 16 and "fern" not in real and "room" not in real
    assert {name for name, kind in real.items() if kind == "blender"} == {"lego", "chair"}
    assert {"fortress", "canclip", "ollie", "dtu_scan24", "dtu_scan65", "bird_figurine"} <= set(real)
    family = settings.collection.procedural
    assert family is not None and (family.seed, family.count, family.weight) == (0, 40, 6.0)


RESUME_OVERRIDES = ["seed=3", "trainer.max_steps=6", "trainer.val_check_interval=3"]


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
    first, second = read_metrics(pretrained_run), read_metrics(tmp_path)
    assert second["global_step"] == first["global_step"] == 6
    assert second["mean"] == first["mean"] and second["per_image"] == first["per_image"]


def test_zero_shot_records_say_what_the_weights_saw(pretrained_run, tmp_path):
    """The pretraining run's own test and `eval` of its checkpoint on the held-out scene are zero-shot:
    the training scenes are the collection's, the scored scene is not among them."""
    document = read_metrics(pretrained_run)
    assert document["mode"] == "zero-shot" and document["seen_in_training"] is False
    assert document["training_scenes"] == ["alpha", "beta"] and document["init_from"] is None
    checkpoint = pretrained_run / "checkpoints" / "last.ckpt"
    result = run_in_process("eval", f"ckpt_path={checkpoint}", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    evaluated = read_metrics(tmp_path)
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


def test_finetuning_inherits_the_checkpoint_network_and_views(pretrained_run, tmp_path):
    """`experiment=finetune init_from=CKPT` needs none of the checkpoint's network keys: the network and
    the source views are the checkpoint's (the preset's quick width and 4 views would refuse or differ),
    and a key the command line gives is kept (a weightless one here: the scores' bound lifted)."""
    checkpoint = pretrained_run / "checkpoints" / "last.ckpt"
    not_network = [o for o in TINY_OVERRIDES if not o.startswith(("model.net.", "data.num_source_views"))]
    result = run_in_process(
        "train",
        "experiment=finetune",
        *not_network,
        f"init_from={checkpoint}",
        "model.net.readout_score_bound=0.5",
        "trainer.max_steps=1",
        "trainer.val_check_interval=1",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    pretrained = read_checkpoint(checkpoint)["hyper_parameters"]["config"]
    tuned = read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["hyper_parameters"]["config"]
    assert tuned["data"]["num_source_views"] == pretrained["data"]["num_source_views"] == 3
    assert tuned["model"]["net"]["readout_score_bound"] == 0.5
    assert {**tuned["model"]["net"], "readout_score_bound": 0.0} == pretrained["model"]["net"]


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
    document = read_metrics(tmp_path)
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
