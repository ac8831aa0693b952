"""AlexNet backbone encoder: torchvision AlexNet's ImageNet convolutions + a small trainable head.

The convolutions are read once, at construction, from the LPIPS weights file `alex_v0.1.npz`
(`features.0` ... `features.10`: weights and biases of the five convs) and registered as parameters,
so a checkpoint holds them. The last `backbone_trainable_layers` convs train; the others are frozen
(requires_grad False, left out of the optimiser) and the frozen part runs without gradients.
`forward` is `frozen_part` then `trainable_part`, so training can keep a source image's frozen
outputs and skip the frozen convs the next time it is a source (`model.feature_cache`).

    input [views, 3, H, W] in [0, 1], ImageNet-normalised
      conv1 11x11/4 pad 2, relu            -> 64 ch  ~H/4     (taken)
      maxpool 3/2, conv2 5x5 pad 2, relu   -> 192 ch ~H/8     (taken)
      maxpool 3/2, conv3..conv5 3x3, relus -> 256 ch ~H/16    (conv3 and conv5 taken)
      each taken map: a 1x1 conv to 64 ch at its own size, resized to ceil(H/4) x ceil(W/4), summed
      head: relu -> 3x3 conv -> relu -> 1x1 conv -> [views, feature_channels, ceil(H/4), ceil(W/4)]

The sum of 1x1 convs of the resized maps is a 1x1 conv of their concatenation (bilinear resizing is
linear and its weights sum to 1), computed before the resizing: the 896 concatenated channels never
exist at 1/4 size (a 3x3 conv over them there was 12.5 GFLOP forward for 4 fern sources at
encoder_input_scale 0.5, most of an AlexNet step).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from pola_gnt.core.errors import UserError
from pola_gnt.core.paths import LPIPS_WEIGHTS_ENV, lpips_env_weights_path, lpips_weights_in
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
# A shipped checkpoint leaves out the frozen convolutions (up to 9.9 MB, near all of the 10 MB a shipped
# file may take): under this key it records which state-dict entries and the sha256 of their values,
# and loading reads them from the npz, found as the LPIPS weights are (`restore_frozen_convs`).
OMITTED_KEY = "omitted_frozen_backbone"
CONVS_PREFIX = "net.encoder.convs."  # the convolutions' entries in a GNTSystem's state dict

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


def alexnet_weights_path(setting: str | None, lpips_weights: str | None = None) -> tuple[Path, str]:
    """The npz to read and where it was named (for messages): `backbone_weights` (a file, or a
    folder holding alex_v0.1.npz) or, when it is None, the AlexNet LPIPS weights as the LPIPS metric
    finds them: the run's `metrics.lpips_weights` (`lpips_weights`; a VGG file stands for its
    folder's alex_v0.1.npz), then `$POLA_GNT_LPIPS_WEIGHTS`. None of them: one UserError line."""
    if setting is not None:
        path = Path(setting).expanduser()
        return (path / "alex_v0.1.npz" if path.is_dir() else path), ""
    if lpips_weights:
        path = lpips_weights_in(lpips_weights, "alex")
        if path is not None:
            return path, "metrics.lpips_weights"
    path = lpips_env_weights_path("alex")
    if path is not None:
        return path, f"${LPIPS_WEIGHTS_ENV}"
    raise UserError(
        f"{WEIGHTS_KEY}: null, and neither metrics.lpips_weights nor ${LPIPS_WEIGHTS_ENV} names an "
        f"alex_v0.1.npz; set one"
    )


def frozen_conv_count(encoder: Mapping) -> int:
    """How many of AlexNet's convs a run config's `model.net.encoder` section freezes (0: no AlexNet)."""
    if encoder.get("backbone") != "alexnet":
        return 0
    return len(ALEXNET_CONVS) - int(encoder.get("backbone_trainable_layers", 0))


def _frozen_conv_keys(n_frozen: int) -> list[str]:
    return [f"{CONVS_PREFIX}{i}.{kind}" for i in range(n_frozen) for kind in ("weight", "bias")]


def _tensors_sha256(tensors: list[Tensor]) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def omit_frozen_convs(checkpoint: dict, n_frozen: int) -> dict:
    """`checkpoint` without the state dict's first `n_frozen` AlexNet convs (the frozen ones, the
    ImageNet weights unchanged) and with their record under `OMITTED_KEY`."""
    keys = _frozen_conv_keys(n_frozen)
    state = checkpoint["state_dict"]
    record = {"keys": keys, "sha256": _tensors_sha256([state[key] for key in keys])}
    kept = {key: value for key, value in state.items() if key not in keys}
    return {**checkpoint, "state_dict": kept, OMITTED_KEY: record}


def restore_frozen_convs(
    checkpoint: dict, path: Path | str, backbone_weights: str | None, lpips_weights: str | None
) -> dict:
    """The state dict of `checkpoint` (read from `path`), with the frozen convs a shipped checkpoint left
    out read from the AlexNet npz (`backbone_weights`, else found as the LPIPS weights are); one
    UserError line when the npz is missing or holds other weights than the checkpoint was trained with."""
    record = checkpoint.get(OMITTED_KEY)
    if record is None:
        return checkpoint["state_dict"]
    npz, origin = alexnet_weights_path(backbone_weights, lpips_weights)
    convs = read_alexnet_convs(npz, origin)
    restored = {}
    for key in record["keys"]:
        index, kind = key.removeprefix(CONVS_PREFIX).split(".")
        weight, bias = convs[int(index)]
        restored[key] = torch.from_numpy(weight if kind == "weight" else bias)
    if _tensors_sha256([restored[key] for key in record["keys"]]) != record["sha256"]:
        raise UserError(f"{WEIGHTS_KEY}: {npz}: not the AlexNet weights {path} was trained with (their sha256 differs)")
    return {**checkpoint["state_dict"], **restored}


def read_alexnet_convs(path: Path, origin: str = "") -> list[tuple[np.ndarray, np.ndarray]]:
    """The five convs' (weight, bias) of an LPIPS npz (named by `origin`, when not backbone_weights
    itself), checked; one UserError line when wrong."""
    source = f"{path} (from {origin})" if origin else str(path)
    if not path.is_file():
        raise UserError(f"{WEIGHTS_KEY}: {source}: no such file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except Exception as err:
        reason = " ".join(str(err).split())
        raise UserError(f"{WEIGHTS_KEY}: {source}: not a readable npz file ({reason})") from None
    convs = []
    for index, c_in, c_out, kernel, _, _ in ALEXNET_CONVS:
        expected = {"weight": (c_out, c_in, kernel, kernel), "bias": (c_out,)}
        pair = []
        for kind, shape in expected.items():
            key = next((k for k in arrays if k.endswith(f"features.{index}.{kind}")), None)
            if key is None:
                raise UserError(f"{WEIGHTS_KEY}: {source}: no AlexNet features.{index}.{kind} array")
            if tuple(arrays[key].shape) != shape:
                raise UserError(
                    f"{WEIGHTS_KEY}: {source}: {key} has shape {tuple(arrays[key].shape)}, expected {shape}"
                )
            pair.append(arrays[key].astype(np.float32))
        convs.append((pair[0], pair[1]))
    return convs


def alexnet_convs_to_build(weights: str | None, lpips_weights: str | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """The five convs' (weight, bias) a module starts from: read from the npz (`alexnet_weights_path`), or,
    while a network is rebuilt for a checkpoint (`weights_from_checkpoint`), zero placeholders of the
    right shapes that the checkpoint's tensors replace."""
    if _from_checkpoint:
        return [
            (np.zeros((c_out, c_in, kernel, kernel), np.float32), np.zeros(c_out, np.float32))
            for _, c_in, c_out, kernel, _, _ in ALEXNET_CONVS
        ]
    return read_alexnet_convs(*alexnet_weights_path(weights, lpips_weights))


class AlexNetEncoder(nn.Module):
    """ImageEncoder's contract from AlexNet's ImageNet convolutions and a trainable head."""

    mean: Tensor  # ImageNet normalisation, [1, 3, 1, 1] buffers (not in the state dict)
    std: Tensor

    def __init__(self, settings: EncoderSettings, lpips_weights: str | None = None):
        """`lpips_weights`: the run's `metrics.lpips_weights`, where a null `backbone_weights` looks first."""
        super().__init__()
        self.feature_channels = settings.feature_channels
        convs = alexnet_convs_to_build(settings.backbone_weights, lpips_weights)
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
        # One 1x1 conv per taken stage (the bias once, on the first): together a 1x1 conv of the concatenation.
        self.reduce = nn.ModuleList(
            nn.Conv2d(ALEXNET_CONVS[i][2], HEAD_CHANNELS, 1, bias=j == 0) for j, i in enumerate(TAKEN)
        )
        self.head = nn.Sequential(
            nn.ReLU(),
            nn.Conv2d(HEAD_CHANNELS, HEAD_CHANNELS, 3, padding=1, padding_mode="reflect"),
            nn.ReLU(inplace=True),
            nn.Conv2d(HEAD_CHANNELS, self.feature_channels, 1),
        )

    def stages(self, x: Tensor) -> list[Tensor]:
        """The relu outputs of the five convs (AlexNet's `features` up to its last relu) of the
        normalised images `x`."""
        outs = []
        for i in range(len(self.convs)):
            outs.append(self._stage(i, outs[-1] if outs else x))
        return outs

    def _stage(self, i: int, x: Tensor) -> Tensor:
        """Conv `i` (after its max-pool) and relu; without gradients when frozen."""
        if i in (1, 2):
            x = F.max_pool2d(x, 3, 2)
        with torch.set_grad_enabled(torch.is_grad_enabled() and i >= self.n_frozen):
            return F.relu(self.convs[i](x))

    @property
    def kept_stages(self) -> tuple[int, ...]:
        """The frozen stages whose outputs the trainable part reads: the taken ones, and the last
        frozen one (the input of the first trainable conv). Empty when no conv is frozen."""
        last = self.n_frozen - 1
        return tuple(i for i in range(self.n_frozen) if i in TAKEN or i == last)

    def frozen_part(self, images: Float[Tensor, "views 3 h w"]) -> list[Tensor]:
        """What `trainable_part` reads of `images` (in [0, 1], as `forward` takes them): the outputs of
        `kept_stages`, computed without gradients; with no frozen conv, the normalised images."""
        if not self.n_frozen:
            return [(images - self.mean) / self.std]
        return [torch.cat(maps) for maps in zip(*self.frozen_outputs(images), strict=True)]

    def frozen_outputs(self, images: Float[Tensor, "views 3 h w"]) -> list[list[Tensor]]:
        """Per image, the outputs of `kept_stages` (each `[1, C, h, w]`), computed without gradients.

        The frozen convs run image by image, so that an image's outputs do not depend on the batch it
        came in: CPU convolutions choose their algorithm by batch size, and the last bits with it. An
        image's outputs kept from one step (`model.feature_cache`) are then a fresh encode's exactly."""
        x = (images - self.mean) / self.std
        kept_stages, per_image = self.kept_stages, []
        with torch.no_grad():
            for view in range(len(x)):
                image, kept = x[view : view + 1], []
                for i in range(self.n_frozen):
                    image = self._stage(i, image)
                    if i in kept_stages:
                        kept.append(image)
                per_image.append(kept)
        return per_image

    def trainable_part(self, kept: list[Tensor], size: tuple[int, int]) -> Tensor:
        """The trainable convs and the head from `frozen_part`'s outputs, to feature maps of `size`."""
        outs = dict(zip(self.kept_stages, kept, strict=True)) if self.n_frozen else {}
        x = kept[-1]
        for i in range(self.n_frozen, len(self.convs)):
            x = outs[i] = self._stage(i, x)
        reduced = [
            F.interpolate(reduce(outs[i]), size=size, mode="bilinear", align_corners=False)
            for reduce, i in zip(self.reduce, TAKEN, strict=True)
        ]
        return self.head(torch.stack(reduced).sum(dim=0))

    @staticmethod
    def feature_size(images: Tensor) -> tuple[int, int]:
        """The feature maps' size for `images` `[..., H, W]`: ceil(H / 4) x ceil(W / 4)."""
        return math.ceil(images.shape[-2] / 4), math.ceil(images.shape[-1] / 4)

    def forward(self, images: Float[Tensor, "views 3 h w"]) -> Float[Tensor, "views channels fh fw"]:
        return self.trainable_part(self.frozen_part(images), self.feature_size(images))
