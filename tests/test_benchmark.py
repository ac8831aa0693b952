"""`pola_gnt.benchmark`: LLFF at the published protocol over a data root of small LLFF folders (the real
fern, generated scenes in other sizes, a folder without images_4/): the table's rows and marks, both
protocols' numbers equal to `eval`'s for the same checkpoint (and not another's), one render scored by
both, resume after a stop without rendering the scenes done again, the training modes, the published
figures, and bad input as one `error:` line."""

from __future__ import annotations

import csv
import json
import shutil
import signal
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest
import torch
from helpers import assert_one_error_line, read_metrics, run_in_process

import pola_gnt.runs.system as system_module
from pola_gnt.apps.benchmark import CSV_FILE, RECORD_FILE, TABLE_FILE, ScenePlan, published_size, scene_marks
from pola_gnt.evaluation.study import REFERENCES
from pola_gnt.evaluation.study.benchmark_table import SCORED, SceneResult, table_rows
from pola_gnt.evaluation.study.published import (
    GNT_CROSS_SCENE,
    GNT_SINGLE_SCENE,
    IBRNET_FINETUNED,
    IBRNET_GENERALIZABLE,
    LLFF_SCENES,
    PUBLISHED,
    TENSORF,
    Scores,
    figures_for,
)
from pola_gnt.runs.checkpoints import TRAINING_RECORD
from pola_gnt.runs.guards import Interrupted

METRICS = ("psnr", "ssim", "lpips")


def _generated_scene(folder: Path, demo: Path) -> Path:
    """An LLFF folder from the tiny demo scene (126x94 images as `images_4/`): not the published size."""
    folder.mkdir(parents=True)
    shutil.copy(demo / "poses_bounds.npy", folder / "poses_bounds.npy")
    shutil.copytree(demo / "images_32", folder / "images_4")
    return folder


@pytest.fixture(scope="module")
def bench_root(tmp_path_factory, tiny_runs, demo_scene_in_tmp) -> Path:
    """flower and fortress (generated, 126x94: not the published size), horns without images_4/; the
    other five missing. (The real fern at 1008x756: the slow test.)"""
    root = tmp_path_factory.mktemp("llff_root")
    for name in ("flower", "fortress"):
        _generated_scene(root / name, demo_scene_in_tmp)
    (root / "horns").mkdir()
    shutil.copy(demo_scene_in_tmp / "poses_bounds.npy", root / "horns" / "poses_bounds.npy")
    return root


@pytest.fixture(scope="module")
def fortress_checkpoint(tiny_runs, tmp_path_factory) -> Path:
    """The tiny Pola-GNT checkpoint, its training record saying it also trained on fortress (as the
    shipped checkpoints did)."""
    checkpoint = torch.load(tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    checkpoint[TRAINING_RECORD] = {"training_scenes": ["demo", "fortress"], "init_from": None}
    path = tmp_path_factory.mktemp("fortress_ckpt") / "seen_fortress.ckpt"
    torch.save(checkpoint, path)
    return path


def _table_rows(run_dir: Path) -> dict[str, dict[str, str]]:
    with open(run_dir / CSV_FILE, newline="") as file:
        return {row["row"]: row for row in csv.DictReader(file)}


def _eval(checkpoint: Path, scene_dir: Path, out: Path, *keys: str) -> dict:
    result = run_in_process(
        "eval",
        f"ckpt_path={checkpoint}",
        "scene=llff",
        f"scene.path={scene_dir}",
        "data.factor=4",
        *keys,
        f"hydra.run.dir={out}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return read_metrics(out)


def test_benchmark_rows_marks_and_both_protocols_as_eval_scores_them(
    bench_root, fortress_checkpoint, tiny_runs, tmp_path
):
    run_dir = tmp_path / "bench"
    result = run_in_process(
        "benchmark", f"ckpt_path={fortress_checkpoint}", f"data.root={bench_root}", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "horns      skipped: no images_4/" in result.stdout
    assert "trex       missing: not on disk" in result.stdout
    assert "flower     20 views at 126x94 (re-processed copy: not 1008x756), 3 test views" in result.stdout
    assert "fortress   20 views at 126x94 (re-processed copy: not 1008x756), seen: in the checkpoint's" in result.stdout

    rows = _table_rows(run_dir)
    assert rows["flower"]["marks"] == "re-processed"
    assert rows["fortress"]["marks"] == "seen, re-processed"  # in the checkpoint's training scenes
    assert rows["horns"]["marks"] == "skipped: no images_4/"
    for name in ("fern", "leaves", "orchids", "room", "trex"):
        assert rows[name]["marks"] == "missing: not on disk" and rows[name]["ours_gnt_psnr"] == ""
    mean_label = "mean of the 2 scenes at hand (not the 8-scene mean)"
    assert rows[mean_label]["marks"] == "flower, fortress" and rows[mean_label]["test_views"] == "6"
    published = rows["published 8-scene mean"]
    assert float(published["gnt_cross_scene_psnr"]) == 25.86 and float(published["ibrnet_ssim"]) == 0.817
    assert rows["flower"]["gnt_cross_scene_psnr"] == ""  # no per-scene figure was found: none is shown
    markdown = (run_dir / TABLE_FILE).read_text()
    assert "| fortress | seen, re-processed | 3 at 126x94 |" in markdown
    assert "fortress: **seen**" in markdown and "https://arxiv.org/abs/2207.13298" in markdown
    assert json.loads((run_dir / RECORD_FILE).read_text())["identity"]["mode"] == "zero_shot"

    # Each scene's metrics.json: both protocols of one render, the standard one's keys at the top.
    flower = read_metrics(run_dir / "flower")
    assert flower["resolution"] == [94, 126] and flower["protocol"] == "standard" and flower["factor"] == 4
    assert set(flower["protocols"]) == {"standard", "gnt"} and flower["mode"] == "zero-shot"
    assert flower["protocols"]["gnt"]["resolution"] == [47, 63] and flower["protocols"]["gnt"]["lpips_net"] == "vgg"
    assert read_metrics(run_dir / "fortress")["seen_in_training"] is True
    for name in ("flower", "fortress"):
        document = read_metrics(run_dir / name)
        for protocol in ("gnt", "standard"):
            for metric in ("psnr", "ssim"):
                assert float(rows[name][f"ours_{protocol}_{metric}"]) == document["protocols"][protocol]["mean"][metric]

    # The same numbers as eval's, which renders every 2nd pixel only for GNT's protocol: the strided
    # pixels of the full render are the render of those pixels, bit for bit.
    for protocol in ("gnt", "standard"):
        evaluated = _eval(
            fortress_checkpoint, bench_root / "flower", tmp_path / f"eval_{protocol}", f"metrics.protocol={protocol}"
        )
        section = flower["protocols"][protocol]
        assert evaluated["per_image"] == section["per_image"], protocol
        assert evaluated["mean"] == section["mean"] and evaluated["baseline"] == section["baseline"]
        assert evaluated["metric_settings"] == section["metric_settings"]
    # Control: another checkpoint's numbers differ.
    other = _eval(
        tiny_runs["gnt"] / "checkpoints" / "last.ckpt",
        bench_root / "flower",
        tmp_path / "eval_other",
        "metrics.protocol=gnt",
    )
    assert other["mean"]["psnr"] != flower["protocols"]["gnt"]["mean"]["psnr"]


@pytest.mark.slow
def test_the_real_fern_at_the_published_size(tiny_runs, fern_dir, tmp_path):
    """The real fern (1008x756, the published copy): no mark but `subset` (one test view keeps the
    render short), and GNT's protocol equal to eval's render of every 2nd pixel of it."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "fern").symlink_to(fern_dir)
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    run_dir = tmp_path / "bench"
    result = run_in_process(
        "benchmark", f"ckpt_path={checkpoint}", f"data.root={root}", "data.test_views=1", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fern       20 views at 1008x756, 3 test views" in result.stdout
    rows = _table_rows(run_dir)
    assert rows["fern"]["marks"] == "subset" and rows["fern"]["test_views"] == "1 at 1008x756"
    fern = read_metrics(run_dir / "fern")
    assert fern["resolution"] == [756, 1008] and fern["protocols"]["gnt"]["resolution"] == [378, 504]
    evaluated = _eval(checkpoint, root / "fern", tmp_path / "eval", "metrics.protocol=gnt", "data.test_views=1")
    assert evaluated["per_image"] == fern["protocols"]["gnt"]["per_image"]


def assert_stopped_line(result, *fragments: str, code: int) -> str:
    """A stop: its exit code and a last line `stopped: ...` (before it only the command's own lines,
    such as LPIPS-VGG's unavailability; no traceback)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr[-2000:]
    assert lines and lines[-1].startswith("stopped:") and "Traceback" not in result.stderr, result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[-1], (fragment, lines[-1])
    return lines[-1]


def _stop_on_render(stop_at: int, signum: int = signal.SIGTERM):
    """`render_image` that stops the process (as a signal would, `Interrupted`) on its `stop_at`-th call."""
    real = system_module.render_image
    calls = {"n": 0}

    def render(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == stop_at:
            raise Interrupted(signum, immediate=True)
        return real(*args, **kwargs)

    return render, calls


def test_a_stopped_benchmark_resumes_without_rendering_the_scenes_done(bench_root, tiny_runs, tmp_path):
    run_dir = tmp_path / "bench"
    keys = (
        f"ckpt_path={tiny_runs['pola_gnt'] / 'checkpoints' / 'last.ckpt'}",
        f"data.root={bench_root}",
        "benchmark.scenes=[flower,fortress]",
        f"hydra.run.dir={run_dir}",
    )
    stop, calls = _stop_on_render(stop_at=5)  # flower has 3 test views: stopped in fortress's 2nd
    with mock.patch.object(system_module, "render_image", stop):
        stopped = run_in_process("benchmark", *keys)
    line = assert_stopped_line(stopped, "SIGTERM during fortress", "1 of 2 scenes done", code=143)
    assert "resume with: python -m pola_gnt.benchmark" in line and f"hydra.run.dir={run_dir}" in line
    flower_file = run_dir / "flower" / "metrics.json"
    kept = flower_file.read_bytes()
    assert not (run_dir / "fortress" / "metrics.json").exists()
    assert _table_rows(run_dir)["fortress"]["marks"] == "pending"

    count, counted = _stop_on_render(stop_at=0)  # never stops: counts the renders
    with mock.patch.object(system_module, "render_image", count):
        resumed = run_in_process("benchmark", *keys)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert counted["n"] == 3  # fortress's 3 test views, none of flower's
    assert "[1/2] flower: done, kept from an earlier run" in resumed.stdout
    assert flower_file.read_bytes() == kept
    assert set(_table_rows(run_dir)["mean of the 2 scenes at hand (not the 8-scene mean)"]["marks"].split(", ")) == {
        "flower",
        "fortress",
    }
    with mock.patch.object(system_module, "render_image", count):
        assert run_in_process("benchmark", *keys).returncode == 0
    assert counted["n"] == 3  # all done: nothing rendered

    # Another checkpoint in the same folder is refused, nothing overwritten.
    other = run_in_process("benchmark", f"ckpt_path={tiny_runs['gnt'] / 'checkpoints' / 'last.ckpt'}", *keys[1:])
    assert_one_error_line(other, "hydra.run.dir", "holds a benchmark of other settings", "checkpoint")
    assert flower_file.read_bytes() == kept


TINY_TRAINING = ("trainer.max_steps=4", "trainer.val_check_interval=2", "data.rays_per_step=64", "data.val_rays=256")


def test_finetune_mode_trains_each_scene_and_resumes_its_training(bench_root, tiny_runs, tmp_path):
    run_dir = tmp_path / "bench"
    keys = (
        "benchmark.mode=finetune",
        f"ckpt_path={tiny_runs['pola_gnt'] / 'checkpoints' / 'last.ckpt'}",
        f"data.root={bench_root}",
        "benchmark.scenes=[flower]",
        *TINY_TRAINING,
        f"hydra.run.dir={run_dir}",
    )
    stop, _ = _stop_on_render(stop_at=1, signum=signal.SIGINT)  # trained, then stopped in the test phase
    with mock.patch.object(system_module, "render_image", stop):
        stopped = run_in_process("benchmark", *keys)
    assert_stopped_line(stopped, "SIGINT during flower", "resume with: python -m pola_gnt.benchmark", code=130)
    last = run_dir / "flower" / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 4
    resumed = run_in_process("benchmark", *keys)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "ckpt_path=last" in resumed.stdout  # the scene's training resumed from its checkpoint
    document = read_metrics(run_dir / "flower")
    assert document["mode"] == "fine-tuned" and document["global_step"] == 4
    assert document["init_from"]["path"] == str((tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt").resolve())
    assert set(document["protocols"]) == {"standard", "gnt"}
    rows = _table_rows(run_dir)
    assert "ibrnet_finetuned_psnr" in rows["flower"] and "gnt_cross_scene_psnr" not in rows["flower"]


@pytest.mark.parametrize(
    "keys, fragments",
    [
        (["scene=fern"], ["scene: set by the benchmark itself", "benchmark.scenes"]),
        (["metrics.protocol=gnt"], ["metrics.protocol: set by the benchmark itself"]),
        (["benchmark.mode=per_scene", "ckpt_path=CKPT"], ["ckpt_path: benchmark.mode=per_scene trains"]),
        (["benchmark.budget_minutes=2", "ckpt_path=CKPT"], ["benchmark.budget_minutes: zero_shot trains nothing"]),
        ([], ["ckpt_path: required for benchmark.mode=zero_shot"]),
        (["benchmark.mode=fast", "ckpt_path=CKPT"], ["benchmark.mode: unknown value 'fast'"]),
    ],
)
def test_bad_settings_are_one_error_line(bench_root, tiny_runs, tmp_path, keys, fragments):
    checkpoint = str(tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt")
    keys = [key.replace("CKPT", checkpoint) for key in keys]
    result = run_in_process("benchmark", *keys, f"data.root={bench_root}", f"hydra.run.dir={tmp_path / 'bench'}")
    assert_one_error_line(result, *fragments)
    assert not (tmp_path / "bench" / RECORD_FILE).exists()


def test_bad_checkpoint_or_data_root_is_one_error_line(bench_root, tiny_runs, tmp_path):
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"PK\x03\x04 not a checkpoint" * 10)
    result = run_in_process(
        "benchmark", f"ckpt_path={corrupt}", f"data.root={bench_root}", f"hydra.run.dir={tmp_path / 'a'}"
    )
    assert_one_error_line(result, str(corrupt), "cannot read checkpoint")
    empty = tmp_path / "empty"
    empty.mkdir()
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    result = run_in_process(
        "benchmark", f"ckpt_path={checkpoint}", f"data.root={empty}", f"hydra.run.dir={tmp_path / 'b'}"
    )
    assert_one_error_line(result, f"data.root: {empty} holds no LLFF scene to benchmark", "fern: not on disk")
    only_skipped = run_in_process(
        "benchmark",
        f"ckpt_path={checkpoint}",
        f"data.root={bench_root}",
        "benchmark.scenes=[horns,trex]",
        f"hydra.run.dir={tmp_path / 'c'}",
    )
    assert_one_error_line(only_skipped, "horns: no images_4/", "trex: not on disk")


# ---- the table and the published figures ---------------------------------------------------------------


def _document(psnr: float, n_images: int) -> dict:
    """A scene's metrics.json as far as the table reads it: every image scoring `psnr`."""
    section = {
        "mean": {"psnr": psnr, "ssim": 0.5, "lpips": None},
        "per_image": [{"psnr": psnr, "ssim": 0.5, "lpips": None}] * n_images,
        "lpips_net": "vgg",
    }
    return {
        "per_image": section["per_image"],
        "resolution": [756, 1008],
        "protocols": {"gnt": section, "standard": {**section, "lpips_net": "alex"}},
    }


def test_the_means_say_which_scenes_they_are_over():
    all_eight = [SceneResult(name, SCORED, document=_document(20.0 + i, 1 + i)) for i, name in enumerate(LLFF_SCENES)]
    rows = {row.label: row for row in table_rows(all_eight, [TENSORF])}
    assert rows["mean of the 8 scenes"].ours["gnt"]["psnr"] == pytest.approx(23.5)
    # GNT's mean is over the pooled images: scenes with more test views weigh more.
    pooled = sum((20.0 + i) * (1 + i) for i in range(8)) / sum(1 + i for i in range(8))
    assert rows["pooled over the images (how GNT averaged)"].ours["gnt"]["psnr"] == pytest.approx(pooled)
    assert rows["mean of the 8 scenes"].published["tensorf"]["psnr"] == pytest.approx(26.7325)
    assert not any(label.startswith("mean of the") and "comparable" in label for label in rows)

    marked = [
        SceneResult("fern", SCORED, document=_document(24.0, 3)),
        SceneResult("room", SCORED, marks={"re-processed": "980x724"}, document=_document(30.0, 6)),
    ]
    rows = {row.label: row for row in table_rows(marked, [TENSORF])}
    at_hand = rows["mean of the 2 scenes at hand (not the 8-scene mean)"]
    assert at_hand.ours["standard"]["psnr"] == 27.0
    assert at_hand.published["tensorf"]["psnr"] == pytest.approx((25.27 + 32.35) / 2)  # the same two scenes
    comparable = rows["mean of the 1 comparable (unmarked) scenes"]
    assert comparable.ours["gnt"]["psnr"] == 24.0 and comparable.published["tensorf"]["psnr"] == 25.27
    assert rows["published 8-scene mean"].published["tensorf"] == TENSORF.mean.as_dict()


def test_published_figures_are_the_papers_and_average_to_their_means():
    assert GNT_CROSS_SCENE.mean == Scores(25.86, 0.867, 0.116)
    assert IBRNET_GENERALIZABLE.mean == Scores(25.13, 0.817, 0.205)
    assert IBRNET_FINETUNED.mean == Scores(26.73, 0.851, 0.175)
    # Per-scene figures where a source gives them; they average to the stated mean, to its rounding.
    for figures in PUBLISHED:
        assert figures.source and figures.protocol in ("gnt", "ibrnet", "nerf")
        if not figures.per_scene:
            continue
        assert set(figures.per_scene) == set(LLFF_SCENES), figures.key
        mean = figures.mean_of_scenes()
        assert mean is not None
        assert abs(mean.psnr - figures.mean.psnr) <= 0.005 + 1e-9, figures.key
        assert abs(mean.ssim - figures.mean.ssim) <= 0.0005 + 1e-9, figures.key
        assert abs(mean.lpips - figures.mean.lpips) <= 0.0005 + 1e-9, figures.key
    # Control: a figure off by one digit no longer averages to the mean.
    wrong = replace(TENSORF, per_scene=dict(TENSORF.per_scene, fern=Scores(26.27, 0.814, 0.237))).mean_of_scenes()
    assert wrong is not None and abs(wrong.psnr - TENSORF.mean.psnr) > 0.1
    assert [f.key for f in figures_for("zero-shot")] == ["gnt_cross_scene", "ibrnet"]
    assert [f.key for f in figures_for("fine-tuned")] == ["ibrnet_finetuned"]
    # GNT's single-scene table (InsertNeRF's reprint, checked by its mean above) is what per_scene shows.
    assert GNT_SINGLE_SCENE.scene("fern") == Scores(24.31, 0.846, 0.116)
    assert GNT_SINGLE_SCENE.scene("room") == Scores(32.96, 0.963, 0.060)
    assert [f.key for f in figures_for("per-scene")] == ["gnt_single_scene", "tensorf"]
    fern = table_rows([SceneResult("fern", SCORED, document=_document(24.0, 3))], figures_for("per-scene"))[0]
    assert fern.published["gnt_single_scene"] == {"psnr": 24.31, "ssim": 0.846, "lpips": 0.116}
    # `report`'s single-scene references are the same figures, unchanged.
    assert [(r.label, r.psnr, r.ssim, r.lpips) for r in REFERENCES] == [
        ("GNT (paper, commonly quoted)", 27.24, 0.889, 0.093),
        ("GNT (reproduction)", 27.25, 0.8868, 0.1019),
        ("Pola-GNT (reproduction)", 27.34, 0.8885, 0.1009),
    ]


def test_the_published_size_rule_and_the_marks(tmp_path):
    """nerf_llff_data's images_4/ are 1008x756: any other size is a re-processed copy (the shared
    fortress 1004x744 and room 980x724)."""
    assert published_size(4) == (756, 1008) and published_size(8) == (378, 504)
    document = {"per_image": [{}] * 3, "seen_in_training": False}
    published = ScenePlan("fern", tmp_path, "pending", size=(756, 1008), n_views=20)
    assert scene_marks(published, document, "zero_shot", 4, 8) == {}
    for size in ((744, 1004), (724, 980), (378, 504)):
        copy = ScenePlan("room", tmp_path, "pending", size=size, n_views=20)
        assert list(scene_marks(copy, document, "zero_shot", 4, 8)) == ["re-processed"]
    assert scene_marks(published, {**document, "seen_in_training": True}, "per_scene", 4, 8) == {}
    subset = scene_marks(published, {**document, "per_image": [{}]}, "zero_shot", 4, 8)
    assert subset == {"subset": "1 of its 3 test views (data.test_views)"}
    eighth = ScenePlan("fern", tmp_path, "pending", size=(378, 504), n_views=20)
    assert list(scene_marks(eighth, document, "zero_shot", 8, 8)) == ["factor"]
