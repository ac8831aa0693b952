"""NeRF's synthetic (Blender) scenes: `transforms_{train,test}.json` + RGBA PNGs -> a `Scene`.

Read as NeRF and GNT read them (GNT: gnt/data_loaders/nerf_synthetic.py): the focal from
`camera_angle_x` and the width of the PNGs as stored, alpha composited on white, Blender's OpenGL
camera axes turned into OpenCV's, world units as stored (GNT does not normalise these scenes: the
cameras sit 4 units from the object) and GNT's fixed near / far, 2 and 6. Training views are the
train split, test views the test split (`data.test_views` picks an evenly spaced subset); the val
split is not read (GNT trains and tests without it), except by a training collection, which reads
every split and trains on all of their frames (`ALL_SPLITS`). The cameras look at the object from
all around: the rig is object-centric, source views are the nearest viewing directions (GNT's rule
for them).

Size: `data.synthetic_factor` F reads the frames at NeRF's 800 px / F. A copy stored smaller (the
project's 400 px lego) is read as stored when that is the size asked for, never halved again; a
larger one is area-downsampled, with the focal scaled alike.
"""

from __future__ import annotations

import math
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch

from pola_gnt.core.errors import UserError
from pola_gnt.data.scene import Scene, evenly_spaced
from pola_gnt.data.source_views import resolve_rig
from pola_gnt.data.transforms_json import area_downsample, frame_file, frame_matrix, opengl_to_opencv, read_json
from pola_gnt.geometry.cameras import Cameras

FULL_WIDTH = 800  # NeRF's synthetic frames are 800 x 800
NEAR_FAR = (2.0, 6.0)  # GNT's depth range for these scenes (nerf_synthetic.py)
SPLITS = ("train", "test")  # a one-scene run's: GNT's
ALL_SPLITS = ("train", "val", "test")  # a training collection's: every frame is a training view


def load_blender_scene(
    path: str | Path,
    factor: int = 2,
    test_views: int | None = None,
    name: str | None = None,
    rig: str = "object",
    splits: tuple[str, ...] = SPLITS,
) -> Scene:
    """A NeRF synthetic scene folder -> `Scene` (frames at `FULL_WIDTH / factor` px). Reads `splits`
    in order, train first: training views are the train split's frames, test views the others' (the
    test split's: all, or `test_views` of them evenly spaced). Bad files raise `UserError` naming the file."""
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(
            f"{folder}: scene folder not found (set data.synthetic_root=DIR or $POLA_GNT_SYNTHETIC to the "
            f"folder holding NeRF's synthetic scenes, nerf_synthetic/; see data/README.md)"
        )
    names, images, c2w, focals = [], [], [], []
    train_count = 0
    for split in splits:
        file = folder / f"transforms_{split}.json"
        document = read_json(file)
        frames = document["frames"]
        angle = document.get("camera_angle_x")
        if isinstance(angle, bool) or not isinstance(angle, (int, float)) or not 0 < angle < math.pi:
            raise UserError(f"{file}: camera_angle_x must be an angle in radians in (0, pi), got {angle!r}")
        matrices = frame_matrix(file, frames)
        ids = list(range(len(frames)))
        if split == "test" and test_views is not None:
            ids = evenly_spaced(ids, test_views)
        for i in ids:
            image_file = frame_file(folder, frames[i].get("file_path"), f"{file}: frames[{i}]")
            if not image_file.is_file():
                raise UserError(f"{image_file}: not found (frames[{i}].file_path of {file.name})")
            image = read_on_white(image_file)
            if images and image.shape != images[0].shape:
                raise UserError(
                    f"{image_file}: {image.shape[1]}x{image.shape[0]} pixels, the other frames "
                    f"{images[0].shape[1]}x{images[0].shape[0]}"
                )
            images.append(image)
            names.append(f"{split}/{image_file.name}")
            c2w.append(opengl_to_opencv(matrices[i]))
            focals.append(0.5 * image.shape[1] / math.tan(0.5 * angle))  # from the PNG's own width
        if split == "train":
            train_count = len(images)
    stored = torch.stack(images)  # [views, H, W, 3]
    downsampling = stored_downsampling(folder, stored.shape[2], factor)
    scene_images = area_downsample(stored, downsampling)
    height, width = scene_images.shape[1:3]
    focal = torch.tensor(focals, dtype=torch.float32) * (width / stored.shape[2])
    intrinsics = torch.zeros(len(focal), 3, 3)
    intrinsics[:, 0, 0], intrinsics[:, 1, 1] = focal, focal
    intrinsics[:, 0, 2], intrinsics[:, 1, 2], intrinsics[:, 2, 2] = width / 2.0, height / 2.0, 1.0
    c2w_tensor = torch.from_numpy(np.stack(c2w)).float()
    rig, rig_reason = resolve_rig(rig, c2w_tensor)
    return Scene(
        name=name or folder.name,
        path=folder,
        factor=factor,
        image_names=names,
        images=scene_images,
        cameras=Cameras(c2w_tensor, intrinsics, int(height), int(width)),
        bounds=torch.tensor([NEAR_FAR] * len(names), dtype=torch.float32),
        train_ids=list(range(train_count)),
        test_ids=list(range(train_count, len(names))),
        scale=1.0,
        rig=rig,
        depth_range=NEAR_FAR,
        rig_reason=rig_reason,
    )


def stored_downsampling(folder: Path, stored_width: int, factor: int) -> int:
    """The area filter that brings frames stored `stored_width` px wide to `FULL_WIDTH / factor`."""
    wanted = FULL_WIDTH / factor
    ratio = stored_width / wanted
    if ratio < 1 or not float(ratio).is_integer():
        smallest = FULL_WIDTH // stored_width if FULL_WIDTH % stored_width == 0 else None
        hint = f"; at this size: data.synthetic_factor={smallest} or a multiple" if smallest else ""
        raise UserError(
            f"data.synthetic_factor: {factor} asks for {FULL_WIDTH}/{factor} = {wanted:g} px frames, but "
            f"{folder}'s PNGs are {stored_width} px wide{hint}"
        )
    return int(ratio)


def read_on_white(file: Path) -> torch.Tensor:
    """An 8-bit RGB or RGBA PNG -> float32 RGB `[H, W, 3]` in [0, 1], alpha composited on white as NeRF
    and GNT do (`rgb * alpha + 1 - alpha` on the 8-bit values / 255)."""
    try:
        image = np.asarray(iio.imread(file))
    except Exception as err:
        raise UserError(f"{file}: cannot read image ({str(err).splitlines()[0] if str(err) else err!r})") from None
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] not in (3, 4):
        raise UserError(f"{file}: expected an 8-bit RGB or RGBA image, got {image.dtype} {tuple(image.shape)}")
    values = torch.from_numpy(image.astype(np.float32) / 255.0)
    if values.shape[-1] == 3:
        return values
    alpha = values[..., 3:]
    return values[..., :3] * alpha + (1.0 - alpha)
