"""Ship a pretraining run's checkpoint inside the package: `pola_gnt/pretrained/NAME.ckpt` (slimmed to
the weights and run config) and its `manifest.json` entry.

    python scripts/ship_pretrained.py RUN_DIR --name pola_gnt --commit SHA \
        --command "python -m pola_gnt.train experiment=pretrain" [--eval EVAL_RUN_DIR ...] [--note TEXT]

The entry records the command and the commit it ran at, the run config stored in the checkpoint, its
steps, training wall time and scenes, and the zero-shot metrics of the run's own test (its held-out
scene) and of each `--eval` run folder (`python -m pola_gnt.eval ... ckpt_path=pretrained:NAME`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pola_gnt.interop.pretrained import ship_checkpoint
from pola_gnt.runs.checkpoints import CHECKPOINT_DIR, checkpoint_training_scenes, read_checkpoint


def scores(run_dir: Path) -> tuple[str, dict]:
    document = json.loads((run_dir / "metrics.json").read_text())
    kept = {"mean", "baseline", "protocol", "lpips_net", "resolution", "test_time_s", "mode", "seen_in_training"}
    result = {key: document[key] for key in sorted(kept) if key in document}
    for key in ("depth", "depth_baseline"):  # the demo scene's exact-depth errors
        if key in document:
            result[key] = document[key]
    return document["scene"], result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--commit", required=True, help="the commit the pretraining ran at")
    parser.add_argument("--command", required=True, help="the pretraining command line")
    parser.add_argument("--eval", type=Path, nargs="*", default=[], help="eval run folders of the shipped file")
    parser.add_argument("--note", default="", help="where and how it ran (machine, threads)")
    args = parser.parse_args()
    source = args.run_dir / CHECKPOINT_DIR / "last.ckpt"
    checkpoint = read_checkpoint(source)
    document = json.loads((args.run_dir / "metrics.json").read_text())
    zero_shot = dict([scores(args.run_dir), *(scores(run) for run in args.eval)])
    entry = {
        "model": checkpoint["hyper_parameters"]["config"]["model"]["name"],
        "command": args.command,
        "commit": args.commit,
        "note": args.note,
        "global_step": int(checkpoint.get("global_step", 0)),
        "train_wall_s": document.get("training", {}).get("wall_time_s"),
        "training_scenes": checkpoint_training_scenes(checkpoint),
        "zero_shot": zero_shot,
        "config": checkpoint["hyper_parameters"]["config"],
    }
    entry = ship_checkpoint(source, args.name, entry)
    print(json.dumps({k: entry[k] for k in ("file", "bytes", "sha256", "global_step", "train_wall_s")}, indent=2))


if __name__ == "__main__":
    main()
