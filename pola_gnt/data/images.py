"""Image files: reading any PNG / JPEG mode as 8-bit RGB, the `images_F/` factor folders (built from
`images/` when missing), and writing images in [0, 1] as 8-bit (`to_uint8`)."""

from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, UInt8
from PIL import Image
from torch import Tensor

from pola_gnt.core.errors import UserError
from pola_gnt.core.files import staged_folder

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
OTHER_COLOUR_SPACES = ("CMYK", "YCbCr", "LAB", "HSV")


def image_folder_name(factor: int) -> str:
    """LLFF's folder names: `images/` at full resolution, `images_{factor}/` otherwise."""
    return "images" if factor == 1 else f"images_{factor}"


def list_images(folder: Path) -> list[Path]:
    """The PNG and JPEG images of `folder` in name order. Hidden files, including the macOS
    AppleDouble `._NAME` files a copy from a Mac leaves, are not images and are ignored."""
    files = sorted(
        f
        for f in folder.iterdir()
        if f.suffix.lower() in IMAGE_EXTENSIONS and not f.name.startswith(".") and f.is_file()
    )
    if not files:
        raise UserError(f"{folder}: no PNG or JPG images")
    return files


def _first_line(err: Exception, limit: int = 120) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_image(file: Path) -> np.ndarray:
    """-> uint8 RGB `[H, W, 3]` from any PNG or JPEG mode: 1-bit, grayscale, grayscale + alpha,
    palette, RGB, RGBA, 8 or 16 bits. Alpha is ignored: the colour channels are used as stored
    (not composited over a background). 16-bit values are scaled to 8 bits (v // 257)."""
    try:
        if file.stat().st_size == 0:
            raise UserError(f"{file}: empty file (0 bytes), not an image")
        with Image.open(file) as opened:
            if opened.mode in OTHER_COLOUR_SPACES:  # CMYK / YCbCr JPEGs: converted by Pillow
                return np.asarray(opened.convert("RGB"))
        image = np.asarray(iio.imread(file))
    except UserError:
        raise
    except Exception as err:
        raise UserError(f"{file}: cannot read image ({_first_line(err)})") from None
    if image.dtype == bool:  # 1-bit
        image = image.astype(np.uint8) * 255
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3 or image.shape[-1] not in (1, 2, 3, 4) or image.shape[0] == 0 or image.shape[1] == 0:
        raise UserError(f"{file}: expected a grayscale or colour image, got an array of shape {image.shape}")
    image = np.repeat(image[..., :1], 3, axis=-1) if image.shape[-1] <= 2 else image[..., :3]
    if image.dtype in (np.uint16, np.int32, np.uint32) and image.size and 0 <= image.min() and image.max() <= 65535:
        image = (image.astype(np.uint32) // 257).astype(np.uint8)
    if image.dtype != np.uint8:
        raise UserError(f"{file}: unsupported pixel type {image.dtype}")
    return np.ascontiguousarray(image)


def read_images(files: list[Path]) -> np.ndarray:
    """-> uint8 `[views, H, W, 3]`; every image must have the size of the first."""
    images = []
    for file in files:
        image = read_image(file)
        if images and image.shape != images[0].shape:
            raise UserError(
                f"{file}: size {image.shape[1]}x{image.shape[0]} differs from "
                f"{files[0].name} ({images[0].shape[1]}x{images[0].shape[0]})"
            )
        images.append(image)
    return np.stack(images)


def ensure_image_folder(scene_dir: Path, factor: int) -> Path:
    """`images_F/`, built from full-resolution `images/` with an area filter when missing (cached)."""
    folder = scene_dir / image_folder_name(factor)
    if folder.is_dir():
        return folder
    source = scene_dir / "images"
    if not source.is_dir():
        raise UserError(f"{folder}: not found, and no {source.name}/ folder to build it from")
    downsample_folder(source, folder, factor)
    return folder


def downsample_folder(source: Path, target: Path, factor: int) -> None:
    """Area-downsample every image of `source` by `factor` into `target` (PNG), atomically."""
    files = list_images(source)
    with staged_folder(target) as staging:
        for file in files:
            image = torch.from_numpy(read_image(file)).permute(2, 0, 1)[None].float()  # [1, 3, H, W]
            size = (image.shape[2] // factor, image.shape[3] // factor)
            small = F.interpolate(image, size=size, mode="area")[0].permute(1, 2, 0)
            iio.imwrite(staging / f"{file.stem}.png", small.round().clamp(0, 255).to(torch.uint8).numpy())


def to_uint8(image: Float[Tensor, "*shape"]) -> UInt8[np.ndarray, "*shape"]:
    """An image in [0, 1] (clipped) -> uint8 levels `floor(255 x + 1/2)`: the nearest level, a tie
    (`255 x = k + 1/2` exactly) rounded up. The demo scene's images are written with it, so their
    bytes do not change; its smooth textures hit such ties in many pixels, rendered predictions
    practically never."""
    return torch.floor(image.clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).numpy()
