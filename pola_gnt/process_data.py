"""`python -m pola_gnt.process_data input=PHOTO_DIR|VIDEO out=SCENE_DIR [key=value ...]`

Turns a capture (a folder of photos or a video) into a scene in the LLFF layout with COLMAP
(pycolmap), ready for `python -m pola_gnt.train scene=llff scene.path=SCENE_DIR`:

- `images/` (undistorted to a pinhole camera, principal point at the centre, full size; one
  bicubic resampling of each photo),
  `images_4/`, `images_8/` (area filter, as the loader builds them),
- `poses_bounds.npy` (N x 17: LLFF's `[down, right, back | t | h w f]` and near/far per view from
  the 0.1 / 99.9 percentiles of the depths of the points the view sees), registered views only,
- `colmap/sparse/0/` (COLMAP's model, before undistortion), `process_data.json` (summary).

Everything is written into a hidden temporary folder next to `out` and renamed into place at the
end, so a failure or Ctrl-C never leaves half a scene. Options: conf/process_data.yaml.
"""

from __future__ import annotations

import sys

from pola_gnt.runs.process import prepare_process

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
