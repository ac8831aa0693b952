"""`python -m pola_gnt.train [scene=NAME] [model=pola_gnt|gnt] [experiment=quick|paper] ...`

Fits the model with Lightning, then renders every held-out view and writes `metrics.json`,
`metrics.csv` and the view PNGs into the run folder (`hydra.run.dir`). The run itself, its resume,
stops and disk errors: `pola_gnt.runs.training`.
"""

from __future__ import annotations

import os
import signal
import sys


def _stop_during_startup(signum, frame) -> None:
    """SIGTERM / SIGINT while the libraries load, before anything is saved: one line, 128 + signal."""
    name = signal.Signals(signum).name
    print(
        f"stopped: {name} during start-up; nothing was saved; run the same command again", file=sys.stderr, flush=True
    )
    os._exit(128 + signum)


if __name__ == "__main__":  # installed before the slow imports; `train()` installs the real handlers
    for _signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(_signum, _stop_during_startup)

from pola_gnt.core.process import prepare_process

if __name__ == "__main__":  # before torch loads OpenMP
    prepare_process()

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pola_gnt.runs.config.app import announce, check_finetuning, entry_point, task_overrides
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import checkpoint_to_resume, container_dict, inherit_initial_network
from pola_gnt.runs.training import train


@entry_point
def main(cfg: DictConfig) -> None:
    announce(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    inherit_initial_network(cfg, task_overrides(), run_dir)  # fine-tuning: the checkpoint's network
    settings = read_run_settings(cfg)  # every value checked before any work
    check_finetuning(settings)
    train(settings, container_dict(cfg), run_dir, checkpoint_to_resume(cfg, run_dir), task_overrides())


if __name__ == "__main__":
    main()
