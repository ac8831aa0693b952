"""`python -m pola_gnt.report RUN_DIR... [--out DIR]`: one table and bar charts over many runs.

Each RUN_DIR is a run folder, a `metrics.json`, or any folder above run folders (searched
recursively for `metrics.json`). Writes into `--out`:

- `report.md`: one row per (scene, model) grouped per model and mode, each group closed by its mean
  over the scenes (the 8-scene LLFF mean when all eight are there), next to the published reference
  numbers;
- `report.csv`: the same rows, machine-readable (empty cell = not available);
- `report_psnr.png`, `report_ssim.png`, `report_lpips.png`: one bar per model and scene (the mean
  over seeds, with their standard deviation), the nearest-view baseline as a tick on each bar and
  the published numbers as dashed lines;
- `report_study.csv` and the "Seeded study" section of `report.md`: per scene, model, mode and
  condition, mean and standard deviation over seeds of PSNR / SSIM / LPIPS with the training wall
  time, steps and steps per second; the paired difference Pola-GNT minus GNT (paired by scene and
  seed within one mode) and, when there are fine-tuned runs, the paired difference fine-tuned minus
  from scratch ("Fine-tuned vs from scratch": same model, scene, seed and condition), each with a 95%
  Student t interval; and every run with its seed, mode, budget and timings.

Every run has a mode, from `metrics.json` ("mode", else derived from "init_from" and
"seen_in_training"; older files are per-scene): `per-scene` (trained from scratch on the scored
scene), `fine-tuned` (pretrained weights, then trained on the scored scene) or `zero-shot`
(pretrained on other scenes only). Rows of different modes, protocols or LPIPS networks are never
averaged together or paired as Pola-GNT vs GNT: a model's runs are grouped per (model, mode, protocol,
LPIPS net, condition), and mixing protocols in one report prints a warning. The condition is the
training budget on the scored scene (`N steps` or `T wall time`, from `metrics.json`; a fine-tuned
run's is the fine-tuning's, a zero-shot run has none and reads `zero-shot`) and the settings that
change what a run measures (factor, samples, source views): runs of different conditions are never
averaged or paired. A seeded study is one Hydra multirun, e.g.
`python -m pola_gnt.train -m model=gnt,pola_gnt seed=0,1,2 scene=fern`, then
`python -m pola_gnt.report outputs/multirun/DATE_TIME --out reports/study`.

The reading, statistics and writing are `pola_gnt.evaluation.study`'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from pola_gnt.core.errors import exit_on_user_error
from pola_gnt.evaluation.study import markdown_table, write_full_report


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
    report = write_full_report(args.runs, args.out)
    print("\n".join(markdown_table(report.rows)))
    print()
    print("\n".join(report.study_lines))
    n_runs = sum(row.kind == "run" for row in report.rows)
    print(
        f"wrote {args.out / 'report.md'}, report.csv, report_study.csv, report_{{psnr,ssim,lpips}}.png ({n_runs} runs)"
    )


if __name__ == "__main__":
    main()
