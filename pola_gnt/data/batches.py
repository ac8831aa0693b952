"""Typed batches, from the data module through the LightningModule to the model.

Three kinds, one per loader: `RayBatch` (a training step's random rays of one target view, and the
fixed validation rays), `ViewBatch` (a held-out view, rendered whole at test time), both carrying
their `SourceBatch`. A `Rays` travels whole from the data module into the model. Lightning moves
every tensor of a batch to the device (dataclasses are walked field by field).
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Float, Int
from torch import Tensor

from pola_gnt.geometry.rays import Rays


@dataclass
class SourceBatch:
    """Source views as loaded: images with their cameras (the model encodes them)."""

    ids: Int[Tensor, " views"]  # scene view indices
    images: Float[Tensor, "views 3 height width"]  # in [0, 1]
    c2w: Float[Tensor, "views 4 4"]  # OpenCV camera-to-world
    intrinsics: Float[Tensor, "views 3 3"]  # for the images' (height, width), crop included


@dataclass
class RayBatch:
    """Rays of one target view with their colours: one training step (random rays, random sources)
    or the validation rays (fixed). The model samples depths along them (`model.sampler`)."""

    view: int  # the target view
    rays: Rays
    depth_range: tuple[float, float]  # the scene's near and far sampling bounds
    rgb: Float[Tensor, "rays 3"]  # target colours
    sources: SourceBatch
    sample_seed: int | None = None  # a training step's seed of its jittered depth samples; None: fixed samples
    step: int | None = None  # the global step a training batch belongs to


@dataclass
class ViewBatch:
    """One held-out view, rendered whole in ray chunks: its camera, ground truth and sources."""

    view: int
    c2w: Float[Tensor, "4 4"]
    intrinsics: Float[Tensor, "3 3"]
    rgb: Float[Tensor, "height width 3"]  # ground truth
    sources: SourceBatch
