"""Depth errors of a rendered depth map against an exact one, and the best constant depth as a baseline.

Both maps must hold the same quantity in the same units: here the camera z-depth at the pixel
centres (the renderer's expected depth `sum_s w_s t_s` is a z-depth, since its rays have camera
z-component 1; the demo scene's exact depth is the traced z-depth at the same pixel coordinates).

- `abs_rel`: mean over pixels of `|d - d*| / d*` (scale-free);
- `rmse`: `sqrt(mean((d - d*)^2))`, in the units of the maps.

The baseline is a flat depth map at the constant that minimises each error for that view (an oracle
that knows the exact depth's distribution, not its layout):
- RMSE: the mean of `d*` (its RMSE is the population standard deviation of `d*`);
- abs-rel: `sum_i |c - d*_i| / d*_i` is convex and piecewise linear in `c` with slope
  `sum_{d*_i < c} w_i - sum_{d*_i > c} w_i`, `w_i = 1 / d*_i`, so it is minimal at the weighted median
  of `d*` with weights `1 / d*` (the exact minimiser; the plain median minimises the unweighted
  absolute error instead, slightly higher here).
"""

from __future__ import annotations

import torch
from torch import Tensor

DEPTH_METRICS = ("abs_rel", "rmse")


def _checked(pred: Tensor, exact: Tensor) -> tuple[Tensor, Tensor]:
    if pred.shape != exact.shape:
        raise ValueError(f"depth maps differ in shape: {tuple(pred.shape)} vs {tuple(exact.shape)}")
    exact = exact.double().flatten()
    if not bool(torch.isfinite(exact).all()) or not bool((exact > 0).all()):
        raise ValueError("the exact depth must be finite and positive everywhere")
    return pred.double().flatten(), exact


def depth_errors(pred: Tensor, exact: Tensor) -> dict[str, float]:
    """`{"abs_rel", "rmse"}` of `pred` against `exact` (same shape, same units, exact > 0)."""
    pred, exact = _checked(pred, exact)
    difference = pred - exact
    return {
        "abs_rel": float((difference.abs() / exact).mean()),
        "rmse": float(difference.square().mean().sqrt()),
    }


def best_abs_rel_constant(exact: Tensor) -> float:
    """The constant `c` minimising `mean(|c - d*| / d*)`: the weighted median of `d*`, weights `1 / d*`."""
    exact = exact.double().flatten()
    values, order = torch.sort(exact)
    weights = (1.0 / exact)[order]
    cumulative = torch.cumsum(weights, dim=0)
    # The first value where the weight at or below it reaches half the total: the slope changes sign there.
    index = int(torch.searchsorted(cumulative, 0.5 * cumulative[-1]))
    return float(values[min(index, len(values) - 1)])


def best_constant_errors(exact: Tensor) -> dict[str, float]:
    """Errors of the best constant depth map: abs-rel at the weighted median, RMSE at the mean."""
    _, flat = _checked(exact, exact)
    abs_rel_constant = torch.full_like(flat, best_abs_rel_constant(flat))
    rmse_constant = torch.full_like(flat, float(flat.mean()))
    return {
        "abs_rel": depth_errors(abs_rel_constant, flat)["abs_rel"],
        "rmse": depth_errors(rmse_constant, flat)["rmse"],
    }
