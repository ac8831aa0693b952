"""LLFF scene loader: `poses_bounds.npy` + `images[_F]/` -> a normalised `Scene`.

Conventions (see docs/ARCHITECTURE.md): cameras are OpenCV camera-to-world (x right, y down,
z forward). After normalisation, translations and bounds are scaled by `1 / (0.75 * min bound)`
(GNT) and the world frame is the OpenCV frame of the average camera (GNT's recentring).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, UInt8
from PIL import Image
from torch import Tensor

from pola_gnt.errors import UserError, check_int
from pola_gnt.geometry.cameras import Cameras, llff_to_opencv, normalise_poses
from pola_gnt.runfiles import staged_folder

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
OTHER_COLOUR_SPACES = ("CMYK", "YCbCr", "LAB", "HSV")
ROTATION_TOLERANCE = 1e-2  # max |R^T R - I| of a pose rotation (COLMAP's are exact to ~1e-7 in float32)


@dataclass
class Scene:
    name: str
    path: Path
    factor: int
    image_names: list[str]
    images: Float[Tensor, "views height width 3"]  # float32 in [0, 1]
    cameras: Cameras
    bounds: Float[Tensor, "views 2"]  # near/far per view, normalised
    train_ids: list[int]
    test_ids: list[int]
    scale: float  # the normalisation scale applied to translations and bounds

    @property
    def depth_range(self) -> tuple[float, float]:
        """Sampling range `[0.9 * near, 1.6 * far]` from the scene-wide bounds (GNT)."""
        return 0.9 * float(self.bounds.min()), 1.6 * float(self.bounds.max())

    @property
    def resolution(self) -> tuple[int, int]:  # (H, W)
        return self.cameras.height, self.cameras.width

    def summary(self) -> str:
        near, far = self.depth_range
        height, width = self.resolution
        return "\n".join(
            [
                f"scene       {self.name} ({self.path})",
                f"images      {len(self.image_names)} at {width}x{height} (factor {self.factor})",
                f"split       train {len(self.train_ids)}, test {len(self.test_ids)} {self.test_ids}",
                f"focal       {float(self.cameras.intrinsics[0, 0, 0]):.3f} px",
                f"bounds      {float(self.bounds.min()):.3f} .. {float(self.bounds.max()):.3f} "
                f"(normalised, scale {self.scale:.4f}); sampling {near:.3f} .. {far:.3f}",
            ]
        )


def image_folder_name(factor: int) -> str:
    """LLFF's folder names: `images/` at full resolution, `images_{factor}/` otherwise."""
    return "images" if factor == 1 else f"images_{factor}"


def load_llff_scene(path: str | Path, factor: int = 8, llffhold: int = 8, name: str | None = None) -> Scene:
    """Load and normalise an LLFF scene. Bad input raises `UserError` naming the file."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: scene folder not found")
    check_int(factor, "data.factor")
    poses_llff, bounds = read_poses_bounds(path / "poses_bounds.npy")
    image_dir = ensure_image_folder(path, factor)
    image_files = list_images(image_dir)
    if len(image_files) != len(poses_llff):
        raise UserError(count_mismatch(path / "poses_bounds.npy", len(poses_llff), image_files, image_dir))
    images = read_images(image_files)
    height, width = images.shape[1:3]

    full_height, full_width, full_focal = poses_llff[0, :, 4]
    focal = full_focal * width / full_width  # = focal / factor for standard LLFF folders
    c2w = llff_to_opencv(poses_llff[:, :, :4])
    c2w, bounds, scale = normalise_poses(c2w, bounds)
    intrinsics = (
        torch.tensor([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]], dtype=torch.float32)
        .expand(len(c2w), 3, 3)
        .clone()
    )

    ids = list(range(len(image_files)))
    test_ids = ids[::llffhold] if llffhold > 0 else []
    train_ids = [i for i in ids if i not in test_ids]
    return Scene(
        name=name or path.name,
        path=path,
        factor=factor,
        image_names=[f.name for f in image_files],
        images=torch.from_numpy(images).float() / 255.0,
        cameras=Cameras(torch.from_numpy(c2w).float(), intrinsics, int(height), int(width)),
        bounds=torch.from_numpy(bounds).float(),
        train_ids=train_ids,
        test_ids=test_ids,
        scale=scale,
    )


def read_poses_bounds(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """-> LLFF pose matrices `[views, 3, 5]` ([R | t | hwf], columns [down, right, back]) and bounds `[views, 2]`."""
    if not file.is_file():
        raise UserError(f"{file}: not found")
    try:
        array = np.load(file, allow_pickle=False)
    except Exception as err:  # numpy raises several types for corrupt files
        raise UserError(f"{file}: cannot read ({err})") from None
    if array.ndim != 2 or array.shape[1] != 17 or array.shape[0] == 0:
        raise UserError(f"{file}: expected an N x 17 array, got shape {tuple(array.shape)}")
    if not np.all(np.isfinite(array)):
        raise UserError(f"{file}: contains non-finite values")
    array = array.astype(np.float64)
    poses = array[:, :15].reshape(-1, 3, 5)
    bounds = array[:, 15:]
    if np.any(bounds <= 0) or np.any(bounds[:, 0] >= bounds[:, 1]):
        raise UserError(f"{file}: near/far bounds must be positive with near < far")
    if np.any(poses[:, :, 4] <= 0):
        raise UserError(f"{file}: height, width and focal must be positive")
    rotations = poses[:, :, :3]
    error = np.abs(np.swapaxes(rotations, 1, 2) @ rotations - np.eye(3)).max(axis=(1, 2))
    bad = np.flatnonzero(error > ROTATION_TOLERANCE)
    if len(bad):
        views = ", ".join(str(i) for i in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise UserError(
            f"{file}: the rotation of view(s) {views} is not orthonormal "
            f"(max |R^T R - I| = {error[bad].max():.3g}); poses must be camera rotations"
        )
    return poses, bounds


def count_mismatch(poses_file: Path, n_poses: int, image_files: list[Path], image_dir: Path) -> str:
    """The message for a poses / images count mismatch, naming the files without a pose. LLFF pairs
    poses with the images in sorted name order, so the extra images are the last ones."""
    message = f"{poses_file}: {n_poses} poses but {len(image_files)} images in {image_dir}"
    if len(image_files) > n_poses:
        extra = [f.name for f in image_files[n_poses:]]
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        return f"{message}; without a pose (in sorted order): {shown}"
    return f"{message}; poses {len(image_files)}..{n_poses - 1} have no image"


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
