"""Config values and scene files as users have them: every bad value or file is one `UserError`
(one `error:` line, exit 2), every valid one loads. Property-based (hypothesis) where the space is large."""

from __future__ import annotations

import operator
import os
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
from helpers import TINY_OVERRIDES, assert_one_error_line, run_in_process, run_module, scene_and_data
from helpers import compose_config as compose_run_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from omegaconf import OmegaConf
from PIL import Image

from pola_gnt.core.errors import UserError
from pola_gnt.core.paths import PROJECT_ROOT
from pola_gnt.data.images import list_images, read_image
from pola_gnt.data.llff import load_llff_scene, read_poses_bounds
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.data.settings import RandomCrop
from pola_gnt.runs.checkpoints import resolve_checkpoint
from pola_gnt.runs.config.read import check_scene, read_run_settings

HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def compose_config(*overrides: str):
    return compose_run_config(*TINY_OVERRIDES, *overrides)


# ---- config values -------------------------------------------------------------------------------

BAD_VALUES = [
    ("optim.decay_rate=abc", "optim.decay_rate"),
    ("optim.decay_rate=-0.5", "optim.decay_rate"),
    ("optim.decay_rate=0", "optim.decay_rate"),
    ("optim.decay_rate=1.5", "optim.decay_rate"),
    ("data.llffhold=0", "data.llffhold"),
    ("data.llffhold=abc", "data.llffhold"),
    ("trainer.val_check_interval=0", "trainer.val_check_interval"),
    ("trainer.val_check_interval=5000", "trainer.val_check_interval"),
    ("trainer.max_steps=0", "trainer.max_steps"),
    ("trainer.max_steps=-1", "trainer.max_steps"),
    ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val"),
    ("trainer.gradient_clip_val=abc", "trainer.gradient_clip_val"),
    ("seed=-1", "seed"),
    ("seed=abc", "seed"),
    ("seed=1.5", "seed"),
    ("seed=4294967296", "seed"),
    ("optim.lr_transformer=nan", "optim.lr_transformer"),
    ("optim.lr_encoder=inf", "optim.lr_encoder"),
    ("data.crop=[10]", "data.crop"),
    ("data.random_source_views=maybe", "data.random_source_views"),
    ("trainer.log_every_n_steps=0", "trainer.log_every_n_steps"),
]


@pytest.mark.parametrize("override, key", BAD_VALUES)
def test_bad_config_value_is_one_user_error(override, key):
    with pytest.raises(UserError) as err:
        read_run_settings(compose_config(override))
    assert str(err.value).startswith(f"{key}:") and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "overrides, parsed",
    [
        # The tiny overrides (TINY_OVERRIDES, always given here) over the quick preset on a CPU machine.
        (
            [],
            {"data.factor": 32, "data.num_source_views": 3, "data.rays_per_step": 64, "data.crop": None,
             "data.random_crop": None, "render.n_samples": 8, "model.net.width": 16, "model.net.dropout": 0.0,
             "optim.lr_transformer": 1e-3, "optim.decay_rate": 0.5, "trainer.accelerator": "cpu",
             "trainer.max_steps": 500, "trainer.val_check_interval": 125, "trainer.gradient_clip_val": None,
             "seed": 0},
        ),
        # GNT's published setting (conf/experiment/paper.yaml) where the tiny overrides leave it: its lists
        # and mapping as typed values; the command line's keys (data.factor, ...) win over the experiment's.
        (
            ["experiment=paper"],
            {"data.factor": 32, "data.targets_per_step": 8, "data.source_pool_weights": (0.2, 0.45, 0.35),
             "data.random_crop": RandomCrop(heights=(250, 750), area=240000), "data.crop_placement": "gnt",
             "data.scale_rays_with_views": True, "model.net.dropout": 0.1, "optim.lr_transformer": 5e-4,
             "optim.decay_steps": 50000, "trainer.accelerator": "gpu", "trainer.max_steps": 250000,
             "trainer.val_check_interval": 5000, "trainer.precision": "32-true"},
        ),
        # The boundaries: no decay, no clipping, seed 0 (integers given where floats are meant).
        (
            ["optim.decay_rate=1", "trainer.gradient_clip_val=0", "seed=0"],
            {"optim.decay_rate": 1.0, "trainer.gradient_clip_val": 0.0, "seed": 0},
        ),
        # A fixed crop as a tuple; a float validation interval (a fraction of an epoch) stays a float.
        (
            ["data.crop=[32,32]", "trainer.val_check_interval=1.0"],
            {"data.crop": (32, 32), "data.random_crop": None, "trainer.val_check_interval": 1.0},
        ),
    ],
)  # fmt: skip
def test_good_configs_pass(overrides, parsed):
    """Each config parses, to the values it gives (with their types: a float stays a float, lists become tuples)."""
    settings = read_run_settings(compose_config(*overrides))
    got = {key: operator.attrgetter(key)(settings) for key in parsed}
    assert got == parsed
    assert all(type(got[key]) is type(value) for key, value in parsed.items()), {k: type(v) for k, v in got.items()}


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("data.num_source_views=100", "data.num_source_views: 100 requested"),
        ("data.llffhold=1", "data.llffhold: 1 leaves 0 training"),
        ("data.rays_per_step=100000", "data.rays_per_step"),
        ("data.crop=[1000,1000]", "data.crop"),
    ],
)
def test_config_checked_against_the_scene(override, fragment):
    cfg = compose_config(override)
    read_run_settings(cfg)
    with pytest.raises(UserError, match=fragment.replace("[", r"\[")):
        check_scene(read_run_settings(cfg), load_scene(*scene_and_data(cfg)))


CONFIG_KEYS = [
    "seed",
    "optim.decay_rate",
    "optim.decay_steps",
    "optim.lr_transformer",
    "data.llffhold",
    "data.num_source_views",
    "trainer.max_steps",
    "trainer.val_check_interval",
    "trainer.gradient_clip_val",
    "render.n_samples",
    "data.crop",
    "data.random_source_views",
]
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(-5, 500), max_size=3),
)


@HYPOTHESIS
@given(key=st.sampled_from(CONFIG_KEYS), value=VALUES)
def test_any_config_value_passes_or_is_a_user_error(key, value):
    cfg = compose_config()
    OmegaConf.update(cfg, key, value, force_add=True)
    try:
        read_run_settings(cfg)
    except UserError as err:
        # The key itself, or a check of two keys that names it (max_steps against val_check_interval).
        message = str(err)
        assert (message.startswith(f"{key}:") or f"{key} (" in message) and "\n" not in message, message
        return
    if key.startswith("data."):  # accepted: checked against the scene, again one line at most
        try:
            check_scene(read_run_settings(cfg), load_scene(*scene_and_data(cfg)))
        except UserError as err:
            assert str(err).startswith(f"{key}:") and "\n" not in str(err)


def test_checkpoint_path_that_is_a_folder(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    with pytest.raises(UserError, match="is a folder, not a checkpoint file.*did you mean"):
        resolve_checkpoint(str(tmp_path), tmp_path)


# ---- poses -------------------------------------------------------------------------------------


def _pose_row(rotation: np.ndarray) -> np.ndarray:
    pose = np.concatenate([rotation, np.zeros((3, 1)), np.array([[100.0], [150.0], [120.0]])], axis=1)
    return np.concatenate([pose.reshape(-1), [1.0, 10.0]])


@pytest.mark.parametrize("rotation", [np.zeros((3, 3)), np.diag([1.0, 1.0, 2.0]), np.ones((3, 3))])
def test_non_orthonormal_rotations_are_refused(rotation, tmp_path):
    rows = np.stack([_pose_row(np.eye(3)), _pose_row(rotation)])
    np.save(tmp_path / "poses_bounds.npy", rows)
    with pytest.raises(UserError, match="view\\(s\\) 1 is not orthonormal"):
        read_poses_bounds(tmp_path / "poses_bounds.npy")


ARRAYS = hnp.arrays(
    dtype=st.sampled_from([np.float64, np.float32, np.int64, np.float16, np.uint8, np.bool_]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=20),
    elements=None,
)


@HYPOTHESIS
@given(array=ARRAYS)
def test_any_poses_array_loads_or_is_a_user_error(array, tmp_path):
    file = tmp_path / "poses_bounds.npy"
    np.save(file, array)
    try:
        poses, bounds = read_poses_bounds(file)
    except UserError as err:
        assert str(err).startswith(str(file)) and "\n" not in str(err)
        return
    assert poses.shape == (len(array), 3, 5) and bounds.shape == (len(array), 2)
    assert np.isfinite(poses).all() and (bounds > 0).all()


# ---- images --------------------------------------------------------------------------------------

MODES = ["1", "L", "LA", "P", "PA", "RGB", "RGBA", "I;16", "CMYK", "YCbCr", "I", "F"]


@HYPOTHESIS
@given(
    pixels=hnp.arrays(np.uint8, st.tuples(st.integers(1, 9), st.integers(1, 9), st.just(3))),
    mode=st.sampled_from(MODES),
    ext=st.sampled_from([".png", ".jpg", ".jpeg", ".PNG"]),
)
def test_any_image_mode_loads_or_is_a_user_error(pixels, mode, ext, tmp_path):
    image = Image.fromarray(pixels)
    try:
        image = image.convert(mode)
    except ValueError:
        return
    file = tmp_path / f"image{ext}"
    try:
        image.save(file, format="PNG" if ext.lower() == ".png" else "JPEG")
    except OSError:
        return  # a mode the format cannot store
    try:
        loaded = read_image(file)
    except UserError as err:
        assert str(err).startswith(str(file)) and "\n" not in str(err)
        assert mode in ("I", "F")  # 32-bit integer / float images are the only ones refused
        return
    assert loaded.shape == (*pixels.shape[:2], 3) and loaded.dtype == np.uint8
    if mode == "RGB" and ext.lower() == ".png":
        assert np.array_equal(loaded, pixels)


@HYPOTHESIS
@given(content=st.binary(max_size=200))
def test_any_bytes_as_an_image_load_or_are_a_user_error(content, tmp_path):
    file = tmp_path / "image.png"
    file.write_bytes(content)
    try:
        read_image(file)
    except UserError as err:
        assert str(err).startswith(str(file)) and "\n" not in str(err)


def test_gray_alpha_one_bit_and_16_bit_pngs(tmp_path):
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    Image.fromarray(gray).convert("LA").save(tmp_path / "la.png")
    Image.fromarray(gray > 100).save(tmp_path / "bit.png")
    iio.imwrite(tmp_path / "g16.png", gray.astype(np.uint16) * 257)
    assert np.array_equal(read_image(tmp_path / "la.png")[..., 1], gray)
    assert set(np.unique(read_image(tmp_path / "bit.png"))) <= {0, 255}
    assert np.array_equal(read_image(tmp_path / "g16.png")[..., 2], gray)


def test_empty_and_undecodable_images_are_one_line(tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "text.png").write_text("hello")
    with pytest.raises(UserError, match="empty.png: empty file"):
        read_image(tmp_path / "empty.png")
    with pytest.raises(UserError, match="text.png: cannot read image") as err:
        read_image(tmp_path / "text.png")
    assert "\n" not in str(err.value) and "plugin" not in str(err.value)


def _small_scene(root: Path, n: int = 4) -> Path:
    scene = root / "scene"
    (scene / "images_8").mkdir(parents=True)
    np.save(scene / "poses_bounds.npy", np.stack([_pose_row(np.eye(3))] * n))
    for i in range(n):
        iio.imwrite(scene / "images_8" / f"image{i:03d}.png", np.full((6, 8, 3), 40 * i, np.uint8))
    return scene


def test_hidden_and_appledouble_files_are_ignored(tmp_path):
    scene = _small_scene(tmp_path)
    (scene / "images_8" / "._image000.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (scene / "images_8" / ".DS_Store").write_bytes(b"junk")
    (scene / "images_8" / ".hidden.png").write_bytes(b"junk")
    assert [f.name for f in list_images(scene / "images_8")] == [f"image{i:03d}.png" for i in range(4)]
    assert len(load_llff_scene(scene, factor=8, llffhold=2).image_names) == 4


def test_count_mismatch_names_the_images_without_poses(tmp_path):
    scene = _small_scene(tmp_path)
    iio.imwrite(scene / "images_8" / "zz_extra.png", np.zeros((6, 8, 3), np.uint8))
    with pytest.raises(UserError, match="4 poses but 5 images.*without a pose.*zz_extra.png"):
        load_llff_scene(scene, factor=8)


def test_data_check_writes_nothing(tmp_path, monkeypatch):
    """`python -m pola_gnt.check_scene` prints the summary and leaves no run folder or log anywhere."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    before = set(PROJECT_ROOT.iterdir())
    result = run_module("check_scene", "data.factor=32", cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "scene" in result.stdout and list(tmp_path.iterdir()) == [] and set(PROJECT_ROOT.iterdir()) == before
    monkeypatch.chdir(tmp_path)
    assert_one_error_line(run_in_process("check_scene", "data.llffhold=abc"), "error: data.llffhold")
    assert list(tmp_path.iterdir()) == [] and set(PROJECT_ROOT.iterdir()) == before
