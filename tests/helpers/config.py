"""The project's config in tests: composed from `conf/` as a command composes it, and read into the
typed settings by `pola_gnt.runs.config`; the tiny pipeline every training test uses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pola_gnt.core.paths import PROJECT_ROOT
from pola_gnt.data.settings import DataSettings, ProcessDataSettings, SceneSettings
from pola_gnt.model.settings import NetSettings
from pola_gnt.runs.config.app import compose_config, register_config
from pola_gnt.runs.config.read import read_process_data_settings, read_run_settings
from pola_gnt.runs.config.stored import checkpoint_to_resume, container_dict
from pola_gnt.runs.settings import RunSettings
from pola_gnt.runs.system import GNTSystem
from pola_gnt.runs.training import train

CONFIG_DIR = str(PROJECT_ROOT / "conf")
register_config()  # the tests compose configs outside the entry points

# A tiny, fast configuration of the full pipeline (demo scene at 126x94, narrow model), for tests
# that need a trained run or checkpoint. Keep in one place so every test trains the same way.
TINY_OVERRIDES = [
    "data.factor=32",
    "data.rays_per_step=64",
    "data.val_rays=256",
    "data.num_source_views=3",
    "render.n_samples=8",
    "render.chunk_rays=4096",
    "model.net.width=16",
    "model.net.heads=2",
    "model.net.n_blocks=2",
    "model.net.encoder.stage_channels=[8,8,8]",
    "trainer.log_every_n_steps=1",
]
# The session's shared tiny runs (conftest's `tiny_runs`: these with `model=gnt` or `model=pola_gnt`
# and `hydra.run.dir`): a test that needs this very run reads `tiny_runs` rather than training it again.
TINY_RUN_OVERRIDES = [*TINY_OVERRIDES, "trainer.max_steps=6", "trainer.val_check_interval=3"]


def run_settings(*overrides: str) -> RunSettings:
    """The checked settings of `conf/config.yaml` (the CPU defaults) with these overrides."""
    return read_run_settings(compose_config(*overrides))


def net_settings(model: str = "pola_gnt", **values) -> NetSettings:
    """`model.net` of `conf/model/<model>.yaml` as it stands (no experiment's changes), with `values` replaced."""
    return replace(run_settings(f"model={model}", "experiment=standard", "trainer=cpu").model.net, **values)


def process_data_settings(**values) -> ProcessDataSettings:
    """`conf/process_data.yaml`'s settings with `values` set (`input` and `out` at least)."""
    config = OmegaConf.load(PROJECT_ROOT / "conf" / "process_data.yaml")
    for key in ("defaults", "hydra"):  # Hydra's, not the command's (a composed config has neither)
        config.pop(key)
    config.merge_with(values)
    return read_process_data_settings(config)


def scene_and_data(cfg: DictConfig) -> tuple[SceneSettings, DataSettings]:
    """`load_scene`'s arguments for a composed config."""
    settings = read_run_settings(cfg)
    return settings.scene, settings.data


def system_of(cfg: DictConfig) -> GNTSystem:
    """A fresh `GNTSystem` for a composed config, as `train` builds it."""
    return GNTSystem(read_run_settings(cfg), container_dict(cfg))


def train_in_process(cfg: DictConfig, run_dir, overrides: Sequence[str] = ()) -> dict | None:
    """`python -m pola_gnt.train` on a composed config, in this process (no Hydra run)."""
    settings, run_dir = read_run_settings(cfg), Path(run_dir)
    return train(settings, container_dict(cfg), run_dir, checkpoint_to_resume(cfg, run_dir), overrides)
