"""AlexNet backbone encoder: torchvision AlexNet's ImageNet convolutions + a small trainable head.

The convolutions are read once, at construction, from the LPIPS weights file `alex_v0.1.npz`
(`features.0` ... `features.10`: weights and biases of the five convs) and registered as parameters,
so a checkpoint holds them. The last `backbone_trainable_layers` convs train; the others are frozen
(requires_grad False, left out of the optimiser) and the frozen part runs without gradients.

    input [views, 3, H, W] in [0, 1], ImageNet-normalised
      conv1 11x11/4 pad 2, relu            -> 64 ch  ~H/4     (taken)
      maxpool 3/2, conv2 5x5 pad 2, relu   -> 192 ch ~H/8     (taken)
      maxpool 3/2, conv3..conv5 3x3, relus -> 256 ch ~H/16    (conv3 and conv5 taken)
      the taken maps resized to ceil(H/4) x ceil(W/4), concatenated
      head: 3x3 conv -> relu -> 1x1 conv   -> [views, feature_channels, ceil(H/4), ceil(W/4)]
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from pola_gnt.core.errors import UserError
from pola_gnt.core.paths import lpips_env_weights_path
from pola_gnt.model.settings import EncoderSettings

# torchvision's AlexNet `features` convolutions: (index, in, out, kernel, stride, padding)
ALEXNET_CONVS = (
    (0, 3, 64, 11, 4, 2),
    (3, 64, 192, 5, 1, 2),
    (6, 192, 384, 3, 1, 1),
    (8, 384, 256, 3, 1, 1),
    (10, 256, 256, 3, 1, 1),
)
TAKEN = (0, 1, 2, 4)  # the conv stages whose outputs (after relu) feed the head
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HEAD_CHANNELS = 64
WEIGHTS_KEY = "model.net.encoder.backbone_weights"

# Set while a network is rebuilt to take a checkpoint's weights (`weights_from_checkpoint`).
_from_checkpoint = False


@contextlib.contextmanager
def weights_from_checkpoint() -> Iterator[None]:
    """Build AlexNet encoders without reading the npz, for a checkpoint that holds their weights and is
    loaded strictly right after (eval, videos, the viewer): a checkpoint is self-contained."""
    global _from_checkpoint
    previous, _from_checkpoint = _from_checkpoint, True
    try:
        yield
    finally:
        _from_checkpoint = previous


def alexnet_weights_path(setting: str | None) -> Path:
    """The npz named by `backbone_weights` (a file, or a folder holding alex_v0.1.npz) or, when it
    is None, by `$POLA_GNT_LPIPS_WEIGHTS` (as the LPIPS weights are found)."""
    if setting is None:
        path = lpips_env_weights_path("alex")
        if path is None:
            raise UserError(f"{WEIGHTS_KEY}: null and $POLA_GNT_LPIPS_WEIGHTS names no alex_v0.1.npz; set either")
        return path
    path = Path(setting).expanduser()
    return path / "alex_v0.1.npz" if path.is_dir() else path


def read_alexnet_convs(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """The five convs' (weight, bias) of an LPIPS npz, checked; one UserError line when wrong."""
    if not path.is_file():
        raise UserError(f"{WEIGHTS_KEY}: {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except Exception as err:
        raise UserError(f"{WEIGHTS_KEY}: {path}: not a readable npz file ({err})") from None
    convs = []
    for index, c_in, c_out, kernel, _, _ in ALEXNET_CONVS:
        expected = {"weight": (c_out, c_in, kernel, kernel), "bias": (c_out,)}
        pair = []
        for kind, shape in expected.items():
            key = next((k for k in arrays if k.endswith(f"features.{index}.{kind}")), None)
            if key is None:
                raise UserError(f"{WEIGHTS_KEY}: {path}: no AlexNet features.{index}.{kind} array")
            if tuple(arrays[key].shape) != shape:
                raise UserError(f"{WEIGHTS_KEY}: {path}: {key} has shape {tuple(arrays[key].shape)}, expected {shape}")
            pair.append(arrays[key].astype(np.float32))
        convs.append((pair[0], pair[1]))
    return convs


class AlexNetEncoder(nn.Module):
    """ImageEncoder's contract from AlexNet's ImageNet convolutions and a trainable head."""

    mean: Tensor  # ImageNet normalisation, [1, 3, 1, 1] buffers (not in the state dict)
    std: Tensor

    def __init__(self, settings: EncoderSettings):
        super().__init__()
        self.feature_channels = settings.feature_channels
        if _from_checkpoint:  # placeholders of the right shapes: the checkpoint's weights replace them
            convs = [
                (np.zeros((c_out, c_in, kernel, kernel), np.float32), np.zeros(c_out, np.float32))
                for _, c_in, c_out, kernel, _, _ in ALEXNET_CONVS
            ]
        else:
            convs = read_alexnet_convs(alexnet_weights_path(settings.backbone_weights))
        self.convs = nn.ModuleList()
        for (_, c_in, c_out, kernel, stride, padding), (weight, bias) in zip(ALEXNET_CONVS, convs, strict=True):
            conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding)
            conv.weight = nn.Parameter(torch.from_numpy(weight))
            conv.bias = nn.Parameter(torch.from_numpy(bias))
            self.convs.append(conv)
        self.n_frozen = len(ALEXNET_CONVS) - settings.backbone_trainable_layers
        for conv in list(self.convs)[: self.n_frozen]:
            conv.requires_grad_(False)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        taken = sum(ALEXNET_CONVS[i][2] for i in TAKEN)
        self.head = nn.Sequential(
            nn.Conv2d(taken, HEAD_CHANNELS, 3, padding=1, padding_mode="reflect"),
            nn.ReLU(inplace=True),
            nn.Conv2d(HEAD_CHANNELS, self.feature_channels, 1),
        )

    def stages(self, x: Tensor) -> list[Tensor]:
        """The relu outputs of the five convs (AlexNet's `features` up to its last relu)."""
        outs = []
        for i, conv in enumerate(self.convs):
            if i in (1, 2):
                x = F.max_pool2d(x, 3, 2)
            with torch.set_grad_enabled(torch.is_grad_enabled() and i >= self.n_frozen):
                x = F.relu(conv(x))
            outs.append(x)
        return outs

    def forward(self, images: Float[Tensor, "views 3 h w"]) -> Float[Tensor, "views channels fh fw"]:
        size = (math.ceil(images.shape[-2] / 4), math.ceil(images.shape[-1] / 4))
        x = (images - self.mean) / self.std
        outs = self.stages(x)
        maps = [F.interpolate(outs[i], size=size, mode="bilinear", align_corners=False) for i in TAKEN]
        return self.head(torch.cat(maps, dim=1))
