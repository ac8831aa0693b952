"""Lightning data: `data.targets_per_step` target views per training step, each with its source views
and random rays.

Every random choice of a training step (for each target: its scene when training over a collection,
target view, source views, crop, rays, and the seed of the model's sample jitter) is a pure function
of `(seed, rank, step)`, drawn from one random stream target after target, so a resumed run sees
exactly the batches an uninterrupted run would, each DDP rank draws different rays, and a step of
one target draws exactly what it drew before several targets were possible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from pola_gnt.data.batches import RayBatch, SourceBatch, TrainingBatch, ViewBatch
from pola_gnt.data.collection import TrainingScenes
from pola_gnt.data.sampling import draw_crop, draw_crop_position, scaled_ray_count
from pola_gnt.data.scene import Scene
from pola_gnt.data.settings import DataSettings
from pola_gnt.data.source_views import nearest_views, random_training_views, scene_selection_points
from pola_gnt.geometry.rays import RayGrid, patch_pixels, pixel_coordinates, pixel_rays


def source_batch(scene: Scene, source_ids: list[int]) -> SourceBatch:
    """Source images `[views, 3, H, W]` with their cameras, each named by its scene, factor and view."""
    return SourceBatch(
        ids=torch.tensor(source_ids),
        images=scene.images[source_ids].permute(0, 3, 1, 2).contiguous(),
        c2w=scene.cameras.c2w[source_ids],
        intrinsics=scene.cameras.intrinsics[source_ids],
        image_keys=tuple((str(scene.path), scene.factor, int(i), scene.image_names[i]) for i in source_ids),
    )


def eval_source_ids(scene: Scene, view: int, count: int) -> list[int]:
    """The deterministic source views of an evaluation target: its nearest training cameras (by the rig's
    distance, `source_views.selection_points`)."""
    points = scene_selection_points(scene)
    return nearest_views(points[view], points, scene.train_ids, count, exclude=view)


class TrainSteps(Dataset[TrainingBatch]):
    """Item `step`: the training batch of that global step (on this rank): for each of its targets, the
    scene (a collection's draw, or the run's one scene), target view, source views, crop and rays. The
    targets of one step are distinct views (a scene with fewer training views than targets repeats
    none until it has used them all)."""

    def __init__(self, scenes: TrainingScenes | Scene, data: DataSettings, n_steps: int, seed: int, rank: int):
        self.scenes = scenes if isinstance(scenes, TrainingScenes) else TrainingScenes.single(scenes, data)
        self.data = data
        self.n_steps = n_steps
        self.seed = seed
        self.rank = rank

    def __len__(self) -> int:
        return self.n_steps

    def __getitem__(self, step: int) -> TrainingBatch:
        rng = np.random.default_rng([self.seed, self.rank, step])
        drawn: dict[str, list[int]] = {}  # per scene, the targets this step has drawn
        targets = []
        for _ in range(self.data.targets_per_step):
            scene = self.scenes.draw(rng)
            used = drawn.setdefault(str(scene.path), [])
            candidates = [i for i in scene.train_ids if i not in used] or scene.train_ids
            target = int(rng.choice(candidates))
            used.append(target)
            targets.append(self._target_batch(scene, target, step, rng))
        return TrainingBatch(targets=targets, step=step)

    def _target_batch(self, scene: Scene, target: int, step: int, rng: np.random.Generator) -> RayBatch:
        """One target's source views, crop and rays, drawn from `rng`."""
        data = self.data
        points = scene_selection_points(scene)
        if data.random_source_views:
            source_ids = random_training_views(
                points[target],
                points,
                scene.train_ids,
                data.num_source_views,
                target,
                rng,
                data.source_pool_weights,
                data.target_as_source_rate,
            )
        else:
            source_ids = nearest_views(points[target], points, scene.train_ids, data.num_source_views, exclude=target)
        sources = source_batch(scene, source_ids)
        intrinsics = scene.cameras.intrinsics[target].clone()
        image = scene.images[target]  # [H, W, 3]
        window = self._crop_window((int(image.shape[0]), int(image.shape[1])), rng)
        if window is not None:
            sources, intrinsics, image = crop_views(sources, intrinsics, image, window)
        n_rays = data.rays_per_step
        if data.scale_rays_with_views:  # GNT: rays x views about constant
            n_rays = scaled_ray_count(n_rays, data.num_source_views, len(source_ids))
        height, width = image.shape[:2]
        grid = None
        if data.ray_patch_size:
            # The rays as square patches (a grid the prior's neighbours aggregate over), placed anywhere in the
            # image (or crop); the windows' unit is the whole image's longer side, as a render of it has.
            side = min(data.ray_patch_size, height, width)
            count = max(1, n_rays // side**2)
            tops = torch.from_numpy(rng.integers(0, height - side + 1, size=count))
            lefts = torch.from_numpy(rng.integers(0, width - side + 1, size=count))
            chosen = patch_pixels(tops, lefts, side, width)
            grid = RayGrid(count, side, side, max(scene.resolution))
        else:
            chosen = torch.from_numpy(rng.choice(height * width, size=min(n_rays, height * width), replace=False))
        rays = pixel_rays(scene.cameras.c2w[target], intrinsics, pixel_coordinates(chosen, width))
        return RayBatch(
            view=target,
            rays=rays,
            depth_range=scene.depth_range,
            rgb=image.reshape(-1, 3)[chosen],
            sources=sources,
            sample_seed=int(rng.integers(2**62)),  # drawn last: the model's depth jitter of this step
            step=step,
            grid=grid,
        )

    def _crop_window(self, image_size: tuple[int, int], rng: np.random.Generator) -> tuple[int, int, int, int] | None:
        """This step's crop `(top, left, height, width)`: `data.crop`'s fixed size or GNT's random size
        (`data.random_crop`) at a random place; None for the whole image."""
        data = self.data
        if data.crop:
            crop_h, crop_w = (int(x) for x in data.crop)
            position = draw_crop_position(rng, (crop_h, crop_w), image_size, data.crop_placement)
            return None if position is None else (*position, crop_h, crop_w)
        if data.random_crop is not None:
            return draw_crop(rng, data.random_crop.heights, data.random_crop.area, image_size, data.crop_placement)
        return None


def crop_views(
    sources: SourceBatch, intrinsics: Tensor, image: Tensor, window: tuple[int, int, int, int]
) -> tuple[SourceBatch, Tensor, Tensor]:
    """Crop the target `image` `[H, W, 3]` and every source image to one `window` (top, left, height,
    width), shifting the principal points of the target's `intrinsics` and the sources' by its corner."""
    top, left, crop_h, crop_w = window
    shift = torch.tensor([left, top], dtype=torch.float32)
    intrinsics = intrinsics.clone()
    intrinsics[:2, 2] -= shift
    source_intrinsics = sources.intrinsics.clone()
    source_intrinsics[:, :2, 2] -= shift
    images = sources.images[:, :, top : top + crop_h, left : left + crop_w].contiguous()
    return (
        replace(sources, images=images, intrinsics=source_intrinsics, image_keys=None),  # a crop: unnamed
        intrinsics,
        image[top : top + crop_h, left : left + crop_w],
    )


class ResumableSampler(Sampler[int]):
    """Step indices `start() .. end - 1`, where `start` is read when iteration begins: the trainer's
    global step, so a run resumed at any step continues the sequence exactly.

    Its length is always `end` (the whole run is one epoch), so the in-epoch batch index that
    Lightning restores from a checkpoint counts the same steps; iteration starts at the restored
    global step whether the checkpoint was written mid-epoch (an interrupted run) or at its end.
    """

    def __init__(self, start: int | Callable[[], int], end: int):
        self.start = start if callable(start) else (lambda: start)
        self.end = end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start(), self.end))

    def __len__(self) -> int:
        return self.end


class StepLoader(DataLoader):
    """The training loader: stateful for Lightning (`state_dict` / `load_state_dict`), so a
    checkpoint records the next step to draw and a resumed run is checked to continue there."""

    def __init__(self, dataset: TrainSteps, trainer: pl.Trainer):
        self.trainer = trainer
        super().__init__(
            dataset, batch_size=None, sampler=ResumableSampler(lambda: trainer.global_step, trainer.max_steps)
        )

    def state_dict(self) -> dict:
        return {"next_step": int(self.trainer.global_step)}

    def load_state_dict(self, state: dict) -> None:
        self.restored_step = int(state.get("next_step", self.trainer.global_step))


class ValidationRays(Dataset[RayBatch]):
    """A fixed random subset of the rays of the first test view (cheap, deterministic validation)."""

    def __init__(self, scene: Scene, data: DataSettings, seed: int):
        self.batch = self._build(scene, data, seed)

    @staticmethod
    def _build(scene: Scene, data: DataSettings, seed: int) -> RayBatch:
        view = scene.test_ids[0] if scene.test_ids else scene.train_ids[0]
        height, width = scene.resolution
        generator = torch.Generator().manual_seed(seed)
        grid = None
        if data.ray_patch_size:  # patches, as training draws them
            side = min(data.ray_patch_size, height, width)
            count = max(1, data.val_rays // side**2)
            tops = torch.randint(0, height - side + 1, (count,), generator=generator)
            lefts = torch.randint(0, width - side + 1, (count,), generator=generator)
            chosen = patch_pixels(tops, lefts, side, width)
            grid = RayGrid(count, side, side, max(height, width))
        else:
            chosen = torch.randperm(height * width, generator=generator)[: data.val_rays]
        rays = pixel_rays(scene.cameras.c2w[view], scene.cameras.intrinsics[view], pixel_coordinates(chosen, width))
        return RayBatch(
            view=view,
            rays=rays,
            depth_range=scene.depth_range,
            rgb=scene.images[view].reshape(-1, 3)[chosen],
            sources=source_batch(scene, eval_source_ids(scene, view, data.num_source_views)),
            grid=grid,
        )

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> RayBatch:
        return self.batch


class TestViews(Dataset[ViewBatch]):
    """Each held-out view: its index and deterministic source views (the full image is rendered in chunks)."""

    def __init__(self, scene: Scene, view_ids: list[int], num_source_views: int):
        self.scene = scene
        self.view_ids = view_ids
        self.num_source_views = num_source_views

    def __len__(self) -> int:
        return len(self.view_ids)

    def __getitem__(self, index: int) -> ViewBatch:
        view = self.view_ids[index]
        return ViewBatch(
            view=view,
            c2w=self.scene.cameras.c2w[view],
            intrinsics=self.scene.cameras.intrinsics[view],
            rgb=self.scene.images[view],
            sources=source_batch(self.scene, eval_source_ids(self.scene, view, self.num_source_views)),
        )


class SceneDataModule(pl.LightningDataModule):
    """The loaders of a run: training steps (from `training_scenes`, by default `scene` alone), and the
    validation rays and test views of `scene`."""

    def __init__(self, scene: Scene, data: DataSettings, seed: int, training_scenes: TrainingScenes | None = None):
        super().__init__()
        self.scene = scene
        self.data = data
        self.seed = seed
        self.training_scenes = training_scenes or TrainingScenes.single(scene, data)

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("SceneDataModule.train_dataloader: the training loader follows a trainer's steps")
        dataset = TrainSteps(self.training_scenes, self.data, trainer.max_steps, self.seed, trainer.global_rank)
        return StepLoader(dataset, trainer)

    def val_dataloader(self) -> DataLoader:
        dataset = ValidationRays(self.scene, self.data, self.seed)
        return DataLoader(dataset, batch_size=None)

    def test_dataloader(self) -> DataLoader:
        # Each rank renders its share of the test views; results are gathered on rank 0.
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        scene = self.scene
        views = scene.test_ids[rank::world]
        return DataLoader(TestViews(scene, views, self.data.num_source_views), batch_size=None)
