"""The AlexNet backbone encoder (model.backbone): offline ImageNet weights, frozen layers, errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from helpers import TINY_OVERRIDES, compose_config, run_settings, system_of

from pola_gnt.core.errors import UserError
from pola_gnt.data.datamodule import TrainSteps
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.model.backbone import AlexNetEncoder
from pola_gnt.model.encoder import ImageEncoder
from pola_gnt.model.feature_cache import MB, FrozenFeatureCache
from pola_gnt.model.gnt import GNT
from pola_gnt.runs.config.read import read_run_settings
from pola_gnt.runs.config.stored import CONFIG_DIR, check_compatible, run_config_with_overrides


def _settings(weights, trainable: int = 0):
    encoder = run_settings(
        "model.net.encoder.backbone=alexnet", f"model.net.encoder.backbone_weights={weights}"
    ).model.net.encoder
    return replace(encoder, backbone_trainable_layers=trainable)


def test_loads_the_offline_weights_exactly(lpips_alex_weights):
    torch.manual_seed(0)
    encoder = AlexNetEncoder(_settings(lpips_alex_weights)).eval()
    reference = torchvision.models.alexnet(weights=None).eval()
    with np.load(lpips_alex_weights) as npz:
        state = {k.removeprefix("features."): torch.from_numpy(npz[k]) for k in npz.files if k.startswith("features.")}
    reference.features.load_state_dict(state)
    image = torch.rand(1, 3, 67, 91)
    x = (image - encoder.mean) / encoder.std
    with torch.no_grad():
        ours = encoder.stages(x)
        theirs = reference.features[:12](x)  # features up to conv5's relu
        assert torch.allclose(ours[-1], theirs, atol=1e-5)
        assert torch.allclose(ours[0], reference.features[:2](x), atol=1e-5)


@pytest.mark.parametrize("trainable", [0, 1])
def test_frozen_means_frozen(lpips_alex_weights, trainable):
    torch.manual_seed(0)
    cfg = compose_config(
        "model=gnt",
        *TINY_OVERRIDES,
        "model.net.encoder.backbone=alexnet",
        f"model.net.encoder.backbone_weights={lpips_alex_weights}",
        f"model.net.encoder.backbone_trainable_layers={trainable}",
    )
    settings = read_run_settings(cfg)
    scene = load_scene(settings.scene, settings.data)
    batch = TrainSteps(scene, settings.data, n_steps=1, seed=0, rank=0)[0].targets[0]
    system = system_of(cfg)
    encoder = system.net.encoder
    assert isinstance(encoder, AlexNetEncoder)
    convs = {name: p.detach().clone() for name, p in encoder.convs.named_parameters()}
    head = {name: p.detach().clone() for name, p in encoder.head.named_parameters()}
    optimizer = system.configure_optimizers()["optimizer"]
    optimised = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for _ in range(2):
        loss = F.mse_loss(system.render_batch(batch).rgb, batch.rgb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trained = set()
    for name, p in encoder.convs.named_parameters():
        if torch.equal(p, convs[name]):
            assert not p.requires_grad and p.grad is None and id(p) not in optimised, name
        else:
            trained.add(name.split(".")[0])
    assert trained == ({"4"} if trainable else set())
    assert any(not torch.equal(p, head[name]) for name, p in encoder.head.named_parameters())


def test_bad_weights_are_one_error_line(tmp_path):
    missing = tmp_path / "missing.npz"
    with pytest.raises(UserError, match="backbone_weights: .*missing.npz: no such file") as err:
        AlexNetEncoder(_settings(missing))
    assert "\n" not in str(err.value)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, something=np.zeros(3))
    with pytest.raises(UserError, match="backbone_weights: .*wrong.npz: no AlexNet features.0.weight") as err:
        AlexNetEncoder(_settings(wrong))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("model.net.encoder.backbone=vgg", "model.net.encoder.backbone"),
        ("model.net.encoder.backbone_trainable_layers=6", "model.net.encoder.backbone_trainable_layers"),
        ("model.net.encoder.backbone_trainable_layers=-1", "model.net.encoder.backbone_trainable_layers"),
        ("model.net.encoder.feature_cache_mb=-1", "model.net.encoder.feature_cache_mb: must be a non-negative"),
        ("model.net.encoder.feature_cache_mb=big", "model.net.encoder.feature_cache_mb"),
    ],
)
def test_bad_backbone_settings_are_one_error_line(override, fragment):
    with pytest.raises(UserError, match=fragment) as err:
        read_run_settings(compose_config(override))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("size", [(60, 84), (63, 85)])
def test_output_shape_matches_image_encoder(lpips_alex_weights, size):
    settings = _settings(lpips_alex_weights)
    images = torch.rand(2, 3, *size)
    with torch.no_grad():
        ours = AlexNetEncoder(settings)(images)
        theirs = ImageEncoder(settings)(images)
    assert ours.shape == theirs.shape == (2, settings.feature_channels, -(-size[0] // 4), -(-size[1] // 4))


def test_a_checkpoint_is_self_contained(lpips_alex_weights, tmp_path, monkeypatch):
    """The backbone's convolutions travel in the state dict: a network rebuilt for a checkpoint
    (`weights_from_checkpoint`, as eval, videos and the viewer do) needs no npz."""
    from pola_gnt.model.backbone import weights_from_checkpoint

    trained = AlexNetEncoder(_settings(lpips_alex_weights))
    monkeypatch.delenv("POLA_GNT_LPIPS_WEIGHTS", raising=False)
    missing = tmp_path / "gone.npz"
    with pytest.raises(UserError, match="gone.npz"):
        AlexNetEncoder(_settings(missing))
    with weights_from_checkpoint():
        rebuilt = AlexNetEncoder(_settings(missing))
    rebuilt.load_state_dict(trained.state_dict(), strict=True)
    image = torch.rand(1, 3, 64, 80)
    with torch.no_grad():
        assert torch.equal(rebuilt(image), trained(image))


# ---- the feature cache of the frozen convs (model.feature_cache) ------------------------------------


def _net(weights, trainable: int = 0, scale: float = 0.5) -> GNT:
    settings = run_settings(
        "model=gnt",
        *TINY_OVERRIDES,
        "model.net.encoder.backbone=alexnet",
        f"model.net.encoder.backbone_weights={weights}",
        f"model.net.encoder.backbone_trainable_layers={trainable}",
        f"model.net.encoder_input_scale={scale}",
    )
    torch.manual_seed(0)
    return GNT(settings.model.net).train()


def _alexnet(net: GNT) -> AlexNetEncoder:
    assert isinstance(net.encoder, AlexNetEncoder)
    return net.encoder


def _images(n: int = 4, size: tuple[int, int] = (94, 126)) -> tuple[torch.Tensor, list[tuple[str, int]]]:
    generator = torch.Generator().manual_seed(1)
    return torch.rand(n, 3, *size, generator=generator), [("scene", view) for view in range(n)]


@pytest.mark.parametrize(("trainable", "scale"), [(0, 0.5), (2, 1.0), (4, 0.5)])
def test_the_feature_cache_gives_a_fresh_encodes_features_bit_for_bit(lpips_alex_weights, trainable, scale):
    net = _net(lpips_alex_weights, trainable, scale)
    images, keys = _images()
    cache = FrozenFeatureCache(64)
    for order in ([0, 1, 2], [1, 3, 0, 2], [1, 3, 0, 2], [2]):  # all missing, mixed, all kept, one
        fresh = net.encode(images[order])
        cached = cache.encode(net, images[order], [keys[i] for i in order])
        assert cached.dtype == fresh.dtype == torch.float32 and torch.equal(cached, fresh), order
        # the gradients of the trainable layers too
        trainable_params = [p for p in net.encoder.parameters() if p.requires_grad]
        fresh_grads = torch.autograd.grad(fresh.square().sum(), trainable_params)
        cached_grads = torch.autograd.grad(cached.square().sum(), trainable_params)
        assert all(torch.equal(a, b) for a, b in zip(fresh_grads, cached_grads, strict=True))
    assert (cache.hits, cache.misses) == (3 + 4 + 1, 4)
    for _, maps in cache.entries.values():
        assert all(not t.requires_grad and t.grad_fn is None and t.dtype == torch.float32 for t in maps)
        assert [t.shape[0] for t in maps] == [1] * len(_alexnet(net).kept_stages)


def test_the_feature_cache_holds_its_bound_least_recently_used_out_first(lpips_alex_weights):
    net = _net(lpips_alex_weights)
    images, keys = _images(5)
    probe = FrozenFeatureCache(64)
    probe.encode(net, images[:1], keys[:1])
    one_image = probe.bytes  # every image here is the same size
    cache = FrozenFeatureCache(2.5 * one_image / MB)  # room for two
    for view in (0, 1, 2):
        cache.encode(net, images[view : view + 1], keys[view : view + 1])
        assert cache.bytes <= cache.max_bytes
    assert [key[0] for key in cache.entries] == [keys[1], keys[2]]
    cache.encode(net, images[1:2], keys[1:2])  # 1 used: 2 is now the least recent
    cache.encode(net, images[3:5], keys[3:5])
    assert [key[0] for key in cache.entries] == [keys[3], keys[4]]
    assert cache.bytes == 2 * one_image <= cache.max_bytes
    assert (cache.hits, cache.misses) == (1, 5)
    too_small = FrozenFeatureCache(0.5 * one_image / MB)  # not even one image: nothing kept
    too_small.encode(net, images[:2], keys[:2])
    assert not too_small.entries and too_small.bytes == 0


def test_the_feature_cache_only_where_nothing_it_holds_trains(lpips_alex_weights):
    images, keys = _images(2)
    cfg = compose_config(
        "model=gnt",
        *TINY_OVERRIDES,
        "model.net.encoder.backbone=alexnet",
        f"model.net.encoder.backbone_weights={lpips_alex_weights}",
        "model.net.encoder.backbone_trainable_layers=5",
    )
    assert system_of(cfg).feature_cache is None  # every conv trains: nothing frozen to keep
    cfg.model.net.encoder.backbone_trainable_layers = 0
    cfg.model.net.encoder.feature_cache_mb = 0
    assert system_of(cfg).feature_cache is None  # off
    cfg.model.net.encoder.backbone = "none"
    cfg.model.net.encoder.feature_cache_mb = 1024
    assert system_of(cfg).feature_cache is None  # the ResNet-style encoder trains whole

    net = _net(lpips_alex_weights, trainable=5)
    cache = FrozenFeatureCache(64)
    assert torch.equal(cache.encode(net, images, keys), net.encode(images)) and not cache.entries
    net = _net(lpips_alex_weights)
    _alexnet(net).convs[0].requires_grad_(True)  # a cached conv that trains after all
    assert torch.equal(cache.encode(net, images, keys), net.encode(images)) and not cache.entries
    net = _net(lpips_alex_weights)
    for context in (torch.no_grad, torch.inference_mode):  # validation, eval, rendering
        with context():
            assert torch.equal(cache.encode(net, images, keys), net.encode(images)) and not cache.entries
    net.eval()
    assert torch.equal(cache.encode(net, images, keys), net.encode(images)) and not cache.entries
    net.train()
    assert torch.equal(cache.encode(net, images, None), net.encode(images)) and not cache.entries  # unnamed
    cache.encode(net, images, keys)
    assert len(cache.entries) == 2


def test_training_names_its_sources_but_not_cropped_ones(lpips_alex_weights):
    cfg = compose_config(
        "model=gnt",
        *TINY_OVERRIDES,
        "model.net.encoder.backbone=alexnet",
        f"model.net.encoder.backbone_weights={lpips_alex_weights}",
    )
    settings = read_run_settings(cfg)
    scene = load_scene(settings.scene, settings.data)
    sources = TrainSteps(scene, settings.data, n_steps=1, seed=0, rank=0)[0].targets[0].sources
    assert sources.image_keys == tuple(
        (str(scene.path), scene.factor, int(i), scene.image_names[int(i)]) for i in sources.ids
    )
    cropped = TrainSteps(scene, replace(settings.data, crop=(40, 60)), n_steps=1, seed=0, rank=0)[0]
    assert cropped.targets[0].sources.image_keys is None

    system = system_of(cfg)
    assert system.feature_cache is not None
    before = set(system.state_dict())
    batch = TrainSteps(scene, settings.data, n_steps=2, seed=0, rank=0)
    for step in range(2):
        system.render_batch(batch[step].targets[0]).rgb.sum().backward()
    assert system.feature_cache.entries  # training steps filled it ...
    assert set(system.state_dict()) == before  # ... and it is in no state dict, so in no checkpoint
    assert not any(isinstance(m, FrozenFeatureCache) for m in system.modules())


def test_training_keeps_the_consistency_features_of_its_sources(lpips_alex_weights):
    """The read-out's consistency features are frozen convs too: a network with them gets the cache
    whatever its encoder, and its training steps render what a system without the cache renders."""
    cfg = compose_config(
        "model=pola_gnt",
        *TINY_OVERRIDES,
        f"model.net.encoder.backbone_weights={lpips_alex_weights}",
        "model.net.readout_consistency_prior=40",
        "model.net.readout_consistency_features=0.3",
        "model.net.readout_consistency_feature_dims=16",
    )
    settings = read_run_settings(cfg)
    torch.manual_seed(0)
    system = system_of(cfg)
    assert system.feature_cache is not None and not isinstance(system.net.encoder, AlexNetEncoder)
    cfg.model.net.encoder.feature_cache_mb = 0
    uncached = system_of(cfg)
    assert uncached.feature_cache is None
    uncached.load_state_dict(system.state_dict())
    scene = load_scene(settings.scene, settings.data)
    steps = TrainSteps(scene, settings.data, n_steps=3, seed=0, rank=0)
    for step in (0, 1, 0):  # the third draws the first's sources again: all kept
        batch = steps[step].targets[0]
        assert torch.equal(system.render_batch(batch).rgb, uncached.render_batch(batch).rgb)
    cache = system.feature_cache
    assert cache.hits >= settings.data.num_source_views and all(key[0] == "consistency" for key in cache.entries)


def test_the_cache_size_is_the_machines_not_the_checkpoints(tmp_path):
    """A checkpoint resumes, evaluates and fine-tunes under another cache size; the network's keys still count."""
    stored = compose_config("model.net.encoder.backbone=alexnet", "model.net.encoder.feature_cache_mb=0")
    asked = compose_config("model.net.encoder.backbone=alexnet", "model.net.encoder.feature_cache_mb=64")
    assert check_compatible(tmp_path / "run.ckpt", asked, stored) is stored
    config = run_config_with_overrides(tmp_path / "run.ckpt", stored, asked, [], CONFIG_DIR)
    assert config.model.net.encoder.feature_cache_mb == 64
    other = compose_config("model.net.encoder.backbone=alexnet", "model.net.encoder.backbone_trainable_layers=1")
    with pytest.raises(UserError, match="backbone_trainable_layers"):
        check_compatible(tmp_path / "run.ckpt", other, stored)


# ---- where a null backbone_weights finds the npz ------------------------------------------------------


def test_null_weights_are_found_as_the_lpips_weights(lpips_alex_weights, tmp_path, monkeypatch):
    monkeypatch.delenv("POLA_GNT_LPIPS_WEIGHTS", raising=False)
    settings = replace(_settings(lpips_alex_weights), backbone_weights=None)
    with pytest.raises(UserError, match="null, and neither metrics.lpips_weights nor") as err:
        AlexNetEncoder(settings)
    assert "\n" not in str(err.value)
    reference = AlexNetEncoder(_settings(lpips_alex_weights)).convs.state_dict()

    def convs(encoder: AlexNetEncoder) -> bool:
        return all(torch.equal(v, reference[k]) for k, v in encoder.convs.state_dict().items())

    # the run's metrics.lpips_weights: the alex file, or a VGG file beside it, or their folder
    vgg = tmp_path / "vgg_v0.1.npz"
    vgg.write_bytes(b"")
    (tmp_path / "alex_v0.1.npz").write_bytes(lpips_alex_weights.read_bytes())
    for given in (lpips_alex_weights, vgg, tmp_path):
        assert convs(AlexNetEncoder(settings, lpips_weights=str(given)))
    # through the run config, as training builds it
    cfg = compose_config(
        "model=gnt",
        *TINY_OVERRIDES,
        "model.net.encoder.backbone=alexnet",
        f"metrics.lpips_weights={lpips_alex_weights}",
    )
    encoder = system_of(cfg).net.encoder
    assert isinstance(encoder, AlexNetEncoder) and convs(encoder)
    # a VGG file with no AlexNet beside it: on to $POLA_GNT_LPIPS_WEIGHTS, else one error line
    lonely = tmp_path / "lonely" / "vgg_v0.1.npz"
    lonely.parent.mkdir()
    lonely.write_bytes(b"")
    with pytest.raises(UserError, match="neither metrics.lpips_weights nor"):
        AlexNetEncoder(settings, lpips_weights=str(lonely))
    monkeypatch.setenv("POLA_GNT_LPIPS_WEIGHTS", str(lpips_alex_weights))
    assert convs(AlexNetEncoder(settings, lpips_weights=str(lonely)))
    # metrics.lpips_weights comes first, as for LPIPS; a file it names that is no npz: one error line
    garbage = tmp_path / "garbage" / "alex_v0.1.npz"
    garbage.parent.mkdir()
    garbage.write_text("not an npz\nat all\n")
    with pytest.raises(UserError, match=r"alex_v0.1.npz \(from metrics.lpips_weights\): not a readable npz") as err:
        AlexNetEncoder(settings, lpips_weights=str(garbage))
    assert "\n" not in str(err.value)


def test_training_with_the_cache_is_training_without_it(lpips_alex_weights):
    """Five training steps (steps 3 and 4 draw sources drawn before) give the same weights, bit for bit."""
    weights = {}
    for cache_mb in (0, 64):
        cfg = compose_config(
            "model=gnt",
            *TINY_OVERRIDES,
            "model.net.encoder.backbone=alexnet",
            f"model.net.encoder.backbone_weights={lpips_alex_weights}",
            "model.net.encoder.backbone_trainable_layers=1",
            f"model.net.encoder.feature_cache_mb={cache_mb}",
        )
        settings = read_run_settings(cfg)
        scene = load_scene(settings.scene, settings.data)
        steps = TrainSteps(scene, settings.data, n_steps=5, seed=0, rank=0)
        torch.manual_seed(0)
        system = system_of(cfg)
        optimizer = system.configure_optimizers()["optimizer"]
        for step in range(5):
            optimizer.zero_grad()
            target = steps[step].targets[0]
            F.mse_loss(system.render_batch(target).rgb, target.rgb).backward()
            optimizer.step()
        assert (system.feature_cache is not None) == (cache_mb > 0)
        if system.feature_cache is not None:
            assert (system.feature_cache.hits, system.feature_cache.misses) == (6, 9)
        weights[cache_mb] = {k: v.clone() for k, v in system.state_dict().items()}
    assert all(torch.equal(weights[0][k], weights[64][k]) for k in weights[0])


def test_the_heads_per_stage_reduction_is_a_1x1_conv_of_the_resized_concatenation(lpips_alex_weights):
    """Each taken stage's 1x1 conv before its resizing equals one 1x1 conv of the resized maps'
    concatenation (what the head computed before the reduction moved), in float64 to rounding."""
    torch.manual_seed(0)
    encoder = AlexNetEncoder(_settings(lpips_alex_weights, trainable=0)).double().eval()
    images = torch.rand(2, 3, 70, 93, dtype=torch.float64)
    size = encoder.feature_size(images)
    with torch.no_grad():
        outs = encoder.stages((images - encoder.mean) / encoder.std)
        maps = [F.interpolate(outs[i], size=size, mode="bilinear", align_corners=False) for i in (0, 1, 2, 4)]
        weight = torch.cat([reduce.weight for reduce in encoder.reduce], dim=1)
        bias = encoder.reduce[0].bias
        concatenated = F.conv2d(torch.cat(maps, dim=1), weight, bias)
        expected = encoder.head(concatenated)
        assert torch.allclose(encoder(images), expected, rtol=0, atol=1e-10)
