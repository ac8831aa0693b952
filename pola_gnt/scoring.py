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
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import imageio.v3 as iio
import matplotlib
import numpy as np
from jaxtyping import Float, UInt8
from torch import Tensor

from pola_gnt.data.llff import Scene, to_uint8
from pola_gnt.data.source_views import nearest_views
from pola_gnt.metrics import ImageMetrics
from pola_gnt.runfiles import strict_json_values, write_atomic

METRIC_NAMES = ("psnr", "ssim", "lpips")
BASELINE_METHOD = "nearest_train_image"


def protocol_stride(protocol: str) -> int:
    """The GNT-compatible protocol renders and scores every 2nd pixel."""
    return 2 if protocol == "gnt" else 1


def build_image_metrics(metrics_cfg) -> ImageMetrics:
    return ImageMetrics.for_protocol(
        metrics_cfg.protocol,
        lpips_net=metrics_cfg.lpips_net,
        lpips_weights=metrics_cfg.lpips_weights,
        quantize_8bit=metrics_cfg.quantize_8bit,
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

    def row(self) -> dict:
        return {"index": self.index, "name": self.name, **self.scores}


class ViewScorer:
    """Scores one rendered test view and the no-learning baseline (nearest training image, unwarped)."""

    def __init__(self, scene: Scene, metrics: ImageMetrics, protocol: str):
        self.scene = scene
        self.metrics = metrics
        self.stride = protocol_stride(protocol)

    def ground_truth(self, view: int) -> Tensor:  # [H / stride, W / stride, 3]
        return self.scene.images[view, :: self.stride, :: self.stride]

    def baseline_image(self, view: int) -> Tensor:
        centers = self.scene.cameras.centers
        nearest = nearest_views(centers[view], centers, self.scene.train_ids, 1, exclude=view)[0]
        return self.scene.images[nearest, :: self.stride, :: self.stride]

    def __call__(self, view: int, rgb: Tensor, depth: Tensor, keep_images: bool = True) -> ViewResult:
        gt = self.ground_truth(view).to(rgb.device)
        return ViewResult(
            index=view,
            name=self.scene.image_names[view],
            scores=self.metrics(rgb, gt),
            baseline=self.metrics(self.baseline_image(view).to(rgb.device), gt),
            rgb=rgb.cpu() if keep_images else None,
            gt=gt.cpu() if keep_images else None,
            depth=depth.cpu() if keep_images else None,
        )


def mean_scores(rows: list[dict]) -> dict[str, float | None]:
    means = {}
    for name in METRIC_NAMES:
        values = [row[name] for row in rows]
        means[name] = None if any(v is None for v in values) else float(statistics.fmean(values))
    return means


def metrics_document(header: dict, results: list[ViewResult]) -> dict:
    """The `metrics.json` content (interface.md): header, mean, baseline, per-image rows. Strict JSON:
    a non-finite score is `null`, and `null_reasons` says which and why."""
    results = sorted(results, key=lambda r: r.index)
    reasons: dict[str, str] = {}
    document = strict_json_values(
        {
            **header,
            "mean": mean_scores([r.scores for r in results]),
            "baseline": {"method": BASELINE_METHOD, **mean_scores([r.baseline for r in results])},
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


def write_results(
    out_dir: Path, header: dict, results: list[ViewResult], depth_range: tuple[float, float], save_images: bool = True
) -> dict:
    """Write `metrics.json`, `metrics.csv` and (optionally) `test_views/*.png`; return the document."""
    out_dir.mkdir(parents=True, exist_ok=True)
    document = metrics_document(header, results)
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
    csv_buffer = io.StringIO()
    writer = csv.DictWriter(csv_buffer, fieldnames=["index", "name", *METRIC_NAMES])
    writer.writeheader()
    writer.writerows(document["per_image"])
    writer.writerow({"index": "mean", "name": "", **document["mean"]})
    writer.writerow(
        {"index": "baseline", "name": BASELINE_METHOD, **{k: document["baseline"][k] for k in METRIC_NAMES}}
    )
    write_atomic(out_dir / "metrics.csv", csv_buffer.getvalue().encode())
    write_atomic(out_dir / "metrics.json", (json.dumps(document, indent=2, allow_nan=False) + "\n").encode())
    return document


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
    return "\n".join(lines)
