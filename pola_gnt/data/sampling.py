"""GNT's training-step recipe beyond the source views: a random crop of the target and its sources,
and rays per step scaled with the number of source views drawn.

From GNT's code (`gnt/data_loaders/llff_test.py`, `train.py`): each step crops the target and every
source image to one window of a random size, height drawn uniformly from [250, 750) and width
400 * 600 / height (both rounded up to even), placed uniformly at random, and shifts the principal
points by the window's corner; a size that does not fit inside the images (height or width not
smaller) leaves them whole. The rays per step are `N_rand * num_source_views / views drawn`, so
rays x views (the transformer's work) stays about constant as the number of views drawn varies.
"""

from __future__ import annotations

import numpy as np


def crop_size(height: int, area: int) -> tuple[int, int]:
    """The crop (height, width) for a drawn height: height rounded up to even, width = area // height
    rounded up to even."""
    height += height % 2
    width = area // height
    return height, width + width % 2


def draw_crop(
    rng: np.random.Generator, heights: tuple[int, int], area: int, image_size: tuple[int, int]
) -> tuple[int, int, int, int] | None:
    """A random crop window `(top, left, height, width)` of an image of `image_size` (H, W), its
    height drawn from `[heights[0], heights[1])`; None when that size does not fit (the image is
    used whole, as in GNT's code)."""
    crop_h, crop_w = crop_size(int(rng.integers(heights[0], heights[1])), area)
    image_h, image_w = image_size
    if crop_h >= image_h or crop_w >= image_w:
        return None
    return int(rng.integers(image_h - crop_h + 1)), int(rng.integers(image_w - crop_w + 1)), crop_h, crop_w


def scaled_ray_count(rays_per_step: int, num_source_views: int, drawn: int) -> int:
    """GNT's rays per step for `drawn` source views: `rays_per_step * num_source_views / drawn`,
    rounded down."""
    return int(rays_per_step * num_source_views / drawn)
