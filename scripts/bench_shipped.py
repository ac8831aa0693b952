"""Time what a user waits for with the shipped checkpoints, both models side by side from one run.

    python scripts/bench_shipped.py [--models pola_gnt gnt] [--scene fern] [--frames 5] [--out FILE.json]
                                    [--set KEY=VALUE ...]

Parts (each model's in its own child process, the models alternating part by part, so a busy spell of
a shared machine slows both alike; each child's peak resident memory is its own):
- `frame`: frames of the scene's 120-frame spiral at factor 8 (fern: 504x378) through `render_video`'s
  frame loop (`apps.video.render_frames`, its source views kept per scene as the video keeps them),
  colour and depth images made; the median frame after the first (which encodes its source views);
- `view`: the first test view at factor 4 (fern: 1008x756, the published resolution) as the test
  phase renders it: its source views encoded, the prior's per-image part computed, every pixel.

Both use the machine's render settings (`render.precision=auto`, the CPU pass's rays and workers of
`model.render_memory`), as `render_video` and `eval` do. For the demo scene (`--scene demo`) the
factors are 32 and 16 (a check of the script, not a figure). `--set` gives both models the same config
keys, as on the commands' line (e.g. `--set "model.net.readout_neighbour_windows=[0,0.005,0.01,0.02,0.04]"`:
the prior's neighbours, issue 49); a key the checkpoint refuses is the child's `error:` line.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pola_gnt.core.errors import UserError, exit_on_user_error

PARTS = ("frame", "view")
SCENE_FACTORS = {"frame": 8, "view": 4}
DEMO_FACTORS = {"frame": 32, "view": 16}


def measure(model: str, part: str, scene_name: str, frames: int, keys: list[str]) -> dict:
    """One part of one shipped model, in this process."""
    from pola_gnt.core.process import prepare_process

    prepare_process()
    import torch
    from lightning_fabric import Fabric

    from pola_gnt.apps.frames import frame_images
    from pola_gnt.apps.trained_runs import load_trained_checkpoint
    from pola_gnt.apps.video import render_frames, video_camera_path
    from pola_gnt.data.datamodule import SceneDataModule
    from pola_gnt.data.scene_loading import load_scene
    from pola_gnt.model.inference import render_network, resolve_render_precision
    from pola_gnt.model.render_memory import budget_chunk_rays, render_workers
    from pola_gnt.model.renderer import chunk_threads, render_image
    from pola_gnt.runs.config.app import compose_config, register_config
    from pola_gnt.runs.config.stored import trained_run_config

    register_config()
    factor = (DEMO_FACTORS if scene_name == "demo" else SCENE_FACTORS)[part]
    overrides = [f"ckpt_path=pretrained:{model}", f"scene={scene_name}", f"data.factor={factor}", *keys]
    run = trained_run_config(compose_config(*overrides), Path("outputs/bench_shipped"), overrides)
    trained = load_trained_checkpoint(run)
    settings = trained.settings
    scene = load_scene(settings.scene, settings.data)
    system = trained.system.eval()
    cpu = torch.device("cpu")
    precision = resolve_render_precision(settings.render.precision, cpu)
    net = render_network(system.net, precision)
    views = settings.data.num_source_views
    chunk = budget_chunk_rays(settings.render, settings.model.net, views, cpu)
    workers = render_workers(settings.render, settings.model.net, views, chunk, cpu)
    row: dict = {"model": model, "part": part, "scene": scene_name, "precision": str(precision).split(".")[-1]}
    row.update(chunk_rays=chunk, workers=workers)
    if part == "frame":
        path = video_camera_path(scene, settings.video)
        fabric = Fabric(accelerator="cpu", devices=1)
        times, start = [], time.perf_counter()
        for _, frame in render_frames(
            net, scene, path, views, system.sampler, chunk, fabric, range(frames + 1), workers
        ):
            frame_images(frame, scene.depth_range)
            now = time.perf_counter()
            times.append(now - start)
            start = now
        row.update(size=[path.height, path.width], first_frame_s=times[0], frame_s=times[1:])
        row["median_s"] = statistics.median(times[1:])
    else:
        datamodule = SceneDataModule(scene, settings.data, settings.seed)
        datamodule.setup("test")
        batch = next(iter(datamodule.test_dataloader()))
        height, width = scene.resolution
        start = time.perf_counter()
        with torch.no_grad():
            sources = net.source_views(batch.sources.images, batch.sources.c2w, batch.sources.intrinsics)
            images = batch.sources.images
            with chunk_threads(workers):  # as the test phase
                prior = [net.prior_image(images[i : i + 1]) for i in range(len(images))]
            sources.keep_prior_images(net, prior)
            render_image(
                net, batch.c2w, batch.intrinsics, height, width, sources, scene.depth_range, system.sampler, chunk,
                workers=workers,
            )  # fmt: skip
        row.update(size=[height, width], median_s=time.perf_counter() - start)
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def table(rows: list[dict], models: list[str]) -> str:
    lines = [f"{'part':<6} {'size':>9} " + " ".join(f"{m + ' s':>12} {'peak MB':>8}" for m in models)]
    if len(models) == 2:
        lines[0] += f" {models[0] + ' / ' + models[1]:>18}"
    for part in PARTS:
        by_model = {row["model"]: row for row in rows if row["part"] == part}
        if not by_model:
            continue
        size = "x".join(str(n) for n in reversed(next(iter(by_model.values()))["size"]))
        cells = " ".join(f"{by_model[m]['median_s']:12.2f} {by_model[m]['peak_rss_mb']:8.0f}" for m in models)
        line = f"{part:<6} {size:>9} {cells}"
        if len(models) == 2:
            line += f" {by_model[models[0]]['median_s'] / by_model[models[1]]['median_s']:17.2f}x"
        lines.append(line)
    return "\n".join(lines)


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["pola_gnt", "gnt"], choices=["pola_gnt", "gnt"])
    parser.add_argument("--scene", default="fern")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--frames", type=int, default=5, help="frames timed after the first")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config key for both models")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "PART"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.frames < 1:
        raise UserError("--frames must be at least 1")
    if args.child:
        print(json.dumps(measure(*args.child, args.scene, args.frames, args.set)))
        return
    rows = []
    for part in args.parts:
        for model in args.models:
            command = [sys.executable, __file__, "--scene", args.scene, "--frames", str(args.frames)]
            command += [f"--set={key}" for key in args.set]
            result = subprocess.run([*command, "--child", model, part], capture_output=True, text=True)
            if result.returncode != 0:  # its `error:` line (a bad scene, a missing data root), else all it said
                errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
                sys.stderr.write("\n".join(errors[-1:]) + "\n" if errors else result.stderr)
                sys.exit(result.returncode)
            rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
            print(f"{model} {part}: {rows[-1]['median_s']:.2f} s", flush=True)
    print(table(rows, args.models))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
