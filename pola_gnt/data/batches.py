"""Typed batches, from the data module through the LightningModule to the model.

One kind per loader: `TrainingBatch` (a training step: the random rays of one or more target views,
each a `RayBatch`), `RayBatch` (also the fixed validation rays), `ViewBatch` (a held-out view,
rendered whole at test time), each target carrying its `SourceBatch`. A `Rays` travels whole from
the data module into the model. Lightning moves every tensor of a batch to the device (dataclasses
and lists are walked item by item).
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Float, Int
from torch import Tensor

from pola_gnt.geometry.rays import RayGrid, Rays


@dataclass
class SourceBatch:
    """Source views as loaded: images with their cameras (the model encodes them)."""

    ids: Int[Tensor, " views"]  # scene view indices
    images: Float[Tensor, "views 3 height width"]  # in [0, 1]
    c2w: Float[Tensor, "views 4 4"]  # OpenCV camera-to-world
    intrinsics: Float[Tensor, "views 3 3"]  # for the images' (height, width), crop included
    # Per view, what names its pixels, (scene folder, factor, view, image file), by which training keeps
    # the frozen part of an AlexNet encoder's output (model.feature_cache); None: unnamed (a crop), never kept.
    image_keys: tuple[tuple[str, int, int, str], ...] | None = None


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
    grid: RayGrid | None = None  # how the rays lie in patches of the image (data.ray_patch_size); None: one by one


@dataclass
class TrainingBatch:
    """One training step: `data.targets_per_step` target views, each with its own source views, crop and
    rays (GNT's recipe: one target on each of 8 GPUs; here as many on one device). The loss is the mean
    of the targets' losses, as DDP's mean of the GPUs' gradients."""

    targets: list[RayBatch]
    step: int  # the global step

    @property
    def n_rays(self) -> int:
        return sum(len(target.rgb) for target in self.targets)


@dataclass
class ViewBatch:
    """One held-out view, rendered whole in ray chunks: its camera, ground truth and sources."""

    view: int
    c2w: Float[Tensor, "4 4"]
    intrinsics: Float[Tensor, "3 3"]
    rgb: Float[Tensor, "height width 3"]  # ground truth
    sources: SourceBatch
