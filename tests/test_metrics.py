"""PSNR / SSIM / LPIPS: reference formulas, the official LPIPS scores, the weight lookup and the CLI."""

from __future__ import annotations

import json
import os
import urllib.error
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from helpers import CommandResult, assert_one_error_line, run_module

from pola_gnt.core.errors import UserError
from pola_gnt.core.paths import LPIPS_WEIGHTS_ENV
from pola_gnt.evaluation.image_metrics import (
    ImageMetrics,
    backbone_parameters,
    build_lpips_skeleton,
    linear_parameters,
    load_lpips,
    lpips_distance,
    psnr,
    read_float_image,
    ssim,
)
from pola_gnt.metrics import main


def _calibration(calibration_dir: Path) -> tuple[dict[str, float], float]:
    expected = json.loads((calibration_dir / "expected.json").read_text())
    return expected["scores"], expected["tolerance"]


def _pair_chw(calibration_dir: Path, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(distorted, reference) `[3, H, W]` in [0, 1]."""
    dist = read_float_image(calibration_dir / "dist" / f"{name}.bmp").permute(2, 0, 1)
    ref = read_float_image(calibration_dir / "ref" / f"{name}.bmp").permute(2, 0, 1)
    return dist, ref


@pytest.fixture
def offline(monkeypatch):
    """No LPIPS source at all: no env var, and torchvision's weights can't be fetched."""
    monkeypatch.delenv(LPIPS_WEIGHTS_ENV, raising=False)

    def no_network(*args, **kwargs):
        raise urllib.error.URLError("no network (simulated)")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)


# --------------------------------------------------------------------------------------------
# PSNR


def test_psnr_matches_hand_computation():
    gt = torch.zeros(2, 3, 8, 8)
    pred = gt + torch.tensor([0.1, 0.01])[:, None, None, None]  # MSE 1e-2 and 1e-4
    assert torch.allclose(psnr(pred, gt), torch.tensor([20.0, 40.0]), atol=1e-4)

    rng = np.random.default_rng(0)
    gt_np, pred_np = rng.random((3, 10, 12)), rng.random((3, 10, 12))
    expected = -10 * np.log10(np.mean((pred_np - gt_np) ** 2))
    value = psnr(torch.from_numpy(pred_np), torch.from_numpy(gt_np))
    assert value.shape == () and value.item() == pytest.approx(expected, abs=1e-9)


def test_quantisation_and_clipping_change_psnr_as_expected(offline):
    gt = torch.full((32, 32, 3), 100 / 255)
    exact = ImageMetrics(quantize_8bit=False)
    rounded = ImageMetrics(quantize_8bit=True)

    # 0.3 levels off: lost when rounding to 8 bits, 20 log10(255 / 0.3) dB otherwise.
    pred = gt + 0.3 / 255
    assert exact(pred, gt)["psnr"] == pytest.approx(20 * np.log10(255 / 0.3), abs=1e-3)
    assert rounded(pred, gt)["psnr"] == float("inf")
    # 0.7 levels off: rounds to one full level, 20 log10(255) dB.
    pred = gt + 0.7 / 255
    assert rounded(pred, gt)["psnr"] == pytest.approx(20 * np.log10(255), abs=1e-3)
    # The prediction is clipped to [0, 1] before scoring.
    assert exact(torch.full((32, 32, 3), 1.5), torch.ones(32, 32, 3))["psnr"] == float("inf")


# --------------------------------------------------------------------------------------------
# SSIM against a direct numpy implementation of tf.image.ssim


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> np.ndarray:
    offsets = np.arange(size) - size // 2
    gauss = np.exp(-(offsets**2) / (2 * sigma**2))
    gauss /= gauss.sum()
    return np.outer(gauss, gauss)  # [11, 11]


def _filter_valid(image: np.ndarray, window: np.ndarray) -> np.ndarray:
    """`[H, W]` -> `[H - 10, W - 10]`: correlation with the window, no padding."""
    patches = np.lib.stride_tricks.sliding_window_view(image, window.shape)
    return np.einsum("ijkl,kl->ij", patches, window)


def _reference_ssim(x: np.ndarray, y: np.ndarray, zero_pad: int = 0) -> float:
    """TensorFlow's SSIM of `[C, H, W]` images in [0, 1] (k1 0.01, k2 0.03), mean of the map."""
    c1, c2 = 0.01**2, 0.03**2
    window = _gaussian_window()
    maps = []
    for xc, yc in zip(x.astype(np.float64), y.astype(np.float64)):
        xc, yc = np.pad(xc, zero_pad), np.pad(yc, zero_pad)
        mu_x, mu_y = _filter_valid(xc, window), _filter_valid(yc, window)
        var_x = _filter_valid(xc * xc, window) - mu_x**2
        var_y = _filter_valid(yc * yc, window) - mu_y**2
        cov = _filter_valid(xc * yc, window) - mu_x * mu_y
        luminance = (2 * mu_x * mu_y + c1) / (mu_x**2 + mu_y**2 + c1)
        contrast_structure = (2 * cov + c2) / (var_x + var_y + c2)
        maps.append(luminance * contrast_structure)
    return float(np.mean(maps))


def test_ssim_of_an_image_with_itself_is_one():
    image = torch.rand(2, 3, 20, 24)
    assert torch.allclose(ssim(image, image), torch.ones(2), atol=1e-6)
    assert torch.allclose(ssim(image, image, padding="same"), torch.ones(2), atol=1e-6)


def test_ssim_matches_tensorflow_formula():
    generator = torch.Generator().manual_seed(0)
    gt = torch.rand(3, 24, 20, generator=generator)
    pred = (gt + 0.2 * torch.randn(3, 24, 20, generator=generator)).clamp(0, 1)
    expected_valid = _reference_ssim(pred.numpy(), gt.numpy())
    expected_same = _reference_ssim(pred.numpy(), gt.numpy(), zero_pad=5)
    assert 0.2 < expected_valid < 0.95  # a pair where the formula matters
    assert ssim(pred, gt).item() == pytest.approx(expected_valid, abs=1e-5)
    # GNT's variant: zero padding at the border, a different value.
    assert ssim(pred, gt, padding="same").item() == pytest.approx(expected_same, abs=1e-5)
    assert abs(expected_same - expected_valid) > 1e-3


# --------------------------------------------------------------------------------------------
# LPIPS: the official scores, and where the weights come from


def test_lpips_alex_reproduces_official_scores(lpips_alex_weights, lpips_calibration_dir):
    expected, tolerance = _calibration(lpips_calibration_dir)
    model = load_lpips("alex", weights_path=lpips_alex_weights)
    with torch.no_grad():
        for name, score in expected.items():
            dist, ref = _pair_chw(lpips_calibration_dir, name)
            assert lpips_distance(model, dist, ref).item() == pytest.approx(score, abs=tolerance), name


def test_lpips_from_torchvision_backbone_when_no_file(monkeypatch, lpips_alex_weights, lpips_calibration_dir):
    """Without a path or env var, torchvision's backbone (hub cache / download) is loaded for real."""
    monkeypatch.delenv(LPIPS_WEIGHTS_ENV, raising=False)
    with np.load(lpips_alex_weights) as npz:
        torchvision_state = {name: torch.from_numpy(npz[name]) for name in npz.files if "features." in name}
    torchvision_state["classifier.1.weight"] = torch.zeros(4096, 9216)  # ignored: not part of LPIPS
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", lambda url, **kwargs: torchvision_state)

    model = load_lpips("alex")
    expected, tolerance = _calibration(lpips_calibration_dir)
    dist, ref = _pair_chw(lpips_calibration_dir, "I04")
    with torch.no_grad():
        assert lpips_distance(model, dist, ref).item() == pytest.approx(expected["I04"], abs=tolerance)


def test_no_weights_anywhere_means_unavailable_never_a_number(offline, capsys):
    assert load_lpips("alex") is None
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "LPIPS-alex unavailable" in lines[0] and LPIPS_WEIGHTS_ENV in lines[0]

    metrics = ImageMetrics(lpips_net="vgg")
    assert capsys.readouterr().err.count("\n") == 1
    scores = metrics(torch.rand(32, 40, 3), torch.rand(32, 40, 3))
    assert scores["lpips"] is None and not metrics.lpips_available
    assert np.isfinite(scores["psnr"]) and np.isfinite(scores["ssim"])


def _random_weights(net: str) -> dict[str, np.ndarray]:
    """A structurally valid npz payload for `net` (random backbone, the wheel's linear layers)."""
    model = build_lpips_skeleton(net)
    parameters = {**backbone_parameters(model), **linear_parameters(model)}
    return {name: parameter.detach().numpy().copy() for name, parameter in parameters.items()}


@pytest.mark.parametrize(
    "corrupt, complaint",
    [
        (lambda w: w.pop("features.3.weight"), "missing keys for LPIPS-alex: features.3.weight"),
        (lambda w: w.update({"features.0.bias": np.zeros(63, np.float32)}), "features.0.bias has shape (63,)"),
        (lambda w: w["lin1.model.1.weight"].__imul__(2), "lin1.model.1.weight differs"),
        (lambda w: w.update({"features.2.weight": np.zeros(3, np.float32)}), "unexpected keys"),
    ],
)
def test_bad_npz_is_a_user_error_naming_the_file(tmp_path, corrupt, complaint):
    weights = _random_weights("alex")
    corrupt(weights)
    path = tmp_path / "bad.npz"
    np.savez(path, **weights)
    with pytest.raises(UserError, match="bad.npz") as error:
        load_lpips("alex", weights_path=path)
    assert complaint in str(error.value)


def test_npz_of_another_network_or_not_an_npz_is_rejected(tmp_path):
    alex = tmp_path / "alex.npz"
    np.savez(alex, **_random_weights("alex"))
    with pytest.raises(UserError, match=r"alex\.npz.*LPIPS-vgg"):
        load_lpips("vgg", weights_path=alex)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip archive")
    with pytest.raises(UserError, match=r"garbage\.npz: not a readable LPIPS npz"):
        load_lpips("alex", weights_path=garbage)


def test_weights_lookup_order(tmp_path, monkeypatch):
    good = tmp_path / "good.npz"
    np.savez(good, **_random_weights("alex"))
    missing = tmp_path / "missing.npz"

    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(missing))
    assert load_lpips("alex", weights_path=good) is not None  # the explicit path wins
    with pytest.raises(UserError, match=rf"missing\.npz \(from \${LPIPS_WEIGHTS_ENV}\): .*not found"):
        load_lpips("alex")  # then the env var, which must exist if set


def test_env_var_serves_both_networks(tmp_path, monkeypatch, capsys):
    """`$POLA_GNT_LPIPS_WEIGHTS` naming the AlexNet file (or a folder) finds the VGG file beside it;
    without one, VGG is unavailable (one line), never loaded from the AlexNet weights."""
    monkeypatch.setattr(
        torch.hub,
        "load_state_dict_from_url",
        lambda *a, **k: (_ for _ in ()).throw(urllib.error.URLError("offline (simulated)")),
    )
    alex = tmp_path / "alex_v0.1.npz"
    np.savez(alex, **_random_weights("alex"))
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(alex))
    assert load_lpips("alex") is not None
    assert load_lpips("vgg") is None
    assert capsys.readouterr().err.count("LPIPS-vgg unavailable") == 1
    vgg = tmp_path / "vgg_v0.1.npz"
    np.savez(vgg, **_random_weights("vgg"))
    assert load_lpips("vgg") is not None
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(tmp_path))  # a folder of npz files
    assert load_lpips("alex") is not None and load_lpips("vgg") is not None


def test_gnt_protocol_uses_zero_padded_ssim_and_unscaled_lpips(lpips_alex_weights, lpips_calibration_dir):
    dist, ref = (image[:, :96, :128] for image in _pair_chw(lpips_calibration_dir, "I04"))
    standard = ImageMetrics(lpips_weights=lpips_alex_weights)
    gnt = ImageMetrics.for_protocol("gnt", lpips_weights=lpips_alex_weights)
    pred_hwc, gt_hwc = dist.permute(1, 2, 0), ref.permute(1, 2, 0)
    standard_scores, gnt_scores = standard(pred_hwc, gt_hwc), gnt(pred_hwc, gt_hwc)

    assert gnt_scores["ssim"] == pytest.approx(ssim(dist, ref, padding="same").item(), abs=1e-6)
    assert standard_scores["ssim"] == pytest.approx(ssim(dist, ref).item(), abs=1e-6)
    with torch.no_grad():
        unscaled = standard.lpips_model(dist[None], ref[None], normalize=False).item()
    assert gnt_scores["lpips"] == pytest.approx(unscaled, abs=1e-6)
    assert abs(gnt_scores["lpips"] - standard_scores["lpips"]) > 1e-2
    assert gnt.settings["ssim_padding"] == "same" and standard.settings["lpips_input_range"] == "[-1,1]"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_metrics_follow_the_inputs_to_cuda(lpips_alex_weights):
    metrics = ImageMetrics(lpips_weights=lpips_alex_weights)
    pred, gt = torch.rand(64, 80, 3), torch.rand(64, 80, 3)
    on_cpu, on_cuda = metrics(pred, gt), metrics(pred.cuda(), gt.cuda())
    for name in ("psnr", "ssim", "lpips"):
        assert on_cuda[name] == pytest.approx(on_cpu[name], abs=1e-4)


# --------------------------------------------------------------------------------------------
# CLI


def _run_cli(*args: str, weights: Path | None = None):
    env = dict(os.environ)
    env.pop(LPIPS_WEIGHTS_ENV, None)
    if weights is not None:
        env[LPIPS_WEIGHTS_ENV] = str(weights)
    return run_module("metrics", *args, env=env, timeout=300)


def test_cli_prints_one_json_object(lpips_alex_weights, lpips_calibration_dir):
    expected, tolerance = _calibration(lpips_calibration_dir)
    pred, gt = lpips_calibration_dir / "dist" / "I04.bmp", lpips_calibration_dir / "ref" / "I04.bmp"
    result = _run_cli(str(pred), str(gt), weights=lpips_alex_weights)
    assert result.returncode == 0 and result.stderr == "", result.stderr  # no warnings, no notices
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    scores = json.loads(lines[0])
    assert set(scores) == {"psnr", "ssim", "lpips", "lpips_net"} and scores["lpips_net"] == "alex"
    assert scores["lpips"] == pytest.approx(expected["I04"], abs=tolerance)
    assert 10 < scores["psnr"] < 40 and 0 < scores["ssim"] < 1


def _write_png(path: Path, image: np.ndarray) -> Path:
    iio.imwrite(path, image)
    return path


@pytest.mark.parametrize("problem", ["corrupt", "missing", "size"])
def test_cli_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys, problem):
    gt = _write_png(tmp_path / "gt.png", np.zeros((40, 48, 3), np.uint8))
    if problem == "corrupt":
        pred = tmp_path / "corrupt.png"
        pred.write_bytes(b"\x89PNG\r\n\x1a\n this is not really a PNG")
    elif problem == "missing":
        pred = tmp_path / "nowhere.png"
    else:
        pred = _write_png(tmp_path / "pred.png", np.zeros((40, 40, 3), np.uint8))
    with pytest.raises(SystemExit) as exit_info:
        main([str(pred), str(gt)])
    captured = capsys.readouterr()
    assert_one_error_line(CommandResult(exit_info.value.code, captured.out, captured.err), str(pred))
    assert captured.out == ""


def test_cli_identical_grayscale_images_without_weights(tmp_path, capsys, offline):
    gray = np.random.default_rng(0).integers(0, 256, (40, 48), dtype=np.uint8)
    first, second = _write_png(tmp_path / "a.png", gray), _write_png(tmp_path / "b.png", gray)
    main([str(first), str(second)])
    captured = capsys.readouterr()
    scores = json.loads(captured.out)
    # Infinite PSNR has no JSON spelling: null. No weights: lpips null, with one line saying why.
    assert scores == {"psnr": None, "ssim": pytest.approx(1.0, abs=1e-6), "lpips": None, "lpips_net": "alex"}
    assert len(captured.err.strip().splitlines()) == 1
