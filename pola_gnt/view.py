"""`python -m pola_gnt.view ckpt_path=CKPT [scene=NAME] [view.host=127.0.0.1] [view.port=8080]`

A web viewer of a checkpoint's scene (trained, `pretrained:NAME` or converted; `scene=` picks the
source views' scene, default the checkpoint's): open the printed URL. The opening view renders as
soon as the page connects; moving the camera renders a low-resolution preview within about a second
on a CPU, refined to full resolution while the camera stays still (the page shows the full image's
progress); colour or depth; the training cameras drawn as frusta, the nearest source views listed;
keyframes recorded into a camera path saved as camera_path.json (`render_video video.path=FILE`)
or rendered to mp4s from the page. Served on 127.0.0.1 by default: from another machine, forward
the port over ssh (the line is printed). Ctrl-C stops it.
"""

from __future__ import annotations

from pola_gnt.core.process import prepare_process

if __name__ == "__main__":  # before torch loads OpenMP
    prepare_process()

import logging
import threading
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pola_gnt.apps.viewer import start_viewer
from pola_gnt.runs.config.app import announce, entry_point, task_overrides
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import trained_run_config


@entry_point
def main(cfg: DictConfig) -> None:
    announce(cfg, with_experiment=False)
    settings = read_run_settings(cfg)  # the command line's values checked before the checkpoint is read
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    logging.getLogger("websockets").setLevel(logging.WARNING)
    app = start_viewer(trained_run_config(cfg, run_dir, task_overrides()), run_dir, str(settings.ckpt_path))
    print(f"viewer      open {app.url} in a browser (Ctrl-C stops)", flush=True)
    print(
        f"remote      on another machine: ssh -N -L {app.port}:127.0.0.1:{app.port} USER@THIS_HOST, "
        f"then open http://127.0.0.1:{app.port}",
        flush=True,
    )
    try:
        threading.Event().wait()
    finally:
        app.stop()


if __name__ == "__main__":
    main()
