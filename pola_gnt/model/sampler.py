"""Depth samples along rays: uniform in inverse depth (disparity) between the near and far bounds,
drawn by the model (`DepthSampler`); the data layer yields rays only."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from pola_gnt.geometry.rays import RayGrid, Rays


def sample_depths(
    near: float | Tensor,
    far: float | Tensor,
    n_rays: int,
    n_samples: int,
    jitter: bool,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Float[Tensor, "rays samples"]:
    """Depths `[rays, samples]` uniform in inverse depth between `near` and `far`.

    With `jitter`, each sample is drawn uniformly inside its disparity bin (training); without,
    samples sit at the bin edges including both ends (deterministic evaluation, as GNT).
    """
    near_disp = 1.0 / torch.as_tensor(near, dtype=torch.float32, device=device)
    far_disp = 1.0 / torch.as_tensor(far, dtype=torch.float32, device=device)
    fractions = torch.linspace(0.0, 1.0, n_samples, device=device).expand(n_rays, n_samples)
    if jitter:
        # Move each sample uniformly within the bin around it (midpoints as bin edges).
        mids = 0.5 * (fractions[:, 1:] + fractions[:, :-1])
        upper = torch.cat([mids, fractions[:, -1:]], dim=-1)
        lower = torch.cat([fractions[:, :1], mids], dim=-1)
        uniform = torch.rand(
            (n_rays, n_samples), generator=generator, device=generator.device if generator else device
        ).to(fractions.device)
        fractions = lower + (upper - lower) * uniform
    disparity = near_disp * (1.0 - fractions) + far_disp * fractions
    return 1.0 / disparity


@dataclass(frozen=True)
class DepthSampler:
    """The model's ray sampler: `n_samples` depths per ray in a scene's depth range. A training batch
    carries a seed (jittered samples, drawn on the CPU from that seed so a step's samples do not
    depend on the device or on resume); without one the samples are deterministic (validation,
    test, videos)."""

    n_samples: int

    def __call__(
        self, rays: Rays, depth_range: tuple[float, float], seed: int | None = None, grid: RayGrid | None = None
    ) -> Float[Tensor, "rays samples"]:
        """With a `grid` (rays in patches), a jittered draw is one per patch, shared by its rays: the rays of
        a patch keep common depth planes, over which the prior's neighbours aggregate (`model.neighbours`)."""
        near, far = depth_range
        device = rays.origins.device
        if seed is None:
            return sample_depths(near, far, len(rays), self.n_samples, jitter=False, device=device)
        generator = torch.Generator().manual_seed(seed)
        if grid is None:
            return sample_depths(near, far, len(rays), self.n_samples, jitter=True, generator=generator).to(device)
        per_patch = sample_depths(near, far, grid.patches, self.n_samples, jitter=True, generator=generator)
        return per_patch.repeat_interleave(grid.rows * grid.cols, dim=0).to(device)
