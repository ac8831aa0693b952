"""Scoring rendered test views (and the nearest-view baseline) and writing `metrics.json`,
`metrics.csv` and the view PNGs.

Training (after fitting) and `pola_gnt.eval` both go through `ViewScorer` and `write_results` (in the
test phase of `system.GNTSystem`), so the same checkpoint under the same protocol gives identical
files.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import imageio.v3 as iio
import matplotlib
import numpy as np
from jaxtyping import Float, UInt8
from torch import Tensor

from pola_gnt.core.files import strict_json_values, write_atomic
from pola_gnt.data.images import to_uint8
from pola_gnt.data.scene import Scene
from pola_gnt.data.source_views import nearest_views
from pola_gnt.evaluation.depth_metrics import DEPTH_METRICS, best_constant_errors, depth_errors
from pola_gnt.evaluation.image_metrics import ImageMetrics
from pola_gnt.evaluation.settings import MetricsSettings

METRIC_NAMES = ("psnr", "ssim", "lpips")
BASELINE_METHOD = "nearest_train_image"
DEPTH_NAMES = tuple(f"depth_{name}" for name in DEPTH_METRICS)  # depth_abs_rel, depth_rmse
DEPTH_BASELINE_NAMES = tuple(f"depth_baseline_{name}" for name in DEPTH_METRICS)
DEPTH_BASELINE_METHOD = "best_constant_depth"
DEPTH_DEFINITION = {
    "reference": "exact depth of the demo scene's analytic geometry (ray-traced)",
    "quantity": "camera z-depth at the pixel centres; rendered: the read-out's expected depth sum_s w_s t_s",
    "units": "the demo scene's own units (its back wall is at z = 9), not the normalised scene's",
    "baseline": "per view, the constant depth minimising each error: the mean for RMSE, the 1/depth-weighted "
    "median for abs-rel",
}


def protocol_stride(protocol: str) -> int:
    """The GNT-compatible protocol renders and scores every 2nd pixel."""
    return 2 if protocol == "gnt" else 1


def render_stride(protocols: Sequence[str]) -> int:
    """The pixel stride one render must have to be scored by every one of `protocols`: each protocol's
    pixels are then every `protocol_stride / render_stride`-th pixel of it (a full render serves both
    the standard protocol and GNT's every 2nd pixel)."""
    return math.gcd(*(protocol_stride(protocol) for protocol in protocols))


def build_image_metrics(metrics: MetricsSettings) -> ImageMetrics:
    return ImageMetrics.for_protocol(
        metrics.protocol,
        lpips_net=metrics.lpips_net,
        lpips_weights=metrics.lpips_weights,
        quantize_8bit=metrics.quantize_8bit,
    )


@dataclass
class ViewResult:
    index: int
    name: str
    scores: dict[str, float | None]
    baseline: dict[str, float | None]
    rgb: Float[Tensor, "height width 3"] | None = field(default=None, repr=False)  # prediction in [0, 1]
    gt: Float[Tensor, "height width 3"] | None = field(default=None, repr=False)
    depth: Float[Tensor, "height width"] | None = field(default=None, repr=False)
    # With an exact depth (demo scene): depth_abs_rel, depth_rmse and the best constant's, per view.
    depth_scores: dict[str, float] | None = None
    exact_depth: Float[Tensor, "height width"] | None = field(default=None, repr=False)  # the rendered depth's units

    def row(self) -> dict:
        return {"index": self.index, "name": self.name, **self.scores, **(self.depth_scores or {})}


class ViewScorer:
    """Scores one rendered test view and the no-learning baseline (nearest training image, unwarped);
    with `exact_depth` (`view -> [H, W]` in the rendered depth's units, `scene_loading.exact_depth_source`),
    also the rendered depth and the best constant depth against it, in the scene's own units."""

    def __init__(
        self,
        scene: Scene,
        metrics: ImageMetrics,
        protocol: str,
        exact_depth: Callable[[int], Tensor] | None = None,
    ):
        self.scene = scene
        self.metrics = metrics
        self.stride = protocol_stride(protocol)
        self.exact_depth = exact_depth

    def depth_scores(self, view: int, depth: Tensor) -> tuple[dict[str, float], Tensor]:
        """Errors of the rendered `depth` and of the best constant, in the scene's own units
        (the normalised units divided by `scene.scale`), and the exact depth at the scored pixels."""
        if self.exact_depth is None:
            raise RuntimeError("ViewScorer.depth_scores: the scene has no exact depth")
        exact = self.exact_depth(view)[:: self.stride, :: self.stride]
        own_units = 1.0 / self.scene.scale
        rendered = depth_errors(depth.cpu().double() * own_units, exact * own_units)
        constant = best_constant_errors(exact * own_units)
        return {
            **{f"depth_{k}": rendered[k] for k in DEPTH_METRICS},
            **{f"depth_baseline_{k}": constant[k] for k in DEPTH_METRICS},
        }, exact

    def ground_truth(self, view: int) -> Tensor:  # [H / stride, W / stride, 3]
        return self.scene.images[view, :: self.stride, :: self.stride]

    def baseline_image(self, view: int) -> Tensor:
        centers = self.scene.cameras.centers
        nearest = nearest_views(centers[view], centers, self.scene.train_ids, 1, exclude=view)[0]
        return self.scene.images[nearest, :: self.stride, :: self.stride]

    def __call__(self, view: int, rgb: Tensor, depth: Tensor, keep_images: bool = True) -> ViewResult:
        gt = self.ground_truth(view).to(rgb.device)
        depth_scores, exact = self.depth_scores(view, depth) if self.exact_depth is not None else (None, None)
        return ViewResult(
            index=view,
            name=self.scene.image_names[view],
            scores=self.metrics(rgb, gt),
            baseline=self.metrics(self.baseline_image(view).to(rgb.device), gt),
            rgb=rgb.cpu() if keep_images else None,
            gt=gt.cpu() if keep_images else None,
            depth=depth.cpu() if keep_images else None,
            depth_scores=depth_scores,
            exact_depth=exact.float() if keep_images and exact is not None else None,
        )


def mean_scores(rows: list[dict], names: tuple[str, ...] = METRIC_NAMES) -> dict[str, float | None]:
    means = {}
    for name in names:
        values = [row[name] for row in rows]
        means[name] = None if any(v is None for v in values) else float(statistics.fmean(values))
    return means


# The keys of a metrics document that depend on the protocol it was scored by (the rest, the header's
# scene, model, training record and timings, are the run's): `protocols` holds these per protocol.
PROTOCOL_KEYS = (
    "protocol",
    "lpips_net",
    "resolution",
    "metric_settings",
    "mean",
    "baseline",
    "depth_baseline",
    "depth_definition",
    "per_image",
    "null_reasons",
)


@dataclass
class ProtocolResults:
    """The same test views scored by one more protocol (`metrics.extra_protocols`): the header keys of
    that protocol (`protocol`, `lpips_net`, `resolution`, `metric_settings`) and its view results."""

    header: dict
    results: list[ViewResult]


def metrics_document(header: dict, results: list[ViewResult]) -> dict:
    """The `metrics.json` content (docs/interface.md): header, mean, baseline, per-image rows. Strict JSON:
    a non-finite score is `null`, and `null_reasons` says which and why."""
    results = sorted(results, key=lambda r: r.index)
    reasons: dict[str, str] = {}
    depth = [r.depth_scores for r in results if r.depth_scores is not None]
    if depth and len(depth) != len(results):
        raise ValueError("exact-depth scores for some test views only")
    depth_sections = {}
    if depth:
        baseline = mean_scores(depth, DEPTH_BASELINE_NAMES)
        depth_sections = {
            "depth_baseline": {
                "method": DEPTH_BASELINE_METHOD,
                **{f"depth_{k}": baseline[f"depth_baseline_{k}"] for k in DEPTH_METRICS},
            },
            "depth_definition": DEPTH_DEFINITION,
        }
    document = strict_json_values(
        {
            **header,
            "mean": {**mean_scores([r.scores for r in results]), **(mean_scores(depth, DEPTH_NAMES) if depth else {})},
            "baseline": {"method": BASELINE_METHOD, **mean_scores([r.baseline for r in results])},
            **depth_sections,
            "per_image": [r.row() for r in results],
        },
        reasons=reasons,
    )
    if reasons:
        document["null_reasons"] = reasons
    return document


def _png_bytes(image: np.ndarray) -> bytes:
    return iio.imwrite("<bytes>", image, extension=".png")


def colorize_depth(
    depth: Float[Tensor, "height width"], near: float, far: float
) -> UInt8[np.ndarray, "height width 3"]:
    """Depth `[H, W]` -> uint8 RGB with a perceptual colour map (turbo), near bright, inverse-depth scaled."""
    disparity = (1.0 / depth.clamp(min=1e-6) - 1.0 / far) / (1.0 / near - 1.0 / far)
    colours = matplotlib.colormaps["turbo"](disparity.clamp(0, 1).numpy())[..., :3]
    return (colours * 255.0).round().astype(np.uint8)


def protocol_section(document: dict) -> dict:
    """What of a metrics document its protocol decides (`PROTOCOL_KEYS`)."""
    return {key: document[key] for key in PROTOCOL_KEYS if key in document}


def write_results(
    out_dir: Path,
    header: dict,
    results: list[ViewResult],
    depth_range: tuple[float, float],
    save_images: bool = True,
    extra: Sequence[ProtocolResults] = (),
) -> dict:
    """Write `metrics.json`, `metrics.csv` and (optionally) `test_views/*.png`; return the document.
    With `extra` protocols (the same views scored again), `metrics.json` also holds `protocols`, every
    protocol's section (`header`'s first), and each extra protocol's rows go to `metrics_<protocol>.csv`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    document = metrics_document(header, results)
    extra_documents = [metrics_document({**header, **scored.header}, scored.results) for scored in extra]
    if extra_documents:
        document["protocols"] = {d["protocol"]: protocol_section(d) for d in [document, *extra_documents]}
    if save_images:
        views_dir = out_dir / "test_views"
        views_dir.mkdir(exist_ok=True)
        for result in results:
            if result.rgb is None or result.gt is None or result.depth is None:  # kept together (`keep_images`)
                continue
            stem = Path(result.name).stem
            error = (result.rgb - result.gt).abs().mean(dim=-1, keepdim=True).expand(-1, -1, 3)
            write_atomic(views_dir / f"{stem}_pred.png", _png_bytes(to_uint8(result.rgb)))
            write_atomic(views_dir / f"{stem}_gt.png", _png_bytes(to_uint8(result.gt)))
            write_atomic(views_dir / f"{stem}_error.png", _png_bytes(to_uint8(error)))
            write_atomic(views_dir / f"{stem}_depth.png", _png_bytes(colorize_depth(result.depth, *depth_range)))
            if result.exact_depth is not None:  # the same colour map and range as the rendered depth
                write_atomic(
                    views_dir / f"{stem}_depth_exact.png", _png_bytes(colorize_depth(result.exact_depth, *depth_range))
                )
    write_atomic(out_dir / "metrics.csv", _csv_bytes(document))
    for extra_document in extra_documents:
        write_atomic(out_dir / f"metrics_{extra_document['protocol']}.csv", _csv_bytes(extra_document))
    write_atomic(out_dir / "metrics.json", (json.dumps(document, indent=2, allow_nan=False) + "\n").encode())
    return document


def _csv_bytes(document: dict) -> bytes:
    """`metrics.csv`: the per-image rows, the mean and the baseline of one protocol's document."""
    has_depth = "depth_baseline" in document
    csv_buffer = io.StringIO()
    depth_fields = [*DEPTH_NAMES, *DEPTH_BASELINE_NAMES] if has_depth else []
    writer = csv.DictWriter(csv_buffer, fieldnames=["index", "name", *METRIC_NAMES, *depth_fields])
    writer.writeheader()
    writer.writerows(document["per_image"])
    mean_row = {"index": "mean", "name": "", **document["mean"]}
    if has_depth:
        mean_row.update({f"depth_baseline_{k}": document["depth_baseline"][f"depth_{k}"] for k in DEPTH_METRICS})
    writer.writerow(mean_row)
    writer.writerow(
        {"index": "baseline", "name": BASELINE_METHOD, **{k: document["baseline"][k] for k in METRIC_NAMES}}
    )
    return csv_buffer.getvalue().encode()


def format_tables(document: dict) -> str:
    """`format_table` of the document, and of each further protocol it holds (`protocols`)."""
    sections = [section for name, section in document.get("protocols", {}).items() if name != document["protocol"]]
    return "\n".join(format_table({**document, **section}) for section in [{}, *sections])


def format_table(document: dict) -> str:
    """A small text table: per image, mean and baseline."""

    def cell(value):
        return "   n/a" if value is None else f"{value:6.3f}" if value < 10 else f"{value:6.2f}"

    title = (
        f"{document['scene']} / {document['model']} - {document['protocol']} protocol, "
        f"LPIPS-{document['lpips_net']}, {document['resolution'][1]}x{document['resolution'][0]}"
    )
    lines = [title, f"{'view':<24}{'PSNR':>8}{'SSIM':>8}{'LPIPS':>8}"]
    for row in document["per_image"]:
        lines.append(f"{row['name']:<24}" + "".join(f"{cell(row[m]):>8}" for m in METRIC_NAMES))
    lines.append(f"{'mean':<24}" + "".join(f"{cell(document['mean'][m]):>8}" for m in METRIC_NAMES))
    lines.append(
        f"{'baseline (nearest view)':<24}" + "".join(f"{cell(document['baseline'][m]):>8}" for m in METRIC_NAMES)
    )
    if "depth_baseline" in document:
        mean, constant = document["mean"], document["depth_baseline"]
        lines.append(f"{'depth (exact reference)':<24}{'abs-rel':>8}{'RMSE':>8}")
        lines.append(f"{'rendered':<24}{cell(mean['depth_abs_rel']):>8}{cell(mean['depth_rmse']):>8}")
        lines.append(f"{'best constant':<24}{cell(constant['depth_abs_rel']):>8}{cell(constant['depth_rmse']):>8}")
    return "\n".join(lines)
