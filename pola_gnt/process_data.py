"""`python -m pola_gnt.process_data input=PHOTO_DIR|VIDEO out=SCENE_DIR [key=value ...]`

A capture (a folder of photos or a video) -> a scene in the LLFF layout, ready for
`python -m pola_gnt.train scene=llff scene.path=SCENE_DIR`; what is written and how:
`pola_gnt.data.processing`. Options: conf/process_data.yaml.
"""

from __future__ import annotations

import sys

from pola_gnt.core.process import prepare_process

if __name__ == "__main__":  # before torch loads OpenMP
    prepare_process()

from dataclasses import replace

from omegaconf import DictConfig

from pola_gnt.data.processing import process_data
from pola_gnt.runs.config.app import entry_point
from pola_gnt.runs.config.read import read_process_data_settings


@entry_point(config_name="process_data")
def main(cfg: DictConfig) -> None:
    settings = read_process_data_settings(cfg)
    if sys.stderr is None:  # no terminal to show progress on
        settings = replace(settings, progress=False)
    process_data(settings)


if __name__ == "__main__":
    main()
