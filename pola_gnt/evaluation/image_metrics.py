"""Image-quality metrics for novel-view synthesis: PSNR, SSIM and LPIPS (real weights only).

Protocol (`docs/metrics_protocol.md`):
- PSNR `-10 log10(MSE)` per image.
- SSIM as TensorFlow's `tf.image.ssim` (NeRF, IBRNet): Gaussian window 11, sigma 1.5, k1 0.01,
  k2 0.03, data range 1, "valid" filtering, mean of the map. `padding="same"` zero-pads instead,
  as GNT's pytorch-ssim code does (GNT-compatible protocol only).
- LPIPS v0.1 (`lpips` package), AlexNet by default, VGG on request, inputs scaled to [-1, 1]. The
  GNT-compatible protocol feeds [0, 1] images unscaled, reproducing GNT's bug.

Image layouts: the functions `psnr`, `ssim` and `lpips_distance` take `[3, H, W]` or
`[B, 3, H, W]` in [0, 1] and return `[]` or `[B]`. `ImageMetrics` takes one image pair in the data
code's layout, `[H, W, 3]`, and returns Python floats.

LPIPS weights are looked up in this order: an explicit npz path (config key `metrics.lpips_weights`,
CLI `--lpips-weights`), `$POLA_GNT_LPIPS_WEIGHTS`, then torchvision's pretrained backbone (torch hub
cache, else download). When none works, LPIPS is reported as unavailable (`None`) with one line on
stderr: a randomly initialised backbone is never used.

CLI (`__main__.py`): `python -m pola_gnt.metrics PRED_IMAGE GT_IMAGE [--lpips-net alex|vgg]
[--lpips-weights NPZ]` prints one JSON object `{"psnr", "ssim", "lpips", "lpips_net"}`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import kornia
import lpips
import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from jaxtyping import Float
from torch import Tensor

from pola_gnt.core.errors import UserError
from pola_gnt.core.paths import LPIPS_WEIGHTS_ENV, lpips_env_weights_path
from pola_gnt.data.images import read_image as read_rgb8

LPIPS_NETS = ("alex", "vgg")
PROTOCOLS = ("standard", "gnt")  # standard, or GNT-compatible (see docs/metrics_protocol.md)


@dataclass(frozen=True)
class ProtocolDefaults:
    """What a protocol scores with unless `metrics.lpips_net` / `metrics.quantize_8bit` say otherwise."""

    lpips_net: str
    quantize_8bit: bool


# GNT's eval.py scored LPIPS-VGG on the unquantised predictions (as NeRF and IBRNet reported);
# the standard protocol scores what a saved 8-bit PNG holds, with LPIPS-Alex (as nerfbaselines).
PROTOCOL_DEFAULTS = {
    "standard": ProtocolDefaults(lpips_net="alex", quantize_8bit=True),
    "gnt": ProtocolDefaults(lpips_net="vgg", quantize_8bit=False),
}
SSIM_PADDINGS = ("valid", "same")
SSIM_WINDOW = 11
LOGGED_MIN_MSE = 1e-10  # training / validation PSNR and the analysis' ray PSNR stop at 100 dB
# AlexNet's strided first convolution and two 3x3 max-pools need at least 31 pixels per side, VGG's
# four max-pools 16, SSIM's valid window 11: below this no metric is defined for every network.
MIN_IMAGE_SIDE = 32
# The ImageNet backbones the LPIPS v0.1 linear layers were trained on (what `lpips` downloads).
TORCHVISION_BACKBONES = {"alex": "AlexNet_Weights", "vgg": "VGG16_Weights"}
_LINEAR_LAYER_KEY = re.compile(r"lin\d+\.model\.\d+\.weight")


# --------------------------------------------------------------------------------------------
# PSNR and SSIM


def _as_batch(image: Tensor, name: str) -> Tensor:
    """`[3, H, W]` or `[B, 3, H, W]` -> `[B, 3, H, W]`."""
    if image.ndim == 3:
        image = image[None]
    if image.ndim != 4 or image.shape[1] != 3:
        raise ValueError(f"{name}: expected [3, H, W] or [B, 3, H, W], got {tuple(image.shape)}")
    return image


def _paired_batches(pred: Tensor, gt: Tensor) -> tuple[Tensor, Tensor]:
    pred_batch, gt_batch = _as_batch(pred, "pred"), _as_batch(gt, "gt")
    if pred_batch.shape != gt_batch.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and gt {tuple(gt.shape)} differ in shape")
    return pred_batch, gt_batch


def _per_image(values: Tensor, like: Tensor) -> Tensor:
    """`[B]` -> `[]` when the input was a single `[3, H, W]` image."""
    return values[0] if like.ndim == 3 else values


def mse_to_psnr(mse: Float[Tensor, "*batch"], min_mse: float | None = None) -> Float[Tensor, "*batch"]:
    """PSNR in dB, data range 1, of a mean squared error: `-10 log10(mse)` (inf for 0), or of
    `max(mse, min_mse)` (the PSNR logged while training is finite: `LOGGED_MIN_MSE`)."""
    if min_mse is not None:
        mse = mse.clamp(min=min_mse)
    return -10.0 * torch.log10(mse)


def psnr(pred: Tensor, gt: Tensor) -> Tensor:
    """Peak signal-to-noise ratio in dB, data range 1, per image: `[]` or `[B]` (inf if identical)."""
    pred_batch, gt_batch = _paired_batches(pred, gt)
    mse = (pred_batch - gt_batch).square().flatten(1).mean(dim=1)  # [B]
    return _per_image(mse_to_psnr(mse), pred)


def ssim(pred: Tensor, gt: Tensor, padding: str = "valid") -> Tensor:
    """Mean SSIM per image, `[]` or `[B]`: TensorFlow's formula with "valid" or zero ("same") padding."""
    if padding not in SSIM_PADDINGS:
        raise ValueError(f"ssim padding must be one of {SSIM_PADDINGS}, got {padding!r}")
    pred_batch, gt_batch = _paired_batches(pred, gt)
    if padding == "same":
        # kornia's "same" reflects at the border; GNT convolves with zero padding. Zero-padding the
        # images by the window radius and filtering "valid" gives exactly that map, at full size.
        radius = SSIM_WINDOW // 2
        pred_batch = F.pad(pred_batch, [radius] * 4)
        gt_batch = F.pad(gt_batch, [radius] * 4)
    if min(pred_batch.shape[-2:]) < SSIM_WINDOW:
        raise ValueError(f"ssim needs images of at least {SSIM_WINDOW}x{SSIM_WINDOW} pixels")
    # eps=0: the reference formula has no extra denominator term (c1 * c2 keeps it positive).
    ssim_map = kornia.metrics.ssim(
        pred_batch, gt_batch, window_size=SSIM_WINDOW, max_val=1.0, eps=0.0, padding="valid"
    )  # [B, 3, H - 10, W - 10]
    return _per_image(ssim_map.flatten(1).mean(dim=1), pred)


# --------------------------------------------------------------------------------------------
# LPIPS


def build_lpips_skeleton(net: str) -> lpips.LPIPS:
    """`lpips.LPIPS` with the wheel's v0.1 linear layers and a RANDOM backbone, to be overwritten.

    `pnet_rand=True` is what keeps torchvision from downloading; the linear layers are read from
    the `lpips` wheel itself. Never score with it before a real backbone is loaded.
    """
    with warnings.catch_warnings():
        # `lpips` still calls torchvision's deprecated `pretrained=` argument.
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torchvision\.models\._utils")
        return lpips.LPIPS(net=net, pnet_rand=True, pretrained=True, verbose=False)


def backbone_parameters(model: lpips.LPIPS) -> dict[str, torch.nn.Parameter]:
    """The backbone's parameters under torchvision's names: `features.{i}.{weight,bias}`.

    `model.net.slice1..5` keep torchvision's layer indices (`slice2.3.weight` is `features.3.weight`).
    """
    parameters = {}
    for name, parameter in model.net.named_parameters():
        _slice, layer_index, kind = name.split(".")
        parameters[f"features.{layer_index}.{kind}"] = parameter
    return parameters


def linear_parameters(model: lpips.LPIPS) -> dict[str, torch.nn.Parameter]:
    """The v0.1 linear layers under the `lpips` state-dict names: `lin{k}.model.1.weight`, `[1, C, 1, 1]`."""
    return {name: parameter for name, parameter in model.named_parameters() if _LINEAR_LAYER_KEY.fullmatch(name)}


def _check_weights(arrays: Mapping[str, np.ndarray], model: lpips.LPIPS, source: str) -> None:
    """Raise `UserError(source: ...)` unless `arrays` is a complete LPIPS backbone for `model`.

    Linear-layer arrays are optional but, when present, must be the v0.1 layers of the wheel.
    """
    backbone, linear = backbone_parameters(model), linear_parameters(model)
    net = model.pnet_type
    unexpected = sorted(set(arrays) - set(backbone) - set(linear))
    if unexpected:
        raise UserError(
            f"{source}: unexpected keys for LPIPS-{net}: {', '.join(unexpected[:4])} (weights of another network?)"
        )
    missing = [name for name in backbone if name not in arrays]
    if missing:
        raise UserError(f"{source}: missing keys for LPIPS-{net}: {', '.join(missing[:4])}")
    expected = {**backbone, **linear}
    for name, array in arrays.items():
        if tuple(array.shape) != tuple(expected[name].shape):
            raise UserError(
                f"{source}: {name} has shape {tuple(array.shape)}, LPIPS-{net} needs {tuple(expected[name].shape)}"
            )
        if not np.issubdtype(array.dtype, np.floating):
            raise UserError(f"{source}: {name} has dtype {array.dtype}, expected float32")
    for name in sorted(set(arrays) & set(linear)):
        if not np.array_equal(arrays[name].astype(np.float32), linear[name].detach().cpu().numpy()):
            raise UserError(f"{source}: {name} differs from the v0.1 linear layer of the lpips package")


@torch.no_grad()
def _load_backbone(model: lpips.LPIPS, state: Mapping[str, np.ndarray]) -> None:
    """Copy `features.{i}.*` arrays into the backbone slices (shapes already checked)."""
    for name, parameter in backbone_parameters(model).items():
        parameter.copy_(torch.as_tensor(np.asarray(state[name], dtype=np.float32)))


def _read_npz(path: Path, source: str) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise UserError(f"{source}: LPIPS weights file not found")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("a single .npy array, not an npz archive")
        with loaded as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise UserError(f"{source}: not a readable LPIPS npz file ({err})") from None


def lpips_from_npz(net: str, path: str | Path, origin: str = "") -> lpips.LPIPS:
    """LPIPS-`net` with the backbone (and optionally linear layers) of an npz file.

    `origin` says where the path came from, for error messages (e.g. the environment variable).
    """
    path = Path(path).expanduser()
    source = f"{path} (from {origin})" if origin else str(path)
    arrays = _read_npz(path, source)
    model = build_lpips_skeleton(net)
    _check_weights(arrays, model, source)
    _load_backbone(model, arrays)
    return model


def _torchvision_backbone_state(net: str) -> dict[str, Tensor]:
    """torchvision's ImageNet backbone for `net`: from the torch hub cache, else downloaded."""
    weights = getattr(torchvision.models, TORCHVISION_BACKBONES[net]).IMAGENET1K_V1
    captured = io.StringIO()
    # torch.hub announces "Downloading: ..." on stdout even when the download then fails. Stdout
    # carries the CLI's JSON, and an offline run should say one line, not two: pass the notice on
    # to stderr only when the download succeeds.
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        state = torch.hub.load_state_dict_from_url(weights.url, progress=False, check_hash=True)
    sys.stderr.write(captured.getvalue())
    return state


def env_weights_path(net: str) -> Path | None:
    """The npz for LPIPS-`net` named by `$POLA_GNT_LPIPS_WEIGHTS`, or None (`core.paths`)."""
    return lpips_env_weights_path(net, LPIPS_NETS)


def load_lpips(net: str = "alex", weights_path: str | Path | None = None) -> lpips.LPIPS | None:
    """The real LPIPS-`net` v0.1 model (eval mode, CPU), or None when no backbone weights exist.

    Order: `weights_path`, `$POLA_GNT_LPIPS_WEIGHTS` (see `env_weights_path`), torchvision's
    pretrained backbone. A path that is given but missing or invalid is the user's mistake
    (`UserError`); having no source at all prints one line on stderr and returns None.
    """
    if net not in LPIPS_NETS:
        raise UserError(f"metrics.lpips_net: must be one of {', '.join(LPIPS_NETS)}, got {net!r}")
    if weights_path not in (None, ""):
        return lpips_from_npz(net, weights_path)
    env_path = env_weights_path(net)
    if env_path is not None:
        return lpips_from_npz(net, env_path, origin=f"${LPIPS_WEIGHTS_ENV}")
    try:
        state = _torchvision_backbone_state(net)
    except Exception as err:  # offline, no cache, corrupt download: all mean "no weights here"
        reason = " ".join(f"{type(err).__name__}: {err}".split())
        env_note = (
            f"${LPIPS_WEIGHTS_ENV} has no {net} weights"
            if os.environ.get(LPIPS_WEIGHTS_ENV)
            else f"${LPIPS_WEIGHTS_ENV} unset"
        )
        print(
            f"LPIPS-{net} unavailable, reported as null: no weights path given, {env_note}, "
            f"and torchvision's {TORCHVISION_BACKBONES[net]} could not be loaded ({reason})",
            file=sys.stderr,
            flush=True,
        )
        return None
    model = build_lpips_skeleton(net)
    state = {name: tensor.numpy() for name, tensor in state.items() if name.startswith("features.")}
    _check_weights(state, model, f"torchvision {TORCHVISION_BACKBONES[net]}")
    _load_backbone(model, state)
    return model


def lpips_distance(model: lpips.LPIPS, pred: Tensor, gt: Tensor, gnt_protocol: bool = False) -> Tensor:
    """LPIPS of [0, 1] images, `[]` or `[B]`, scaled to [-1, 1] as the package expects.

    `gnt_protocol=True` feeds the [0, 1] images unscaled, as GNT did (only to compare with GNT).
    """
    pred_batch, gt_batch = _paired_batches(pred, gt)
    distance = model(pred_batch, gt_batch, normalize=not gnt_protocol)  # [B, 1, 1, 1]
    return _per_image(distance.flatten(), pred)


# --------------------------------------------------------------------------------------------
# The per-image metrics used by training and evaluation


class ImageMetrics:
    """PSNR, SSIM and LPIPS of one rendered image against its ground truth.

    Images are `[H, W, 3]` floats in [0, 1] (the data code's layout), on any device: LPIPS follows
    the inputs. The prediction is clipped to [0, 1]; `quantize_8bit` rounds both images to 8 bits
    first (as nerfbaselines). LPIPS is loaded once, here; `lpips` is None in the results when no
    weights could be found.
    """

    def __init__(
        self,
        lpips_net: str = "alex",
        lpips_weights: str | Path | None = None,
        ssim_padding: str = "valid",
        quantize_8bit: bool = False,
        gnt_protocol: bool = False,
    ):
        if ssim_padding not in SSIM_PADDINGS:
            raise UserError(f"ssim_padding: must be one of {', '.join(SSIM_PADDINGS)}, got {ssim_padding!r}")
        self.lpips_net = lpips_net
        self.ssim_padding = ssim_padding
        self.quantize_8bit = quantize_8bit
        self.gnt_protocol = gnt_protocol
        self.lpips_model = load_lpips(lpips_net, lpips_weights)

    @classmethod
    def for_protocol(cls, protocol: str = "standard", **options) -> ImageMetrics:
        """`standard` (valid SSIM, LPIPS on [-1, 1]) or `gnt` (zero-padded SSIM, LPIPS on [0, 1])."""
        if protocol not in PROTOCOLS:
            raise UserError(f"metrics.protocol: must be standard or gnt, got {protocol!r}")
        gnt = protocol == "gnt"
        return cls(ssim_padding="same" if gnt else "valid", gnt_protocol=gnt, **options)

    @property
    def lpips_available(self) -> bool:
        return self.lpips_model is not None

    @property
    def settings(self) -> dict:
        """How the numbers were computed, for the metrics file."""
        return {
            "lpips_net": self.lpips_net,
            "lpips_available": self.lpips_available,
            "lpips_input_range": "[0,1] (GNT protocol)" if self.gnt_protocol else "[-1,1]",
            "ssim_padding": self.ssim_padding,
            "quantize_8bit": self.quantize_8bit,
        }

    def _prepare(self, image: Tensor, name: str) -> Tensor:
        """`[H, W, 3]` -> float32 `[1, 3, H, W]` in [0, 1], quantised if asked."""
        if image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"{name}: expected [H, W, 3], got {tuple(image.shape)}")
        if min(image.shape[:2]) < MIN_IMAGE_SIDE:
            raise ValueError(f"{name}: images need at least {MIN_IMAGE_SIDE} pixels per side, got {tuple(image.shape)}")
        image = image.float().clamp(0.0, 1.0)
        if self.quantize_8bit:
            image = torch.round(image * 255.0) / 255.0
        return image.permute(2, 0, 1)[None]

    @torch.no_grad()
    def __call__(self, pred: Tensor, gt: Tensor) -> dict[str, float | None]:
        """-> `{"psnr": dB, "ssim": ..., "lpips": ... or None}` for `[H, W, 3]` images."""
        pred_batch, gt_batch = self._prepare(pred, "pred"), self._prepare(gt, "gt")  # [1, 3, H, W]
        if pred_batch.shape != gt_batch.shape:
            raise ValueError(f"pred {tuple(pred.shape)} and gt {tuple(gt.shape)} differ in shape")
        # Scores are float32 even inside a mixed-precision validation step.
        with torch.autocast(device_type=pred_batch.device.type, enabled=False):
            scores = {
                "psnr": psnr(pred_batch, gt_batch).item(),
                "ssim": ssim(pred_batch, gt_batch, self.ssim_padding).item(),
                "lpips": None,
            }
            if self.lpips_model is not None:
                self.lpips_model.to(pred_batch.device)
                scores["lpips"] = lpips_distance(self.lpips_model, pred_batch, gt_batch, self.gnt_protocol).item()
        return scores


# --------------------------------------------------------------------------------------------
# Image files (the CLI's inputs, `python -m pola_gnt.metrics`: `__main__.py`)


def read_float_image(path: str | Path) -> Float[Tensor, "height width 3"]:
    """An 8-bit image file -> float32 `[H, W, 3]` in [0, 1] (alpha dropped, grayscale expanded)."""
    return torch.from_numpy(read_rgb8(Path(path)).astype(np.float32) / 255.0)
