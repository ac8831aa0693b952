"""Training's cache of what frozen convolutions make of each source image (`model.net.encoder.feature_cache_mb`).

Two kinds of frozen convs see the source images, and what they make of an image never changes while
training: `FrozenFeatureCache` keeps it per image, and a later step that draws the same image as a
source skips them.
- An AlexNet encoder's frozen convs (`backbone=alexnet`, `backbone_trainable_layers` < 5): the step
  runs only the trainable convs and the head on the kept outputs (`encode`).
- The read-out's consistency features (`model.net.readout_consistency_features`, `ConsistencyFeatures`,
  fixed ImageNet convs): the step only projects the kept unit-length maps on the principal directions
  of the views it drew, from their kept moments (`consistency_maps`). At 8 fern sources that is 0.13 s
  of a 0.75 s fine-tuning step (docs/results.md).

- Key: what the data names the image by (`SourceBatch.image_keys`: the scene's folder and factor, the
  view and its image file; a cropped source has none, its crop being drawn anew each step), with the
  image's height and width and, for the encoder, `model.net.encoder_input_scale` and the autocast
  dtype the frozen convs ran in; for the consistency features, their layer and projection.
- Values: `AlexNetEncoder.frozen_part`'s outputs for that one image, or its
  `ConsistencyFeatures.image_features`, detached, on the network's device, in the dtype they were
  computed in; a plain attribute of the LightningModule, so never in a state dict or a checkpoint.
- Bound: `max_mb` MB in all, both kinds together; the least recently used images leave first (as
  `data.cache_mb`'s scenes); an image larger than the bound is not kept.
- Used only where it cannot change a result: in training mode with gradients on (never in
  validation, eval or rendering, where each image is encoded once anyway), and for the encoder only
  while every cached conv is frozen. The results are those of a fresh encode, bit for bit: the same
  operations on the same pixels (tests/test_backbone.py, tests/test_consistency_features.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from pola_gnt.model.backbone import AlexNetEncoder
from pola_gnt.model.consistency_prior import ImageFeatures
from pola_gnt.model.gnt import GNT

MB = 2**20
# One image's: the size of its feature maps, and its frozen outputs (`AlexNetEncoder.kept_stages`), each [1, C, h, w].
Entry = tuple[tuple[int, int], list[Tensor]]


def _nbytes(value: Entry | ImageFeatures) -> int:
    return value.nbytes if isinstance(value, ImageFeatures) else sum(t.nbytes for t in value[1])


class FrozenFeatureCache:
    """Per source image, what frozen convs make of it (an AlexNet encoder's frozen outputs, the read-out's
    consistency features), least recently used out first."""

    def __init__(self, max_mb: float):
        self.max_bytes = int(max_mb * MB)
        # (the data's name of the image, its (height, width), encoder_input_scale, autocast dtype) -> Entry;
        # ("consistency", the name, (height, width), layer, dims) -> ImageFeatures
        self.entries: OrderedDict[tuple, Entry | ImageFeatures] = OrderedDict()
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
        cached = [self._get_entry(key) for key in full_keys]
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

    def consistency_maps(
        self, net: GNT, images: Float[Tensor, "views 3 height width"], keys: Sequence[Hashable] | None
    ) -> Float[Tensor, "views channels h w"]:
        """`net.consistency_features(images)`, each image's unit-length maps and moments taken from the
        cache when there, computed and kept when not (in training mode with gradients on, for named
        images; a fresh extraction elsewhere). `keys`: as `encode`'s."""
        extractor = net.consistency_features
        if extractor is None:
            raise ValueError("FrozenFeatureCache.consistency_maps: the network reads no consistency features")
        if keys is None or not (net.training and torch.is_grad_enabled()):
            return extractor(images)
        if len(keys) != len(images):
            raise ValueError(f"FrozenFeatureCache.consistency_maps: {len(keys)} keys for {len(images)} images")
        shape = (int(images.shape[-2]), int(images.shape[-1]))
        per_image = []
        for view, key in enumerate(keys):
            full_key = ("consistency", key, shape, extractor.layer, extractor.dims)
            features = self._get(full_key)
            if isinstance(features, ImageFeatures):
                self.hits += 1
            else:
                features = extractor.image_features(images[view : view + 1])
                self.misses += 1
                self._put(full_key, features)
            per_image.append(features)
        return extractor.combine(per_image)

    def _get(self, key: tuple) -> Entry | ImageFeatures | None:
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def _get_entry(self, key: tuple) -> Entry | None:
        """An encoder entry (the consistency features' keys start with "consistency": never one)."""
        entry = self._get(key)
        return None if isinstance(entry, ImageFeatures) else entry

    def _put(self, key: tuple, entry: Entry | ImageFeatures) -> None:
        size = _nbytes(entry)
        if size > self.max_bytes:
            return
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= _nbytes(old)
        while self.entries and self.bytes + size > self.max_bytes:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= _nbytes(dropped)
        self.entries[key] = entry
        self.bytes += size

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0
