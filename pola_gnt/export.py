"""`python -m pola_gnt.export ckpt_path=PATH [scene=NAME] [export.outputs=[pointcloud,mesh,depth,cameras]]
[export.cameras=train|test|spiral] [export.views=N] [export.scale=0.5] [export.min_confidence=C]
[export.consistent_views=N] [export.voxel_size=V] [export.max_points=N] [export.mesh_format=ply|obj]`

Geometry out of any checkpoint (trained, converted or `pretrained:NAME` on a scene it never saw) into the
run folder (`hydra.run.dir`): `pointcloud.ply` (coloured points fused from the rendered depth of a camera
set, filtered by the read-out's confidence and by multi-view depth consistency), `mesh.ply|obj` (TSDF
fusion of the same depth; `pip install -e ".[export]"`), `depth/` (per-view depth as float32 .npy and
16-bit PNG, confidence maps, `depth.json`) and `cameras/` (nerfstudio's transforms.json and COLMAP's text
model, with the images), all in the scene's normalised frame; `export.json` records counts and times.
The model and render settings come from the checkpoint as for `pola_gnt.eval`; the `export`, `video`
(the spiral) and `trainer` sections from the command line.
"""

from __future__ import annotations

from pola_gnt.core.process import prepare_process

if __name__ == "__main__":  # before torch loads OpenMP
    prepare_process()

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pola_gnt.apps.export.run import run_export
from pola_gnt.apps.export.tsdf import import_marching_cubes
from pola_gnt.runs.config.app import announce, entry_point, task_overrides
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import trained_run_config


@entry_point
def main(cfg: DictConfig) -> None:
    announce(cfg, with_experiment=False)
    settings = read_run_settings(cfg)  # the command line's values checked before the checkpoint is read
    if "mesh" in settings.export.outputs:
        import_marching_cubes()  # a missing optional extra: one line before the checkpoint loads
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    run_export(trained_run_config(cfg, run_dir, task_overrides()), run_dir)


if __name__ == "__main__":
    main()
