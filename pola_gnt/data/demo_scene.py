"""Synthetic forward-facing demo scene (`scene=demo`), written in the LLFF layout on first use.

An analytic scene is ray-traced so that the demo runs through exactly the same loader path as the
real LLFF scenes (`poses_bounds.npy` + `images_{factor}/image000.png ...`):

- a back wall `z = 9` (smooth checker with a colour gradient) that fills every camera's view,
- a floor `y = 1.5` (wavy stripes),
- two spheres resting on the floor (latitude / longitude checkers),
- a tilted rectangular card floating in front (concentric rings).

World frame is OpenCV-like: x right, y down, z forward. Shading is Lambertian with a fixed
directional light plus ambient, so a surface point has the same colour in every view (what the
geometry tests rely on). Textures are smooth (sinusoids through a soft `tanh`) and every pixel is
supersampled 2x2, so the images are anti-aliased and learnable quickly. The same smooth, repeating
textures give SIFT few, poorly located features: for COLMAP round trips `render_demo_view(detail=)`
adds the fine, irregular surface texture of a real capture (the demo scene itself never uses it).

Twenty cameras sit on a 5 x 4 grid facing +z (serpentine order like a hand-held LLFF capture) with
small deterministic wobbles of position, aim and roll. Nothing is random: two generations give
byte-identical files.
"""

from __future__ import annotations

import functools
import io
import math
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch
from torch import Tensor

from pola_gnt.core.errors import UserError, check_int
from pola_gnt.core.files import staged_folder, write_atomic
from pola_gnt.data.images import image_folder_name, to_uint8
from pola_gnt.data.raytrace import Plane, RayFunction, Sphere, nearest_hit, render_view, trace, view_bounds
from pola_gnt.geometry.cameras import look_at, opencv_to_llff
from pola_gnt.geometry.rays import Rays, pixel_grid

# Full-resolution camera like fern's (hwf in poses_bounds.npy); only downsampled folders are written.
FULL_HEIGHT = 3024
FULL_WIDTH = 4032
FULL_FOCAL = 3260.0

GRID_COLUMNS = 5
GRID_ROWS = 4
N_VIEWS = GRID_COLUMNS * GRID_ROWS

AMBIENT = 0.3
DIFFUSE = 0.7
LIGHT_DIRECTION = torch.nn.functional.normalize(
    torch.tensor([-0.35, -0.75, -0.55], dtype=torch.float64), dim=0
)  # towards the light: up (-y), left and back towards the cameras
MISS_COLOUR = (0.0, 0.0, 0.0)  # only cameras looking away from the scene see it

BOUNDS_FACTOR = 16  # resolution of the depth grid that the per-view near/far bounds come from


# --------------------------------------------------------------------------------------------
# Textures: smooth functions of 2D surface coordinates
# --------------------------------------------------------------------------------------------


def _mix(colour_a: tuple[float, ...], colour_b: tuple[float, ...], weight: Tensor) -> Tensor:
    """Blend two RGB colours with `weight` `[rays]` in [0, 1] -> `[rays, 3]`."""
    a = torch.tensor(colour_a, dtype=weight.dtype, device=weight.device)
    b = torch.tensor(colour_b, dtype=weight.dtype, device=weight.device)
    return a + weight[:, None] * (b - a)


def _soft_checker(a: Tensor, b: Tensor, period_a: float, period_b: float, sharpness: float = 3.0) -> Tensor:
    """A checker board with soft edges (band-limited enough not to alias): `[rays]` in [0, 1]."""
    wave = torch.sin(2 * math.pi * a / period_a) * torch.sin(2 * math.pi * b / period_b)
    return 0.5 + 0.5 * torch.tanh(sharpness * wave)


def wall_texture(a: Tensor, b: Tensor) -> Tensor:
    """Back wall: a blue/cream checker whose colours drift to red/green across the wall."""
    checker = _soft_checker(a, b, 1.2, 1.2)
    drift = torch.sigmoid(a / 3.0)[:, None]  # left -> right colour gradient
    dark = _mix((0.15, 0.25, 0.6), (0.55, 0.15, 0.2), drift[:, 0])
    light = _mix((0.95, 0.9, 0.75), (0.8, 0.95, 0.6), drift[:, 0])
    return dark + checker[:, None] * (light - dark)


def floor_texture(a: Tensor, b: Tensor) -> Tensor:
    """Floor: wavy stripes running away from the cameras (x varies, wobbling with z)."""
    wave = torch.sin(2 * math.pi * (a + 0.25 * torch.sin(2 * math.pi * b / 2.5)) / 0.7)
    return _mix((0.35, 0.22, 0.1), (0.85, 0.7, 0.45), 0.5 + 0.5 * torch.tanh(2.0 * wave))


def big_sphere_texture(longitude: Tensor, latitude: Tensor) -> Tensor:
    """Big sphere: 12 x 6 red/yellow checker on longitude / latitude."""
    checker = _soft_checker(longitude, latitude, 2 * math.pi / 6, 2 * math.pi / 6)
    return _mix((0.75, 0.1, 0.1), (0.95, 0.85, 0.2), checker)


def small_sphere_texture(longitude: Tensor, latitude: Tensor) -> Tensor:
    """Small sphere: green/white bands along latitude with a twist in longitude."""
    wave = torch.sin(8 * latitude + 2 * longitude)
    return _mix((0.1, 0.55, 0.3), (0.9, 0.95, 0.9), 0.5 + 0.5 * torch.tanh(2.0 * wave))


def card_texture(a: Tensor, b: Tensor) -> Tensor:
    """Card: purple/cyan concentric rings around its centre."""
    radius = torch.sqrt(a * a + b * b)
    rings = 0.5 + 0.5 * torch.tanh(2.5 * torch.cos(2 * math.pi * radius / 0.22))
    return _mix((0.45, 0.15, 0.6), (0.3, 0.85, 0.9), rings)


DETAIL_WAVES = 48  # plane waves summed into the detail pattern
DETAIL_WAVELENGTHS = (0.08, 0.3)  # scene units, log-uniform: 4-14 px on the back wall at images_8
DETAIL_SEED = 20  # the pattern is fixed: the same for every view and every run


@functools.lru_cache(maxsize=1)
def _detail_waves() -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(DETAIL_SEED)
    directions = rng.normal(size=(DETAIL_WAVES, 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    wavelengths = np.exp(rng.uniform(*np.log(DETAIL_WAVELENGTHS), size=DETAIL_WAVES))
    phases = rng.uniform(0.0, 2 * math.pi, size=DETAIL_WAVES)
    return torch.from_numpy(2 * math.pi * directions / wavelengths[:, None]), torch.from_numpy(phases)


def detail_pattern(points: Tensor) -> Tensor:
    """A fine, non-repeating solid texture of world points `[rays, 3]` -> `[rays]` in (-1, 1).

    A sum of plane waves of random directions and wavelengths (a fixed draw), through a `tanh`:
    blob- and corner-like structure at every place, unlike the demo's smooth repeating patterns.
    Defined in 3D, so a surface point has the same value in every view."""
    frequencies, phases = _detail_waves()
    waves = torch.sin(points @ frequencies.to(points).T + phases.to(points))  # [rays, waves]
    return torch.tanh(2.0 * waves.sum(-1) / math.sqrt(DETAIL_WAVES / 2))


# --------------------------------------------------------------------------------------------
# Surfaces (ray intersection, normals and albedo: data.raytrace)
# --------------------------------------------------------------------------------------------


def _vector(values: tuple[float, float, float]) -> Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _vectors(values: list) -> Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _tilted_frame(yaw_deg: float, pitch_deg: float) -> tuple[Tensor, Tensor, Tensor]:
    """Axes (a, b, normal) of a card turned by `yaw` about y, then tilted by `pitch` about its a-axis."""
    yaw, pitch = math.radians(yaw_deg), math.radians(pitch_deg)
    axis_a = _vector((math.cos(yaw), 0.0, math.sin(yaw)))
    facing = _vector((math.sin(yaw), 0.0, -math.cos(yaw)))  # towards the cameras before the tilt
    down = _vector((0.0, 1.0, 0.0))
    axis_b = math.cos(pitch) * down + math.sin(pitch) * facing
    normal = math.cos(pitch) * facing - math.sin(pitch) * down
    return axis_a, axis_b, normal


def demo_surfaces() -> list[Plane | Sphere]:
    """The scene's surfaces (world frame: x right, y down, z forward)."""
    card_a, card_b, card_normal = _tilted_frame(yaw_deg=30.0, pitch_deg=20.0)
    return [
        Plane(  # back wall, fills every view
            point=_vector((0.0, 0.0, 9.0)),
            normal=_vector((0.0, 0.0, -1.0)),
            axis_a=_vector((1.0, 0.0, 0.0)),
            axis_b=_vector((0.0, 1.0, 0.0)),
            texture=wall_texture,
        ),
        Plane(  # floor, normal pointing up (-y)
            point=_vector((0.0, 1.5, 0.0)),
            normal=_vector((0.0, -1.0, 0.0)),
            axis_a=_vector((1.0, 0.0, 0.0)),
            axis_b=_vector((0.0, 0.0, 1.0)),
            texture=floor_texture,
        ),
        Sphere(center=_vector((-1.1, 0.3, 5.6)), radius=1.2, texture=big_sphere_texture),
        Sphere(center=_vector((1.3, 0.9, 4.3)), radius=0.6, texture=small_sphere_texture),
        Plane(  # tilted card floating upper right
            point=_vector((0.55, -0.55, 3.6)),
            normal=card_normal,
            axis_a=card_a,
            axis_b=card_b,
            texture=card_texture,
            half_extent=(0.55, 0.4),
        ),
    ]


# --------------------------------------------------------------------------------------------
# Tracing
# --------------------------------------------------------------------------------------------


def _shade(surfaces: list, origins: Tensor, directions: Tensor, detail: float = 0.0) -> Tensor:
    """Lambertian colour `[rays, 3]` of the nearest hit of each ray (albedo modulated by
    `detail_pattern` with amplitude `detail` when non-zero)."""
    depth, index = nearest_hit(surfaces, origins, directions)
    colour = torch.tensor(MISS_COLOUR, dtype=origins.dtype).repeat(len(origins), 1)
    hit_points = origins + depth.nan_to_num(posinf=0.0)[:, None] * directions  # [rays, 3]
    for i, surface in enumerate(surfaces):
        rays = (index == i).nonzero().squeeze(1)  # [hits]
        if len(rays) == 0:
            continue
        points = hit_points.index_select(0, rays)
        lambert = (surface.normals(points) @ LIGHT_DIRECTION).clamp(min=0.0)
        albedo = surface.albedo(points)
        if detail:
            albedo = albedo * (1.0 + detail * detail_pattern(points))[:, None]
        colour.index_copy_(0, rays, albedo * (AMBIENT + DIFFUSE * lambert)[:, None])
    return colour.clamp(0.0, 1.0)


def _colour(detail: float = 0.0) -> RayFunction:
    """The demo scene's colour of each ray (`_shade`), for `raytrace.render_view`."""
    surfaces = demo_surfaces()
    return lambda rays: _shade(surfaces, rays.origins, rays.directions, detail)


def _depth() -> RayFunction:
    """The camera z-depth of each ray's nearest surface (inf on a miss), for the tracer."""
    surfaces = demo_surfaces()

    def depth(rays: Rays) -> Tensor:
        return nearest_hit(surfaces, rays.origins, rays.directions)[0]

    return depth


def trace_demo_depth(c2w: Tensor, intrinsics: Tensor, pixels: Tensor) -> Tensor:
    """Camera z-depth `[pixels]` of the nearest surface through each pixel `[pixels, 2]` (float64)."""
    return trace(_depth(), c2w, intrinsics, pixels)


def render_demo_view(
    c2w: np.ndarray, K: np.ndarray, height: int, width: int, detail: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Trace any OpenCV camera (`c2w` `[4, 4]`, `K` `[3, 3]`) through the demo scene.

    Returns the colour `[H, W, 3]` float32 in [0, 1] (mean of a 2x2 supersampling of each pixel)
    and the exact camera z-depth `[H, W]` float32 at the integer pixel coordinates (inf where a ray
    misses everything, which never happens for the demo cameras).

    `detail` > 0 multiplies every albedo by `1 + detail * detail_pattern(point)`: the same geometry
    with the fine, non-repeating surface texture of a real capture (photos for COLMAP). The demo
    scene itself (`scene=demo`, training and tests) is rendered with `detail=0`.
    """
    c2w_t = torch.as_tensor(np.asarray(c2w), dtype=torch.float64)
    intrinsics = torch.as_tensor(np.asarray(K), dtype=torch.float64)
    colour, depth = render_view(_colour(detail), _depth(), c2w_t, intrinsics, height, width)
    return colour.float().numpy(), depth.float().numpy()


# --------------------------------------------------------------------------------------------
# Cameras and LLFF files
# --------------------------------------------------------------------------------------------


def demo_resolution(factor: int) -> tuple[int, int]:
    """(H, W) of the `images_{factor}` folder (the full resolution divided, rounded down)."""
    check_int(factor, "data.factor")
    height, width = FULL_HEIGHT // factor, FULL_WIDTH // factor
    if height < 8:
        raise UserError(f"data.factor: {factor} leaves a {width}x{height} demo image, too small")
    return height, width


def demo_intrinsics(factor: int) -> np.ndarray:
    """`K` `[3, 3]` as the loader builds it: focal / factor, principal point at the image centre."""
    height, width = demo_resolution(factor)
    focal = FULL_FOCAL / factor
    return np.array([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]])


def demo_poses() -> np.ndarray:
    """OpenCV camera-to-world `[views, 4, 4]`: a 5 x 4 grid, serpentine like an LLFF capture."""
    positions, targets, rolls = [], [], []
    for row in range(GRID_ROWS):
        columns = range(GRID_COLUMNS) if row % 2 == 0 else reversed(range(GRID_COLUMNS))
        for column in columns:
            i = len(positions)
            # Deterministic "hand-held" wobble of position, aim and roll (no random generator).
            positions.append(
                [
                    -0.6 + 0.3 * column + 0.04 * math.sin(1.7 * i + 0.3),
                    -0.3 + 0.2 * row + 0.03 * math.sin(2.3 * i + 1.1),
                    0.08 * math.sin(1.3 * i + 0.7),
                ]
            )
            targets.append([0.25 * math.sin(0.9 * i), 0.3 + 0.15 * math.cos(1.1 * i), 6.0])
            rolls.append(math.radians(2.0) * math.sin(1.9 * i))
    world_down = _vector((0.0, 1.0, 0.0))
    return look_at(_vectors(positions), _vectors(targets), world_down, roll=_vectors(rolls)).numpy()


def demo_cameras(factor: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """-> c2w `[views, 4, 4]` (OpenCV), K `[3, 3]` (shared by all views), H, W at `factor`."""
    height, width = demo_resolution(factor)
    return demo_poses(), demo_intrinsics(factor), height, width


def demo_depth(view: int, factor: int) -> np.ndarray:
    """Exact camera z-depth `[H, W]` float64 of view `view` at `factor` (pixel centres), in the
    scene's own units (the loader's normalised scene multiplies them by `Scene.scale`)."""
    c2w, intrinsics, height, width = demo_cameras(factor)
    pixels = pixel_grid(height, width).double()
    depth = trace_demo_depth(torch.from_numpy(c2w[view]), torch.from_numpy(intrinsics), pixels)
    return depth.reshape(height, width).numpy()


def demo_depths(factor: int) -> np.ndarray:
    """Exact camera z-depth `[views, H, W]` float32 of every view at `factor` (pixel centres)."""
    return np.stack([demo_depth(view, factor).astype(np.float32) for view in range(N_VIEWS)])


def demo_bounds() -> np.ndarray:
    """Near / far `[views, 2]` of each view, valid at every factor.

    The depth is traced on a grid covering the full-resolution image plane plus a pixel of margin
    (a superset of the pixel centres of any factor), and the extremes are padded by 2%
    (`raytrace.view_bounds`).
    """
    return _cached_bounds().copy()


@functools.lru_cache(maxsize=1)
def _cached_bounds() -> np.ndarray:  # the same for every factor: traced once per process
    intrinsics = torch.from_numpy(demo_intrinsics(BOUNDS_FACTOR))
    height, width = FULL_HEIGHT / BOUNDS_FACTOR, FULL_WIDTH / BOUNDS_FACTOR
    return view_bounds(_depth(), demo_poses(), intrinsics, height, width)


def demo_poses_bounds() -> np.ndarray:
    """The `poses_bounds.npy` array `[views, 17]`: `[R | t | hwf]` row-major, then near, far."""
    poses = opencv_to_llff(demo_poses())  # [views, 3, 4]
    hwf = np.tile(np.array([FULL_HEIGHT, FULL_WIDTH, FULL_FOCAL], dtype=np.float64)[None, :, None], (N_VIEWS, 1, 1))
    matrices = np.concatenate([poses, hwf], axis=-1)  # [views, 3, 5]
    return np.concatenate([matrices.reshape(N_VIEWS, 15), demo_bounds()], axis=-1)


def _write_poses_bounds(scene_dir: Path) -> None:
    buffer = io.BytesIO()
    np.save(buffer, demo_poses_bounds())
    write_atomic(scene_dir / "poses_bounds.npy", buffer.getbuffer())


def _write_images(scene_dir: Path, factor: int) -> None:
    with staged_folder(scene_dir / image_folder_name(factor)) as staging:
        c2w, intrinsics, height, width = demo_cameras(factor)
        for i, pose in enumerate(c2w):
            rgb, _ = render_demo_view(pose, intrinsics, height, width)
            iio.imwrite(staging / f"image{i:03d}.png", to_uint8(torch.from_numpy(rgb)))


def ensure_demo_scene(scene_dir: Path, factor: int = 8) -> Path:
    """Write the demo scene's `poses_bounds.npy` and `images_{factor}/` (`images/` at factor 1)
    where missing; -> `scene_dir`.

    Each is written into a temporary name and renamed into place, so an interrupted generation
    never leaves a half-written folder behind. A fast no-op when both already exist.
    """
    scene_dir = Path(scene_dir)
    demo_resolution(factor)  # validate before touching the disk
    image_dir = scene_dir / image_folder_name(factor)
    if (scene_dir / "poses_bounds.npy").is_file() and image_dir.is_dir():
        return scene_dir
    try:
        scene_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{scene_dir}: cannot create the demo scene folder ({err.strerror})") from None
    if not (scene_dir / "poses_bounds.npy").is_file():
        _write_poses_bounds(scene_dir)
    if not image_dir.is_dir():
        _write_images(scene_dir, factor)
    return scene_dir
