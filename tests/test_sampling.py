"""GNT's random training crop (`data.sampling`, `data.settings.RandomCrop`): its sizes and where a
window may lie."""

from __future__ import annotations

import numpy as np

from pola_gnt.data.sampling import crop_size, draw_crop
from pola_gnt.data.settings import RandomCrop


def test_gnt_crop_sizes():
    """Heights drawn in [250, 750) give even sides of about 400 x 600 pixels (GNT's code)."""
    sizes = RandomCrop(heights=(250, 750), area=240000).sizes()
    heights = [h for h, _ in sizes]
    assert min(heights) == 250 and max(heights) == 750 and len(sizes) == 251
    for height, width in sizes:
        assert height % 2 == 0 and width % 2 == 0
        assert abs(height * width - 240000) <= height + width + 1
    assert crop_size(399, 240000) == (400, 600) and crop_size(250, 240000) == (250, 960)


def test_draw_crop_stays_inside_the_image_and_covers_it():
    rng = np.random.default_rng(0)
    windows = [draw_crop(rng, (250, 750), 240000, (756, 1008), "anywhere") for _ in range(3000)]
    assert all(w is not None for w in windows)  # every GNT size fits LLFF at factor 4
    tops, lefts = np.array([w[0] for w in windows]), np.array([w[1] for w in windows])
    for top, left, height, width in windows:
        assert 0 <= top <= 756 - height and 0 <= left <= 1008 - width and 250 <= height <= 750
    assert tops.min() == 0 and lefts.min() == 0  # uniform placement reaches the borders
    assert max(w[0] + w[2] for w in windows) == 756 and max(w[1] + w[3] for w in windows) == 1008
    # At factor 8 (378 x 504) no GNT size fits: the image is used whole, as in GNT's code.
    assert all(draw_crop(rng, (250, 750), 240000, (378, 504), "anywhere") is None for _ in range(200))
