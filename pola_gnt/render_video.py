"""`python -m pola_gnt.render_video scene=NAME ckpt_path=PATH [video.frames=120] [video.fps=30]
[video.path=spiral|interpolate|FILE.json] [video.save_path=FILE.json] [video.scale=0.5]`

Renders a fly-through of a trained checkpoint and writes `video_rgb.mp4` and `video_depth.mp4`
(H.264, yuv420p) into the run folder (`hydra.run.dir`). The path is GNT's spiral, an interpolation
through the training cameras, or a camera_path.json file (nerfstudio's format, e.g. saved by
`python -m pola_gnt.view`: its cameras, size and frame rate); `video.save_path` saves the rendered
path in that format. Each frame is rendered from its `data.num_source_views` nearest training
cameras, at the path's size times `video.scale` (0.5: a preview at half the width and height, about
4x faster; the source views stay at full size), and kept in `frames/` as it is rendered: the same
command with the same `hydra.run.dir` resumes after the last finished frame. The model and render
settings come from the checkpoint exactly as for `pola_gnt.eval`; the `video` section and the
`trainer` section (accelerator, precision) from the command line.
"""

from __future__ import annotations

from pola_gnt.core.process import prepare_process

if __name__ == "__main__":  # before torch loads OpenMP
    prepare_process()

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pola_gnt.apps.camera_path_file import read_camera_path
from pola_gnt.apps.video import render_video
from pola_gnt.runs.config.app import announce, entry_point, task_overrides
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import trained_run_config


@entry_point
def main(cfg: DictConfig) -> None:
    announce(cfg, with_experiment=False)
    settings = read_run_settings(cfg)  # the command line's values checked before the checkpoint is read
    if settings.video.path.endswith(".json"):
        read_camera_path(Path(settings.video.path))  # a bad path file: one error line, before the checkpoint loads
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    render_video(trained_run_config(cfg, run_dir, task_overrides()), run_dir)


if __name__ == "__main__":
    main()
