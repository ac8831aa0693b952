"""The report's rows: the constants of a study (metrics, modes, the compared pair), the published
references, `Row` (a run, a group mean or a reference), and the main table built from the runs: per
scene the mean over seeds, per group the mean over scenes and over images (pooled)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from pola_gnt.evaluation.study.published import FINE_TUNED, LLFF_SCENES, PER_SCENE, REPORT_REFERENCES, ZERO_SHOT

METRICS = ("psnr", "ssim", "lpips")
METRIC_TITLES = {"psnr": "PSNR (dB) ↑", "ssim": "SSIM ↑", "lpips": "LPIPS ↓"}
MODEL_ORDER = ("gnt", "pola_gnt")
METRICS_FILE = "metrics.json"
PAIR = ("pola_gnt", "gnt")  # the study's difference: first minus second
CONFIDENCE = 0.95
UNKNOWN_CONDITION = "budget n/a"
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


# The single-scene figures of `published` (their sources there). All three use GNT's evaluation (every
# 2nd pixel at factor 4, LPIPS-VGG on [0, 1] inputs): only our rows with protocol=gnt and LPIPS-VGG, on
# all eight scenes, are comparable with them.
REFERENCES = tuple(
    Reference(f.label, f.mean.psnr, f.mean.ssim, f.mean.lpips, f.protocol, f.lpips_net) for f in REPORT_REFERENCES
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
# The main table


def scene_order(scene: str) -> tuple[int, str]:
    return (LLFF_SCENES.index(scene), "") if scene in LLFF_SCENES else (len(LLFF_SCENES), scene)


def model_order(model: str) -> tuple[int, str]:
    return (MODEL_ORDER.index(model), "") if model in MODEL_ORDER else (len(MODEL_ORDER), model)


def mode_order(mode: str) -> int:
    return MODES.index(mode)


def model_label(model: str, mode: str, always: bool = False) -> str:
    """`pola_gnt (zero-shot)`; a per-scene run is plain `pola_gnt` unless `always` (modes side by side)."""
    return f"{model} ({mode})" if always or mode != PER_SCENE else model


def complete_mean(values: list[float | None]) -> float | None:
    """Mean, or None when any value is missing (a mean over fewer scenes would be mislabelled)."""
    present = [v for v in values if v is not None]
    return float(statistics.fmean(present)) if len(present) == len(values) else None


def _std(values: list[float | None]) -> float | None:
    """Sample standard deviation (n - 1), None for fewer than two values or a missing one."""
    present = [v for v in values if v is not None]
    return None if len(values) < 2 or len(present) != len(values) else float(statistics.stdev(present))


def seed_order(row: Row) -> tuple[int, int]:
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
        members = sorted(members, key=seed_order)
        first = members[0]
        rows.append(
            Row(
                "seeds",
                first.model,
                first.scene,
                first.protocol,
                first.lpips_net,
                scores={m: complete_mean([r.scores[m] for r in members]) for m in METRICS},
                baseline={m: complete_mean([r.baseline[m] for r in members]) for m in METRICS},
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
    return complete_mean(values) if values else None


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
        scores={m: complete_mean([row.scores[m] for row in members]) for m in METRICS},
        baseline={m: complete_mean([row.baseline[m] for row in members]) for m in METRICS},
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
    for key in sorted(groups, key=lambda k: (model_order(k[0]), mode_order(k[1]), k[2], k[3], k[4])):
        members = sorted(groups[key], key=lambda r: (scene_order(r.scene), seed_order(r)))
        ordered.extend(members)
        ordered.append(group_mean(members))
        pooled = pooled_mean(members)
        if pooled is not None:
            ordered.append(pooled)
    return ordered


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
