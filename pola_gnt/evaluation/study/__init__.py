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

The modules, in the order a report is made: `runs` (reading `metrics.json`), `rows` (the constants,
`Row` and the main table), `seed_statistics` (statistics over seeds, paired differences), `writers`
(CSV and markdown), `charts` (the bar charts) and `report` (all of it, and the files written). The
names below are the package's interface.
"""

from __future__ import annotations

from pola_gnt.evaluation.study.charts import (
    bar_chart,
)
from pola_gnt.evaluation.study.report import (
    Report,
    build_report,
    write_full_report,
    write_report,
)
from pola_gnt.evaluation.study.rows import (
    CONFIDENCE,
    FINE_TUNED,
    LLFF_SCENES,
    METRIC_TITLES,
    METRICS,
    METRICS_FILE,
    MODEL_COMPARISON,
    MODEL_ORDER,
    MODES,
    PAIR,
    PER_SCENE,
    REFERENCE_SCENE,
    REFERENCES,
    SCRATCH_COMPARISON,
    SCRATCH_PAIR,
    UNKNOWN_CONDITION,
    ZERO_SHOT,
    Reference,
    Row,
    group_mean,
    mixing_warning,
    model_label,
    pooled_mean,
    reference_rows,
    scene_rows,
    table_rows,
)
from pola_gnt.evaluation.study.runs import (
    find_metrics_files,
    keep_newest,
    load_run,
    run_mode,
)
from pola_gnt.evaluation.study.seed_statistics import (
    GroupStats,
    PairedDifference,
    paired_differences,
    scratch_differences,
    study_groups,
)
from pola_gnt.evaluation.study.writers import (
    CSV_FIELDS,
    STUDY_CSV_FIELDS,
    markdown_table,
    report_csv,
    report_markdown,
    study_csv,
    study_markdown,
)

__all__ = [
    "CONFIDENCE",
    "CSV_FIELDS",
    "FINE_TUNED",
    "GroupStats",
    "LLFF_SCENES",
    "METRICS",
    "METRICS_FILE",
    "METRIC_TITLES",
    "MODEL_COMPARISON",
    "MODEL_ORDER",
    "MODES",
    "PAIR",
    "PER_SCENE",
    "PairedDifference",
    "REFERENCES",
    "REFERENCE_SCENE",
    "Reference",
    "Report",
    "Row",
    "SCRATCH_COMPARISON",
    "SCRATCH_PAIR",
    "STUDY_CSV_FIELDS",
    "UNKNOWN_CONDITION",
    "ZERO_SHOT",
    "bar_chart",
    "build_report",
    "find_metrics_files",
    "group_mean",
    "keep_newest",
    "load_run",
    "markdown_table",
    "mixing_warning",
    "model_label",
    "paired_differences",
    "pooled_mean",
    "reference_rows",
    "report_csv",
    "report_markdown",
    "run_mode",
    "scene_rows",
    "scratch_differences",
    "study_csv",
    "study_groups",
    "study_markdown",
    "table_rows",
    "write_full_report",
    "write_report",
]
