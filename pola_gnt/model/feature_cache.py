"""Training's cache of the frozen part of an AlexNet encoder (`model.net.encoder.feature_cache_mb`).

With `backbone=alexnet` and frozen convolutions (`backbone_trainable_layers` < 5), what those convs
make of a source image never changes while training: `FrozenFeatureCache` keeps it per image and a
later step that draws the same image as a source runs only the trainable convs and the head on it.

- Key: what the data names the image by (`SourceBatch.image_keys`: the scene's folder and factor, the
  view and its image file; a cropped source has none, its crop being drawn anew each step), with the
  image's height and width, `model.net.encoder_input_scale`, and the autocast dtype the frozen convs
  ran in.
- Values: `AlexNetEncoder.frozen_part`'s outputs for that one image, detached, on the encoder's
  device, in the dtype they were computed in; a plain attribute of the LightningModule, so never in
  a state dict or a checkpoint.
- Bound: `max_mb` MB in all; the least recently used images leave first (as `data.cache_mb`'s scenes);
  an image larger than the bound is not kept.
- Used only where it cannot change a result: in training mode with gradients on (never in
  validation, eval or rendering, where each image is encoded once anyway), and only while every
  cached conv is frozen. The features are those of a fresh encode, bit for bit: the same operations
  on the same pixels (tests/test_backbone.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from pola_gnt.model.backbone import AlexNetEncoder
from pola_gnt.model.gnt import GNT

MB = 2**20
# One image's: the size of its feature maps, and its frozen outputs (`AlexNetEncoder.kept_stages`), each [1, C, h, w].
Entry = tuple[tuple[int, int], list[Tensor]]


class FrozenFeatureCache:
    """Per source image, the outputs of an AlexNet encoder's frozen convs, least recently used out first."""

    def __init__(self, max_mb: float):
        self.max_bytes = int(max_mb * MB)
        # (the data's name of the image, its (height, width), encoder_input_scale, autocast dtype) -> Entry
        self.entries: OrderedDict[tuple, Entry] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def applies(net: GNT) -> bool:
        """Whether `net` may encode from the cache now: an AlexNet encoder with frozen convs, every one
        of them frozen indeed, in training mode with gradients on."""
        encoder = net.encoder
        if not (isinstance(encoder, AlexNetEncoder) and encoder.n_frozen > 0):
            return False
        if not (net.training and torch.is_grad_enabled()):  # off in validation, eval, rendering
            return False
        frozen = list(encoder.convs)[: encoder.n_frozen]
        return not any(p.requires_grad for conv in frozen for p in conv.parameters())

    def encode(
        self, net: GNT, images: Float[Tensor, "views 3 height width"], keys: Sequence[Hashable] | None
    ) -> Float[Tensor, "views channels h w"]:
        """`net.encode(images)`, the frozen convs' outputs of each image taken from the cache when
        there, computed and kept when not. `keys`: one per image, what identifies its pixels (None:
        nothing to key by, a fresh encode)."""
        if keys is None or not self.applies(net):
            return net.encode(images)
        encoder = net.encoder
        assert isinstance(encoder, AlexNetEncoder)
        if len(keys) != len(images):
            raise ValueError(f"FrozenFeatureCache.encode: {len(keys)} keys for {len(images)} images")
        device_type = images.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        shape = (int(images.shape[-2]), int(images.shape[-1]))
        full_keys = [(key, shape, net.encoder_input_scale, str(dtype)) for key in keys]
        cached = [self._get(key) for key in full_keys]
        missing = [i for i, entry in enumerate(cached) if entry is None]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        computed: dict[int, Entry] = {}
        if missing:
            inputs = net.encoder_input(images[missing])
            size = encoder.feature_size(inputs)
            for i, outputs in zip(missing, encoder.frozen_outputs(inputs), strict=True):
                computed[i] = (size, [t.detach() for t in outputs])  # without gradients: detached already
                self._put(full_keys[i], computed[i])
        entries = [entry if entry is not None else computed[i] for i, entry in enumerate(cached)]
        sizes = {size for size, _ in entries}
        if len(sizes) != 1:
            raise RuntimeError(f"FrozenFeatureCache: images of one batch encode to different sizes {sorted(sizes)}")
        kept = [torch.cat([maps[k] for _, maps in entries]) for k in range(len(encoder.kept_stages))]
        return encoder.trainable_part(kept, sizes.pop())

    def _get(self, key: tuple) -> Entry | None:
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def _put(self, key: tuple, entry: Entry) -> None:
        size = sum(t.nbytes for t in entry[1])
        if size > self.max_bytes:
            return
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= sum(t.nbytes for t in old[1])
        while self.entries and self.bytes + size > self.max_bytes:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.bytes -= sum(t.nbytes for t in dropped)
        self.entries[key] = entry
        self.bytes += size

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0
