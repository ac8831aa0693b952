"""How test views are scored (`MetricsSettings`) and what is written (`OutputSettings`). Plain frozen
values; they are the config's schema (`pola_gnt.runs.config.schema`), with their defaults in `conf/`."""

from __future__ import annotations

from dataclasses import dataclass

from pola_gnt.core.errors import check_choice
from pola_gnt.evaluation.image_metrics import LPIPS_NETS, PROTOCOLS


@dataclass(frozen=True)
class MetricsSettings:
    lpips_net: str  # alex | vgg (null in the YAML: the protocol's, PROTOCOL_DEFAULTS)
    lpips_weights: str | None  # an npz file; None: $POLA_GNT_LPIPS_WEIGHTS, then torchvision's download
    protocol: str  # standard | gnt
    quantize_8bit: bool  # (null in the YAML: the protocol's)

    def check(self, key: str) -> None:
        check_choice(self.protocol, f"{key}.protocol", PROTOCOLS)
        check_choice(self.lpips_net, f"{key}.lpips_net", LPIPS_NETS)


@dataclass(frozen=True)
class OutputSettings:
    save_images: bool  # prediction, ground truth, error and depth PNGs of every test view
