"""A training step's views, crop and rays (`data.datamodule`): the crop cuts the target and its
sources alike and shifts their intrinsics, GNT's recipe scales the rays with the views drawn, and
without the recipe a step draws what it always drew."""

from __future__ import annotations

import torch
from helpers import TINY_OVERRIDES, compose_config, scene_and_data

from pola_gnt.data.datamodule import TrainSteps, crop_views, source_batch
from pola_gnt.data.sampling import scaled_ray_count
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.data.settings import RandomCrop
from pola_gnt.geometry.rays import pixel_grid, pixel_rays
from pola_gnt.runs.config.read import check_scene, read_run_settings


def test_crop_views_cuts_target_and_sources_alike_and_shifts_intrinsics():
    scene = load_scene(*scene_and_data(compose_config("data.factor=32")))
    target, sources = scene.train_ids[0], scene.train_ids[1:4]
    batch = source_batch(scene, sources)
    window = (10, 17, 40, 60)  # top, left, height, width
    cropped, intrinsics, image = crop_views(batch, scene.cameras.intrinsics[target], scene.images[target], window)
    assert torch.equal(image, scene.images[target][10:50, 17:77])
    assert torch.equal(cropped.images, batch.images[:, :, 10:50, 17:77])
    # A pixel (u, v) of the crop is the ray of pixel (u + left, v + top) of the whole image.
    pixels = pixel_grid(40, 60)
    c2w = scene.cameras.c2w[target]
    in_crop = pixel_rays(c2w, intrinsics, pixels)
    whole = pixel_rays(c2w, scene.cameras.intrinsics[target], pixels + torch.tensor([17.0, 10.0]))
    torch.testing.assert_close(in_crop.directions, whole.directions)
    # A point projects into each cropped source at its whole-image pixel minus the corner.
    for view in range(len(sources)):
        full, crop = batch.intrinsics[view], cropped.intrinsics[view]
        torch.testing.assert_close(crop[:2, 2], full[:2, 2] - torch.tensor([17.0, 10.0]))
        torch.testing.assert_close(crop[:, :2], full[:, :2])
    assert torch.equal(batch.intrinsics, source_batch(scene, sources).intrinsics)  # not in place


def _find_window(part: torch.Tensor, whole: torch.Tensor) -> tuple[int, int]:
    """Where `part` `[3, h, w]` sits inside `whole` `[3, H, W]`."""
    height, width = part.shape[-2:]
    corner = (whole == part[:, :1, :1]).all(dim=0)  # where the first pixel's colour occurs
    for top, left in corner.nonzero().tolist():
        if torch.equal(whole[:, top : top + height, left : left + width], part):
            return top, left
    raise AssertionError("not a window of the image")


def test_training_steps_crop_consistently_and_scale_the_rays():
    cfg = compose_config(
        *TINY_OVERRIDES,
        "data.num_source_views=4",
        "data.random_crop={heights:[40,80],area:4000}",
        "data.scale_rays_with_views=true",
    )
    settings = read_run_settings(cfg)
    scene = load_scene(*scene_and_data(cfg))
    check_scene(settings, scene)
    counts = set()
    for steps in [TrainSteps(scene, settings.data, 12, seed=0, rank=0)]:
        for step in range(12):
            batch = steps[step].targets[0]
            images = batch.sources.images
            height, width = images.shape[-2:]
            assert (height, width) in RandomCrop((40, 80), 4000).sizes()
            corners = {
                _find_window(images[i], scene.images[v].permute(2, 0, 1))
                for i, v in enumerate(batch.sources.ids.tolist())
            }
            assert len(corners) == 1  # one window for every source
            top, left = corners.pop()
            shift = torch.tensor([left, top], dtype=torch.float32)
            for i, view in enumerate(batch.sources.ids.tolist()):
                torch.testing.assert_close(
                    batch.sources.intrinsics[i][:2, 2], scene.cameras.intrinsics[view][:2, 2] - shift
                )
            # The target's rays and colours come from the same window.
            target = batch.view
            window = scene.images[target][top : top + height, left : left + width].reshape(-1, 3)
            matches = (batch.rgb[:, None, :] == window[None]).all(-1)
            assert matches.any(dim=1).all()
            drawn = len(batch.sources.ids)
            assert len(batch.rgb) == scaled_ray_count(64, 4, drawn) == int(64 * 4 / drawn)
            counts.add(len(batch.rgb))
    assert len(counts) > 1  # the number of views drawn varies, and the rays with it


def _pixel_indices(batch, scene) -> torch.Tensor:
    """The row-major pixel index of each of `batch`'s rays in its target image (whole, uncropped): its
    direction projected back through the target camera, which lands on a pixel centre."""
    c2w, intrinsics = scene.cameras.c2w[batch.view].double(), scene.cameras.intrinsics[batch.view].double()
    projected = (batch.rays.directions.double() @ c2w[:3, :3]) @ intrinsics.T  # the camera's rotation inverted
    uv = projected[:, :2] / projected[:, 2:]
    assert (uv - uv.round()).abs().max() < 1e-3  # a pixel's ray, not a point between pixels
    return (uv[:, 1].round() * scene.images.shape[2] + uv[:, 0].round()).long()


# What `TrainSteps(seed=0, rank=0)` drew at steps 0-3 on the demo scene (94 x 126 pixels, 64 rays a
# step), computed once (2026-12-06) and pinned: (target view, source views, the depth jitter's seed,
# the first 6 ray pixels, the sum of the 64 ray pixels, the first 2 colours and the sum of all 64 x 3
# colours in 8-bit units).
PINNED_DRAWS = [
    (17, [12, 18, 7], 1683773458080347525,
     [11793, 949, 9992, 11601, 1054, 7453], 404985, [[177, 145, 93], [108, 98, 92]], 17958),
    (18, [17], 4326614698414839344,
     [7157, 4758, 10337, 1432, 10725, 735], 350030, [[69, 144, 101], [97, 69, 71]], 18120),
    (4, [6, 14], 758434510313348179,
     [1794, 7794, 2937, 4841, 8190, 11665], 417372, [[49, 45, 90], [174, 142, 91]], 16784),
    (14, [13, 3, 12, 17, 7], 3788070286676129653,
     [9098, 7034, 8349, 9923, 9666, 5235], 425484, [[175, 144, 92], [146, 163, 111]], 18373),
]  # fmt: skip


def test_without_the_recipe_the_steps_are_unchanged():
    """Off (the quick preset), a step draws exactly what it drew before: same views, rays, colours
    (`PINNED_DRAWS`, seed 0)."""
    cfg = compose_config(*TINY_OVERRIDES)
    scene = load_scene(*scene_and_data(cfg))
    plain = TrainSteps(scene, read_run_settings(cfg).data, 4, seed=0, rank=0)
    for step, pinned in enumerate(PINNED_DRAWS):
        batch = plain[step].targets[0]
        assert len(batch.rgb) == 64 and batch.sources.images.shape[-2:] == scene.images.shape[1:3]
        pixels = _pixel_indices(batch, scene)
        assert torch.equal(batch.rgb, scene.images[batch.view].reshape(-1, 3)[pixels])  # each ray's own colour
        colours = (batch.rgb * 255).round().long()
        drawn = (
            batch.view,
            batch.sources.ids.tolist(),
            batch.sample_seed,
            pixels[:6].tolist(),
            int(pixels.sum()),
            colours[:2].tolist(),
            int(colours.sum()),
        )
        assert drawn == pinned, (step, drawn)
    # The random crop only changes what the crop draws, after the views.
    cropped = compose_config(*TINY_OVERRIDES, "data.random_crop={heights:[40,80],area:4000}")
    with_crop = TrainSteps(scene, read_run_settings(cropped).data, 4, seed=0, rank=0)
    for step in range(4):
        assert torch.equal(plain[step].targets[0].sources.ids, with_crop[step].targets[0].sources.ids)
