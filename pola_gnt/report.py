"""`python -m pola_gnt.report RUN_DIR... [--out DIR]`: one table and bar charts over many runs.

Each RUN_DIR is a run folder, a `metrics.json`, or any folder above run folders (searched
recursively for `metrics.json`). Writes into `--out`:

- `report.md`: one row per (scene, model) grouped per model, each group closed by its mean over the
  scenes (the 8-scene LLFF mean when all eight are there), next to the published reference numbers;
- `report.csv`: the same rows, machine-readable (empty cell = not available);
- `report_psnr.png`, `report_ssim.png`, `report_lpips.png`: one bar per model and scene, the
  nearest-view baseline as a tick on each bar and the published numbers as dashed lines.

Rows of different protocols or LPIPS networks are never averaged together: a model's runs are grouped
per (model, protocol, LPIPS net), and mixing them in one report prints a warning.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure

from pola_gnt.errors import UserError, exit_on_user_error

METRICS = ("psnr", "ssim", "lpips")
METRIC_TITLES = {"psnr": "PSNR (dB) ↑", "ssim": "SSIM ↑", "lpips": "LPIPS ↓"}
LLFF_SCENES = ("fern", "flower", "fortress", "horns", "leaves", "orchids", "room", "trex")
MODEL_ORDER = ("gnt", "pola_gnt")
METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class Reference:
    """A published 8-scene LLFF average (docs: gnt_reference.md, "Published figures")."""

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

    kind: str  # "run" | "mean" | "reference"
    model: str
    scene: str
    protocol: str
    lpips_net: str
    scores: dict[str, float | None]
    baseline: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(METRICS))
    n_scenes: int = 1
    source: str = ""
    mtime: float = 0.0

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Two runs with the same key measure the same thing: a re-run or a re-evaluation."""
        return self.scene, self.model, self.protocol, self.lpips_net


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
    """The scene-mean row of one `metrics.json` (interface.md format)."""
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
    )


def keep_newest(rows: list[Row]) -> tuple[list[Row], list[str]]:
    """One row per (scene, model, protocol, LPIPS net): the newest file wins. Returns the rows and a note
    per ignored file. (An LPIPS-VGG evaluation of a run is kept next to its LPIPS-Alex one.)"""
    newest: dict[tuple[str, str, str, str], Row] = {}
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


def _mean(values: list[float | None]) -> float | None:
    """Mean, or None when any value is missing (a mean over fewer scenes would be mislabelled)."""
    present = [v for v in values if v is not None]
    return float(statistics.fmean(present)) if len(present) == len(values) else None


def group_mean(rows: list[Row]) -> Row:
    """Mean row of one (model, protocol, LPIPS net) group: over the 8 LLFF scenes when all are there."""
    llff = [row for row in rows if row.scene in LLFF_SCENES]
    if len({row.scene for row in llff}) == len(LLFF_SCENES):
        members, label = llff, REFERENCE_SCENE
    else:
        members = rows
        label = f"mean ({len(rows)} scene{'s' if len(rows) != 1 else ''})"
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
    )


def table_rows(runs: list[Row]) -> list[Row]:
    """Runs grouped per (model, protocol, LPIPS net), scenes in LLFF order, each group then its mean."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for row in runs:
        groups.setdefault((row.model, row.protocol, row.lpips_net), []).append(row)
    ordered = []
    for key in sorted(groups, key=lambda k: (_model_order(k[0]), k[1], k[2])):
        members = sorted(groups[key], key=lambda r: _scene_order(r.scene))
        ordered.extend(members)
        ordered.append(group_mean(members))
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
    "protocol",
    "lpips_net",
    *METRICS,
    *(f"baseline_{m}" for m in METRICS),
    "source",
)


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
                "protocol": row.protocol,
                "lpips_net": row.lpips_net,
                **{m: "" if row.scores[m] is None else repr(row.scores[m]) for m in METRICS},
                **{f"baseline_{m}": "" if row.baseline[m] is None else repr(row.baseline[m]) for m in METRICS},
                "source": row.source,
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
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [row.model, row.scene, *(_cell(row.scores[m], m) for m in METRICS)]
        if row.kind == "reference":
            cells += ["—"] * len(METRICS) + [f"{row.protocol} (published)"]
        else:
            cells += [*(_cell(row.baseline[m], m) for m in METRICS), row.protocol]
        cells.append(row.lpips_net)
        if row.kind == "mean":
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def report_markdown(rows: Sequence[Row], notes: Sequence[str]) -> str:
    lines = [
        "# Pola-GNT results",
        "",
        "Test-view means per scene; the nearest-view columns score the closest training image, unwarped "
        "(a no-learning baseline). Bold rows average the scenes of the group above them.",
        "",
        *markdown_table(rows),
        "",
        "The published rows are 8-scene LLFF averages under GNT's evaluation (`protocol=gnt`: factor 4, "
        "every 2nd pixel, LPIPS-VGG fed [0, 1] images, zero-padded SSIM). Our numbers are comparable "
        "with them only if the protocol matches: protocol gnt, LPIPS net vgg, all eight LLFF scenes, "
        "trained in the paper setting (`experiment=paper`). Rows under the `standard` protocol "
        "(every pixel, LPIPS on [-1, 1], valid SSIM) are not on the same scale.",
    ]
    if notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in notes)]
    runs = [row for row in rows if row.kind == "run"]
    lines += ["", "## Runs", "", *(f"- {' / '.join(row.key)}: `{row.source}`" for row in runs), ""]
    return "\n".join(lines)


def _bar_label(row: Row, mixed: bool) -> str:
    return f"{row.model} [{row.protocol}, {row.lpips_net}]" if mixed else row.model


REFERENCE_SLOT = "published\n(LLFF 8-scene mean,\nGNT protocol)"
REFERENCE_COLOURS = ("0.35", "0.55", "0.75")


def bar_chart(rows: Sequence[Row], metric: str, path: Path) -> None:
    """Per scene, then per group mean, one bar per model with the nearest-view baseline as a black tick;
    the published numbers as a last group of grey bars. Every bar carries its value."""
    ours = [row for row in rows if row.kind != "reference"]
    references = [row for row in rows if row.kind == "reference"]
    mixed = len({(r.protocol, r.lpips_net) for r in ours}) > 1
    # Scenes in LLFF order, then the group means, then the references.
    slots = list(dict.fromkeys(r.scene for r in sorted(ours, key=lambda r: (r.kind == "mean", _scene_order(r.scene)))))
    slots.append(REFERENCE_SLOT)
    series = list(dict.fromkeys(_bar_label(row, mixed) for row in ours))
    figure = Figure(figsize=(max(6.0, 1.3 * len(slots) + 1.5), 5.0), layout="constrained")
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
        index = series.index(_bar_label(row, mixed))
        x = slots.index(row.scene) + (index - (len(series) - 1) / 2) * width
        draw(x, width, row.scores[metric], f"C{index}", series[index], "//" if row.kind == "mean" else None)
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
    axes.set_title(f"{METRIC_TITLES[metric]} per scene (hatched: group mean)", fontsize=10)
    axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, frameon=False)
    figure.savefig(path, dpi=120)


def write_report(run_paths: Sequence[Path], out_dir: Path) -> list[Row]:
    """Read the runs, write `report.md`, `report.csv` and the three charts; return the table rows."""
    runs = [load_run(path) for path in find_metrics_files(run_paths)]
    runs, notes = keep_newest(runs)
    warning = mixing_warning(runs)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    rows = table_rows(runs) + reference_rows()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.md").write_text(report_markdown(rows, [warning, *notes] if warning else notes))
    (out_dir / "report.csv").write_text(report_csv(rows))
    for metric in METRICS:
        bar_chart(rows, metric, out_dir / f"report_{metric}.png")
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pola_gnt.report", description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "runs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="run folder, metrics.json, or a folder searched recursively for metrics.json",
    )
    parser.add_argument("--out", type=Path, default=Path("report"), help="output folder (default: ./report)")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    rows = write_report(args.runs, args.out)
    print("\n".join(markdown_table(rows)))
    n_runs = sum(row.kind == "run" for row in rows)
    print(f"wrote {args.out / 'report.md'}, report.csv, report_{{psnr,ssim,lpips}}.png ({n_runs} runs)")


if __name__ == "__main__":
    main()
