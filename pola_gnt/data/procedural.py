"""A seeded family of procedurally generated scenes with exact depth, written in the LLFF layout.

Pretraining a generalizable model needs many varied scenes whose depth is known exactly. Scene
`index` of family `family_seed` is drawn from `np.random.default_rng([family_seed, index])` and
ray-traced analytically (`data.raytrace`, as the demo scene) into a folder that `llff.load_llff_scene`
reads: `poses_bounds.npy`, `images_{factor}/imageNNN.png`, plus `depth_{factor}.npy` (the exact
camera z-depth at every pixel centre) and `scene.json` (what was generated, by which version).

- Rigs: half the scenes are 'forward' (about an LLFF hand-held capture: 20 cameras on a jittered
  5 x 4 grid facing +z, random baseline), half 'object' (about DTU: 30 cameras in 5 rings of a
  spherical cap, looking at an object cluster on a table). Field of view 40-75 degrees, nearest
  depth about 1-5 units, far / near about 2-10 (what the geometry gives: measured 0.7-6 and 1.8-14).
- Geometry: a random mix of boxes (axis-aligned, turned about the vertical, or freely rotated),
  spheres and floating rectangular cards placed so that they occlude each other, in front of a
  background that every ray hits (a back wall, with a floor and a side wall at times; or a table
  top inside a big sphere seen from inside), so every pixel has a finite depth.
- Texture: every surface shows a random crop of a natural image shipped with matplotlib (a photo,
  or a shaded elevation map through a random palette), colour-jittered, turned and scaled to about a
  pixel per texel, then modulated by solid multi-scale noise of its own. Shading is Lambertian
  (random directional light, ambient and diffuse strengths), so a surface point has the same colour
  in every view: multi-view matching is possible everywhere, as in a real capture.

Images are supersampled 2x2 like the demo's. The full resolution (hwf in `poses_bounds.npy`) is
2016 x 1512, so `images_8` is 252 x 189. Bump `PROCEDURAL_VERSION` whenever the output changes: a
cached folder of another version is regenerated.
"""

from __future__ import annotations

import functools
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch
from torch import Tensor

from pola_gnt.core.errors import UserError, check_int
from pola_gnt.core.files import disk_error, is_disk_error, staged_folder, write_atomic
from pola_gnt.data.images import image_folder_name, to_uint8
from pola_gnt.data.raytrace import Box, Plane, RayFunction, Sphere, dot, render_view, single_thread, view_bounds
from pola_gnt.geometry.cameras import look_at, opencv_to_llff
from pola_gnt.geometry.rays import Rays

PROCEDURAL_VERSION = 1

RIGS = ("forward", "object")
FULL_HEIGHT = 1512
FULL_WIDTH = 2016
MIN_IMAGE_SIZE = 8  # px: the smallest image side a factor may leave

FORWARD_GRID = (5, 4)  # columns x rows of the hand-held grid: 20 views
OBJECT_GRID = (6, 5)  # cameras per ring x rings of the spherical cap: 30 views
HFOV_DEGREES = (40.0, 75.0)
NEAR_RANGE = (1.0, 5.0)  # scene units
FAR_NEAR_RATIO = (2.0, 10.0)

REFERENCE_FACTOR = 8  # texel and noise sizes are chosen in pixels of images_8
TEXEL_PIXELS = (0.7, 1.5)  # texel size at a surface's typical distance, images_8 pixels
NOISE_WAVES = 24  # plane waves per surface
NOISE_WAVELENGTHS = (2.5, 48.0)  # images_8 pixels at the surface's typical distance, log-uniform

BOUNDS_FACTOR = 8  # resolution of the depth grid that the per-view near/far bounds come from

SCENE_FILE = "scene.json"
POSES_FILE = "poses_bounds.npy"


# --------------------------------------------------------------------------------------------
# Arguments and cameras
# --------------------------------------------------------------------------------------------


def _check_ids(family_seed: int, index: int) -> None:
    check_int(family_seed, "family_seed", minimum=0)
    check_int(index, "index", minimum=0)


def _rng(family_seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([family_seed, index])


def _draw_rig(rng: np.random.Generator) -> str:
    """The first draw of a scene: the rig, so that `procedural_rig` needs no geometry."""
    return RIGS[int(rng.integers(len(RIGS)))]


def procedural_rig(family_seed: int, index: int) -> str:
    """'forward' (LLFF-like) or 'object' (DTU-like, object-centric) for scene `index` of family
    `family_seed`: the scene's first random draw, so known without generating anything."""
    _check_ids(family_seed, index)
    return _draw_rig(_rng(family_seed, index))


def procedural_resolution(factor: int) -> tuple[int, int]:
    """(H, W) of `images_{factor}` (the full resolution divided, rounded down, as LLFF's folders)."""
    check_int(factor, "data.factor")
    height, width = FULL_HEIGHT // factor, FULL_WIDTH // factor
    if min(height, width) < MIN_IMAGE_SIZE:
        raise UserError(f"data.factor: {factor} leaves a {width}x{height} procedural image, too small")
    return height, width


def _intrinsics(focal: float, height: int, width: int) -> np.ndarray:
    """`K` as `load_llff_scene` builds it from hwf: focal scaled by the width, centred principal point."""
    scaled = focal * width / FULL_WIDTH
    return np.array([[scaled, 0.0, width / 2.0], [0.0, scaled, height / 2.0], [0.0, 0.0, 1.0]])


# --------------------------------------------------------------------------------------------
# Textures: natural image crops, multi-scale solid noise
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _sources() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The natural images textures are cut from, loaded once: a photo `[H, W, 3]` in [0, 1], and an
    elevation map's normalised height and hill shading `[H, W]` in [0, 1] (a relief full of
    branching valleys, fine irregular structure at every scale)."""
    from matplotlib import cbook  # the sample data ship inside the matplotlib package

    photo = np.asarray(iio.imread(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)))
    with np.load(cbook.get_sample_data("jacksboro_fault_dem.npz", asfileobj=False)) as archive:
        elevation = archive["elevation"].astype(np.float64)
    height = (elevation - elevation.min()) / (elevation.max() - elevation.min())
    slope_rows, slope_cols = np.gradient(40.0 * height)  # exaggerated: a relief, not a plain
    normals = np.stack([-slope_cols, -slope_rows, np.ones_like(height)], axis=-1)
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    shade = np.clip(normals @ (np.array([-1.0, -1.0, 1.5]) / math.sqrt(4.25)), 0.0, 1.0)
    return photo[..., :3].astype(np.float64) / 255.0, height, shade


def _mirror(index: np.ndarray, size: int) -> np.ndarray:
    """Integer texel coordinates -> indices in [0, size), mirrored repeat: no seams."""
    period = np.remainder(index, 2 * size)
    return np.where(period < size, period, 2 * size - 1 - period)


@dataclass
class ImageTexture:
    """An image laid on a surface with mirrored repeat: surface coordinates (a, b) map to texel
    coordinates by `transform` (rotation and scale) plus `offset`, looked up bilinearly.

    `texels` holds one whole period of the mirrored tiling and one more row and column
    (`[(2 height + 1) * (2 width + 1), 3]` float32), so a lookup is four plain gathers."""

    texels: Tensor
    height: int  # of the image: the period is twice that
    width: int
    transform: tuple[float, float, float, float]  # row-major 2x2: (a, b) -> (column, row)
    offset: tuple[float, float]

    @classmethod
    def tiled(cls, image: np.ndarray, transform: tuple[float, float, float, float], offset: tuple[float, float]):
        """From an image `[height, width, 3]`: its mirrored period is stored once."""
        height, width = image.shape[:2]
        rows, cols = _mirror(np.arange(2 * height + 1), height), _mirror(np.arange(2 * width + 1), width)
        period = np.ascontiguousarray(image[rows][:, cols].reshape(-1, 3), dtype=np.float32)
        return cls(torch.from_numpy(period), height, width, transform, offset)

    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        m00, m01, m10, m11 = self.transform
        u = m00 * a + m01 * b + self.offset[0]
        v = m10 * a + m11 * b + self.offset[1]
        u0, v0 = torch.floor(u), torch.floor(v)
        fu, fv = (u - u0).float()[:, None], (v - v0).float()[:, None]
        stride = 2 * self.width + 1
        corner = (torch.remainder(v0, 2 * self.height) * stride + torch.remainder(u0, 2 * self.width)).long()
        t = self.texels
        top, top_right = t[corner], t[corner + 1]
        bottom, bottom_right = t[corner + stride], t[corner + stride + 1]
        top = top + fu * (top_right - top)
        bottom = bottom + fu * (bottom_right - bottom)
        return (top + fv * (bottom - top)).double()


@dataclass
class Noise:
    """Solid multi-scale colour noise: plane waves of random direction, wavelength and phase in 3D
    (defined on world points, so the same in every view), weighted per colour channel, their sum
    through a `tanh` modulating the albedo. Longer waves weigh more (a pink spectrum), so it reads
    as grain on mottling rather than as a grating."""

    frequencies: Tensor  # [waves, 3] float32, radians per scene unit
    phases: Tensor  # [waves] float32
    weights: Tensor  # [waves, 3] float32: each wave's amplitude per colour channel, sum of unit variance
    strength: float

    def __call__(self, points: Tensor, albedo: Tensor) -> Tensor:
        waves = torch.sin(torch.addmm(self.phases, points.float(), self.frequencies.T))  # [points, waves]
        modulation = 1.0 + self.strength * torch.tanh(waves @ self.weights).double()  # [points, 3]
        return (albedo * modulation).clamp(0.0, 1.0)


@dataclass
class TexturedSurface:
    """A surface of `data.raytrace` (its albedo an `ImageTexture`), its noise, and a sphere that
    encloses it (None for the unbounded background): rays that miss the sphere are not traced
    against the surface, which makes small objects cheap."""

    shape: Plane | Sphere | Box
    noise: Noise
    bound: tuple[Tensor, float] | None = None  # centre [3], radius

    def albedo(self, points: Tensor) -> Tensor:
        return self.noise(points, self.shape.albedo(points))


def _hue_rotation(angle: float) -> np.ndarray:
    """RGB rotation `[3, 3]` about the grey axis: shifts hue, keeps brightness and saturation."""
    axis = np.ones(3) / math.sqrt(3.0)
    cross = np.array([[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]])
    return math.cos(angle) * np.eye(3) + math.sin(angle) * cross + (1 - math.cos(angle)) * np.outer(axis, axis)


def _crop(rng: np.random.Generator, image: np.ndarray, size: int) -> np.ndarray:
    """A random `size` x `size` crop, turned / flipped by one of the 8 symmetries of the square."""
    row = int(rng.integers(image.shape[0] - size + 1))
    col = int(rng.integers(image.shape[1] - size + 1))
    crop = np.rot90(image[row : row + size, col : col + size], k=int(rng.integers(4)))
    return crop[:, ::-1] if rng.random() < 0.5 else crop


def _draw_texels(rng: np.random.Generator) -> np.ndarray:
    """A texture image `[size, size, 3]` in (0, 1]: a colour-jittered photo crop or a relief crop
    coloured by a random palette."""
    photo, height, shade = _sources()
    size = int(rng.integers(96, 257))
    if rng.random() < 0.4:
        crop = _crop(rng, photo, size)
        grey = crop.mean(-1, keepdims=True)
        crop = grey + rng.uniform(0.7, 1.6) * (crop - grey)  # saturation
        crop = crop @ _hue_rotation(rng.uniform(0.0, 2 * math.pi)).T
        crop = 0.5 + rng.uniform(0.8, 1.4) * (crop - 0.5) + rng.uniform(-0.1, 0.1)  # contrast, brightness
        crop = crop * rng.uniform(0.8, 1.2, size=3)  # white balance
    else:
        window = int(rng.integers(height.shape[0] - size + 1)), int(rng.integers(height.shape[1] - size + 1))
        rows, cols = slice(window[0], window[0] + size), slice(window[1], window[1] + size)
        relief = np.stack([height[rows, cols], shade[rows, cols]], axis=-1)
        relief = np.rot90(relief, k=int(rng.integers(4)))
        level = relief[..., 0] ** rng.uniform(0.5, 2.0)  # where the palette's colours fall
        level = (level - level.min()) / max(level.max() - level.min(), 1e-6)
        palette = rng.uniform(0.1, 0.95, size=(3, 3))  # low, middle, high colours
        colour = np.stack([np.interp(level, [0.0, 0.5, 1.0], palette[:, c]) for c in range(3)], axis=-1)
        crop = colour * (0.35 + 0.65 * relief[..., 1:])
    # A dark or flat crop (a uniform, the sky) would leave the surface without texture to match:
    # every crop gets a random mid-grey mean and a clear contrast.
    mean, spread = crop.mean(), crop.mean(-1).std()
    crop = rng.uniform(0.35, 0.6) + (crop - mean) * rng.uniform(0.12, 0.22) / max(float(spread), 0.02)
    return np.clip(crop, 0.03, 1.0)


# --------------------------------------------------------------------------------------------
# Scene description: surfaces drawn from the generator
# --------------------------------------------------------------------------------------------


def _unit(vector) -> np.ndarray:
    vector = np.asarray(vector, dtype=np.float64)
    return vector / np.linalg.norm(vector)


def _tensor(values) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float64))


def _frame(normal: np.ndarray, spin: float) -> tuple[np.ndarray, np.ndarray]:
    """Two unit axes spanning the plane of `normal`, turned by `spin` radians within it."""
    helper = np.array([0.0, 1.0, 0.0]) if abs(normal[1]) < 0.9 else np.array([1.0, 0.0, 0.0])
    axis_a = _unit(np.cross(helper, normal))
    axis_b = np.cross(normal, axis_a)
    return (
        math.cos(spin) * axis_a + math.sin(spin) * axis_b,
        -math.sin(spin) * axis_a + math.cos(spin) * axis_b,
    )


def _rotation(rng: np.random.Generator) -> np.ndarray:
    """A box's orientation `[3, 3]`: axis-aligned, turned about the vertical, or free (uniform)."""
    kind = int(rng.integers(3))
    if kind == 0:
        return np.eye(3)
    if kind == 1:
        angle = rng.uniform(0.0, 2 * math.pi)
        c, s = math.cos(angle), math.sin(angle)
        return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])
    w, x, y, z = _unit(rng.normal(size=4))  # a uniform random unit quaternion
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


@dataclass
class Light:
    direction: Tensor  # [3] unit, towards the light
    ambient: float
    diffuse: float


@dataclass
class ProceduralScene:
    """One drawn scene: cameras (full resolution), surfaces and light."""

    rig: str
    c2w: np.ndarray  # [views, 4, 4] OpenCV camera-to-world
    focal: float  # at the full resolution, px
    surfaces: list[TexturedSurface]
    light: Light


class _Builder:
    """Draws textured surfaces from the scene's generator, sizing texels and noise to the pixel
    footprint at the distance the surface is typically seen from (fine but not aliased)."""

    def __init__(self, rng: np.random.Generator, focal: float):
        self.rng = rng
        self.reference_focal = focal / REFERENCE_FACTOR
        self.surfaces: list[TexturedSurface] = []
        self.viewpoint = np.zeros(3)  # where the cameras are, roughly: sets the objects' texture scale

    def _pixel(self, distance: float) -> float:
        """Scene units covered by one images_8 pixel at `distance`."""
        return distance / self.reference_focal

    def _texture(self, distance: float, unit: float = 1.0) -> ImageTexture:
        """An image texture at about one texel per images_8 pixel at `distance`; `unit`: the scene
        length of one surface coordinate (a sphere's radius: its coordinates are angles)."""
        rng = self.rng
        texels = _draw_texels(rng)
        size = texels.shape[0]
        scale = unit / (self._pixel(distance) * rng.uniform(*TEXEL_PIXELS))  # texels per coordinate unit
        angle = rng.uniform(0.0, 2 * math.pi)
        stretch = rng.uniform(-0.2, 0.2)
        c, s = math.cos(angle), math.sin(angle)
        sa, sb = scale * (1 + stretch), scale * (1 - stretch)
        offset = (rng.uniform(0.0, 2 * size), rng.uniform(0.0, 2 * size))
        return ImageTexture.tiled(texels, (c * sa, -s * sb, s * sa, c * sb), offset)

    def _noise(self, distance: float) -> Noise:
        rng = self.rng
        directions = rng.normal(size=(NOISE_WAVES, 3))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        wavelengths = np.exp(rng.uniform(*np.log(NOISE_WAVELENGTHS), size=NOISE_WAVES))  # images_8 pixels
        frequencies = 2 * math.pi * directions / (wavelengths * self._pixel(distance))[:, None]
        phases = rng.uniform(0.0, 2 * math.pi, size=NOISE_WAVES)
        weights = np.sqrt(wavelengths)[:, None] * rng.uniform(0.5, 1.5, size=(NOISE_WAVES, 3))
        weights *= 1.2 / np.sqrt((weights**2).sum(0) / 2)  # a unit sine has variance 1/2
        return Noise(
            frequencies=torch.from_numpy(frequencies).float(),
            phases=torch.from_numpy(phases).float(),
            weights=torch.from_numpy(weights).float(),
            strength=float(rng.uniform(0.15, 0.4)),
        )

    def _add(self, shape: Plane | Sphere | Box, distance: float, bound: float | None) -> None:
        """Add `shape`; `bound`: the radius of a sphere about its centre enclosing it (None: unbounded)."""
        centre = shape.point if isinstance(shape, Plane) else shape.center
        enclosing = None if bound is None else (centre, bound * (1 + 1e-9))
        self.surfaces.append(TexturedSurface(shape, self._noise(distance), enclosing))

    def plane(
        self,
        point,
        normal,
        distance: float,
        half_extent: tuple[float, float] | None = None,
        axes: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """A plane (or a card, with `half_extent` along `axes`; random axes by default) through
        `point`, `normal` towards the cameras."""
        normal = _unit(normal)
        axis_a, axis_b = axes if axes is not None else _frame(normal, self.rng.uniform(0.0, 2 * math.pi))
        texture = self._texture(distance)
        shape = Plane(_tensor(point), _tensor(normal), _tensor(axis_a), _tensor(axis_b), texture, half_extent)
        self._add(shape, distance, None if half_extent is None else math.hypot(*half_extent))

    def sphere(self, center, radius: float, distance: float, background: bool = False) -> None:
        texture = self._texture(distance, unit=radius)
        self._add(Sphere(_tensor(center), float(radius), texture), distance, None if background else radius)

    def box(self, center, rotation: np.ndarray, half_size: np.ndarray, distance: float) -> None:
        texture = self._texture(distance)
        face_shift = float(self.rng.uniform(0.5, 1.0) * half_size.max())
        shape = Box(_tensor(center), _tensor(rotation), _tensor(half_size), texture, face_shift)
        self._add(shape, distance, float(np.linalg.norm(half_size)))

    def light(self, towards_light: np.ndarray) -> Light:
        return Light(
            direction=_tensor(_unit(towards_light)),
            ambient=float(self.rng.uniform(0.3, 0.5)),
            diffuse=float(self.rng.uniform(0.5, 0.75)),
        )

    def object(self, center: np.ndarray, radius: float, facing: np.ndarray, ground: float | None, rest: bool) -> None:
        """A box, sphere or card within `radius` of `center`; a card faces `facing` (roughly). With
        `ground` (its y), the object rests on it (`rest`) or at least does not go through it."""
        rng = self.rng
        kind = int(rng.choice(3, p=[0.4, 0.3, 0.3]))  # box, sphere, card
        center = np.array(center, dtype=np.float64)
        if kind == 0:
            rotation = _rotation(rng)
            half_size = radius * _unit(rng.uniform(0.3, 1.0, size=3))
            reach = float(np.abs(rotation[1]) @ half_size)  # lowest point below the centre
        elif kind == 1:
            rotation, half_size, reach = np.eye(3), np.zeros(3), radius
        else:
            normal = _unit(np.asarray(facing) + rng.uniform(-0.6, 0.6, size=3))
            axis_a, axis_b = _frame(normal, rng.uniform(0.0, 2 * math.pi))
            spread = rng.uniform(0.35, 1.2)
            half_extent = (radius * math.cos(spread), radius * math.sin(spread))
            reach = abs(axis_a[1]) * half_extent[0] + abs(axis_b[1]) * half_extent[1]
            rotation, half_size = np.stack([axis_a, axis_b, normal], axis=1), np.array([*half_extent, 0.0])
        if ground is not None:
            center[1] = ground - reach if rest and kind != 2 else min(center[1], ground - reach)
        distance = float(np.linalg.norm(center - self.viewpoint))
        if kind == 0:
            self.box(center, rotation, half_size, distance)
        elif kind == 1:
            self.sphere(center, radius, distance)
        else:
            axes = (rotation[:, 0], rotation[:, 1])
            self.plane(center, rotation[:, 2], distance, half_extent=(half_size[0], half_size[1]), axes=axes)


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def _forward_scene(rng: np.random.Generator, builder: _Builder, tan_h: float, tan_v: float) -> np.ndarray:
    """A forward-facing capture: cameras on a jittered grid around the origin facing +z; a back
    wall at z = far; objects between near and far. -> c2w `[views, 4, 4]`."""
    near = _log_uniform(rng, *NEAR_RANGE)
    far = near * _log_uniform(rng, *FAR_NEAR_RATIO)
    columns, rows = FORWARD_GRID
    grid_width = near * rng.uniform(0.12, 0.4)
    grid_height = grid_width * rng.uniform(0.5, 0.8)
    step_x, step_y = grid_width / (columns - 1), grid_height / (rows - 1)
    focus = math.sqrt(near * far)
    ground_distance = near**0.35 * far**0.65  # texture scale of a floor or side wall: fine far off, not aliased
    positions, targets, rolls = [], [], []
    for row in range(rows):
        for column in range(columns) if row % 2 == 0 else reversed(range(columns)):  # serpentine
            jitter = rng.uniform(-0.15, 0.15, size=2)
            positions.append(
                [
                    -grid_width / 2 + (column + jitter[0]) * step_x,
                    -grid_height / 2 + (row + jitter[1]) * step_y,
                    rng.uniform(-0.04, 0.04) * grid_width,
                ]
            )
            targets.append([rng.normal(0.0, 0.02) * focus, rng.normal(0.0, 0.02) * focus, focus])
            rolls.append(math.radians(rng.normal(0.0, 1.5)))
    c2w = look_at(_tensor(positions), _tensor(targets), _tensor([0.0, 1.0, 0.0]), roll=_tensor(rolls)).numpy()
    lowest_camera, widest_camera = max(p[1] for p in positions), max(abs(p[0]) for p in positions)
    margin = math.radians(6.0)  # aim wobble and roll of the cameras

    yaw, pitch = rng.uniform(-0.25, 0.25, size=2)  # the back wall, tilted up to ~15 degrees
    builder.plane([0.0, 0.0, far], [math.sin(yaw), math.sin(pitch), -1.0], far)
    floor = None
    if rng.random() < 0.55:  # enters the view at a depth of at least `near`
        floor = lowest_camera + near * math.tan(math.atan(tan_v) + margin) * rng.uniform(1.0, 1.6)
        builder.plane([0.0, floor, 0.0], [0.0, -1.0, 0.0], ground_distance)
    if rng.random() < 0.3:
        side = 1.0 if rng.random() < 0.5 else -1.0
        wall_x = side * (widest_camera + near * math.tan(math.atan(tan_h) + margin) * rng.uniform(1.0, 1.8))
        builder.plane([wall_x, 0.0, 0.0], [-side, 0.0, 0.0], ground_distance)

    builder.viewpoint = np.zeros(3)
    screen: list[np.ndarray] = []
    for k in range(int(rng.integers(4, 10))):
        if k == 0:  # the nearest object, its front at about `near`
            front = near * rng.uniform(1.0, 1.1)
        else:
            front = _log_uniform(rng, 1.15 * near, 0.8 * far)
        radius = min(front * tan_h * rng.uniform(0.08, 0.3), 0.45 * (far - near))
        depth = min(max(front + radius, near + radius), far - radius)
        if k > 0 and rng.random() < 0.45:  # in line with an earlier object: one occludes the other
            position = screen[int(rng.integers(len(screen)))] + rng.normal(0.0, 0.15, size=2)
        else:
            position = rng.uniform(-0.8, 0.8, size=2)
        screen.append(position)
        center = np.array([position[0] * depth * tan_h, position[1] * depth * tan_v, depth])
        builder.object(center, radius, np.array([0.0, 0.0, -1.0]), floor, rest=bool(rng.random() < 0.5))
    return c2w


def _cap_direction(azimuth: float, elevation: float) -> np.ndarray:
    """Unit vector from the object towards a camera at `azimuth` about the vertical and `elevation`
    above the horizon (azimuth 0: the camera on the -z side, looking along +z)."""
    return np.array(
        [math.sin(azimuth) * math.cos(elevation), -math.sin(elevation), -math.cos(azimuth) * math.cos(elevation)]
    )


def _object_scene(rng: np.random.Generator, builder: _Builder, tan_v: float) -> tuple[np.ndarray, np.ndarray]:
    """An object-centric capture: an object cluster on a table at the origin, cameras on a
    spherical cap around it looking at its centre, all inside a big textured sphere.
    -> c2w `[views, 4, 4]` and the cap's central direction (from the object towards the cameras)."""
    near = _log_uniform(rng, *NEAR_RANGE)
    ratio = _log_uniform(rng, *FAR_NEAR_RATIO)
    spread = tan_v * rng.uniform(0.65, 0.95)  # cluster radius / camera distance: fills the view
    distance = near / (1.0 - spread)
    cluster = spread * distance
    per_ring, rings = OBJECT_GRID
    azimuth0 = rng.uniform(0.0, 2 * math.pi)
    half_azimuth = math.radians(rng.uniform(25.0, 55.0))
    low = math.radians(rng.uniform(8.0, 25.0))
    high = low + math.radians(rng.uniform(20.0, 35.0))
    positions, targets, rolls = [], [], []
    for ring in range(rings):
        elevation = low + (high - low) * ring / (rings - 1)
        for step in range(per_ring) if ring % 2 == 0 else reversed(range(per_ring)):  # serpentine
            azimuth = azimuth0 + half_azimuth * (2 * step / (per_ring - 1) - 1) + rng.normal(0.0, 0.03)
            radius = distance * (1.0 + rng.normal(0.0, 0.02))
            positions.append(radius * _cap_direction(azimuth, elevation + rng.normal(0.0, 0.02)))
            targets.append(rng.normal(0.0, 0.03 * cluster, size=3))
            rolls.append(math.radians(rng.normal(0.0, 1.0)))
    c2w = look_at(_tensor(positions), _tensor(targets), _tensor([0.0, 1.0, 0.0]), roll=_tensor(rolls)).numpy()
    axis = _cap_direction(azimuth0, (low + high) / 2)

    ground = cluster * rng.uniform(0.25, 0.6)  # y of the table top, below the cluster's centre
    background = max(near * ratio - distance, 1.4 * distance)  # cameras well inside the sphere
    table_x, table_z = np.minimum(cluster * rng.uniform(1.4, 2.4, size=2), 0.7 * distance)  # short of the cameras
    table = (float(table_x), float(table_z))
    builder.plane([0.0, ground, 0.0], [0.0, -1.0, 0.0], distance, half_extent=table)
    builder.sphere([0.0, 0.0, 0.0], background, background, background=True)

    builder.viewpoint = distance * axis
    for k in range(int(rng.integers(3, 8))):
        if k == 0:  # the main object, in the middle
            radius = cluster * rng.uniform(0.5, 0.8)
            offset = rng.normal(0.0, 0.05 * cluster, size=2)
        else:
            radius = cluster * rng.uniform(0.15, 0.4)
            angle = rng.uniform(0.0, 2 * math.pi)
            offset = rng.uniform(0.2, 1.0) * (cluster - radius) * np.array([math.cos(angle), math.sin(angle)])
        height = rng.uniform(-0.8 * cluster, ground)
        center = np.array([offset[0], height, offset[1]])
        builder.object(center, radius, axis, ground, rest=bool(rng.random() < 0.7))
    return c2w, axis


def build_procedural_scene(family_seed: int, index: int) -> ProceduralScene:
    """Draw scene `index` of family `family_seed` (no rendering): every choice comes from
    `np.random.default_rng([family_seed, index])`, in a fixed order."""
    _check_ids(family_seed, index)
    rng = _rng(family_seed, index)
    rig = _draw_rig(rng)
    hfov = math.radians(rng.uniform(*HFOV_DEGREES))
    tan_h = math.tan(hfov / 2)
    tan_v = tan_h * FULL_HEIGHT / FULL_WIDTH
    focal = FULL_WIDTH / 2 / tan_h
    builder = _Builder(rng, focal)
    if rig == "forward":
        c2w = _forward_scene(rng, builder, tan_h, tan_v)
        towards_light = [rng.uniform(-0.7, 0.7), rng.uniform(-1.0, -0.3), rng.uniform(-1.0, -0.15)]
    else:
        c2w, axis = _object_scene(rng, builder, tan_v)
        azimuth = math.atan2(axis[0], -axis[2]) + rng.uniform(-1.0, 1.0)
        towards_light = _cap_direction(azimuth, rng.uniform(0.5, 1.3))
    light = builder.light(np.asarray(towards_light))
    return ProceduralScene(rig, c2w, focal, builder.surfaces, light)


# --------------------------------------------------------------------------------------------
# Tracing
# --------------------------------------------------------------------------------------------


def _nearest_hit(scene: ProceduralScene, origin: Tensor, directions: Tensor) -> tuple[Tensor, Tensor]:
    """`raytrace.nearest_hit` for rays from one camera centre `origin` `[3]`: a bounded surface is
    traced only for the rays that meet its enclosing sphere (a dot product per ray), unless the
    camera is inside that sphere. -> depth `[rays]` (inf on a miss), surface index `[rays]` (-1)."""
    depth = torch.full(directions.shape[:1], math.inf, dtype=directions.dtype)
    index = torch.full(directions.shape[:1], -1, dtype=torch.long)
    squared_length = dot(directions, directions)
    for i, surface in enumerate(scene.surfaces):
        rays = None
        if surface.bound is not None:
            centre, radius = surface.bound
            offset = centre - origin
            beyond = float(offset @ offset) - radius**2
            if beyond > 0:  # the camera is outside the sphere: the ray must point at it
                along = directions @ offset
                rays = ((along > 0) & (along * along >= squared_length * beyond)).nonzero().squeeze(1)
        if rays is None:
            candidate = surface.shape.intersect(origin.expand_as(directions), directions)
            closer = candidate < depth
            depth = torch.where(closer, candidate, depth)
            index = torch.where(closer, torch.full_like(index, i), index)
        elif len(rays):
            candidate = surface.shape.intersect(origin.expand(len(rays), 3), directions.index_select(0, rays))
            current = depth.index_select(0, rays)
            closer = candidate < current
            depth.index_copy_(0, rays, torch.where(closer, candidate, current))
            index.index_copy_(0, rays, torch.where(closer, torch.full_like(rays, i), index.index_select(0, rays)))
    return depth, index


def _shade(scene: ProceduralScene, origin: Tensor, directions: Tensor) -> Tensor:
    """Lambertian colour `[rays, 3]` of the nearest hit of each ray. The normal is taken on the side
    the ray arrives from (a card's back, a sphere from inside): a closed object is only ever seen
    from outside, so a surface point keeps one colour in every view."""
    depth, index = _nearest_hit(scene, origin, directions)
    if bool((index < 0).any()):
        raise RuntimeError("a ray missed every surface of a procedural scene")  # the background encloses all
    hit_points = origin + depth[:, None] * directions
    colour = torch.zeros(len(directions), 3, dtype=directions.dtype)
    light = scene.light
    for i, surface in enumerate(scene.surfaces):
        rays = (index == i).nonzero().squeeze(1)
        if len(rays) == 0:
            continue
        points = hit_points.index_select(0, rays)
        normals = surface.shape.normals(points)
        towards_ray = dot(normals, directions.index_select(0, rays)) < 0
        normals = torch.where(towards_ray[:, None], normals, -normals)
        lambert = (normals @ light.direction).clamp(min=0.0)
        albedo = surface.albedo(points)
        colour.index_copy_(0, rays, albedo * (light.ambient + light.diffuse * lambert)[:, None])
    return colour.clamp(0.0, 1.0)


def _colour(scene: ProceduralScene) -> RayFunction:
    """The scene's colour of each ray of one camera (`_shade`), for `raytrace.render_view`."""
    return lambda rays: _shade(scene, rays.origins[0], rays.directions)


def _depth(scene: ProceduralScene) -> RayFunction:
    """The camera z-depth of each ray's nearest surface, for the tracer."""

    def depth(rays: Rays) -> Tensor:
        return _nearest_hit(scene, rays.origins[0], rays.directions)[0]

    return depth


def render_procedural_view(
    scene: ProceduralScene, c2w: np.ndarray, K: np.ndarray, height: int, width: int
) -> tuple[Tensor, Tensor]:
    """Trace one OpenCV camera through `scene` -> colour `[H, W, 3]` float64 in [0, 1] (mean of a
    2x2 supersampling of each pixel) and the exact camera z-depth `[H, W]` float64 at the pixel
    centres."""
    c2w_t = torch.as_tensor(np.asarray(c2w), dtype=torch.float64)
    intrinsics = torch.as_tensor(np.asarray(K), dtype=torch.float64)
    return render_view(_colour(scene), _depth(scene), c2w_t, intrinsics, height, width)


def _bounds(scene: ProceduralScene) -> np.ndarray:
    """Near / far `[views, 2]` of each view, valid at every factor (`raytrace.view_bounds`, on a grid
    at `BOUNDS_FACTOR`)."""
    intrinsics = torch.from_numpy(_intrinsics(scene.focal, FULL_HEIGHT // BOUNDS_FACTOR, FULL_WIDTH // BOUNDS_FACTOR))
    return view_bounds(_depth(scene), scene.c2w, intrinsics, FULL_HEIGHT / BOUNDS_FACTOR, FULL_WIDTH / BOUNDS_FACTOR)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def _npy_bytes(array: np.ndarray) -> memoryview:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getbuffer()


def _poses_bounds(scene: ProceduralScene) -> np.ndarray:
    """The `poses_bounds.npy` array `[views, 17]`: `[R | t | hwf]` row-major (LLFF axes), near, far."""
    views = len(scene.c2w)
    hwf = np.tile(np.array([FULL_HEIGHT, FULL_WIDTH, scene.focal])[None, :, None], (views, 1, 1))
    matrices = np.concatenate([opencv_to_llff(scene.c2w), hwf], axis=-1)  # [views, 3, 5]
    return np.concatenate([matrices.reshape(views, 15), _bounds(scene)], axis=-1)


def _depth_file(scene_dir: Path, factor: int) -> Path:
    return scene_dir / f"depth_{factor}.npy"


def _factor_complete(scene_dir: Path, factor: int) -> bool:
    return (scene_dir / image_folder_name(factor)).is_dir() and _depth_file(scene_dir, factor).is_file()


def _write_factor(scene_dir: Path, scene: ProceduralScene, factor: int) -> None:
    """Render every view at `factor` into `images_{factor}/` (staged: appears complete or not at
    all; kept if another process put it there first) and `depth_{factor}.npy` (atomic)."""
    height, width = procedural_resolution(factor)
    intrinsics = _intrinsics(scene.focal, height, width)
    depths = np.empty((len(scene.c2w), height, width), dtype=np.float32)
    with staged_folder(scene_dir / image_folder_name(factor)) as staging:
        for i, pose in enumerate(scene.c2w):
            rgb, depth = render_procedural_view(scene, pose, intrinsics, height, width)
            iio.imwrite(staging / f"image{i:03d}.png", to_uint8(rgb))
            depths[i] = depth.numpy()
    write_atomic(_depth_file(scene_dir, factor), _npy_bytes(depths))


def _scene_info(scene: ProceduralScene, family_seed: int, index: int) -> dict:
    return {
        "family_seed": family_seed,
        "index": index,
        "rig": scene.rig,
        "version": PROCEDURAL_VERSION,
        "views": len(scene.c2w),
        "resolution": [FULL_HEIGHT, FULL_WIDTH],  # full resolution (hwf); images_F is H // F x W // F
    }


def _is_generated_name(name: str) -> bool:
    """A file or folder this module writes (or a staging leftover of one)."""
    return (
        name in (SCENE_FILE, POSES_FILE)
        or name.startswith((".", "images"))
        or (name.startswith("depth_") and name.endswith(".npy"))
    )


def _folder_state(scene_dir: Path, family_seed: int, index: int) -> str:
    """'current' (this scene, this version), 'stale' (generated by another version, or an
    incomplete generated folder: replaced) or 'missing' (absent or empty). A folder of anything
    else is a `UserError`: it is never deleted."""
    if not scene_dir.exists():
        return "missing"
    if not scene_dir.is_dir():
        raise UserError(f"{scene_dir}: exists and is not a folder; cannot generate a procedural scene there")
    entries = [entry.name for entry in scene_dir.iterdir()]
    if not entries:
        return "missing"
    try:
        info = json.loads((scene_dir / SCENE_FILE).read_text())
    except (OSError, ValueError):
        info = None
    if not isinstance(info, dict):
        if all(_is_generated_name(name) for name in entries):
            return "stale"
        raise UserError(f"{scene_dir}: not a procedural scene folder (no {SCENE_FILE}); remove it or use another path")
    same = (info.get("version"), info.get("family_seed"), info.get("index")) == (PROCEDURAL_VERSION, family_seed, index)
    return "current" if same and (scene_dir / POSES_FILE).is_file() else "stale"


class _AlreadyGenerated(Exception):
    """Another process put the current scene in place while this one was generating it."""


def _generate(scene_dir: Path, scene: ProceduralScene, family_seed: int, index: int, factor: int, replace: bool):
    """Write the whole scene into a staging folder next to `scene_dir`, then rename it into place
    (replacing a stale folder with `replace`): readers never see a half-written scene."""
    try:
        scene_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{scene_dir.parent}: cannot create the procedural scenes folder ({err.strerror})") from None
    try:
        with staged_folder(scene_dir, replace=replace) as staging:
            write_atomic(staging / POSES_FILE, _npy_bytes(_poses_bounds(scene)))
            _write_factor(staging, scene, factor)
            info = json.dumps(_scene_info(scene, family_seed, index), indent=2, sort_keys=True) + "\n"
            write_atomic(staging / SCENE_FILE, info.encode())
            if replace and _folder_state(scene_dir, family_seed, index) == "current":
                raise _AlreadyGenerated  # the same bytes: keep the folder readers may already use
    except _AlreadyGenerated:
        pass


def ensure_procedural_scene(scene_dir: Path, family_seed: int, index: int, factor: int) -> Path:
    """Generate scene `index` of family `family_seed` into `scene_dir` unless it is already there
    (same version): `poses_bounds.npy`, `images_{factor}/imageNNN.png`, `depth_{factor}.npy`
    (float32 `[views, H, W]`: the exact camera z-depth at the pixel centres, in the scene's own
    units) and `scene.json`. -> `scene_dir`.

    A missing or stale folder is generated whole in a staging folder and renamed into place; a
    current one missing this factor gets `images_{factor}/` (staged) and `depth_{factor}.npy`
    (atomic). An interruption leaves nothing half-written, and processes generating the same scene
    at once write the same bytes, the first one's folder kept. Deterministic: the same arguments
    give byte-identical files."""
    scene_dir = Path(scene_dir)
    _check_ids(family_seed, index)
    procedural_resolution(factor)  # validate before touching the disk
    with single_thread():  # the work is elementwise arithmetic: see `raytrace.single_thread`
        try:
            state = _folder_state(scene_dir, family_seed, index)
            if state != "current":
                scene = build_procedural_scene(family_seed, index)
                _generate(scene_dir, scene, family_seed, index, factor, replace=state == "stale")
            if not _factor_complete(scene_dir, factor):
                _write_factor(scene_dir, build_procedural_scene(family_seed, index), factor)
        except OSError as err:
            if is_disk_error(err):
                raise disk_error(scene_dir, err) from None
            raise
    return scene_dir


def procedural_depth(scene_dir: Path, view: int, factor: int) -> np.ndarray:
    """Exact camera z-depth `[H, W]` float64 of `view` at `factor` (pixel centres), in the scene's
    own units (the loader's normalised scene multiplies them by `Scene.scale`), from
    `depth_{factor}.npy`."""
    file = _depth_file(Path(scene_dir), check_int(factor, "data.factor"))
    if not file.is_file():
        raise UserError(f"{file}: not found; generate the scene at factor {factor} first (ensure_procedural_scene)")
    depths = np.load(file, mmap_mode="r")
    check_int(view, "view", minimum=0, maximum=len(depths) - 1)
    return np.asarray(depths[view], dtype=np.float64)
