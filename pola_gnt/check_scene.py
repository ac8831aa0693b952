"""`python -m pola_gnt.check_scene [scene=NAME] [data.root=DIR] [data.factor=F]`: load a scene and print a
summary. Writes nothing (no run folder, no Hydra log); a missing `images_F/` folder is still built
in the scene folder, as training would."""

import sys

from pola_gnt.core.process import prepare_process

if __name__ == "__main__":  # before torch loads OpenMP
    prepare_process()

from omegaconf import DictConfig

from pola_gnt.data.scene_loading import load_scene
from pola_gnt.runs.config.app import entry_point
from pola_gnt.runs.config.read import read_run_settings

# Given before the user's arguments, so an explicit `hydra.run.dir=...` still wins.
NO_OUTPUT_OVERRIDES = [
    "hydra.run.dir=.",
    "hydra.output_subdir=null",
    "hydra/job_logging=disabled",
    "hydra/hydra_logging=disabled",
    "~hydra.callbacks.run_folder_check",
]


@entry_point
def main(cfg: DictConfig) -> None:
    settings = read_run_settings(cfg)
    print(load_scene(settings.scene, settings.data).summary())


if __name__ == "__main__":
    sys.argv[1:1] = NO_OUTPUT_OVERRIDES
    main()
