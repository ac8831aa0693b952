"""Plot training and validation PSNR against step for one or more runs, from their CSV logs.

    python scripts/plot_training.py RUN_DIR [RUN_DIR ...] --out psnr_vs_step.png

Each run is labelled `<scene> / <model>` from its metrics.json (or the folder name).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pola_gnt.core.errors import UserError, exit_on_user_error  # noqa: E402


def read_log(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """`{"train/psnr": [(step, value)], "val/psnr": [...]}` from `<run>/csv/metrics.csv`."""
    log = run_dir / "csv" / "metrics.csv"
    if not log.is_file():
        raise UserError(f"{log}: not found (is {run_dir} a training run folder?)")
    series: dict[str, list[tuple[int, float]]] = {"train/psnr": [], "val/psnr": []}
    with log.open() as file:
        for row in csv.DictReader(file):
            for key in series:
                if row.get(key):
                    series[key].append((int(row["step"]), float(row[key])))
    return series


def run_label(run_dir: Path) -> str:
    metrics = run_dir / "metrics.json"
    if metrics.is_file():
        document = json.loads(metrics.read_text())
        return f"{document['scene']} / {document['model']} (test {document['mean']['psnr']:.2f} dB)"
    return run_dir.name


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, default=Path("psnr_vs_step.png"))
    args = parser.parse_args()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for index, run_dir in enumerate(args.runs):
        series = read_log(run_dir)
        colour = f"C{index}"
        label = run_label(run_dir)
        if series["train/psnr"]:
            steps, values = zip(*series["train/psnr"])
            axis.plot(steps, values, color=colour, alpha=0.35, linewidth=1)
        if series["val/psnr"]:
            steps, values = zip(*series["val/psnr"])
            axis.plot(steps, values, color=colour, marker="o", label=f"{label}, validation")
    axis.set_xlabel("training step")
    axis.set_ylabel("PSNR (dB)")
    axis.set_title("PSNR against step (faint: training batches)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(args.out, dpi=120)
    print(args.out)


if __name__ == "__main__":
    main()
