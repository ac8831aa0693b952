"""`python -m pola_gnt.convert_gnt GNT.pth OUT.ckpt [--config GNT_CONFIG.txt] [--network coarse|fine]`:
a checkpoint of GNT's official code (as its `train.py` saves it) -> a Pola-GNT checkpoint of
`model=gnt` with `model.net.compat=gnt`, which computes GNT's forward and which `eval`,
`render_video` and `init_from` read (see `pola_gnt.interop.gnt_checkpoints`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pola_gnt.core.errors import UserError, exit_on_user_error
from pola_gnt.interop.gnt_checkpoints import NETWORKS, convert_gnt_checkpoint, finetune_command


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pola_gnt.convert_gnt",
        description="Convert a checkpoint of GNT's official code into a Pola-GNT checkpoint (model.net.compat=gnt).",
        epilog=(
            "Sizes (netwidth, trans_depth, feature channels, single_net) come from the weights' shapes; the "
            "config file, when given, must agree with them and gives N_samples, num_source_views and the "
            "training scenes. Then: python -m pola_gnt.eval scene=fern ckpt_path=OUT.ckpt"
        ),
    )
    parser.add_argument("checkpoint", type=Path, help="GNT's checkpoint (model_XXXXXX.pth)")
    parser.add_argument("out", type=Path, help="the Pola-GNT checkpoint to write (.ckpt)")
    parser.add_argument("--config", type=Path, default=None, help="GNT's config file it was trained with (optional)")
    parser.add_argument(
        "--network",
        choices=NETWORKS,
        default="coarse",
        help="which of GNT's networks (fine: net_fine, when single_net was off); default coarse",
    )
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    if not args.checkpoint.is_file():
        raise UserError(f"{args.checkpoint}: not found")
    if args.config is not None and not args.config.is_file():
        raise UserError(f"--config: {args.config}: not found")
    if not args.out.parent.is_dir():
        raise UserError(f"{args.out}: its folder does not exist")
    converted = convert_gnt_checkpoint(args.checkpoint, args.out, args.config, args.network)
    layout, net = converted.layout, converted.config["model"]["net"]
    source = "its config and weights" if args.config is not None else "the weights' shapes (no config given)"
    print(
        f"wrote {converted.path}: GNT's net_{converted.network} at step {converted.global_step}, width "
        f"{layout.width}, {layout.depth} blocks, {layout.feature_channels} feature channels"
        f"{'' if layout.single_net else ' (coarse and fine)'}, sizes from {source}; model=gnt "
        f"model.net.compat={net['compat']}, render.n_samples={converted.config['render']['n_samples']}"
    )
    print(f"evaluate with: python -m pola_gnt.eval scene=NAME ckpt_path={converted.path}")
    print(f"fine-tune with: {finetune_command(converted.config, converted.path)} scene=NAME")


if __name__ == "__main__":
    main()
