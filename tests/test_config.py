"""The config (`pola_gnt/runs/config/`, the settings in `runs/settings.py` and beside their consumers):
one place for every config check with the right key names, the YAML as the one place of every
default (the settings are its schema, key for key), the YAML inheritance of the presets and scenes,
device-aware defaults (mocked CUDA), and GNT's training recipe checked against the scene."""

from __future__ import annotations

import dataclasses
import re
import shutil
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import CONFIG_DIR, TINY_OVERRIDES, assert_one_error_line, run_in_process, scene_and_data
from helpers import compose_config as compose_run_config
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import pola_gnt
from pola_gnt.core.errors import UserError, check_int, check_number
from pola_gnt.data.scene_loading import load_scene, scene_dir
from pola_gnt.data.settings import ProcessDataSettings, RandomCrop, SceneSettings
from pola_gnt.evaluation.image_metrics import PROTOCOL_DEFAULTS
from pola_gnt.runs.config.app import CONFIG_NAME, GPU_CONFIG_NAME, default_config_name
from pola_gnt.runs.config.read import check_scene, read_process_data_settings, read_run_settings
from pola_gnt.runs.config.schema import composition_error
from pola_gnt.runs.settings import RunSettings


def compose_config(*overrides: str, name: str = CONFIG_NAME):
    with initialize_config_dir(CONFIG_DIR, version_base="1.3"):
        return compose(name, overrides=list(overrides), return_hydra_config=True)


@pytest.fixture
def gpu_present(monkeypatch):
    """A machine with a CUDA device, as far as the config's choices can tell."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# ---- one place, right key names --------------------------------------------------------------


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.net.view_attention=linear", "model.net.view_attention"),  # was named model.view_attention
        ("model.net.ray_attention=subtraction", "model.net.ray_attention"),
        ("model.net.encoder_input_scale=0", "model.net.encoder_input_scale"),  # was model.encoder_input_scale
        ("model.net.encoder_input_scale=1.5", "model.net.encoder_input_scale"),
        ("model.net.readout_consistency_prior=-1", "model.net.readout_consistency_prior"),
        ("model.net.readout_source_colour=sometimes", "model.net.readout_source_colour"),
        ("model.net.compat=ibrnet", "model.net.compat"),
        ("model.net.compat=gnt", "model.net.view_attention"),  # GNT's network: its attention kinds
        ("model.compile=maybe", "model.compile"),
        ("model.net.encoder.stage_blocks=[1]", "model.net.encoder"),
        ("model.net.encoder.stage_channels=[8,0,8]", "model.net.encoder.stage_channels"),
        ("model.net.ffn_mult=0", "model.net.ffn_mult"),
        ("model.net.ray_lepe=sometimes", "model.net.ray_lepe"),
        ("model.net.heads=3", "model.net.width"),  # 16 is not divisible by 2 * 3
        ("data.factor=0", "data.factor"),
        ("data.scale_rays_with_views=1", "data.scale_rays_with_views"),
        ("data.random_crop={heights:[300,200],area:1000}", "data.random_crop.heights"),
        ("data.random_crop={heights:[200,300]}", "data.random_crop.area"),
        ("data.random_crop={heights:[20,30],area:0}", "data.random_crop.area"),
        ("scene.kind=nerf", "scene.kind"),
        ("video.scale=0", "video.scale"),
        ("metrics.extra_protocols=[standard]", "metrics.extra_protocols"),  # metrics.protocol's own
        ("metrics.extra_protocols=[gnt,gnt]", "metrics.extra_protocols"),
        ("metrics.extra_protocols=[nerf]", "metrics.extra_protocols"),
        ("benchmark.mode=fast", "benchmark.mode"),
        ("benchmark.scenes=[fern,fern]", "benchmark.scenes"),
        ("benchmark.budget_minutes=0", "benchmark.budget_minutes"),
    ],
)
def test_bad_values_name_their_full_key(override, key):
    with pytest.raises(UserError) as error:
        cfg = compose_config(*TINY_OVERRIDES, override)
        read_run_settings(cfg)
    message = str(error.value)
    assert message.startswith(f"{key}:") and "\n" not in message, message


def test_each_kind_of_message_is_worded_once():
    """The same check gives the same words wherever the value comes from (config, library call)."""
    from pola_gnt.data.demo_scene import demo_resolution

    with pytest.raises(UserError) as from_library:
        demo_resolution(0)
    with pytest.raises(UserError) as from_config:
        read_run_settings(compose_config("data.factor=0"))
    assert str(from_library.value) == str(from_config.value) == "data.factor: must be a positive integer, got 0"
    with pytest.raises(UserError, match=r"^video.crf: must be an integer from 0 to 51 \(0 lossless, 51 worst\)"):
        check_int(60, "video.crf", 0, 51, why="0 lossless, 51 worst")
    with pytest.raises(UserError, match=r"^optim.decay_rate: must be a number in \(0, 1\]"):
        check_number(0, "optim.decay_rate", 0, 1)
    assert check_int(np.int64(3), "x") == 3 and check_number(2, "x", 0) == 2.0


@pytest.mark.parametrize("experiment", ["quick", "standard", "paper"])
@pytest.mark.parametrize("model", ["gnt", "pola_gnt"])
def test_every_preset_gives_valid_settings(model, experiment):
    settings = read_run_settings(compose_config(f"model={model}", f"experiment={experiment}"))
    assert isinstance(settings, RunSettings) and settings.model.name == model
    if experiment != "quick":  # GNT's model size and training recipe
        assert (settings.model.net.width, settings.model.net.n_blocks, settings.model.net.encoder.stage_blocks) == (
            64,
            4,
            (3, 4, 6),
        )
        assert settings.data.random_crop == RandomCrop(heights=(250, 750), area=240000)
        assert settings.data.scale_rays_with_views and settings.data.factor == 4 and settings.render.n_samples == 192
    else:
        assert settings.data.random_crop is None and not settings.data.scale_rays_with_views


def test_pola_gnt_yaml_is_gnt_plus_its_attention():
    """conf/model/pola_gnt.yaml inherits GNT's file and sets only its name and 3 attention keys."""
    text = yaml.safe_load((Path(CONFIG_DIR) / "model" / "pola_gnt.yaml").read_text())
    assert text["defaults"] == ["gnt", "_self_"]
    assert set(text) == {"defaults", "name", "net"} and set(text["net"]) == {
        "view_attention",
        "ray_attention",
        "ray_lepe",
    }
    gnt, pola = compose_config("model=gnt").model, compose_config("model=pola_gnt").model
    assert {k for k in gnt.net if gnt.net[k] != pola.net[k]} == {"view_attention", "ray_attention", "ray_lepe"}


# ---- device-aware defaults ------------------------------------------------------------------


def _choices(cfg) -> tuple[str, str, str, str]:
    choices = cfg.hydra.runtime.choices
    return choices.trainer, choices.experiment, cfg.trainer.accelerator, cfg.trainer.precision


def test_without_a_gpu_the_defaults_are_cpu_and_quick(no_gpu):
    assert default_config_name() == CONFIG_NAME
    assert _choices(compose_config()) == ("cpu", "quick", "cpu", "32-true")


def test_with_a_gpu_the_defaults_are_gpu_bf16_and_standard(gpu_present):
    assert default_config_name() == GPU_CONFIG_NAME
    cfg = compose_config(name=GPU_CONFIG_NAME)
    assert _choices(cfg) == ("gpu", "standard", "gpu", "bf16-mixed")
    assert cfg.trainer.max_steps == 16000 and cfg.model.net.width == 64 and cfg.data.rays_per_step == 512
    assert cfg.data.targets_per_step == 4  # 4 x 512 rays: half the paper's 8 x 512
    # The rest of the config is the project's: the GPU file only changes the two choices.
    cpu = OmegaConf.to_container(compose_config("trainer=gpu", "experiment=standard"), resolve=False)
    gpu = OmegaConf.to_container(cfg, resolve=False)
    for part in (cpu, gpu):
        part.pop("hydra")
    assert cpu == gpu


@pytest.mark.parametrize(
    "name, overrides, expected",
    [
        (GPU_CONFIG_NAME, ["trainer=cpu"], ("cpu", "standard", "cpu", "32-true")),
        (GPU_CONFIG_NAME, ["experiment=quick"], ("gpu", "quick", "gpu", "bf16-mixed")),
        (GPU_CONFIG_NAME, ["experiment=paper", "trainer=cpu"], ("cpu", "paper", "cpu", "32-true")),
        (GPU_CONFIG_NAME, ["trainer=ddp"], ("ddp", "standard", "auto", "bf16-mixed")),
        (CONFIG_NAME, ["trainer=gpu"], ("gpu", "quick", "gpu", "bf16-mixed")),
        (CONFIG_NAME, ["experiment=paper"], ("gpu", "paper", "gpu", "32-true")),  # paper selects the GPU, in fp32
        (CONFIG_NAME, ["experiment=paper", "trainer=cpu"], ("cpu", "paper", "cpu", "32-true")),
    ],
)
def test_explicit_choices_win(name, overrides, expected):
    assert _choices(compose_config(*overrides, name=name)) == expected


def test_the_choice_is_printed_and_cfg_job_follows_the_machine(tmp_path, monkeypatch):
    run_dir = f"hydra.run.dir={tmp_path}"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # A bad value stops the command after the line: no training starts.
    result = run_in_process("train", "data.rays_per_step=0", run_dir)
    assert (
        result.stdout.splitlines()[0]
        == "device: cuda (bf16; auto: GPU present), experiment: standard (auto: GPU present)"
    )
    assert_one_error_line(result, "data.rays_per_step")
    result = run_in_process("train", "trainer=cpu", "experiment=quick", "data.rays_per_step=0", run_dir)
    assert result.stdout.splitlines()[0] == "device: cpu (fp32; given), experiment: quick (given)"
    shown = run_in_process("train", "--cfg", "job")
    assert shown.returncode == 0 and "accelerator: gpu" in shown.stdout and "max_steps: 16000" in shown.stdout
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = run_in_process("eval", "ckpt_path=missing.ckpt", run_dir)
    assert result.stdout.splitlines()[0] == "device: cpu (fp32; auto: no GPU)"
    assert_one_error_line(result, "missing.ckpt")
    shown = run_in_process("train", "--cfg", "job")
    assert "accelerator: cpu" in shown.stdout and "max_steps: 500" in shown.stdout


def test_a_gpu_trainer_without_a_gpu_is_one_error_line(tmp_path, no_gpu):
    result = run_in_process("train", "experiment=paper", f"hydra.run.dir={tmp_path}")
    assert (
        result.stdout.splitlines()[0] == "device: cuda (fp32; selected by experiment=paper), experiment: paper (given)"
    )
    assert_one_error_line(result, "trainer.accelerator", "trainer=cpu")
    assert list(tmp_path.iterdir()) == [Path(tmp_path, ".hydra")]  # Hydra's record only, nothing of a run


# ---- GNT's recipe against the scene ---------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["data.random_crop={heights:[200,300],area:40000}"], "data.random_crop: none of its sizes"),
        (
            ["data.random_crop={heights:[20,30],area:400}", "data.rays_per_step=500"],
            "data.random_crop: a 24x16 random crop has 384 pixels, fewer than data.rays_per_step (500)",
        ),
        (["data.random_crop={heights:[40,80],area:4000}", "data.crop=[32,32]"], "data.random_crop: set together"),
        (
            ["data.rays_per_step=8000", "data.scale_rays_with_views=true"],
            "data.rays_per_step: 8000 (up to 24000 with data.scale_rays_with_views)",
        ),
        (["data.crop=[12,12]", "data.rays_per_step=16"], "data.crop: the smallest side"),
        (
            ["data.crop=[32,32]", "model.net.working_size=64"],
            "data.crop: training crops with model.net.working_size 64",
        ),
    ],
)
def test_the_recipe_is_checked_against_the_scene(overrides, key):
    with pytest.raises(UserError) as error:
        cfg = compose_config(*TINY_OVERRIDES, *overrides)
        check_scene(read_run_settings(cfg), load_scene(*scene_and_data(cfg)))
    assert key in str(error.value) and "\n" not in str(error.value), str(error.value)


# --------------------------------------------------------------------------------------------------
# The YAML is the one place a default lives: the settings objects mirror it key for key


def _yaml_leaves(node, prefix: str = "") -> dict[str, object]:
    """Dotted key -> value of every leaf of a composed config (lists and nulls are leaves)."""
    leaves = {}
    for key, value in node.items():
        path = f"{prefix}{key}"
        leaves.update(_yaml_leaves(value, f"{path}.") if isinstance(value, dict) and value else {path: value})
    return leaves


def _settings_leaves(settings, prefix: str = "") -> dict[str, object]:
    """Dotted field path -> value of every leaf of a settings object (tuples as lists, like the YAML)."""
    leaves = {}
    for field in dataclasses.fields(settings):
        value, path = getattr(settings, field.name), f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            leaves.update(_settings_leaves(value, f"{path}."))
        elif isinstance(value, tuple):  # a list in the YAML; a list of sections: a list of mappings
            leaves[path] = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value]  # type: ignore[arg-type]
        else:
            leaves[path] = value
    return leaves


def _settings_classes(cls, seen=None) -> set[type]:
    seen = set() if seen is None else seen
    seen.add(cls)
    for hint in typing.get_type_hints(cls).values():
        for kind in typing.get_args(hint) or (hint,):
            if dataclasses.is_dataclass(kind) and kind not in seen:
                _settings_classes(kind, seen)
    return seen


@pytest.mark.parametrize("model", ["gnt", "pola_gnt"])
@pytest.mark.parametrize("experiment", ["quick", "standard", "paper", "pretrain", "finetune"])
def test_run_settings_mirror_the_yaml_key_for_key(model, experiment):
    """Every key of conf/config.yaml (with each model and experiment) is one settings field with the
    YAML's value, and every field is a key: a new key cannot be added in one place only."""
    init = ["init_from=pretrained:pola_gnt"] if experiment == "finetune" else []
    cfg = compose_run_config(f"model={model}", f"experiment={experiment}", "trainer=cpu", *init)
    raw = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(raw, dict)
    raw.pop("hydra", None)
    yaml_leaves, settings_leaves = _yaml_leaves(raw), _settings_leaves(read_run_settings(cfg))
    # a null LPIPS network or quantisation is the protocol's own: the settings hold the resolved value
    protocol = PROTOCOL_DEFAULTS[yaml_leaves["metrics.protocol"]]
    for key, default in (("metrics.lpips_net", protocol.lpips_net), ("metrics.quantize_8bit", protocol.quantize_8bit)):
        if yaml_leaves[key] is None:
            yaml_leaves[key] = default
    # the one key a config may leave out: a collection folder's kind (cpu_mix's folders, written before
    # kinds as the shipped checkpoints store them, have none) is auto (runs/config/read.py, yaml_forms)
    for folder in yaml_leaves.get("collection.folders") or []:
        folder.setdefault("kind", "auto")
    assert sorted(yaml_leaves) == sorted(settings_leaves)
    assert yaml_leaves == settings_leaves


def test_process_data_settings_mirror_their_yaml_key_for_key():
    raw = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "process_data.yaml"))
    assert isinstance(raw, dict)
    for key in ("defaults", "hydra"):
        raw.pop(key)
    raw.update(input="photos", out="scene")  # the two keys without a default
    settings = read_process_data_settings(OmegaConf.create(raw))
    assert _yaml_leaves(raw) == _settings_leaves(settings)


def test_no_settings_class_holds_a_default_of_its_own():
    """The defaults are the YAML's; a dataclass default would be a second one (and would win silently
    for a key missing from the YAML)."""
    classes = _settings_classes(RunSettings) | {ProcessDataSettings}
    assert len(classes) >= 12
    defaults = [
        f"{cls.__name__}.{field.name}"
        for cls in classes
        for field in dataclasses.fields(cls)
        if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
    ]
    assert defaults == []


def test_a_key_missing_from_the_config_is_one_error_line_naming_it():
    cfg = compose_run_config()
    del cfg.model.net.ffn_mult
    with pytest.raises(UserError, match=r"^model\.net\.ffn_mult: must be set \(missing from the config\)$"):
        read_run_settings(cfg)


def test_a_key_that_nothing_reads_is_one_error_line_naming_it():
    """`+key=value` adds keys to the config; one that no setting reads (a misspelt Lightning argument,
    say) is refused instead of silently doing nothing."""
    cfg = compose_run_config("+trainer.max_step=5")
    with pytest.raises(UserError, match=r"^trainer\.max_step: not a config key"):
        read_run_settings(cfg)


def test_a_misspelt_key_is_one_error_line_naming_the_meant_one(tmp_path):
    """The settings classes are Hydra's schema: a key that is no setting stops the command as it
    composes its config, given on the command line or written in a YAML file, in one line."""
    meant = r"^model\.net\.widht: not a config key; did you mean model\.net\.width\?$"
    with pytest.raises(UserError, match=meant):
        compose_run_config("model.net.widht=3")
    result = run_in_process("check_scene", "scene=fern", "model.net.widht=3")
    assert_one_error_line(result, "error: model.net.widht: not a config key", "model.net.width?")
    assert_one_error_line(run_in_process("check_scene", "model.net=5"), "error: model.net: must be a config section")
    conf = tmp_path / "conf"
    shutil.copytree(CONFIG_DIR, conf)
    (conf / "scene" / "typo.yaml").write_text("defaults:\n  - llff\n  - _self_\n\nname: fern\nrigg: auto\n")
    with initialize_config_dir(str(conf), version_base="1.3"), pytest.raises(Exception) as error:
        compose("config", overrides=["scene=typo"])
    assert str(composition_error(error.value, RunSettings)) == "scene.rigg: not a config key; did you mean scene.rig?"


def test_a_scenes_settings_live_in_one_file():
    """conf/scene/fern.yaml and its kin name one scene over the settings of its kind (llff.yaml,
    blender.yaml), nothing else: `scene=fern` is `scene=llff scene.name=fern`."""
    named = {}
    for file in sorted((Path(CONFIG_DIR) / "scene").glob("*.yaml")):
        content = yaml.safe_load(file.read_text())
        if "defaults" in content:
            named[file.stem] = base = content["defaults"][0]
            assert content == {"defaults": [base, "_self_"], "name": file.stem}, file
            scene = compose_run_config(f"scene={file.stem}").scene
            assert scene == compose_run_config(f"scene={base}", f"scene.name={file.stem}").scene
    assert sorted(named.values()) == ["blender"] * 8 + ["llff"] * 8
    assert read_run_settings(compose_run_config("scene=lego")).scene == SceneSettings("lego", "blender", None, "object")
    assert read_run_settings(compose_run_config("scene=fern")).scene == SceneSettings("fern", "llff", None, "auto")
    unnamed = read_run_settings(compose_run_config("scene=blender"))
    with pytest.raises(UserError, match=r"^scene=blender needs scene.path=DIR \(or scene.name=NAME under data.synt"):
        scene_dir(unnamed.scene, unnamed.data)


def test_only_the_entry_points_and_the_config_package_read_the_raw_config():
    """Below the entry points everything takes typed settings: no module outside `runs/config/`, the
    entry points (the files directly in `pola_gnt/`) and the Python API (`api/`, which composes the config
    as a command does) mentions Hydra's `DictConfig` or reads `cfg.`."""
    package = Path(pola_gnt.__file__).parent
    readers = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if len(relative.parts) == 1 or relative.parts[:2] == ("runs", "config") or relative.parts[0] == "api":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "DictConfig" in line or re.search(r"\bcfg\.", line):
                readers.append(f"{relative}:{number}: {line.strip()}")
    assert readers == []
