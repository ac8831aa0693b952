"""`python -m pola_gnt.eval scene=NAME ckpt_path=PATH [metrics.lpips_net=alex|vgg] [metrics.protocol=standard|gnt]`

Renders every held-out view of a trained checkpoint and writes `metrics.json`, `metrics.csv` and the
view PNGs into the run folder (`hydra.run.dir`), through the same Lightning test phase as training
(`apps.evaluation.evaluate`): the same checkpoint under the same protocol gives the numbers of the
training run's own `metrics.json`.

The run config is the one stored in the checkpoint; only keys given on the command line change it
(`runs.config.stored.trained_run_config`). `metrics.protocol=gnt` without an explicit
`metrics.lpips_net` scores LPIPS with VGG, as GNT's published numbers did.
"""

from __future__ import annotations

from pola_gnt.core.process import prepare_process

if __name__ == "__main__":  # before torch loads OpenMP
    prepare_process()

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pola_gnt.apps.evaluation import evaluate
from pola_gnt.runs.config.app import announce, entry_point, task_overrides
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import trained_run_config


@entry_point
def main(cfg: DictConfig) -> None:
    announce(cfg, with_experiment=False)
    read_run_settings(cfg)  # the command line's values checked before the checkpoint is read
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    evaluate(trained_run_config(cfg, run_dir, task_overrides()), run_dir)


if __name__ == "__main__":
    main()
