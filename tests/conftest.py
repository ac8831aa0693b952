"""Shared fixtures. Tests that need `../shared` (real fern scene, LPIPS weights) fail in CI when it
is missing and skip elsewhere; its location can be overridden with `POLA_GNT_SHARED`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Type and shape checks (jaxtyping + beartype) of every pola_gnt function in this process and in the
# commands the tests start: set before pola_gnt is first imported (its import installs the hook).
os.environ["POLA_GNT_CHECK_SHAPES"] = "1"

import torch  # noqa: E402

import pola_gnt  # noqa: E402, F401  (first: sets the OpenMP wait policy before torch starts OpenMP)
from pola_gnt.paths import PROJECT_ROOT  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))


def pytest_configure(config: pytest.Config) -> None:
    # beartype reads omegaconf's DictConfig as a `typing.MutableMapping` hint and warns about that alias.
    config.addinivalue_line("filterwarnings", r"ignore:.*typing\.MutableMapping.*deprecated by PEP 585")


def _shared_dir() -> Path:
    return Path(os.environ.get("POLA_GNT_SHARED", PROJECT_ROOT.parent / "shared")).resolve()


def _require(path: Path) -> Path:
    if not path.exists():
        message = f"shared data missing: {path} (set POLA_GNT_SHARED to the shared/ folder)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return _require(_shared_dir())


@pytest.fixture(scope="session")
def llff_root(shared_dir: Path) -> Path:
    """Folder holding the real LLFF scene folders (fern)."""
    return _require(shared_dir / "data" / "nerf_llff_data")


@pytest.fixture(scope="session")
def fern_dir(llff_root: Path) -> Path:
    return _require(llff_root / "fern")


@pytest.fixture(scope="session")
def lpips_alex_weights(shared_dir: Path) -> Path:
    return _require(shared_dir / "lpips" / "alex_v0.1.npz")


@pytest.fixture(scope="session")
def lpips_calibration_dir(shared_dir: Path) -> Path:
    return _require(shared_dir / "lpips" / "calibration")


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


def run_module(module: str, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python -m pola_gnt.<module> overrides...` as a user would; returns the finished process."""
    return subprocess.run(
        [sys.executable, "-m", f"pola_gnt.{module}", *overrides],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=PROJECT_ROOT,
    )


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory) -> dict[str, Path]:
    """A short demo-scene training run per model (`gnt`, `pola_gnt`): run folder with checkpoints and metrics."""
    runs = {}
    for model in ("gnt", "pola_gnt"):
        run_dir = tmp_path_factory.mktemp(f"tiny_{model}")
        result = run_module(
            "train",
            f"model={model}",
            *TINY_OVERRIDES,
            "trainer.max_steps=6",
            "trainer.val_check_interval=3",
            f"hydra.run.dir={run_dir}",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs[model] = run_dir
    return runs
