"""`python -m pola_gnt.benchmark ckpt_path=PATH [benchmark.mode=zero_shot|finetune|per_scene]
[benchmark.scenes=[fern,room]] [benchmark.budget_minutes=M] [data.root=DIR]`

LLFF at the published protocol in one command: every LLFF scene under `data.root` at factor 4
(`images_4/`), every 8th view held out, all test views, each view rendered once and scored by the
standard protocol and GNT's; per scene a folder with its `metrics.json` (both protocols), and
`benchmark.md` / `benchmark.csv`: ours beside GNT's and IBRNet's published figures, with the scenes
whose scores are not comparable marked. The same command with the same `hydra.run.dir` resumes a
stopped benchmark. The library: `pola_gnt.apps.benchmark`.
"""

from __future__ import annotations

import sys

from pola_gnt.core.process import prepare_process

if __name__ == "__main__":  # before torch loads OpenMP
    prepare_process()

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pola_gnt.apps.benchmark import run_benchmark
from pola_gnt.runs.config.app import announce, entry_point, task_overrides
from pola_gnt.runs.config.read import read_run_settings

# Given before the user's arguments, so an explicit `hydra.run.dir=...` still wins: the benchmark's
# folder is not one scene's (the project config's default names the scene and the model).
RUN_DIR_OVERRIDES = ["hydra.run.dir=outputs/benchmark/${now:%Y-%m-%d_%H-%M-%S}"]


@entry_point
def main(cfg: DictConfig) -> None:
    announce(cfg, with_experiment=cfg.benchmark.mode == "per_scene")  # finetune: experiment=finetune per scene
    settings = read_run_settings(cfg)  # the command line's values checked before anything is read
    hydra_config = HydraConfig.get()
    run_dir = Path(hydra_config.runtime.output_dir)
    run_benchmark(settings, task_overrides(), run_dir, str(hydra_config.job.config_name))


if __name__ == "__main__":
    sys.argv[1:1] = RUN_DIR_OVERRIDES
    main()
