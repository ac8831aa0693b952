"""How test views are scored (`MetricsSettings`) and what is written (`OutputSettings`). Plain frozen
values; their defaults live in `conf/` only, read and checked in `pola_gnt.runs.config`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricsSettings:
    lpips_net: str  # alex | vgg
    lpips_weights: str | None  # an npz file; None: $POLA_GNT_LPIPS_WEIGHTS, then torchvision's download
    protocol: str  # standard | gnt
    quantize_8bit: bool


@dataclass(frozen=True)
class OutputSettings:
    save_images: bool  # prediction, ground truth, error and depth PNGs of every test view
