"""A whole report: the runs read, every table computed (`build_report`), and the files written
(`write_full_report`, `write_report`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pola_gnt.evaluation.study.charts import bar_chart
from pola_gnt.evaluation.study.rows import METRICS, Row, mixing_warning, reference_rows, table_rows
from pola_gnt.evaluation.study.runs import find_metrics_files, keep_newest, load_run
from pola_gnt.evaluation.study.seed_statistics import (
    GroupStats,
    PairedDifference,
    paired_differences,
    scratch_differences,
    study_groups,
)
from pola_gnt.evaluation.study.writers import report_csv, report_markdown, study_csv, study_markdown


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
