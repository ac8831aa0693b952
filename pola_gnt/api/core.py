"""The Python API's functions and classes (`pola_gnt.api`, whose docstring says what each is a layer over)."""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning_fabric import Fabric
from torch import Tensor

from pola_gnt.apps.camera_path_file import CameraPath
from pola_gnt.apps.evaluation import evaluate_trained
from pola_gnt.apps.export.ply import PointCloud
from pola_gnt.apps.export.run import point_cloud_of, render_views
from pola_gnt.apps.export.views import check_depth
from pola_gnt.apps.frames import EncodedViews, frame_images
from pola_gnt.apps.trained_runs import TrainedCheckpoint, load_trained_checkpoint
from pola_gnt.apps.video import render_frame, render_frames, video_camera_path
from pola_gnt.core.errors import UserError, check_choice, check_int, check_number, is_int
from pola_gnt.data import scene as scene_module
from pola_gnt.data.collection import KIND_FILES
from pola_gnt.data.datamodule import eval_source_ids, source_batch
from pola_gnt.data.scene_loading import load_scene as load_scene_of_settings
from pola_gnt.data.scene_loading import scene_dir
from pola_gnt.model.consistency_prior import PriorImageCache
from pola_gnt.model.gnt import GNT
from pola_gnt.model.render_memory import budget_chunk_rays, render_workers
from pola_gnt.model.renderer import RenderCancelled, RenderedImage, RenderNetwork
from pola_gnt.runs.config.app import compose_config, default_config_name
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import (
    CONFIG_DIR,
    checkpoint_to_resume,
    container_dict,
    inherit_initial_network,
    trained_run_config,
)
from pola_gnt.runs.settings import RunSettings

PRECISIONS = ("auto", "fp32", "bf16")  # render.precision
PROTOCOLS = ("standard", "gnt")  # metrics.protocol
SCENE_KINDS = ("auto", *KIND_FILES)  # load_scene(kind=): the folder kinds a path may hold
# `progress(done, total)` after each chunk of rays (render) or frame (render_path); False cancels
# (`RenderCancelled`), anything else goes on.
Progress = Callable[[int, int], object]

_PLAIN_VALUE = re.compile(r"[\w./:+@-]+")


def _value(value: Any) -> str:
    """`value` as a Hydra override's value: as is when plain, else quoted (a path with spaces)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    text = str(value)
    if _PLAIN_VALUE.fullmatch(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _compose(overrides: Sequence[str]):
    """The config a command composes on this machine (`default_config_name`) with these overrides."""
    return compose_config(*overrides, config_name=default_config_name())


# ---- scenes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Camera:
    """A pinhole camera: `c2w` `[4, 4]` (OpenCV axes: x right, y down, looking down +z; the scene's
    normalised frame), `intrinsics` `[3, 3]` for `height` x `width` pixels; `view`: the scene's image
    it is (None: a camera of its own)."""

    c2w: Tensor
    intrinsics: Tensor
    height: int
    width: int
    view: int | None = None

    @staticmethod
    def of(c2w: Any, intrinsics: Any, size: tuple[int, int] | Sequence[int]) -> Camera:
        """A camera of its own from a `c2w` (3x4 or 4x4, tensor, array or nested lists), `intrinsics`
        (3x3) and `size` (height, width): one `UserError` naming what is wrong."""
        pose = _matrix(c2w, "c2w", ((3, 4), (4, 4)))
        if pose.shape[0] == 3:
            pose = torch.cat([pose, torch.tensor([[0.0, 0.0, 0.0, 1.0]])])
        rotation = pose[:3, :3].double()
        if (rotation @ rotation.T - torch.eye(3, dtype=torch.float64)).abs().max() > 1e-3:
            raise UserError("camera: c2w is not a rotation and a position (scaled or skewed axes)")
        matrix = _matrix(intrinsics, "intrinsics", ((3, 3),))
        if not isinstance(size, Sequence) or len(size) != 2:
            raise UserError(f"camera: size must be (height, width), got {size!r}")
        height = check_int(size[0], "camera: size (height)")
        width = check_int(size[1], "camera: size (width)")
        return Camera(pose, matrix, height, width)


def _matrix(value: Any, name: str, shapes: tuple[tuple[int, int], ...]) -> Tensor:
    try:
        matrix = torch.as_tensor(np.asarray(value, dtype=np.float64)).float()
    except (TypeError, ValueError):
        raise UserError(f"camera: {name} must be a matrix of numbers, got {type(value).__name__}") from None
    wanted = " or ".join(f"{rows}x{cols}" for rows, cols in shapes)
    if tuple(matrix.shape) not in shapes:
        raise UserError(f"camera: {name} must be a {wanted} matrix, got shape {tuple(matrix.shape)}")
    if not bool(torch.isfinite(matrix).all()):
        raise UserError(f"camera: {name} holds a value that is not finite")
    return matrix


@dataclass(frozen=True)
class Scene:
    """A loaded scene (`data`: the commands' `pola_gnt.data.scene.Scene`: images, cameras, bounds,
    splits) and the command-line keys that load it (`overrides`), with which a model renders and
    scores it."""

    data: scene_module.Scene
    overrides: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.data.name

    @property
    def path(self) -> Path:
        return self.data.path

    @property
    def images(self) -> Tensor:
        """`[views, H, W, 3]` float32 in [0, 1]."""
        return self.data.images

    @property
    def cameras(self):
        """`pola_gnt.geometry.cameras.Cameras`: `c2w` `[views, 4, 4]`, `intrinsics` `[views, 3, 3]`."""
        return self.data.cameras

    @property
    def bounds(self) -> Tensor:
        """Near / far per view `[views, 2]`, normalised."""
        return self.data.bounds

    @property
    def depth_range(self) -> tuple[float, float]:
        return self.data.depth_range

    @property
    def train_ids(self) -> list[int]:
        return self.data.train_ids

    @property
    def test_ids(self) -> list[int]:
        return self.data.test_ids

    @property
    def resolution(self) -> tuple[int, int]:
        """(height, width)."""
        return self.data.resolution

    def camera(self, view: int) -> Camera:
        """The camera of the scene's image `view` (any split)."""
        count = len(self.data.image_names)
        if not is_int(view) or not 0 <= view < count:
            raise UserError(f"camera: view {view!r} is not an image of {self.name} (0 to {count - 1})")
        cameras = self.data.cameras
        return Camera(cameras.c2w[view], cameras.intrinsics[view], cameras.height, cameras.width, int(view))

    def test_camera(self, index: int) -> Camera:
        """The camera of the `index`-th test view (`test_ids[index]`)."""
        count = len(self.test_ids)
        if not is_int(index) or not -count <= index < count:
            raise UserError(f"camera: test view {index!r} out of range ({self.name} has {count} test views)")
        return self.camera(self.test_ids[index])

    def summary(self) -> str:
        return self.data.summary()


def _scene_option(name: str) -> str | None:
    """`name` when it is a scene of `conf/scene/` (`fern`, `lego`, `demo`, ...), else None."""
    return name if (CONFIG_DIR / "scene" / f"{name}.yaml").is_file() else None


def _kind_of_folder(path: Path, kind: str) -> str:
    """The scene kind (`scene=` group option: llff, blender, transforms) of the folder `path`."""
    if not path.is_dir():
        raise UserError(
            f"{path}: scene folder not found (set data.root=DIR or $POLA_GNT_DATA to the folder holding "
            f"the LLFF scenes; see data/README.md)"
        )
    if kind != "auto":
        return kind
    found = next((name for name, file in KIND_FILES.items() if (path / file).is_file()), None)
    if found is None:
        raise UserError(
            f"{path}: no scene files (none of {', '.join(KIND_FILES.values())}); a scene folder is an LLFF "
            f"scene, a NeRF Blender scene or a transforms.json capture (kind=llff|blender|transforms)"
        )
    return found


def load_scene(
    scene: str | Path,
    factor: int | None = None,
    kind: str = "auto",
    test_views: int | None = None,
    *,
    rig: str | None = None,
    llffhold: int | None = None,
    overrides: Sequence[str] = (),
) -> Scene:
    """A scene as the commands load it: a name of `conf/scene/` (`"fern"`, `"lego"`, `"demo"`; found
    under `data.root` / `$POLA_GNT_DATA` as the commands find it) or a folder (`kind="auto"`: an LLFF
    scene, NeRF's Blender layout or a transforms.json capture, from its files; or say which).
    `factor`: `data.factor` (Blender: `data.synthetic_factor`), None: the commands' default on this
    machine; `test_views`: `data.test_views` (None: all); `rig`, `llffhold`: `scene.rig`,
    `data.llffhold`; `overrides`: more keys as on a command line (`data.root=DIR`)."""
    check_choice(kind, "kind", SCENE_KINDS)
    option = _scene_option(str(scene)) if isinstance(scene, str) and not Path(scene).is_dir() else None
    keys = list(overrides)
    if option is not None:
        keys.insert(0, f"scene={option}")
    else:
        path = Path(scene).expanduser()
        keys[:0] = [f"scene={_kind_of_folder(path, kind)}", f"scene.path={_value(path.resolve())}"]
    if rig is not None:
        keys.append(f"scene.rig={_value(rig)}")
    if llffhold is not None:
        keys.append(f"data.llffhold={_value(llffhold)}")
    if test_views is not None:
        keys.append(f"data.test_views={_value(test_views)}")
    if factor is not None:
        keys.append(f"data.factor={_value(factor)}")
        keys.append(f"data.synthetic_factor={_value(factor)}")
    settings = read_run_settings(_compose(keys))
    scene_settings, data = settings.scene, settings.data
    # Every key that decides the loaded scene, as loaded: a model's run of it (its own stored config
    # otherwise) reads the same images, split and test views.
    loaded = {
        "scene.path": _value(scene_dir(scene_settings, data).resolve()),
        "scene.rig": _value(scene_settings.rig),
        "data.factor": str(data.factor),
        "data.synthetic_factor": str(data.synthetic_factor),
        "data.llffhold": str(data.llffhold),
        "data.test_views": _value(data.test_views),
    }
    extra = [key for key in keys[1:] if key.split("=", 1)[0] not in loaded]
    loaded_keys = (keys[0], *(f"{key}={value}" for key, value in loaded.items()), *extra)
    settings = read_run_settings(_compose(loaded_keys))
    return Scene(load_scene_of_settings(settings.scene, settings.data), loaded_keys)


# ---- renderings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendering:
    """One rendered image: `rgb` `[H, W, 3]` in [0, 1], `depth` `[H, W]` (camera z-depth, the scene's
    normalised units), `confidence` `[H, W]` (the read-out's largest sample weight: near 1 where it
    pools one sample, near 1 / samples where it cannot tell the depth), on the CPU; `depth_range`:
    the scene's near / far, over which `images` colours the depth; `sources`: the training views it
    was rendered from."""

    rgb: Tensor
    depth: Tensor
    confidence: Tensor
    depth_range: tuple[float, float]
    sources: list[int] = field(default_factory=list)

    def numpy(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rgb, depth, confidence) as float32 arrays."""
        return self.rgb.numpy(), self.depth.numpy(), self.confidence.numpy()

    def images(self) -> tuple[np.ndarray, np.ndarray]:
        """The two uint8 images `[H, W, 3]` the commands write: colour (`eval`'s `_pred.png`), and depth
        colour-mapped over `depth_range`, near bright (`_depth.png`)."""
        return frame_images(RenderedImage(self.rgb, self.depth), self.depth_range)

    def save(self, rgb: str | Path | None = None, depth: str | Path | None = None) -> None:
        """Write the colour and / or the colour-mapped depth (`images`) as PNG files."""
        import imageio.v3 as iio

        colour, depth_image = self.images()
        for path, image in ((rgb, colour), (depth, depth_image)):
            if path is not None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                iio.imwrite(Path(path), image, extension=".png")


def _rendering(image: RenderedImage, peaks: list[Tensor], scene: Scene, sources: list[int]) -> Rendering:
    return Rendering(
        rgb=image.rgb.float().cpu(),
        depth=image.depth.float().cpu(),
        confidence=peaks[-1].float().cpu(),
        depth_range=scene.depth_range,
        sources=sources,
    )


class _Cancel:
    """`progress` as `render_image`'s `progress` and `cancelled`: a False from it cancels."""

    def __init__(self, progress: Progress | None):
        self.callback, self.stop = progress, False

    def progress(self, done: int, total: int) -> None:
        if self.callback is not None and self.callback(done, total) is False:
            self.stop = True

    def cancelled(self) -> bool:
        return self.stop


@dataclass
class Evaluation:
    """`eval`'s result: the `metrics.json` document (`document`), its `mean` and `per_image` metrics,
    and the folder it was written to with `metrics.csv` and `test_views/` (`out_dir`)."""

    document: dict
    out_dir: Path

    @property
    def mean(self) -> dict:
        return self.document["mean"]

    @property
    def per_image(self) -> list[dict]:
        return self.document["per_image"]


# ---- the model ---------------------------------------------------------------------------------


@dataclass
class _Run:
    """The model's checkpoint under one scene's (and protocol's) keys: settings, system, render state."""

    trained: TrainedCheckpoint
    fabric: Fabric
    network: RenderNetwork
    prior_images: PriorImageCache = field(default_factory=PriorImageCache)
    encoded: EncodedViews | None = None


class Model:
    """A trained checkpoint, loaded as `eval` loads it (`load_model`): its settings (`settings`, the
    stored run config with the given keys), its network (`net`) and render network (`render_network`:
    the network or its bf16 copy at `render.precision`) on `device`."""

    def __init__(self, checkpoint: str, overrides: Sequence[str]):
        self.checkpoint = checkpoint  # as given: a file or pretrained:NAME
        self.overrides = tuple(overrides)  # the keys given with it
        self._runs: dict[tuple[str, ...], _Run] = {}
        self._base = self._run(())

    # the checkpoint as loaded with no scene's keys

    @property
    def path(self) -> Path:
        """The checkpoint file."""
        return self._base.trained.path

    @property
    def settings(self) -> RunSettings:
        return self._base.trained.settings

    @property
    def name(self) -> str:
        """The model: `pola_gnt` or `gnt`."""
        return self.settings.model.name

    @property
    def step(self) -> int:
        """The global step the checkpoint was saved at."""
        return self._base.trained.system.checkpoint_step

    @property
    def net(self) -> GNT:
        return self._base.trained.system.net

    @property
    def render_network(self) -> RenderNetwork:
        return self._base.network

    @property
    def device(self) -> torch.device:
        return self._base.fabric.device

    def __repr__(self) -> str:
        return f"Model({self.checkpoint!r}, {self.name}, step {self.step}, {self.device})"

    def _run(self, keys: tuple[str, ...]) -> _Run:
        """The checkpoint under the model's keys and `keys` (a scene's, a protocol's), built as `eval`
        builds it; the last two kept."""
        if keys in self._runs:
            return self._runs[keys]
        overrides = [*self.overrides, *keys]
        cfg = _compose(overrides)
        cfg.ckpt_path = self.checkpoint
        trained = load_trained_checkpoint(trained_run_config(cfg, Path.cwd(), overrides))
        settings = trained.settings
        precision: Any = settings.trainer.precision  # Lightning's precision names, as the Trainer takes them
        fabric = Fabric(accelerator=settings.trainer.accelerator, devices=1, precision=precision)
        trained.system.to(fabric.device).eval()
        run = _Run(trained, fabric, trained.system.rendering_network(fabric.device))
        if len(self._runs) >= 3:  # the base and the last two
            for key in [key for key in self._runs if key != ()][:1]:
                del self._runs[key]
        self._runs[keys] = run
        return run

    def render(
        self,
        scene: Scene,
        camera: int | Camera | Tensor | np.ndarray | Sequence,
        intrinsics: Any = None,
        size: tuple[int, int] | None = None,
        *,
        progress: Progress | None = None,
    ) -> Rendering:
        """Render one camera of `scene`: `camera` an index into its test views (`scene.test_ids`), a
        `Camera` (`scene.camera(view)`, `Camera.of(...)`), or a `c2w` (3x4 / 4x4) with `intrinsics`
        (3x3) and `size` (height, width). A scene's image renders as `eval` renders a test view, from
        its nearest training views but itself; a camera of its own as a video frame, from its nearest
        training views. `progress(rays done, rays)` after each chunk, counting both passes of a network
        whose prior aggregates over neighbouring rays (`model.net.readout_neighbour_windows`: twice the
        pixels in all); returning False cancels (`RenderCancelled`)."""
        run = self._run(scene.overrides)
        if isinstance(camera, Camera):
            chosen = camera
        elif is_int(camera):
            chosen = scene.test_camera(int(camera))  # type: ignore[arg-type]
        else:
            if intrinsics is None or size is None:
                raise UserError("camera: a c2w needs intrinsics= (3x3) and size=(height, width)")
            chosen = Camera.of(camera, intrinsics, size)
        cancel, peaks = _Cancel(progress), []
        settings, system, device = run.trained.settings, run.trained.system, run.fabric.device
        count = settings.data.num_source_views
        with torch.inference_mode():
            if chosen.view is not None and chosen.view < len(scene.data.image_names):
                source_ids = eval_source_ids(scene.data, chosen.view, count)
                sources = _to_device(source_batch(scene.data, source_ids), device)
                if (chosen.height, chosen.width) != scene.resolution:
                    raise UserError(f"camera: a scene image renders at the scene's size {scene.resolution}")
                with run.fabric.autocast():
                    image = system.render_view(
                        run.network,
                        scene.data,
                        sources,
                        chosen.c2w.to(device),
                        chosen.intrinsics.to(device),
                        prior_images=run.prior_images,
                        cancelled=cancel.cancelled,
                        progress=cancel.progress,
                        peak_weights=peaks,
                    )
            else:
                from pola_gnt.apps.frames import frame_source_views

                chunk_rays, workers = self._chunks(run)
                if run.encoded is None:
                    run.encoded = EncodedViews(run.network, scene.data, device, workers)
                source_ids = frame_source_views(scene.data, chosen.c2w, count)
                image = render_frame(
                    run.network,
                    scene.data,
                    run.encoded,
                    chosen.c2w,
                    chosen.intrinsics,
                    chosen.height,
                    chosen.width,
                    count,
                    system.sampler,
                    chunk_rays,
                    run.fabric,
                    workers,
                    cancelled=cancel.cancelled,
                    progress=cancel.progress,
                    peak_weights=peaks,
                )
        return _rendering(image, peaks, scene, [int(v) for v in source_ids])

    @staticmethod
    def _chunks(run: _Run) -> tuple[int, int]:
        """Rays per pass and passes at once of a video frame on this machine (`render_video`'s)."""
        settings, device = run.trained.settings, run.fabric.device
        views = settings.data.num_source_views
        chunk_rays = budget_chunk_rays(settings.render, settings.model.net, views, device)
        return chunk_rays, render_workers(settings.render, settings.model.net, views, chunk_rays, device)

    def evaluate(self, scene: Scene, protocol: str = "standard", out_dir: str | Path | None = None) -> Evaluation:
        """Score the scene's test views as `eval scene=... metrics.protocol=PROTOCOL` does (`standard`:
        LPIPS-Alex, every pixel, 8-bit; `gnt`: GNT's published protocol, LPIPS-VGG, every 2nd pixel):
        `metrics.json`, `metrics.csv` and `test_views/` written into `out_dir` (None: a new temporary
        folder)."""
        check_choice(protocol, "metrics.protocol", PROTOCOLS)
        run = self._run((*scene.overrides, f"metrics.protocol={protocol}"))
        folder = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="pola_gnt_eval_"))
        folder.mkdir(parents=True, exist_ok=True)
        document = evaluate_trained(run.trained, scene.data, folder)
        if document is None:  # only the ranks other than 0 of several devices
            raise RuntimeError("Model.evaluate: no metrics document (not rank 0)")
        return Evaluation(document, folder)

    def render_path(
        self,
        scene: Scene,
        path: str | Path | CameraPath = "spiral",
        frames: int | None = None,
        scale: float = 1.0,
        *,
        progress: Progress | None = None,
    ) -> list[Rendering]:
        """The frames of a camera path as `render_video` renders them: `"spiral"` or `"interpolate"`
        (`video.path`, `frames`: `video.frames`), a camera_path.json file (nerfstudio's, e.g. saved
        by the viewer or `render_video video.save_path=`), or a `CameraPath`; at `scale` of its size
        (`video.scale`). `progress(frames done, frames)` after each frame; False cancels
        (`RenderCancelled`)."""
        run = self._run(scene.overrides)
        settings = run.trained.settings
        if isinstance(path, CameraPath):
            camera_path = path.scaled(check_number(scale, "video.scale", 0))
        else:
            video = dataclasses.replace(
                settings.video,
                path=str(path),
                frames=settings.video.frames if frames is None else frames,
                scale=scale,
            )
            video.check("video")
            camera_path = video_camera_path(scene.data, video)
        chunk_rays, workers = self._chunks(run)
        peaks: list[Tensor] = []
        renderings = []
        frames_of = render_frames(
            run.network,
            scene.data,
            camera_path,
            settings.data.num_source_views,
            run.trained.system.sampler,
            chunk_rays,
            run.fabric,
            workers=workers,
            peak_weights=peaks,
        )
        for index, image in frames_of:
            renderings.append(_rendering(image, peaks, scene, []))
            if progress is not None and progress(index + 1, len(camera_path)) is False:
                raise RenderCancelled
        return renderings

    def export_points(
        self,
        scene: Scene,
        cameras: str = "train",
        views: int | None = None,
        scale: float | None = None,
        overrides: Sequence[str] = (),
    ) -> PointCloud:
        """`export`'s point cloud (`pointcloud.ply`'s points): `points` `[n, 3]` float32 (the scene's
        normalised frame), `colours` `[n, 3]` uint8, `confidence` `[n]`; from the camera set `cameras`
        (`export.cameras`: train | test | spiral), at most `views` of it (`export.views`), at `scale`
        of the scene's size (`export.scale`); `overrides`: more `export.*` keys."""
        keys = [f"export.cameras={_value(cameras)}", f"export.views={_value(views)}", *overrides]
        if scale is not None:
            keys.append(f"export.scale={_value(scale)}")
        run = self._run((*scene.overrides, *keys))
        settings = run.trained.settings
        with torch.inference_mode():
            rendered = render_views(run.trained, scene.data, run.fabric)
        check_depth(rendered, str(run.trained.path))
        cloud, _, _ = point_cloud_of(rendered, settings.export, settings.seed)
        return cloud


def _to_device(batch, device: torch.device):
    if device.type == "cpu":
        return batch
    return dataclasses.replace(
        batch,
        images=batch.images.to(device),
        c2w=batch.c2w.to(device),
        intrinsics=batch.intrinsics.to(device),
    )


def _trainer_keys(device: str | torch.device | None) -> list[str]:
    if device is None:
        return []
    kind = torch.device(device).type
    if kind == "cpu":
        return ["trainer=cpu"]
    if kind == "cuda":
        return ["trainer=gpu"]
    raise UserError(f"device: {device!r}: expected cpu, cuda or None (this machine's default)")


def load_model(
    checkpoint: str | Path,
    device: str | torch.device | None = None,
    precision: str = "auto",
    *,
    model: str | None = None,
    overrides: Sequence[str] = (),
) -> Model:
    """A trained checkpoint as `eval ckpt_path=CHECKPOINT` loads it: a file or `pretrained:NAME`
    (`pretrained:pola_gnt`, `pretrained:gnt`, shipped in the package). `device`: `cpu`, `cuda` (bf16
    autocast, as `trainer=gpu`) or None (this machine's default, as the commands choose it);
    `precision`: `render.precision` (auto | fp32 | bf16); `model`: the model it must hold (`model=`:
    refused in one line otherwise); `overrides`: more keys as on `eval`'s command line."""
    check_choice(precision, "render.precision", PRECISIONS)
    keys = [*_trainer_keys(device), f"render.precision={precision}", *overrides]
    if model is not None:
        keys.insert(0, f"model={_value(model)}")
    spec = str(checkpoint)
    if not spec.startswith("pretrained:"):
        spec = str(Path(spec).expanduser())
    return Model(spec, keys)


def fine_tune(
    model: Model,
    scene: Scene,
    minutes: float = 2.0,
    *,
    steps: int | None = None,
    run_dir: str | Path | None = None,
    seed: int | None = None,
    overrides: Sequence[str] = (),
) -> Model:
    """Fine-tune `model` on `scene` as `train experiment=finetune init_from=CHECKPOINT scene=...
    trainer.max_time=MINUTES` does (Lightning; the checkpoint's network and source views, a fresh
    optimiser): for `minutes` or `steps` (`trainer.max_steps`), whichever comes first; the run folder
    `run_dir` (None: `outputs/<scene>/<model>/<date-time>`, as the command's) gets the command's
    layout (`checkpoints/`, `metrics.json`, `test_views/`, logs, `.hydra/`). Returns the fine-tuned
    model (`checkpoints/last.ckpt`), on the model's device and precision."""
    check_number(minutes, "trainer.max_time", 0)
    init = model.checkpoint
    keys = [
        "experiment=finetune",
        f"model={model.name}",
        f"init_from={_value(init)}",
        *scene.overrides,
        f"trainer.max_time={_value(minutes)}",
        *[key for key in model.overrides if key.startswith("trainer")],
    ]
    if steps is not None:
        keys.append(f"trainer.max_steps={check_int(steps, 'trainer.max_steps')}")
    if seed is not None:
        keys.append(f"seed={check_int(seed, 'seed', minimum=0)}")
    keys += list(overrides)
    cfg = _compose(keys)
    folder = Path(run_dir) if run_dir is not None else _default_run_dir(cfg)
    inherit_initial_network(cfg, keys, folder)  # fine-tuning: the checkpoint's network
    settings = read_run_settings(cfg)
    _write_hydra_files(folder, cfg, keys)
    from pola_gnt.runs.training import train

    train(settings, container_dict(cfg), folder, checkpoint_to_resume(cfg, folder), keys)
    render_keys = [key for key in model.overrides if not key.startswith(("model=", "ckpt_path="))]
    return Model(str(folder / "checkpoints" / "last.ckpt"), render_keys)


def _default_run_dir(cfg) -> Path:
    """Hydra's run folder of the commands: `outputs/<scene>/<model>/<date-time>`."""
    return Path("outputs") / str(cfg.scene.name) / str(cfg.model.name) / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def _write_hydra_files(folder: Path, cfg, overrides: Sequence[str]) -> None:
    """The run config and the command line's keys in `.hydra/`, where a Hydra run keeps them."""
    from omegaconf import OmegaConf

    hydra_dir = folder / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, hydra_dir / "config.yaml", resolve=False)
    OmegaConf.save(OmegaConf.create(list(overrides)), hydra_dir / "overrides.yaml")
