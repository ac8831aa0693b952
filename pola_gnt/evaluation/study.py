"""Seeded studies over many runs: the library behind `python -m pola_gnt.report`.

Reads run folders (every `metrics.json` below the paths given), keeps the newest file of each run and
builds the report's tables:

- the main table: one row per (scene, model) grouped per model and mode, each group closed by its mean
  over the scenes (the 8-scene LLFF mean when all eight are there) and, for several scenes, its mean
  over every test image of those scenes (pooled, as GNT's eval.py averaged: scenes with more test
  views weigh more), next to the published reference numbers;
- the seeded study: per scene, model, mode and condition, mean and standard deviation over seeds of
  PSNR / SSIM / LPIPS with the training wall time, steps and steps per second; the paired difference
  Pola-GNT minus GNT (paired by scene and seed within one mode) and the paired difference fine-tuned
  minus from scratch (same model, scene, seed and condition), each with a 95% Student t interval;
  every run's timings.

and writes them as `report.md`, `report.csv`, `report_study.csv` and one bar chart per metric.

Every run has a mode (`metrics.json` "mode", or derived from "init_from" and "seen_in_training"; older
files are per-scene):

- `per-scene`: trained from scratch on the scored scene;
- `fine-tuned`: started from weights pretrained on other scenes, then trained on the scored scene;
- `zero-shot`: weights pretrained on other scenes only, scored on a scene they never saw.

Rows of different modes, protocols or LPIPS networks are never averaged together or paired as
Pola-GNT vs GNT: a model's runs are grouped per (model, mode, protocol, LPIPS net, condition). The
condition is the training budget on the scored scene (`N steps` or `T wall time`, from `metrics.json`;
for a fine-tuned run the fine-tuning's) and the settings that change what a run measures (factor,
samples, source views): runs of different conditions are never averaged or paired. A zero-shot run
had no training on its scene: its condition is `zero-shot` and the settings, whatever its checkpoint's
pretraining budget (its steps and times are the checkpoint's, shown as such). So two checkpoints of one
model and seed scored zero-shot on one scene count as one run (the newest file wins, with a note):
report them separately to compare them.

Besides Pola-GNT minus GNT, the study pairs each fine-tuned run with the same model trained from
scratch (per-scene) on the same scene, seed and condition: fine-tuned minus from scratch, in its own
section ("Fine-tuned vs from scratch", shown when there are fine-tuned runs) and in `report_study.csv`
(its `comparison` column says which difference a row is).
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure

from pola_gnt.core.errors import UserError
from pola_gnt.evaluation.stats import Summary, summarize

METRICS = ("psnr", "ssim", "lpips")
METRIC_TITLES = {"psnr": "PSNR (dB) ↑", "ssim": "SSIM ↑", "lpips": "LPIPS ↓"}
LLFF_SCENES = ("fern", "flower", "fortress", "horns", "leaves", "orchids", "room", "trex")
MODEL_ORDER = ("gnt", "pola_gnt")
METRICS_FILE = "metrics.json"
PAIR = ("pola_gnt", "gnt")  # the study's difference: first minus second
CONFIDENCE = 0.95
UNKNOWN_CONDITION = "budget n/a"
ZERO_SHOT, FINE_TUNED, PER_SCENE = "zero-shot", "fine-tuned", "per-scene"
MODES = (ZERO_SHOT, FINE_TUNED, PER_SCENE)  # also the report's order: least training on the scene first
MODEL_COMPARISON = f"{PAIR[0]} - {PAIR[1]}"  # report_study.csv "comparison" of a PAIR difference
SCRATCH_PAIR = (FINE_TUNED, PER_SCENE)  # the second difference: fine-tuned minus trained from scratch
SCRATCH_COMPARISON = f"{SCRATCH_PAIR[0]} - {SCRATCH_PAIR[1]}"


@dataclass(frozen=True)
class Reference:
    """A published 8-scene LLFF average (docs/gnt_reference.md, "Published figures")."""

    label: str
    psnr: float
    ssim: float
    lpips: float
    protocol: str = "gnt"
    lpips_net: str = "vgg"


# All three use GNT's evaluation (every 2nd pixel at factor 4, LPIPS-VGG on [0, 1] inputs): only our
# rows with protocol=gnt and LPIPS-VGG, on all eight scenes, are comparable with them.
REFERENCES = (
    Reference("GNT (paper, commonly quoted)", 27.24, 0.889, 0.093),
    Reference("GNT (reproduction)", 27.25, 0.8868, 0.1019),
    Reference("Pola-GNT (reproduction)", 27.34, 0.8885, 0.1009),
)
REFERENCE_SCENE = "LLFF 8-scene mean"


@dataclass
class Row:
    """One line of the table: a run's scene mean, a group mean or a published reference."""

    kind: str  # "run" | "seeds" | "mean" (of scene means) | "pooled" (over images) | "reference"
    model: str
    scene: str
    protocol: str
    lpips_net: str
    scores: dict[str, float | None]
    baseline: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(METRICS))
    n_scenes: int = 1
    n_images: int | None = None  # test images scored (per run; a group's total over its scenes)
    source: str = ""
    mtime: float = 0.0
    seed: int | None = None
    condition: str = UNKNOWN_CONDITION  # budget and settings: rows are compared within one condition only
    mode: str = PER_SCENE  # zero-shot | fine-tuned | per-scene: rows are compared within one mode only
    steps: float | None = None  # a group's mean of its runs' steps
    train_time_s: float | None = None
    steps_per_s: float | None = None
    test_time_s: float | None = None
    stopped_by: str | None = None
    n_seeds: int = 1  # seeds averaged into this row (scene rows of a study)
    spread: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(METRICS))  # std over seeds

    @property
    def key(self) -> tuple[str, str, str, str, str, str, str]:
        """Two runs with the same key measure the same thing: a re-run or a re-evaluation."""
        seed = "seed n/a" if self.seed is None else f"seed {self.seed}"
        return self.scene, self.model, self.mode, self.protocol, self.lpips_net, self.condition, seed


# ------------------------------------------------------------------------------------------------
# Reading runs


def find_metrics_files(paths: Iterable[Path]) -> list[Path]:
    """Every `metrics.json` named or found below `paths`, each once, in a stable order."""
    found: dict[Path, None] = {}
    for path in paths:
        if not path.exists():
            raise UserError(f"{path}: not found")
        if path.is_file():
            if path.name != METRICS_FILE:
                raise UserError(f"{path}: expected a run folder or a {METRICS_FILE} file")
            candidates = [path]
        else:
            candidates = sorted(path.rglob(METRICS_FILE))
            if not candidates:
                raise UserError(f"{path}: no {METRICS_FILE} found in this folder or below")
        found.update(dict.fromkeys(p.resolve() for p in candidates))
    return list(found)


def _metric_value(value, where: str, allow_null: bool) -> float | None:
    if value is None and allow_null:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _scores(section, where: str) -> dict[str, float | None]:
    if not isinstance(section, dict):
        raise ValueError(f"{where}: missing or not an object")
    # PSNR and SSIM are always computed; LPIPS is null when no weights were available.
    return {name: _metric_value(section.get(name), f"{where}.{name}", allow_null=name == "lpips") for name in METRICS}


def load_run(path: Path) -> Row:
    """The scene-mean row of one `metrics.json` (docs/interface.md format)."""
    try:
        document = json.loads(path.read_text())
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        header = {}
        for key in ("scene", "model", "protocol", "lpips_net"):
            if not isinstance(document.get(key), str):
                raise ValueError(f"{key}: missing or not a string")
            header[key] = document[key]
        scores = _scores(document.get("mean"), "mean")
        baseline = _scores(document.get("baseline"), "baseline")
        per_image = document.get("per_image")
        n_images = len(per_image) if isinstance(per_image, list) and per_image else None
        study = _study_fields(document)
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(f"{path}: malformed {METRICS_FILE} ({err})") from None
    return Row(
        "run",
        header["model"],
        header["scene"],
        header["protocol"],
        header["lpips_net"],
        scores,
        baseline,
        source=str(path),
        mtime=path.stat().st_mtime,
        n_images=n_images,
        **study,
    )


def _optional(document: dict, key: str, kind: type | tuple[type, ...], where: str = ""):
    value = document.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{where}{key}: unexpected value {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}{key}: not finite")
    return value


def run_mode(document: dict) -> str:
    """The run's mode: "mode" when given, else derived (older files, without these fields: per-scene).
    Bad values are a ValueError naming the field."""
    init_from = document.get("init_from")
    if init_from is not None and not isinstance(init_from, dict):
        raise ValueError(f"init_from: expected null or an object, got {init_from!r}")
    seen = document.get("seen_in_training")
    if seen is not None and not isinstance(seen, bool):
        raise ValueError(f"seen_in_training: expected true, false or null, got {seen!r}")
    scenes = document.get("training_scenes")
    if scenes is not None and not (isinstance(scenes, list) and all(isinstance(s, str) for s in scenes)):
        raise ValueError(f"training_scenes: expected a list of scene names, got {scenes!r}")
    mode = document.get("mode")
    if mode is None:
        return FINE_TUNED if init_from is not None else ZERO_SHOT if seen is False else PER_SCENE
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


def _study_fields(document: dict) -> dict:
    """Seed, mode, condition and timings of a run (absent in older files: None / per-scene / "budget
    n/a"). A zero-shot run's budget is its checkpoint's pretraining, not a budget on the scored scene:
    its condition is "zero-shot" (and the settings), so zero-shot Pola-GNT and GNT runs are grouped and
    paired whatever their pretraining budgets; their steps and times stay the checkpoint's."""
    mode = run_mode(document)
    budget = document.get("budget")
    if budget is not None and not (isinstance(budget, dict) and isinstance(budget.get("label"), str)):
        raise ValueError("budget: expected an object with a label")
    training = document.get("training") or {}
    if not isinstance(training, dict):
        raise ValueError("training: expected an object")
    number = (int, float)
    settings = [_optional(document, key, int) for key in ("factor", "n_samples", "num_source_views")]
    condition = ZERO_SHOT if mode == ZERO_SHOT else budget["label"] if budget is not None else UNKNOWN_CONDITION
    if all(value is not None for value in settings):
        condition += "; factor {}, {} samples, {} views".format(*settings)
    steps = _optional(training, "steps", int, "training.")
    return {
        "seed": _optional(document, "seed", int),
        "condition": condition,
        "mode": mode,
        "steps": steps if steps is not None else _optional(document, "global_step", int),
        "train_time_s": _optional(training, "wall_time_s", number, "training."),
        "steps_per_s": _optional(training, "steps_per_s", number, "training."),
        "test_time_s": _optional(document, "test_time_s", number),
        "stopped_by": _optional(training, "stopped_by", str, "training."),
    }


def keep_newest(rows: list[Row]) -> tuple[list[Row], list[str]]:
    """One row per `Row.key` (scene, model, mode, protocol, LPIPS net, condition, seed): the newest file
    wins. Returns the rows and a note per ignored file. (An LPIPS-VGG evaluation of a run is kept next to
    its LPIPS-Alex one.)"""
    newest: dict[tuple[str, ...], Row] = {}
    for row in sorted(rows, key=lambda r: r.mtime):
        newest[row.key] = row  # later files overwrite earlier ones
    notes = [
        f"duplicate {' / '.join(row.key)}: kept {newest[row.key].source} (newest), ignored {row.source}"
        for row in rows
        if newest[row.key] is not row
    ]
    return list(newest.values()), notes


# ------------------------------------------------------------------------------------------------
# Table rows


def _scene_order(scene: str) -> tuple[int, str]:
    return (LLFF_SCENES.index(scene), "") if scene in LLFF_SCENES else (len(LLFF_SCENES), scene)


def _model_order(model: str) -> tuple[int, str]:
    return (MODEL_ORDER.index(model), "") if model in MODEL_ORDER else (len(MODEL_ORDER), model)


def _mode_order(mode: str) -> int:
    return MODES.index(mode)


def model_label(model: str, mode: str, always: bool = False) -> str:
    """`pola_gnt (zero-shot)`; a per-scene run is plain `pola_gnt` unless `always` (modes side by side)."""
    return f"{model} ({mode})" if always or mode != PER_SCENE else model


def _mean(values: list[float | None]) -> float | None:
    """Mean, or None when any value is missing (a mean over fewer scenes would be mislabelled)."""
    present = [v for v in values if v is not None]
    return float(statistics.fmean(present)) if len(present) == len(values) else None


def _std(values: list[float | None]) -> float | None:
    """Sample standard deviation (n - 1), None for fewer than two values or a missing one."""
    present = [v for v in values if v is not None]
    return None if len(values) < 2 or len(present) != len(values) else float(statistics.stdev(present))


def _seed_order(row: Row) -> tuple[int, int]:
    return (0, row.seed) if row.seed is not None else (1, 0)


def scene_rows(runs: list[Row]) -> list[Row]:
    """One row per (model, mode, protocol, LPIPS net, condition, scene): the mean over its seeds, with their
    standard deviation in `spread` and the mean timings. A single run is returned as it is."""
    groups: dict[tuple, list[Row]] = {}
    for row in runs:
        key = (row.model, row.mode, row.protocol, row.lpips_net, row.condition, row.scene)
        groups.setdefault(key, []).append(row)
    rows = []
    for members in groups.values():
        if len(members) == 1:
            rows.append(members[0])
            continue
        members = sorted(members, key=_seed_order)
        first = members[0]
        rows.append(
            Row(
                "seeds",
                first.model,
                first.scene,
                first.protocol,
                first.lpips_net,
                scores={m: _mean([r.scores[m] for r in members]) for m in METRICS},
                baseline={m: _mean([r.baseline[m] for r in members]) for m in METRICS},
                condition=first.condition,
                mode=first.mode,
                steps=_optional_mean([r.steps for r in members]),
                train_time_s=_optional_mean([r.train_time_s for r in members]),
                steps_per_s=_optional_mean([r.steps_per_s for r in members]),
                test_time_s=_optional_mean([r.test_time_s for r in members]),
                n_seeds=len(members),
                n_images=members[0].n_images if len({r.n_images for r in members}) == 1 else None,
                spread={m: _std([r.scores[m] for r in members]) for m in METRICS},
                source=", ".join(r.source for r in members),
            )
        )
    return rows


def _optional_mean(values: list) -> float | None:
    return _mean(values) if values else None


def group_mean(rows: list[Row]) -> Row:
    """Mean row of one (model, mode, protocol, LPIPS net, condition) group: each scene's mean over its seeds,
    then the mean over the scenes (the 8 LLFF scenes when all are there)."""
    per_scene = scene_rows(rows)
    llff = [row for row in per_scene if row.scene in LLFF_SCENES]
    if len({row.scene for row in llff}) == len(LLFF_SCENES):
        members, label = llff, REFERENCE_SCENE
    else:
        members = per_scene
        label = f"mean ({len(per_scene)} scene{'s' if len(per_scene) != 1 else ''})"
    first = rows[0]
    return Row(
        "mean",
        first.model,
        label,
        first.protocol,
        first.lpips_net,
        scores={m: _mean([row.scores[m] for row in members]) for m in METRICS},
        baseline={m: _mean([row.baseline[m] for row in members]) for m in METRICS},
        n_scenes=len(members),
        condition=first.condition,
        mode=first.mode,
        n_seeds=len(rows),
    )


def pooled_mean(rows: list[Row]) -> Row | None:
    """Mean over every test image of one group's scenes (GNT's multi-scene figure: eval.py appends each
    image's scores and averages them): each scene's mean over its seeds weighted by its number of test
    images. None for one scene (the same as its mean) or when a run does not say how many images it scored."""
    per_scene = scene_rows(rows)
    counts = [row.n_images for row in per_scene]
    if len(per_scene) < 2 or any(count is None for count in counts):
        return None
    weights = [float(count or 0) for count in counts]
    total = sum(weights)

    def weighted(values: list[float | None]) -> float | None:
        if any(value is None for value in values):
            return None
        return sum(w * float(v or 0.0) for w, v in zip(weights, values, strict=True)) / total

    first = rows[0]
    return Row(
        "pooled",
        first.model,
        f"pooled: {int(total)} images of {len(per_scene)} scenes",
        first.protocol,
        first.lpips_net,
        scores={m: weighted([row.scores[m] for row in per_scene]) for m in METRICS},
        baseline={m: weighted([row.baseline[m] for row in per_scene]) for m in METRICS},
        n_scenes=len(per_scene),
        n_images=int(total),
        condition=first.condition,
        mode=first.mode,
        n_seeds=len(rows),
    )


def table_rows(runs: list[Row]) -> list[Row]:
    """Runs grouped per (model, mode, protocol, LPIPS net, condition), scenes in LLFF order then seeds,
    each group then its mean of scene means and (several scenes) its mean over the pooled images."""
    groups: dict[tuple[str, str, str, str, str], list[Row]] = {}
    for row in runs:
        groups.setdefault((row.model, row.mode, row.protocol, row.lpips_net, row.condition), []).append(row)
    ordered = []
    for key in sorted(groups, key=lambda k: (_model_order(k[0]), _mode_order(k[1]), k[2], k[3], k[4])):
        members = sorted(groups[key], key=lambda r: (_scene_order(r.scene), _seed_order(r)))
        ordered.extend(members)
        ordered.append(group_mean(members))
        pooled = pooled_mean(members)
        if pooled is not None:
            ordered.append(pooled)
    return ordered


# ------------------------------------------------------------------------------------------------
# Seeded study: per-condition statistics over seeds and the paired differences


@dataclass
class GroupStats:
    """One (scene, model, mode, condition, protocol, LPIPS net) over its seeds."""

    scene: str
    model: str
    condition: str
    protocol: str
    lpips_net: str
    seeds: list[int | None]
    metrics: dict[str, Summary | None]  # None when a run lacks the metric (LPIPS without weights)
    steps: float | None
    train_time_s: float | None
    steps_per_s: float | None
    test_time_s: float | None
    mode: str = PER_SCENE


@dataclass
class PairedDifference:
    """`first - second` over runs paired by scene and seed within one condition: `PAIR[0] - PAIR[1]`
    within one mode (`comparison` MODEL_COMPARISON), or one model fine-tuned minus trained from
    scratch (SCRATCH_COMPARISON)."""

    scene: str  # a scene, or "all N scenes" pooling every (scene, seed) pair
    condition: str
    protocol: str
    lpips_net: str
    pairs: list[tuple[str, int]]  # (scene, seed)
    metrics: dict[str, Summary | None]
    comparison: str = MODEL_COMPARISON
    model: str = MODEL_COMPARISON  # the models compared, or the one model of a fine-tuned - scratch pair
    mode: str = PER_SCENE  # the mode both runs share, or SCRATCH_COMPARISON


def _summary(values: list[float | None]) -> Summary | None:
    present = [v for v in values if v is not None]
    return None if not values or len(present) != len(values) else summarize(present, CONFIDENCE)


def study_groups(runs: list[Row]) -> list[GroupStats]:
    groups: dict[tuple, list[Row]] = {}
    for row in runs:
        key = (row.scene, row.model, row.mode, row.condition, row.protocol, row.lpips_net)
        groups.setdefault(key, []).append(row)
    stats = []
    for key in sorted(groups, key=lambda k: (_scene_order(k[0]), _mode_order(k[2]), *k[3:], _model_order(k[1]))):
        scene, model, mode, condition, protocol, lpips_net = key
        members = sorted(groups[key], key=_seed_order)
        stats.append(
            GroupStats(
                scene,
                model,
                condition,
                protocol,
                lpips_net,
                seeds=[r.seed for r in members],
                metrics={m: _summary([r.scores[m] for r in members]) for m in METRICS},
                steps=_mean([r.steps for r in members]),
                train_time_s=_mean([r.train_time_s for r in members]),
                steps_per_s=_mean([r.steps_per_s for r in members]),
                test_time_s=_mean([r.test_time_s for r in members]),
                mode=mode,
            )
        )
    return stats


# A pairing cell: the runs that may be paired with each other, by side (a model or a mode), then seed.
Cells = dict[tuple, dict[str, dict[int, Row]]]


def paired_differences(runs: list[Row]) -> tuple[list[PairedDifference], list[str]]:
    """`PAIR[0] - PAIR[1]` per (scene, mode, condition, protocol, LPIPS net), paired by seed; then pooled
    over the scenes of a (mode, condition, protocol, LPIPS net) when there are several. Returns the
    differences and a note per run left without a partner (no seed, or its seed missing for the other
    model)."""
    cells: Cells = {}
    notes = []
    for row in runs:
        if row.model not in PAIR:
            continue
        if row.seed is None:
            notes.append(f"not paired (no seed in its metrics.json): {row.source}")
            continue
        key = (row.scene, row.mode, row.condition, row.protocol, row.lpips_net)
        cells.setdefault(key, {}).setdefault(row.model, {})[row.seed] = row
    differences = []
    per_condition: dict[tuple, list[tuple[str, int, Row, Row]]] = {}
    for key in sorted(cells, key=lambda k: (_scene_order(k[0]), _mode_order(k[1]), k[2], k[3], k[4])):
        scene, mode, condition, protocol, lpips_net = key
        where = f"{scene}, {condition}"
        pairs = _pairs(cells[key], PAIR, where, {model: model_label(model, mode) for model in PAIR}, notes)
        if not pairs:
            continue
        per_condition.setdefault((mode, condition, protocol, lpips_net), []).extend(pairs)
        differences.append(_difference(scene, condition, protocol, lpips_net, pairs, mode=mode))
    for (mode, condition, protocol, lpips_net), pairs in per_condition.items():
        scenes = {scene for scene, *_ in pairs}
        if len(scenes) > 1:
            differences.append(
                _difference(f"all {len(scenes)} scenes", condition, protocol, lpips_net, pairs, mode=mode)
            )
    return differences, notes


def scratch_differences(runs: list[Row]) -> tuple[list[PairedDifference], list[str]]:
    """Fine-tuned minus per-scene (trained from scratch) per (scene, model, condition, protocol, LPIPS
    net), paired by seed; then pooled over the scenes of a (model, condition, protocol, LPIPS net) when
    there are several. Notes name the runs left without a partner, only where a scene, model and
    condition has a fine-tuned run (a report of per-scene runs alone has nothing to pair)."""
    cells: Cells = {}
    notes = []
    for row in runs:
        if row.mode not in SCRATCH_PAIR:
            continue
        if row.seed is None:
            if row.mode == FINE_TUNED:
                notes.append(f"not paired with a from-scratch run (no seed in its metrics.json): {row.source}")
            continue
        key = (row.scene, row.model, row.condition, row.protocol, row.lpips_net)
        cells.setdefault(key, {}).setdefault(row.mode, {})[row.seed] = row
    differences = []
    per_condition: dict[tuple, list[tuple[str, int, Row, Row]]] = {}
    for key in sorted(cells, key=lambda k: (_scene_order(k[0]), _model_order(k[1]), k[2], k[3], k[4])):
        if FINE_TUNED not in cells[key]:
            continue
        scene, model, condition, protocol, lpips_net = key
        pairs = _pairs(cells[key], SCRATCH_PAIR, f"{scene}, {model}, {condition}", {}, notes)
        if not pairs:
            continue
        per_condition.setdefault((model, condition, protocol, lpips_net), []).extend(pairs)
        differences.append(_scratch_difference(scene, model, condition, protocol, lpips_net, pairs))
    for (model, condition, protocol, lpips_net), pairs in per_condition.items():
        scenes = {scene for scene, *_ in pairs}
        if len(scenes) > 1:
            pooled = f"all {len(scenes)} scenes"
            differences.append(_scratch_difference(pooled, model, condition, protocol, lpips_net, pairs))
    return differences, notes


def _pairs(
    cell: dict[str, dict[int, Row]], sides: tuple[str, str], where: str, names: dict[str, str], notes: list[str]
) -> list[tuple[str, int, Row, Row]]:
    """(scene, seed, first, second) for each seed both sides of a cell have; a note per seed only one has
    (`names` spells a side in it, when not as it is)."""
    a, b = cell.get(sides[0], {}), cell.get(sides[1], {})
    for seed in sorted(set(a) ^ set(b)):
        missing = sides[1] if seed in a else sides[0]
        notes.append(f"not paired: {where}, seed {seed} has no {names.get(missing, missing)} run")
    return [(row.scene, seed, row, b[seed]) for seed, row in sorted(a.items()) if seed in b]


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _difference(
    scene: str, condition: str, protocol: str, lpips_net: str, pairs: list[tuple[str, int, Row, Row]], **labels: str
) -> PairedDifference:
    metrics = {}
    for m in METRICS:
        values = [_minus(x.scores[m], y.scores[m]) for _, _, x, y in pairs]
        metrics[m] = _summary(values)
    pair_list = [(s, seed) for s, seed, _, _ in pairs]
    return PairedDifference(scene, condition, protocol, lpips_net, pair_list, metrics, **labels)


def _scratch_difference(
    scene: str, model: str, condition: str, protocol: str, lpips_net: str, pairs: list[tuple[str, int, Row, Row]]
) -> PairedDifference:
    labels = {"comparison": SCRATCH_COMPARISON, "model": model, "mode": SCRATCH_COMPARISON}
    return _difference(scene, condition, protocol, lpips_net, pairs, **labels)


def reference_rows() -> list[Row]:
    return [
        Row(
            "reference",
            ref.label,
            REFERENCE_SCENE,
            ref.protocol,
            ref.lpips_net,
            scores={"psnr": ref.psnr, "ssim": ref.ssim, "lpips": ref.lpips},
            n_scenes=len(LLFF_SCENES),
        )
        for ref in REFERENCES
    ]


def mixing_warning(runs: list[Row]) -> str | None:
    """One line naming the protocols / LPIPS networks when the runs mix them (not comparable)."""
    mixed = [
        f"{name} ({', '.join(sorted(values))})"
        for name, values in (("protocols", {r.protocol for r in runs}), ("LPIPS networks", {r.lpips_net for r in runs}))
        if len(values) > 1
    ]
    if not mixed:
        return None
    return f"runs mix {' and '.join(mixed)}: rows are labelled, compare only rows with the same labels"


# ------------------------------------------------------------------------------------------------
# Writers


def _cell(value: float | None, metric: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}" if metric == "psnr" else f"{value:.4f}"


CSV_FIELDS = (
    "kind",
    "model",
    "scene",
    "n_scenes",
    "n_images",
    "protocol",
    "lpips_net",
    *METRICS,
    *(f"baseline_{m}" for m in METRICS),
    "seed",
    "n_seeds",
    "mode",
    "condition",
    "steps",
    "train_time_s",
    "steps_per_s",
    "test_time_s",
    "stopped_by",
    "source",
)


def _csv_number(value) -> str:
    return "" if value is None else repr(value)


def report_csv(rows: Sequence[Row]) -> str:
    """Full-precision values (`repr` of the float, exact on reading back); empty cell for n/a."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {
                "kind": row.kind,
                "model": row.model,
                "scene": row.scene,
                "n_scenes": row.n_scenes,
                "n_images": _csv_number(row.n_images),
                "protocol": row.protocol,
                "lpips_net": row.lpips_net,
                **{m: "" if row.scores[m] is None else repr(row.scores[m]) for m in METRICS},
                **{f"baseline_{m}": "" if row.baseline[m] is None else repr(row.baseline[m]) for m in METRICS},
                "seed": _csv_number(row.seed),
                "n_seeds": "" if row.kind == "reference" else row.n_seeds,
                "mode": "" if row.kind == "reference" else row.mode,
                "condition": "" if row.kind == "reference" else row.condition,
                "steps": _csv_number(row.steps),
                "train_time_s": _csv_number(row.train_time_s),
                "steps_per_s": _csv_number(row.steps_per_s),
                "test_time_s": _csv_number(row.test_time_s),
                "stopped_by": row.stopped_by or "",
                "source": row.source,
            }
        )
    return buffer.getvalue()


STUDY_CSV_FIELDS = (
    "kind",  # group | difference
    "comparison",  # a difference's: "pola_gnt - gnt" or "fine-tuned - per-scene"; empty for a group
    "scene",
    "model",  # a model, or "pola_gnt - gnt"
    "mode",  # a mode (of both runs of a "pola_gnt - gnt" difference), or "fine-tuned - per-scene"
    "condition",
    "protocol",
    "lpips_net",
    "n",
    "seeds",
    *(f"{m}_{part}" for m in METRICS for part in ("mean", "std", "ci_low", "ci_high")),
    "steps",
    "train_time_s",
    "steps_per_s",
    "test_time_s",
)


def _summary_cells(metric: str, summary: Summary | None) -> dict[str, str]:
    if summary is None:
        return {f"{metric}_{part}": "" for part in ("mean", "std", "ci_low", "ci_high")}
    return {
        f"{metric}_mean": repr(summary.mean),
        f"{metric}_std": _csv_number(summary.std),
        f"{metric}_ci_low": _csv_number(summary.low),
        f"{metric}_ci_high": _csv_number(summary.high),
    }


def study_csv(groups: Sequence[GroupStats], differences: Sequence[PairedDifference]) -> str:
    """The study's statistics at full precision: `group` rows (mean, std and t interval of the mean
    over seeds) and `difference` rows (a paired difference and its t interval; `comparison` says which)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=STUDY_CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for group in groups:
        writer.writerow(
            {
                "kind": "group",
                "comparison": "",
                "scene": group.scene,
                "model": group.model,
                "mode": group.mode,
                "condition": group.condition,
                "protocol": group.protocol,
                "lpips_net": group.lpips_net,
                "n": len(group.seeds),
                "seeds": " ".join("n/a" if seed is None else str(seed) for seed in group.seeds),
                **{k: v for m in METRICS for k, v in _summary_cells(m, group.metrics[m]).items()},
                "steps": _csv_number(group.steps),
                "train_time_s": _csv_number(group.train_time_s),
                "steps_per_s": _csv_number(group.steps_per_s),
                "test_time_s": _csv_number(group.test_time_s),
            }
        )
    for difference in differences:
        writer.writerow(
            {
                "kind": "difference",
                "comparison": difference.comparison,
                "scene": difference.scene,
                "model": difference.model,
                "mode": difference.mode,
                "condition": difference.condition,
                "protocol": difference.protocol,
                "lpips_net": difference.lpips_net,
                "n": len(difference.pairs),
                "seeds": " ".join(f"{scene}:{seed}" for scene, seed in difference.pairs),
                **{k: v for m in METRICS for k, v in _summary_cells(m, difference.metrics[m]).items()},
            }
        )
    return buffer.getvalue()


def markdown_table(rows: Sequence[Row]) -> list[str]:
    columns = [
        "Model",
        "Scene",
        "PSNR ↑",
        "SSIM ↑",
        "LPIPS ↓",
        "Nearest view PSNR",
        "Nearest view SSIM",
        "Nearest view LPIPS",
        "Protocol",
        "LPIPS net",
        "Seed",
        "Mode",
        "Condition",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [row.model, row.scene, *(_cell(row.scores[m], m) for m in METRICS)]
        if row.kind == "reference":
            cells += ["—"] * len(METRICS) + [f"{row.protocol} (published)"]
        else:
            cells += [*(_cell(row.baseline[m], m) for m in METRICS), row.protocol]
        cells.append(row.lpips_net)
        if row.kind == "reference":
            cells += ["—", "—", "—"]
        elif row.kind in ("mean", "pooled"):
            cells += [f"{row.n_seeds} run{'s' if row.n_seeds != 1 else ''}", row.mode, row.condition]
        else:
            cells += ["n/a" if row.seed is None else str(row.seed), row.mode, row.condition]
        if row.kind in ("mean", "pooled"):
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _plus_minus(summary: Summary | None, metric: str) -> str:
    if summary is None:
        return "n/a"
    return f"{_cell(summary.mean, metric)} ± {_cell(summary.std, metric)}"


def _signed(value: float, metric: str) -> str:
    return ("+" if value >= 0 else "−") + _cell(abs(value), metric)


def _interval(summary: Summary | None, metric: str) -> str:
    if summary is None:
        return "n/a"
    if summary.low is None or summary.high is None:
        return f"{_signed(summary.mean, metric)} [n/a: one pair]"
    return f"{_signed(summary.mean, metric)} [{_signed(summary.low, metric)}, {_signed(summary.high, metric)}]"


def _seconds(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _difference_table(
    differences: Sequence[PairedDifference],
    first: tuple[str, str],
    label: Callable[[PairedDifference], tuple[str, str]],
) -> list[str]:
    """A paired difference table; `first` names its leading columns, `label` gives their cells."""
    columns = [*first, "Condition", "Pairs", *(f"Δ {METRIC_TITLES[m]} [95% CI]" for m in METRICS)]
    columns += ["Protocol", "LPIPS net"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for difference in differences:
        cells = [*label(difference), difference.condition, str(len(difference.pairs))]
        cells += [_interval(difference.metrics[m], m) for m in METRICS]
        cells += [difference.protocol, difference.lpips_net]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def study_markdown(
    runs: Sequence[Row],
    groups: Sequence[GroupStats],
    differences: Sequence[PairedDifference],
    scratch: Sequence[PairedDifference] = (),
) -> list[str]:
    """The "Seeded study" section: statistics over seeds, the paired differences (Pola-GNT - GNT; when
    there are fine-tuned runs, fine-tuned - from scratch), every run's timings."""
    columns = ["Scene", "Model", "Mode", "Condition", "Seeds", *(METRIC_TITLES[m] for m in METRICS)]
    columns += ["Steps", "Train time (s)", "Steps/s", "Test time (s)", "Protocol", "LPIPS net"]
    lines = [
        "## Seeded study",
        "",
        "Mean ± sample standard deviation (n − 1) over the seeds of each scene, model, mode and condition "
        "(the training budget and the settings that change what is measured); steps and times are means "
        "over the seeds. Training time is the wall time of the training loop (validation and checkpoints "
        "included), test time the rendering and scoring of the test views.",
        "",
        f"Modes: {PER_SCENE} (trained from scratch on the scene), {FINE_TUNED} (pretrained on other scenes, "
        f"then trained on the scene: the budget, steps and time are the fine-tuning's), {ZERO_SHOT} "
        "(pretrained on other scenes only, scored on a scene it never saw: no budget on the scene; steps "
        "and time are the checkpoint's pretraining). Runs of different modes are never averaged or paired.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for group in groups:
        seeds = ", ".join("n/a" if seed is None else str(seed) for seed in group.seeds)
        cells = [group.scene, group.model, group.mode, group.condition, f"{len(group.seeds)} ({seeds})"]
        cells += [_plus_minus(group.metrics[m], m) for m in METRICS]
        cells += [
            "n/a" if group.steps is None else f"{group.steps:.0f}",
            _seconds(group.train_time_s),
            _seconds(group.steps_per_s, 3),
            _seconds(group.test_time_s),
            group.protocol,
            group.lpips_net,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"### {PAIR[0]} − {PAIR[1]}, paired by scene and seed",
        "",
        "Mean of the per-pair differences with its 95% Student t interval (n − 1 degrees of freedom). "
        f"Positive Δ PSNR / Δ SSIM and negative Δ LPIPS favour {PAIR[0]}; an interval that contains 0 "
        "does not separate the models. Runs are paired within one mode (zero-shot with zero-shot, "
        "fine-tuned with fine-tuned, per-scene with per-scene); runs of different conditions (equal steps "
        "vs equal time, other settings) are never paired.",
        "",
    ]
    if differences:
        lines += _difference_table(differences, ("Scene", "Mode"), lambda d: (d.scene, d.mode))
    else:
        lines.append(
            f"No pairs: no scene, mode and condition has both a {PAIR[0]} and a {PAIR[1]} run with the same seed."
        )
    if any(row.mode == FINE_TUNED for row in runs):
        lines += [
            "",
            "### Fine-tuned vs from scratch",
            "",
            f"{FINE_TUNED} − {PER_SCENE}: a model fine-tuned on a scene from pretrained weights minus the "
            "same model trained on it from scratch, paired by scene and seed within one condition (the "
            "same budget on the scene), pooled over the scenes of a model and condition when there are "
            "several. Mean of the per-pair differences with its 95% Student t interval (n − 1 degrees of "
            "freedom); positive Δ PSNR / Δ SSIM and negative Δ LPIPS favour the pretrained start.",
            "",
        ]
        if scratch:
            lines += _difference_table(scratch, ("Model", "Scene"), lambda d: (d.model, d.scene))
        else:
            lines.append(
                f"No pairs: no scene, model and condition has both a {FINE_TUNED} and a {PER_SCENE} run with "
                "the same seed."
            )
    columns = ["Scene", "Model", "Mode", "Seed", "Condition", "Steps", "Stopped by", "Train time (s)", "Steps/s"]
    columns += ["Test time (s)", *(METRIC_TITLES[m] for m in METRICS)]
    lines += ["", "### Runs", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    order = sorted(
        runs,
        key=lambda r: (_scene_order(r.scene), _mode_order(r.mode), r.condition, _model_order(r.model), _seed_order(r)),
    )
    for row in order:
        cells = [row.scene, row.model, row.mode, "n/a" if row.seed is None else str(row.seed), row.condition]
        cells += [
            "n/a" if row.steps is None else str(row.steps),
            row.stopped_by or "n/a",
            _seconds(row.train_time_s),
            _seconds(row.steps_per_s, 3),
            _seconds(row.test_time_s),
            *(_cell(row.scores[m], m) for m in METRICS),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def report_markdown(
    rows: Sequence[Row],
    notes: Sequence[str],
    study: Sequence[str] = (),
) -> str:
    lines = [
        "# Pola-GNT results",
        "",
        "Test-view means per scene; the nearest-view columns score the closest training image, unwarped "
        "(a no-learning baseline). Bold rows average the scenes of the group above them (each scene's "
        "seeds averaged first): the mean of scene means, then, for several scenes, the mean over every "
        "test image of them (`pooled`, as GNT's eval.py averaged its images; scenes with more test views "
        "weigh more). The mode says how the weights met the scene: per-scene (trained from "
        "scratch on it), fine-tuned (pretrained on other scenes, then trained on it), zero-shot "
        "(pretrained on other scenes only: no training budget on the scene); modes are never averaged "
        "together.",
        "",
        *markdown_table(rows),
        "",
        "The published rows are 8-scene LLFF averages under GNT's evaluation (`protocol=gnt`: factor 4, "
        "every 2nd pixel, LPIPS-VGG fed [0, 1] images, zero-padded SSIM). Our numbers are comparable "
        "with them only if the protocol matches: protocol gnt, LPIPS net vgg, all eight LLFF scenes, "
        "trained in the paper setting (`experiment=paper`). Rows under the `standard` protocol "
        "(every pixel, LPIPS on [-1, 1], valid SSIM) are not on the same scale.",
    ]
    if study:
        lines += ["", *study]
    if notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in notes)]
    runs = [row for row in rows if row.kind == "run"]
    lines += ["", "## Runs", "", *(f"- {' / '.join(row.key)}: `{row.source}`" for row in runs), ""]
    return "\n".join(lines)


def _bar_label(row: Row, mixed: bool, modes_mixed: bool) -> str:
    """The model, its mode when not per-scene or when modes are side by side, then what else differs."""
    name = model_label(row.model, row.mode, always=modes_mixed)
    return f"{name} [{row.protocol}, {row.lpips_net}, {row.condition}]" if mixed else name


REFERENCE_SLOT = "published\n(LLFF 8-scene mean,\nGNT protocol)"
REFERENCE_COLOURS = ("0.35", "0.55", "0.75")


def bar_chart(rows: Sequence[Row], metric: str, path: Path) -> None:
    """Per scene (the mean over seeds, their standard deviation as an error bar), then per group mean,
    one bar per model with the nearest-view baseline as a black tick; the published numbers as a last
    group of grey bars. Every bar carries its value."""
    ours = scene_rows([row for row in rows if row.kind == "run"]) + [row for row in rows if row.kind == "mean"]
    references = [row for row in rows if row.kind == "reference"]
    mixed = len({(r.protocol, r.lpips_net, r.condition) for r in ours}) > 1
    modes_mixed = len({r.mode for r in ours}) > 1
    # Scenes in LLFF order, then the group means, then the references.
    slots = list(dict.fromkeys(r.scene for r in sorted(ours, key=lambda r: (r.kind == "mean", _scene_order(r.scene)))))
    slots.append(REFERENCE_SLOT)
    series = list(dict.fromkeys(_bar_label(row, mixed, modes_mixed) for row in ours))
    legend_rows = len(series) + 1 if mixed else 1 + (len(series) + len(references)) // 3  # long labels: one a row
    figure = Figure(figsize=(max(6.0, 1.3 * len(slots) + 1.5), 5.0 + 0.2 * legend_rows), layout="constrained")
    axes = figure.add_subplot()
    labelled: set[str] = set()

    def once(label: str) -> str:
        """Each legend entry once (matplotlib skips labels starting with an underscore)."""
        if label in labelled:
            return "_" + label
        labelled.add(label)
        return label

    def draw(x: float, width: float, value: float | None, colour: str, label: str, hatch: str | None = None):
        if value is None:  # an empty bar keeps the series in the legend
            axes.bar(x, 0.0, width * 0.9, color=colour, label=once(label))
            axes.text(x, 0.0, "n/a", ha="center", va="bottom", fontsize=8, color=colour, rotation=90)
            return
        bars = axes.bar(x, value, width * 0.9, color=colour, hatch=hatch, edgecolor="white", label=once(label))
        axes.bar_label(bars, labels=[_cell(value, metric)], fontsize=7, padding=2)

    width = 0.8 / len(series)
    for row in ours:
        index = series.index(_bar_label(row, mixed, modes_mixed))
        x = slots.index(row.scene) + (index - (len(series) - 1) / 2) * width
        draw(x, width, row.scores[metric], f"C{index}", series[index], "//" if row.kind == "mean" else None)
        score, spread = row.scores[metric], row.spread[metric]
        if row.kind == "seeds" and score is not None and spread is not None:
            axes.errorbar(x, score, yerr=spread, color="black", capsize=3, lw=1)
        baseline = row.baseline[metric]
        if baseline is not None:
            axes.plot(
                [x - 0.45 * width, x + 0.45 * width],
                [baseline] * 2,
                color="black",
                lw=2.5,
                label=once("nearest-view baseline"),
            )
    ref_width = 0.8 / len(references)
    for index, (ref, colour) in enumerate(zip(references, REFERENCE_COLOURS)):
        x = len(slots) - 1 + (index - (len(references) - 1) / 2) * ref_width
        draw(x, ref_width, ref.scores[metric], colour, ref.model)
    axes.set_xticks(range(len(slots)), slots, fontsize=8)
    axes.set_xlim(-0.5, len(slots) - 0.5)  # fixed: a slot of n/a values has no bar to autoscale on
    axes.set_ylabel(METRIC_TITLES[metric])
    if metric == "ssim":
        axes.set_ylim(top=1.0)
    axes.set_title(f"{METRIC_TITLES[metric]} per scene (mean ± std over seeds; hatched: group mean)", fontsize=10)
    axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1 if mixed else 3, frameon=False)
    figure.savefig(path, dpi=120)


@dataclass
class Report:
    """Every table of a report."""

    rows: list[Row]  # the main table: runs, group means, published references
    groups: list[GroupStats]  # the study: statistics over seeds
    differences: list[PairedDifference]  # the study: PAIR[0] - PAIR[1], paired by scene and seed within a mode
    study_lines: list[str]  # its markdown section
    scratch_differences: list[PairedDifference] = field(default_factory=list)  # fine-tuned - per-scene


def build_report(run_paths: Sequence[Path]) -> tuple[Report, list[str]]:
    """Read the runs and compute every table; returns the report and the notes to print."""
    runs = [load_run(path) for path in find_metrics_files(run_paths)]
    runs, notes = keep_newest(runs)
    warning = mixing_warning(runs)
    groups = study_groups(runs)
    differences, pairing_notes = paired_differences(runs)
    scratch, scratch_notes = scratch_differences(runs)
    report = Report(
        rows=table_rows(runs) + reference_rows(),
        groups=groups,
        differences=differences,
        study_lines=study_markdown(runs, groups, differences, scratch),
        scratch_differences=scratch,
    )
    return report, ([warning] if warning else []) + notes + pairing_notes + scratch_notes


def write_report(run_paths: Sequence[Path], out_dir: Path) -> list[Row]:
    """Read the runs, write `report.md`, `report.csv`, `report_study.csv` and the three charts; return
    the main table's rows."""
    return write_full_report(run_paths, out_dir).rows


def write_full_report(run_paths: Sequence[Path], out_dir: Path) -> Report:
    """`write_report`, returning every table. The notes (duplicates, unpaired runs) and the warning on
    mixed protocols go to stderr as they are found, one line each, before anything is written."""
    report, notes = build_report(run_paths)
    for line in notes:
        print(f"{'warning' if line.startswith('runs mix') else 'note'}: {line}", file=sys.stderr)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.md").write_text(report_markdown(report.rows, notes, report.study_lines))
    (out_dir / "report.csv").write_text(report_csv(report.rows))
    (out_dir / "report_study.csv").write_text(
        study_csv(report.groups, [*report.differences, *report.scratch_differences])
    )
    for metric in METRICS:
        bar_chart(report.rows, metric, out_dir / f"report_{metric}.png")
    return report
