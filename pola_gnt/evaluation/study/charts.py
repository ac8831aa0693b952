"""The report's bar charts, one per metric: a bar per model and scene (the mean over seeds with their
standard deviation), the nearest-view baseline as a tick and the published numbers as dashed lines."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from pola_gnt.evaluation.study.rows import METRIC_TITLES, Row, model_label, scene_order, scene_rows
from pola_gnt.evaluation.study.writers import metric_cell


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
    slots = list(dict.fromkeys(r.scene for r in sorted(ours, key=lambda r: (r.kind == "mean", scene_order(r.scene)))))
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
        axes.bar_label(bars, labels=[metric_cell(value, metric)], fontsize=7, padding=2)

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
