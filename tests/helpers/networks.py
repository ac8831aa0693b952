"""Networks and source views with random values, for the tests of the render paths: the quick preset's
network with its zero-initialised read-out perturbed (so that the learned colour and scores matter), and
random source images around an identity target camera."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from pola_gnt.geometry.rays import Rays, pixel_grid, pixel_rays
from pola_gnt.model.gnt import GNT, SourceViews
from pola_gnt.model.sampler import sample_depths
from pola_gnt.runs.config.app import compose_config
from pola_gnt.runs.config.read import read_run_settings


def perturbed_quick_net(kind: str = "pola_gnt", seed: int = 0, **overrides) -> GNT:
    """The quick preset's network of `kind` (`model=kind`) with `overrides` of its settings, random weights
    from `seed`, its read-out (and learned view blend) perturbed by 0.2 standard deviations; in eval mode."""
    settings = read_run_settings(compose_config(f"model={kind}", "experiment=quick", "trainer=cpu")).model.net
    torch.manual_seed(seed)
    net = GNT(replace(settings, **overrides)).eval()
    with torch.no_grad():
        perturbed = [*net.readout.parameters(), *(net.view_blend.parameters() if net.view_blend else [])]
        for parameter in perturbed:
            parameter.add_(torch.randn_like(parameter) * 0.2)
    return net


def random_source_views(net: GNT, height: int, width: int, views: int, seed: int) -> tuple[SourceViews, Tensor]:
    """`views` random images of `height` x `width` from cameras facing the identity target's way, shifted
    sideways at random (from `seed`), encoded by `net`; and their shared intrinsics `[3, 3]`."""
    generator = torch.Generator().manual_seed(seed)
    intrinsics = torch.tensor([[0.8 * width, 0.0, width / 2], [0.0, 0.8 * width, height / 2], [0.0, 0.0, 1.0]])
    c2w = torch.eye(4).repeat(views, 1, 1)
    c2w[:, :2, 3] = (torch.rand(views, 2, generator=generator) - 0.5) * 1.2
    images = torch.rand(views, 3, height, width, generator=generator)
    with torch.no_grad():
        return net.source_views(images, c2w, intrinsics.expand(views, 3, 3).clone()), intrinsics


def random_target_rig(
    net: GNT, height: int = 40, width: int = 48, views: int = 4, seed: int = 1
) -> tuple[SourceViews, Rays, Tensor]:
    """`random_source_views` around the identity target camera, the target's rays through every pixel and
    their fixed depth samples (24, from 1 to 12): near the borders some samples fall outside some views,
    and some outside every view."""
    sources, intrinsics = random_source_views(net, height, width, views, seed)
    rays = pixel_rays(torch.eye(4), intrinsics, pixel_grid(height, width))
    return sources, rays, sample_depths(1.0, 12.0, len(rays), 24, jitter=False)
