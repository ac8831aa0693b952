"""GNT's own outputs for seeded weights: the golden fixture of `tests/test_convert_gnt.py`, and the
full-size check of the conversion (`--compare`).

GNT's official code is not part of this project: export it to a folder OUTSIDE the repository and
give that folder (the one holding `gnt/`) as `--gnt`:

    mkdir -p /work/gnt_golden/gnt
    git -C GNT_REPO archive 53e0fc3 gnt | tar -x -C /work/gnt_golden/gnt
    python scripts/make_gnt_golden.py --gnt /work/gnt_golden/gnt                  # writes the fixture
    python scripts/make_gnt_golden.py --gnt /work/gnt_golden/gnt --width 64 --depth 8 --compare

Only GNT's `gnt/transformer_network.py` (`GNT`), `gnt/feature_network.py` (`ResUNet`) and
`gnt/projection.py` (`Projector`, built with device "cpu": the hard-coded `cuda:0` is in
`gnt/model.py`, which is not used) run, on the CPU in fp32, with `ret_alpha=True` (GNT's depth from
its last ray attention). Their weights are `pola_gnt.interop.gnt_checkpoints.seeded_gnt_checkpoint(seed,
width, depth)`, made again by the test; the inputs (4 source views of 60x84 pixels, sides that are no
multiples of 16, so GNT's decoder pads; 64 target rays x 24 depths, among them samples behind one
source camera, outside some views and outside all of them) are drawn here from the seed and stored.

`--compare` writes nothing: it converts the same weights with `python -m pola_gnt.convert_gnt`'s
library and prints the largest colour and depth differences from GNT's, with `model.net.compat=gnt`
and with it off.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pola_gnt.core.paths import PROJECT_ROOT
from pola_gnt.geometry.cameras import look_at
from pola_gnt.geometry.rays import Rays, pixel_rays
from pola_gnt.interop.gnt_checkpoints import GNT_COMMIT, convert_gnt_checkpoint, seeded_gnt_checkpoint
from pola_gnt.model.gnt import GNT
from pola_gnt.runs.checkpoints import read_checkpoint
from pola_gnt.runs.config.read import read_run_settings

FIXTURE = PROJECT_ROOT / "tests" / "fixtures" / "gnt_golden.npz"
HEIGHT, WIDTH, FOCAL = 60, 84, 60.0
TARGET_FOCAL = 45.0  # a wider target view than the sources': some rays leave every source frustum
N_RAYS, N_SAMPLES = 64, 24
NEAR, FAR = 0.5, 8.0


def golden_inputs(seed: int) -> dict[str, np.ndarray]:
    """Source images, cameras, target rays and depths drawn from `seed` (float32 arrays)."""
    generator = torch.Generator().manual_seed(seed)
    # Smooth images: bilinear reads differ little when a pixel coordinate differs in its last bits.
    coarse = torch.rand(4, 3, 8, 11, generator=generator)
    images = F.interpolate(coarse, size=(HEIGHT, WIDTH), mode="bicubic", align_corners=True).clamp(0, 1)
    centers = torch.tensor([[0.3, 0.2, -0.2], [-0.4, 0.1, 0.1], [0.1, -0.3, 0.0], [0.05, -0.05, 0.8]])
    targets = torch.tensor([[0.0, 0.0, 4.0], [0.2, 0.0, 4.0], [0.0, 0.1, 3.0], [0.05, -0.05, 5.0]])
    c2w = look_at(centers, targets, torch.tensor([0.0, 1.0, 0.0]))
    intrinsics = torch.tensor([[FOCAL, 0.0, WIDTH / 2], [0.0, FOCAL, HEIGHT / 2], [0.0, 0.0, 1.0]])
    target_intrinsics = intrinsics.clone()
    target_intrinsics[0, 0] = target_intrinsics[1, 1] = TARGET_FOCAL
    pixels = torch.rand(N_RAYS, 2, generator=generator) * torch.tensor([WIDTH - 1.0, HEIGHT - 1.0])
    rays = pixel_rays(torch.eye(4), target_intrinsics, pixels.round())
    inverse = torch.linspace(1 / NEAR, 1 / FAR, N_SAMPLES)  # uniform in inverse depth, as GNT's eval
    depths = (1 / inverse).expand(N_RAYS, N_SAMPLES)
    arrays = {
        "images": images,
        "c2w": c2w,
        "intrinsics": intrinsics.expand(4, 3, 3),
        "target_c2w": torch.eye(4),
        "target_intrinsics": target_intrinsics,
        "ray_origins": rays.origins,
        "ray_directions": rays.directions,
        "depths": depths,
    }
    return {name: value.float().contiguous().numpy() for name, value in arrays.items()}


def _camera_rows(height: int, width: int, intrinsics: np.ndarray, c2w: np.ndarray) -> torch.Tensor:
    """GNT's 34-number camera: image size, 4x4 intrinsics, 4x4 camera-to-world (OpenCV), flattened."""
    k4 = np.eye(4, dtype=np.float32)
    k4[:3, :3] = intrinsics
    return torch.from_numpy(np.concatenate([[height, width], k4.ravel(), c2w.ravel()]).astype(np.float32))


def gnt_outputs(gnt_folder: Path, checkpoint: dict, inputs: dict[str, np.ndarray], width: int, depth: int) -> dict:
    """Run GNT's code on `inputs` with the weights of `checkpoint` (GNT's layout)."""
    sys.path.insert(0, str(gnt_folder))
    from gnt.feature_network import ResUNet  # type: ignore[import-not-found]
    from gnt.projection import Projector  # type: ignore[import-not-found]
    from gnt.transformer_network import GNT as GNTCode  # type: ignore[import-not-found]

    args = types.SimpleNamespace(netwidth=width, trans_depth=depth)
    net = GNTCode(args, in_feat_ch=32, posenc_dim=3 + 3 * 2 * 10, viewenc_dim=3 + 3 * 2 * 10, ret_alpha=True)
    net.load_state_dict(checkpoint["net_coarse"])
    feature_net = ResUNet(coarse_out_ch=32, fine_out_ch=32, single_net=True)
    feature_net.load_state_dict(checkpoint["feature_net"])
    net.eval()
    feature_net.eval()
    images = torch.from_numpy(inputs["images"])  # [views, 3, H, W]
    rows = [_camera_rows(HEIGHT, WIDTH, k, c) for k, c in zip(inputs["intrinsics"], inputs["c2w"])]
    cameras = torch.stack(rows)[None]  # [1, views, 34]
    query = _camera_rows(HEIGHT, WIDTH, inputs["target_intrinsics"], inputs["target_c2w"])[None]
    ray_o, ray_d = torch.from_numpy(inputs["ray_origins"]), torch.from_numpy(inputs["ray_directions"])
    z_vals = torch.from_numpy(inputs["depths"])
    with torch.no_grad():
        featmaps = feature_net(images)
        pts = z_vals.unsqueeze(2) * ray_d.unsqueeze(1) + ray_o.unsqueeze(1)  # render_ray.py's points
        rgb_feat, ray_diff, mask = Projector(device="cpu").compute(
            pts, query, images.permute(0, 2, 3, 1)[None], cameras, featmaps=featmaps[0]
        )
        out = net(rgb_feat, ray_diff, mask, pts, ray_d)
    weights = out[:, 3:]
    return {
        "rgb": out[:, :3].numpy(),
        "weights": weights.numpy(),
        "depth": (weights * z_vals).sum(dim=-1).numpy(),  # render_ray.py's depth_map
        "features": featmaps[0].numpy(),
        "mask": mask[..., 0].numpy().astype(bool),
    }


def converted_network(checkpoint: dict, folder: Path, compat: bool = True) -> GNT:
    """Our network from `checkpoint` (GNT's layout) through the converter; `compat` False: the same
    weights with `model.net.compat=none`."""
    source, target = folder / "gnt.pth", folder / "converted.ckpt"
    torch.save(checkpoint, source)
    convert_gnt_checkpoint(source, target)
    converted = read_checkpoint(target)
    settings = read_run_settings(converted["hyper_parameters"]["config"]).model.net
    net = GNT(settings if compat else replace(settings, compat="none"))
    prefix = "net."
    net.load_state_dict({k[len(prefix) :]: v for k, v in converted["state_dict"].items() if k.startswith(prefix)})
    return net.eval()


def our_outputs(net: GNT, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Colour and depth of our network on `inputs`."""
    tensors = {name: torch.from_numpy(value) for name, value in inputs.items()}
    with torch.no_grad():
        sources = net.source_views(tensors["images"], tensors["c2w"], tensors["intrinsics"])
        output = net(Rays(tensors["ray_origins"], tensors["ray_directions"]), tensors["depths"], sources)
    return output.rgb.numpy(), output.depth.numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gnt", type=Path, required=True, help="folder holding GNT's gnt/ package (outside the repo)")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--width", type=int, default=32, help="GNT's netwidth (the fixture: 32)")
    parser.add_argument("--depth", type=int, default=3, help="GNT's trans_depth (the fixture: 3)")
    parser.add_argument("--compare", action="store_true", help="print the conversion's differences, write nothing")
    parser.add_argument("--out", type=Path, default=FIXTURE)
    args = parser.parse_args()
    torch.set_num_threads(2)
    inputs = golden_inputs(args.seed)
    checkpoint = seeded_gnt_checkpoint(args.seed, args.width, args.depth)
    golden = gnt_outputs(args.gnt, checkpoint, inputs, args.width, args.depth)
    mask = golden["mask"]  # [rays, samples, views]
    seen = mask.any(axis=-1)
    print(
        f"samples seen by every view {mask.all(axis=-1).mean():.2f}, by none {(~seen).mean():.2f}; "
        f"rays with an unseen sample {(~seen).any(axis=-1).mean():.2f}; features {golden['features'].shape}"
    )
    if args.compare:
        with tempfile.TemporaryDirectory() as folder:
            for compat in (True, False):
                rgb, depth = our_outputs(converted_network(checkpoint, Path(folder), compat), inputs)
                print(
                    f"width {args.width} depth {args.depth} compat={'gnt' if compat else 'none'}: max |rgb - GNT's| "
                    f"{np.abs(rgb - golden['rgb']).max():.3g}, max |depth - GNT's| "
                    f"{np.abs(depth - golden['depth']).max():.3g}"
                )
        return
    note = (
        f"GNT's code (github.com/VITA-Group/GNT at {GNT_COMMIT}) on the CPU, fp32, ret_alpha=True; weights "
        f"seeded_gnt_checkpoint({args.seed}, {args.width}, {args.depth}); made by scripts/make_gnt_golden.py"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out,
        **inputs,
        **{f"gnt_{name}": value for name, value in golden.items()},
        seed=np.int64(args.seed),
        width=np.int64(args.width),
        depth=np.int64(args.depth),
        note=np.array(note),
    )
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.2f} MB)")


if __name__ == "__main__":
    main()
