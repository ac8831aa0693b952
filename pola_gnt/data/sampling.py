"""GNT's training-step recipe beyond the source views: a random crop of the target and its sources,
and rays per step scaled with the number of source views drawn.

From GNT's code (`gnt/data_loaders/llff_test.py`, `train.py`): each step crops the target and every
source image to one window of a random size, height drawn uniformly from [250, 750) and width
400 * 600 / height (both rounded up to even), placed uniformly at random, and shifts the principal
points by the window's corner; a size that does not fit inside the images (height or width not
smaller) leaves them whole. GNT draws the window's centre so that it keeps at least 1 pixel from the
top and left edges and 2 from the bottom and right ones (`data_utils.random_crop`'s
`randint(h // 2 + 1, H - h // 2 - 1)`, high exclusive): `crop_placement="gnt"`; "anywhere" draws every
position alike. The rays per step are `N_rand * num_source_views / views drawn`, so
rays x views (the transformer's work) stays about constant as the number of views drawn varies.
"""

from __future__ import annotations

import numpy as np

CROP_PLACEMENTS = ("anywhere", "gnt")
# GNT's margins (top/left, bottom/right) in pixels: where its window centre can be drawn.
GNT_CROP_MARGINS = (1, 2)


def crop_size(height: int, area: int) -> tuple[int, int]:
    """The crop (height, width) for a drawn height: height rounded up to even, width = area // height
    rounded up to even."""
    height += height % 2
    width = area // height
    return height, width + width % 2


def crop_offsets(crop: int, image: int, placement: str) -> tuple[int, int] | None:
    """The range `[first, last]` of a crop's offset along one side (`crop` of `image` pixels) under
    `placement`; None when the crop does not fit there."""
    low, high = GNT_CROP_MARGINS if placement == "gnt" else (0, 0)
    last = image - crop - high
    return (low, last) if last >= low else None


def draw_crop_position(
    rng: np.random.Generator, crop: tuple[int, int], image_size: tuple[int, int], placement: str
) -> tuple[int, int] | None:
    """`(top, left)` of a `crop` (height, width) drawn uniformly where `placement` allows; None if it
    does not fit."""
    rows, cols = (crop_offsets(c, i, placement) for c, i in zip(crop, image_size, strict=True))
    if rows is None or cols is None:
        return None
    return int(rng.integers(rows[0], rows[1] + 1)), int(rng.integers(cols[0], cols[1] + 1))


def draw_crop(
    rng: np.random.Generator, heights: tuple[int, int], area: int, image_size: tuple[int, int], placement: str
) -> tuple[int, int, int, int] | None:
    """A random crop window `(top, left, height, width)` of an image of `image_size` (H, W), its
    height drawn from `[heights[0], heights[1])`; None when that size does not fit (the image is
    used whole, as in GNT's code): not smaller than the image, or no room for GNT's margins."""
    crop_h, crop_w = crop_size(int(rng.integers(heights[0], heights[1])), area)
    image_h, image_w = image_size
    if crop_h >= image_h or crop_w >= image_w:
        return None
    position = draw_crop_position(rng, (crop_h, crop_w), image_size, placement)
    return None if position is None else (*position, crop_h, crop_w)


def scaled_ray_count(rays_per_step: int, num_source_views: int, drawn: int) -> int:
    """GNT's rays per step for `drawn` source views: `rays_per_step * num_source_views / drawn`,
    rounded down."""
    return int(rays_per_step * num_source_views / drawn)
