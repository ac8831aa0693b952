"""`python -m pola_gnt.analyze ckpt_path=PATH [scene=NAME] [analyze.n_rays=N] [hydra.run.dir=DIR]`

Attention diagnostics of a trained Pola-GNT checkpoint, as the PolaFormer++ paper plots them. Renders
`analyze.n_rays` random rays of a held-out view while recording what every polarity-attention module
sees, and writes into the run folder:

- `attention_temperatures.png`: per layer, the learned temperatures `sigmoid(s)` per channel: the
  `x+` half against the `x-` half of each stream, and the same-sign against the opposite-sign stream
  for the same query part, with the y = x diagonal (init: every point at (0.5, 0.5));
- `attention_gates_pca.png`: per layer, the gate values of the same-sign ("Gs") and opposite-sign
  ("Go") channels, one point per token and stream, projected on their two principal axes;
- `attention_entropy.png`: per layer, the distribution of the row entropies of the trained polarity
  weights (both streams) and of softmax and ReLU-linear weights computed on the *same* q, k;
- `analysis.json`: the per-layer numbers behind the plots.

The checkpoint's stored config decides the model, data and rendering settings; keys given on the
command line (`scene=NAME`, `data.root=DIR`, `render.n_samples=N`, ...) replace the stored ones, as for
`pola_gnt.eval` (`runs.config.stored.trained_run_config`). The computations and plots are
`pola_gnt.evaluation.attention_analysis`'s; this command loads the checkpoint.
"""

from __future__ import annotations

from pola_gnt.core.process import prepare_process

if __name__ == "__main__":  # before torch loads OpenMP
    prepare_process()

from collections.abc import Sequence
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pola_gnt.apps.trained_runs import load_trained_checkpoint
from pola_gnt.core.errors import UserError
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.evaluation.attention_analysis import analyse_view, summary_lines
from pola_gnt.runs.config.app import entry_point, task_overrides
from pola_gnt.runs.config.read import read_analyze_settings
from pola_gnt.runs.config.stored import trained_run_config
from pola_gnt.runs.settings import RunSettings


def require_polarity_attention(path: Path, settings: RunSettings) -> None:
    net = settings.model.net
    if "pola" not in (net.view_attention, net.ray_attention):
        raise UserError(
            f"{path}: a model={settings.model.name} checkpoint (view attention {net.view_attention}, ray "
            f"attention {net.ray_attention}) has no polarity attention to analyse; "
            "the analysis needs model=pola_gnt"
        )


def analyze(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> dict:
    """Load the checkpoint, render and record, plot; write and return the `analysis.json` document.

    `overrides`: the command line's keys, the only ones that change the checkpoint's stored config
    (as for `pola_gnt.eval`); the `analyze` section always comes from the command line's config.
    """
    options = read_analyze_settings(cfg.analyze)  # checked before the checkpoint is read
    trained = load_trained_checkpoint(trained_run_config(cfg, run_dir, overrides))
    settings = trained.settings
    require_polarity_attention(trained.path, settings)
    net = trained.system.net.eval().to("cuda" if torch.cuda.is_available() else "cpu")
    scene = load_scene(settings.scene, settings.data)
    if options.test_view >= len(scene.test_ids):
        raise UserError(f"analyze.test_view: {options.test_view} but {scene.name} has {len(scene.test_ids)} test views")
    return analyse_view(
        net,
        scene,
        scene.test_ids[options.test_view],
        options.n_rays,
        int(cfg.seed),  # the command line's seed, not the trained run's: it picks the analysed rays
        settings.data.num_source_views,
        trained.system.sampler,
        settings.render.chunk_rays,
        run_dir,
        header={"checkpoint": str(trained.path), "model": settings.model.name},
    )


@entry_point
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    print("\n".join(summary_lines(analyze(cfg, run_dir, task_overrides()), run_dir)))


if __name__ == "__main__":
    main()
