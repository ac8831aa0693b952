"""The report's text files: `report.csv`, `report_study.csv` and the markdown of `report.md` (the main
table, the seeded study's sections, the notes and every run)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence

from pola_gnt.evaluation.stats import Summary
from pola_gnt.evaluation.study.rows import (
    FINE_TUNED,
    METRIC_TITLES,
    METRICS,
    PAIR,
    PER_SCENE,
    ZERO_SHOT,
    Row,
    mode_order,
    model_order,
    scene_order,
    seed_order,
)
from pola_gnt.evaluation.study.seed_statistics import GroupStats, PairedDifference


def metric_cell(value: float | None, metric: str) -> str:
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
        cells = [row.model, row.scene, *(metric_cell(row.scores[m], m) for m in METRICS)]
        if row.kind == "reference":
            cells += ["—"] * len(METRICS) + [f"{row.protocol} (published)"]
        else:
            cells += [*(metric_cell(row.baseline[m], m) for m in METRICS), row.protocol]
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
    return f"{metric_cell(summary.mean, metric)} ± {metric_cell(summary.std, metric)}"


def _signed(value: float, metric: str) -> str:
    return ("+" if value >= 0 else "−") + metric_cell(abs(value), metric)


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
        key=lambda r: (scene_order(r.scene), mode_order(r.mode), r.condition, model_order(r.model), seed_order(r)),
    )
    for row in order:
        cells = [row.scene, row.model, row.mode, "n/a" if row.seed is None else str(row.seed), row.condition]
        cells += [
            "n/a" if row.steps is None else str(row.steps),
            row.stopped_by or "n/a",
            _seconds(row.train_time_s),
            _seconds(row.steps_per_s, 3),
            _seconds(row.test_time_s),
            *(metric_cell(row.scores[m], m) for m in METRICS),
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
