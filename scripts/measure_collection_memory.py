"""Peak memory of pretraining against the size of its collection: the same short pretraining over
10 and over 100 generated scenes, each in its own process, its peak resident set size read from the
kernel (`wait4`), printed side by side with the ratio (the cache bound `data.cache_mb` holds both).

    python scripts/measure_collection_memory.py [--steps 300] [--cache-mb 256] [--model pola_gnt] [--out FILE.json]

Every step draws its scene by weight, so 300 steps over 100 scenes load about 95 of them (generated on
first use into data/procedural, once); over 10 scenes all stay cached.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def peak_rss_mb(command: list[str]) -> tuple[float, float, int]:
    """-> (peak RSS of the child in MB, wall seconds, exit code)."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        print(child.stderr.read() if child.stderr else "", file=sys.stderr)
    return usage.ru_maxrss / 1024, time.perf_counter() - started, child.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--cache-mb", type=int, default=256)
    parser.add_argument("--model", default="pola_gnt")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    for collection in ("procedural10", "procedural100"):
        with tempfile.TemporaryDirectory() as run_dir:
            command = [
                sys.executable, "-m", "pola_gnt.train", "experiment=pretrain", f"collection={collection}",
                f"model={args.model}", "scene=demo", f"trainer.max_steps={args.steps}",
                f"trainer.val_check_interval={args.steps}", f"data.cache_mb={args.cache_mb}",
                "output.save_images=false", f"hydra.run.dir={run_dir}",
            ]  # fmt: skip
            peak, seconds, code = peak_rss_mb(command)
            if code:
                raise SystemExit(f"{collection}: exit code {code}")
            steps_done = json.loads(open(os.path.join(run_dir, "metrics.json")).read())["global_step"]
        rows.append({"collection": collection, "steps": steps_done, "cache_mb": args.cache_mb,
                     "peak_rss_mb": round(peak, 1), "wall_s": round(seconds, 1)})  # fmt: skip
    small, large = rows
    ratio = large["peak_rss_mb"] / small["peak_rss_mb"]
    print(f"{'collection':<15} {'steps':>6} {'cache MB':>9} {'peak RSS MB':>12} {'wall s':>8}")
    for row in rows:
        print(
            f"{row['collection']:<15} {row['steps']:>6} {row['cache_mb']:>9} {row['peak_rss_mb']:>12.1f} "
            f"{row['wall_s']:>8.1f}"
        )
    print(f"ratio 100 / 10 scenes: {ratio:.3f}")
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"rows": rows, "ratio": ratio}, file, indent=2)


if __name__ == "__main__":
    main()
