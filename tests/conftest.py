"""Shared fixtures. Tests that need `../shared` (real fern scene, LPIPS weights) fail in CI when it
is missing and skip elsewhere; its location can be overridden with `POLA_GNT_SHARED`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from pola_gnt.paths import PROJECT_ROOT

torch.set_num_threads(min(2, torch.get_num_threads()))


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
