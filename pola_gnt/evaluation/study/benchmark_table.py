"""The benchmark's table: per LLFF scene our scores by GNT's protocol beside the published figures of the
benchmark's setting (`published.figures_for`), our standard-protocol scores in their own columns, the
scene's marks (seen in pretraining, a re-processed copy, ...), and the means, labelled with the scenes
they are over. As markdown (`benchmark.md`) and CSV (`benchmark.csv`); `apps.benchmark` writes them
from the scenes' `metrics.json` files."""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from pola_gnt.evaluation.study.published import LLFF_SCENES, PROTOCOL_NOTES, PublishedFigures

METRICS = ("psnr", "ssim", "lpips")
OUR_PROTOCOLS = ("gnt", "standard")  # GNT's first: the published figures are compared by it
SCORED, MISSING, SKIPPED, PENDING = "scored", "missing", "skipped", "pending"
# The marks of a scene whose scores are not comparable with the published ones, and what each means.
MARK_LEGEND = {
    "seen": "the checkpoint trained on this scene (its training record): not a zero-shot score",
    "re-processed": "images_F/ is not the published nerf_llff_data copy (another size): other pixels and poses",
    "subset": "fewer test views than the published split (data.test_views)",
    "factor": "not factor 4 (data.factor): published figures are at 1008x756",
    "split": "not every 8th view held out (data.llffhold)",
}


@dataclass
class SceneResult:
    """One scene of the benchmark: its status, and when scored its metrics.json and marks."""

    name: str
    status: str  # SCORED | MISSING (no such folder) | SKIPPED (reason) | PENDING (not scored yet)
    reason: str = ""
    marks: dict[str, str] = field(default_factory=dict)  # mark -> what it says of this scene
    document: dict | None = None  # the scene's metrics.json (with `protocols`: both of OUR_PROTOCOLS)

    def scores(self, protocol: str) -> dict[str, float | None]:
        if self.document is None:
            return dict.fromkeys(METRICS)
        return self.document["protocols"][protocol]["mean"]

    def image_scores(self, protocol: str) -> list[dict[str, float | None]]:
        return [] if self.document is None else self.document["protocols"][protocol]["per_image"]


def _mean(values: Sequence[float | None]) -> float | None:
    """The mean, or None when there is none or any value is missing (a mean over fewer is mislabelled)."""
    return None if not values or any(v is None for v in values) else float(statistics.fmean(values))  # type: ignore[arg-type]


@dataclass
class TableRow:
    label: str
    marks: str
    views: str
    ours: dict[str, dict[str, float | None]]  # protocol -> metric -> value
    published: dict[str, dict[str, float | None]]  # figures key -> metric -> value
    test_time_s: float | None = None


def _published_scene(figures: PublishedFigures, scene: str) -> dict[str, float | None]:
    scores = figures.scene(scene)
    return scores.as_dict() if scores is not None else dict.fromkeys(METRICS)


def _published_mean_over(figures: PublishedFigures, scenes: Sequence[str]) -> dict[str, float | None]:
    """The mean of the published per-scene figures over `scenes` (the scenes our mean is over)."""
    per_scene = [_published_scene(figures, s) for s in scenes]
    return {m: _mean([row[m] for row in per_scene]) for m in METRICS}


def table_rows(results: Sequence[SceneResult], figures: Sequence[PublishedFigures]) -> list[TableRow]:
    """Per scene, then the means: over the scored scenes (labelled with how many of the 8), over the
    comparable ones (no mark) when they differ, pooled over the images (GNT's mean), and the
    published 8-scene means."""
    rows = []
    for result in results:
        marks = ", ".join(result.marks) if result.status == SCORED else result.status
        if result.status in (SKIPPED, MISSING) and result.reason:
            marks = f"{result.status}: {result.reason}"
        document = result.document
        views = (
            f"{len(document['per_image'])} at {document['resolution'][1]}x{document['resolution'][0]}"
            if document is not None
            else ""
        )
        rows.append(
            TableRow(
                result.name,
                marks,
                views,
                {p: result.scores(p) for p in OUR_PROTOCOLS},
                {f.key: _published_scene(f, result.name) for f in figures},
                None if document is None else document.get("test_time_s"),
            )
        )
    scored = [r for r in results if r.status == SCORED]
    groups = [(scored, _mean_label(scored))]
    comparable = [r for r in scored if not r.marks]
    if comparable and len(comparable) != len(scored):
        groups.append((comparable, f"mean of the {len(comparable)} comparable (unmarked) scenes"))
    for members, label in groups:
        if not members:
            continue
        names = [r.name for r in members]
        rows.append(
            TableRow(
                label,
                ", ".join(names),
                str(sum(len(r.image_scores("standard")) for r in members)),
                {p: {m: _mean([r.scores(p)[m] for r in members]) for m in METRICS} for p in OUR_PROTOCOLS},
                {f.key: _published_mean_over(f, names) for f in figures},
            )
        )
    if scored:
        images = {p: [row for r in scored for row in r.image_scores(p)] for p in OUR_PROTOCOLS}
        rows.append(
            TableRow(
                "pooled over the images (how GNT averaged)",
                ", ".join(r.name for r in scored),
                str(len(images["standard"])),
                {p: {m: _mean([row[m] for row in images[p]]) for m in METRICS} for p in OUR_PROTOCOLS},
                {f.key: dict.fromkeys(METRICS) for f in figures},
            )
        )
    rows.append(
        TableRow(
            "published 8-scene mean",
            "",
            "",
            {p: dict.fromkeys(METRICS) for p in OUR_PROTOCOLS},
            {f.key: f.mean.as_dict() for f in figures},
        )
    )
    return rows


def _mean_label(scored: Sequence[SceneResult]) -> str:
    names = {r.name for r in scored}
    if names >= set(LLFF_SCENES) and len(names) == len(LLFF_SCENES):
        return "mean of the 8 scenes"
    count = "the 1 scene" if len(scored) == 1 else f"the {len(scored)} scenes"
    return f"mean of {count} at hand (not the 8-scene mean)"


def _cell(value: float | None, metric: str) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" if metric == "psnr" else f"{value:.3f}"


def _our_lpips_net(results: Sequence[SceneResult], protocol: str) -> str:
    nets = {r.document["protocols"][protocol]["lpips_net"] for r in results if r.document is not None}
    return "/".join(sorted(nets)) or ("vgg" if protocol == "gnt" else "alex")


def markdown_table(
    results: Sequence[SceneResult], figures: Sequence[PublishedFigures], title: str, notes: Sequence[str] = ()
) -> str:
    """`benchmark.md`: the title, the table, the marks' legend and the sources of the published columns."""
    rows = table_rows(results, figures)
    gnt_net, standard_net = _our_lpips_net(results, "gnt"), _our_lpips_net(results, "standard")
    header = ["scene", "marks", "test views"]
    header += ["ours GNT-protocol PSNR", "SSIM", f"LPIPS-{gnt_net}"]
    for f in figures:
        header += [f"{f.label} PSNR", "SSIM", f"LPIPS-{f.lpips_net}"]
    header += ["ours standard PSNR", "SSIM", f"LPIPS-{standard_net}", "test phase s"]
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.label, row.marks, row.views]
        cells += [_cell(row.ours["gnt"][m], m) for m in METRICS]
        for f in figures:
            cells += [_cell(row.published[f.key][m], m) for m in METRICS]
        cells += [_cell(row.ours["standard"][m], m) for m in METRICS]
        cells.append("" if row.test_time_s is None else f"{row.test_time_s:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "— : not available (a published per-scene figure no source gives, or a score not made).", ""]
    if any(r.marks for r in results):
        lines += ["Marks (scores not comparable with the published ones):", ""]
        for r in results:
            for mark, why in r.marks.items():
                lines.append(f"- {r.name}: **{mark}**: {why}")
        lines.append("")
    lines += ["Protocols:", ""]
    lines.append(f"- ours GNT-protocol: {PROTOCOL_NOTES['gnt']} (`metrics.protocol=gnt`)")
    lines.append("- ours standard: every pixel, LPIPS-Alex on [-1,1], 8-bit predictions (the project's protocol)")
    for f in figures:
        lines.append(f"- {f.label}: {PROTOCOL_NOTES[f.protocol]}; {f.source}." + (f" {f.note}." if f.note else ""))
    lines += ["", *notes]
    return "\n".join(lines).rstrip() + "\n"


def csv_table(results: Sequence[SceneResult], figures: Sequence[PublishedFigures]) -> str:
    """`benchmark.csv`: the markdown table's rows, one column per value."""
    fields = ["row", "marks", "test_views"]
    fields += [f"ours_gnt_{m}" for m in METRICS]
    for f in figures:
        fields += [f"{f.key}_{m}" for m in METRICS]
    fields += [f"ours_standard_{m}" for m in METRICS] + ["test_time_s"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    for row in table_rows(results, figures):
        record: dict[str, object] = {"row": row.label, "marks": row.marks, "test_views": row.views}
        record.update({f"ours_gnt_{m}": row.ours["gnt"][m] for m in METRICS})
        for f in figures:
            record.update({f"{f.key}_{m}": row.published[f.key][m] for m in METRICS})
        record.update({f"ours_standard_{m}": row.ours["standard"][m] for m in METRICS})
        record["test_time_s"] = row.test_time_s
        writer.writerow(record)
    return buffer.getvalue()
