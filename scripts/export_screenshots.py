"""Screenshots of an exported point cloud in the viewer, in headless Chromium: the PLY alone (the viewer's
`Show: Nothing`, no render) with the training cameras' frusta, from the first training camera and from an
oblique viewpoint turned about the point the cameras look at.

    python scripts/export_screenshots.py ckpt_path=CKPT [scene=NAME ...] --ply FILE.ply --out DIR \
        [--name NAME] [--turn 35] [--lift 0.3] [--back 1.3] [--point-size S]

`--mesh mesh.ply` shows the export's mesh instead of its points. Writes DIR/NAME_front.png and
DIR/NAME_oblique.png (`apt-get install chromium`; the browser is driven as in
`scripts/viewer_screenshots.py`).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path

from pola_gnt.core.errors import exit_on_user_error

HERE = Path(__file__).resolve().parent


def viewer_screenshots_module():
    spec = importlib.util.spec_from_file_location("viewer_screenshots", HERE / "viewer_screenshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("overrides", nargs="+", help="the viewer's overrides: ckpt_path=CKPT [scene=NAME ...]")
    parser.add_argument("--ply", type=Path, required=True)
    parser.add_argument("--mesh", type=Path, help="an exported mesh.ply shown instead of the points (trimesh, viser's)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default="pointcloud")
    parser.add_argument("--turn", type=float, default=35.0, help="oblique view: degrees turned about the up axis")
    parser.add_argument("--lift", type=float, default=0.3, help="oblique view: raised by this share of the depth")
    parser.add_argument("--back", type=float, default=1.3, help="oblique view: this many times as far from the pivot")
    parser.add_argument("--point-size", type=float, help="scene units; default the viewer's")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    shots = viewer_screenshots_module()

    from pola_gnt.core.process import prepare_process

    prepare_process()
    import numpy as np

    from pola_gnt.apps.viewer import orbit_depth, start_viewer
    from pola_gnt.runs.config.app import compose_config
    from pola_gnt.runs.config.read import read_run_settings
    from pola_gnt.runs.config.stored import trained_run_config

    overrides = [*args.overrides, "view.port=0", f"view.point_cloud={args.ply.resolve()}"]
    cfg = compose_config(*overrides)
    ckpt_path = str(read_run_settings(cfg).ckpt_path)
    args.out.mkdir(parents=True, exist_ok=True)
    with shots.HeadlessChromium() as browser:
        app = start_viewer(trained_run_config(cfg, args.out, overrides), args.out, ckpt_path)
        try:
            browser.open(app.url)
            shots.wait_until(lambda: bool(app.clients), args.timeout, "page connected")
            view = next(iter(app.clients.values()))
            view.mode.value = "Nothing"  # the point cloud alone: no render behind it
            if args.mesh is not None:
                import trimesh  # viser's own dependency

                view.cloud_shown.value = False
                app.server.scene.add_mesh_trimesh("/geometry/mesh", trimesh.load(args.mesh))
            if args.point_size is not None:
                view.point_size.value = args.point_size
            scene = app.renderer.scene
            c2w = scene.cameras.c2w[scene.train_ids[0]].double().numpy()
            depth = orbit_depth(scene, scene.cameras.c2w[scene.train_ids[0]])
            pivot = c2w[:3, 3] + depth * c2w[:3, 2]
            up = -c2w[:3, 1]
            angle = math.radians(args.turn)
            # Rodrigues: the camera's offset from the pivot turned about the up axis, then lifted.
            offset = c2w[:3, 3] - pivot
            turned = (
                offset * math.cos(angle)
                + np.cross(up, offset) * math.sin(angle)
                + up * float(up @ offset) * (1 - math.cos(angle))
            )
            turned = args.back * turned + args.lift * depth * up
            for suffix, position in (("front", c2w[:3, 3]), ("oblique", pivot + turned)):
                with view.client.atomic():
                    view.client.camera.fov = math.radians(float(view.fov.value))
                    view.client.camera.position = position
                    view.client.camera.up_direction = up
                    view.client.camera.look_at = pivot
                time.sleep(8.0)  # the browser draws the cloud in software (SwiftShader)
                browser.screenshot(args.out / f"{args.name}_{suffix}.png")
                print(f"wrote {args.out / f'{args.name}_{suffix}.png'}", flush=True)
        finally:
            app.stop()


if __name__ == "__main__":
    sys.exit(main())
