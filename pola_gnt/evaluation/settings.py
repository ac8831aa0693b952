"""How test views are scored (`MetricsSettings`) and what is written (`OutputSettings`). Plain frozen
values; they are the config's schema (`pola_gnt.runs.config.schema`), with their defaults in `conf/`."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pola_gnt.core.errors import UserError, check_choice
from pola_gnt.evaluation.image_metrics import LPIPS_NETS, PROTOCOL_DEFAULTS, PROTOCOLS


@dataclass(frozen=True)
class MetricsSettings:
    lpips_net: str  # alex | vgg (null in the YAML: the protocol's, PROTOCOL_DEFAULTS)
    lpips_weights: str | None  # an npz file; None: $POLA_GNT_LPIPS_WEIGHTS, then torchvision's download
    protocol: str  # standard | gnt
    quantize_8bit: bool  # (null in the YAML: the protocol's)
    # Protocols the same renders are scored by too (metrics.json `protocols`), each with its own LPIPS
    # network and quantisation; the views then render at the finest stride any of them scores.
    extra_protocols: tuple[str, ...]

    def check(self, key: str) -> None:
        check_choice(self.protocol, f"{key}.protocol", PROTOCOLS)
        check_choice(self.lpips_net, f"{key}.lpips_net", LPIPS_NETS)
        for protocol in self.extra_protocols:
            check_choice(protocol, f"{key}.extra_protocols", PROTOCOLS)
        if self.protocol in self.extra_protocols or len(set(self.extra_protocols)) < len(self.extra_protocols):
            raise UserError(
                f"{key}.extra_protocols: {list(self.extra_protocols)} repeats a protocol "
                f"({key}.protocol is {self.protocol})"
            )

    @property
    def protocols(self) -> tuple[str, ...]:
        """Every protocol the test views are scored by: `protocol` first, then `extra_protocols`."""
        return (self.protocol, *self.extra_protocols)

    def for_protocol(self, protocol: str) -> MetricsSettings:
        """These settings for one of `protocols`: `protocol` as they are; an extra protocol with its own
        LPIPS network and quantisation (`PROTOCOL_DEFAULTS`) and the same LPIPS weights."""
        if protocol == self.protocol:
            return self
        if protocol not in self.extra_protocols:
            raise ValueError(f"{protocol!r} is none of the scored protocols {self.protocols}")
        defaults = PROTOCOL_DEFAULTS[protocol]
        return replace(
            self,
            protocol=protocol,
            lpips_net=defaults.lpips_net,
            quantize_8bit=defaults.quantize_8bit,
            extra_protocols=(),
        )


@dataclass(frozen=True)
class OutputSettings:
    save_images: bool  # prediction, ground truth, error and depth PNGs of every test view
