"""`python -m pola_gnt.metrics PRED_IMAGE GT_IMAGE [--lpips-net alex|vgg] [--lpips-weights NPZ]`:
PSNR, SSIM and LPIPS of one image against its ground truth, printed as one JSON object
`{"psnr", "ssim", "lpips", "lpips_net"}` (see the package docstring for the protocol)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from pola_gnt.core.errors import UserError, exit_on_user_error
from pola_gnt.core.paths import LPIPS_WEIGHTS_ENV
from pola_gnt.evaluation.image_metrics import LPIPS_NETS, MIN_IMAGE_SIDE, ImageMetrics, read_float_image


def _json_number(value: float | None) -> float | None:
    # JSON has no infinity: identical images (infinite PSNR) are written as null.
    return value if value is not None and math.isfinite(value) else None


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pola_gnt.metrics",
        description="PSNR, SSIM and LPIPS of one image against its ground truth, as one JSON object.",
        epilog=(
            f"LPIPS weights: --lpips-weights, else ${LPIPS_WEIGHTS_ENV}, else torchvision's download; "
            "lpips is null when none is found. psnr is null for identical images (infinite)."
        ),
    )
    parser.add_argument("pred", type=Path, help="rendered image (8-bit PNG/JPG)")
    parser.add_argument("gt", type=Path, help="ground-truth image of the same size")
    parser.add_argument("--lpips-net", choices=LPIPS_NETS, default="alex")
    parser.add_argument("--lpips-weights", type=Path, default=None, help="LPIPS npz (see shared/lpips)")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    pred, gt = read_float_image(args.pred), read_float_image(args.gt)  # [H, W, 3]
    if pred.shape != gt.shape:
        raise UserError(
            f"{args.pred}: size {pred.shape[1]}x{pred.shape[0]} differs from {args.gt} ({gt.shape[1]}x{gt.shape[0]})"
        )
    if min(pred.shape[:2]) < MIN_IMAGE_SIDE:
        raise UserError(f"{args.pred}: images need at least {MIN_IMAGE_SIDE} pixels per side")
    metrics = ImageMetrics(lpips_net=args.lpips_net, lpips_weights=args.lpips_weights)
    scores = metrics(pred, gt)
    report = {name: _json_number(value) for name, value in scores.items()}
    print(json.dumps(report | {"lpips_net": args.lpips_net}))


if __name__ == "__main__":
    main()
