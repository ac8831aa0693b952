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
from pola_gnt.data.scenes import load_scene
from pola_gnt.model.backbone import AlexNetEncoder
from pola_gnt.model.encoder import ImageEncoder
from pola_gnt.runs.config.read import read_run_settings


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
