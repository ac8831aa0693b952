"""A user's capture -> a folder of upright RGB images for COLMAP (`python -m pola_gnt.process_data`).

- A folder of photos (PNG or JPG, any names): EXIF orientation applied, alpha dropped, written as
  `<name>.png` (or `.jpg` when every photo is a JPEG), in the sorted order of the names.
- A video: `frames` frames evenly spaced over the video; in each of the `frames` equal stretches
  the sharpest frame (variance of the Laplacian) is kept, so blurry frames are skipped. Written
  as `frame_<index>.png` with the index of the frame in the video.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from pola_gnt.core.errors import UserError, check_int
from pola_gnt.data.images import IMAGE_EXTENSIONS

VIDEO_EXTENSIONS = (".mp4", ".mov", ".m4v", ".avi", ".mkv", ".webm")
JPEG_EXTENSIONS = (".jpg", ".jpeg")
JPEG_QUALITY = 95

Progress = Callable[..., Any]  # tqdm-like: progress(iterable, total=, desc=) -> an iterable (a tqdm bar)


def is_video(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in VIDEO_EXTENSIONS


def prepare_capture(source: Path, folder: Path, frames: int, progress: Progress) -> list[str]:
    """Write the capture's images into `folder` (created); -> their file names, sorted."""
    if not source.exists():
        raise UserError(f"input: {source} not found")
    folder.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        return prepare_photos(source, folder, progress)
    if is_video(source):
        return extract_video_frames(source, folder, frames, progress)
    raise UserError(f"input: {source} is neither a folder of images nor a video ({', '.join(VIDEO_EXTENSIONS)})")


def prepare_photos(source: Path, folder: Path, progress: Progress) -> list[str]:
    files = sorted(f for f in source.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise UserError(f"input: {source} holds no PNG or JPG images")
    extension = ".jpg" if all(f.suffix.lower() in JPEG_EXTENSIONS for f in files) else ".png"
    names, size = [], None
    for file in progress(files, desc="photos", unit="image"):
        image = read_upright(file)
        if size is None:
            size = image.size
        elif image.size != size:
            raise UserError(
                f"input: {file.name} is {image.size[0]}x{image.size[1]} but {files[0].name} is "
                f"{size[0]}x{size[1]}; every image of a scene must have the same size"
            )
        name = _unique_name(file.stem, extension, names)
        save_image(image, folder / name)
        names.append(name)
    return sorted(names)


def read_upright(file: Path) -> Image.Image:
    """An RGB image with its EXIF orientation applied."""
    try:
        with Image.open(file) as image:
            image = ImageOps.exif_transpose(image)
            return image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise UserError(f"input: {file}: cannot read image ({err})") from None


def save_image(image: Image.Image, file: Path) -> None:
    if file.suffix == ".jpg":
        image.save(file, quality=JPEG_QUALITY, subsampling=0)
    else:
        image.save(file)


def _unique_name(stem: str, extension: str, taken: list[str]) -> str:
    name, i = f"{stem}{extension}", 1
    while name in taken:  # e.g. both a.png and a.jpg given
        name, i = f"{stem}_{i}{extension}", i + 1
    return name


def sharpness(rgb: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian of the grey image (higher = sharper)."""
    grey = rgb.astype(np.float32).mean(-1)
    laplacian = grey[1:-1, :-2] + grey[1:-1, 2:] + grey[:-2, 1:-1] + grey[2:, 1:-1] - 4.0 * grey[1:-1, 1:-1]
    return float(laplacian.var())


def extract_video_frames(video: Path, folder: Path, frames: int, progress: Progress) -> list[str]:
    """The sharpest frame of each of `frames` equal stretches of the video -> `frame_<index>.png`."""
    import imageio_ffmpeg

    check_int(frames, "frames")
    try:
        total, _ = imageio_ffmpeg.count_frames_and_secs(str(video))
    except Exception as err:  # ffmpeg's messages for corrupt or truncated files vary
        raise UserError(f"input: {video}: cannot read the video ({_last_line(err)})") from None
    if total is None or total < 1:
        raise UserError(f"input: {video}: the video has no frames")
    stretch = [min(i * frames // total, frames - 1) for i in range(total)]  # frame -> stretch
    best: dict[int, tuple[float, int, np.ndarray]] = {}
    read = 0
    try:
        reader = imageio_ffmpeg.read_frames(str(video))
        meta = next(reader)
        width, height = meta["size"]
        for index, data in enumerate(progress(reader, total=total, desc="frames", unit="frame")):
            if index >= total:
                break
            frame = np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)
            score = sharpness(frame[::2, ::2])
            part = stretch[index]
            if part not in best or score > best[part][0]:
                best[part] = (score, index, frame.copy())
            read += 1
    except Exception as err:
        raise UserError(f"input: {video}: cannot read the video ({_last_line(err)})") from None
    if read < total:
        raise UserError(f"input: {video}: the video ends after {read} of its {total} frames (truncated?)")
    names = []
    for _, index, frame in best.values():
        name = f"frame_{index:05d}.png"
        Image.fromarray(frame).save(folder / name)
        names.append(name)
    return sorted(names)


def _last_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
