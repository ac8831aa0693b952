"""Attention diagnostics of a trained Pola-GNT checkpoint: the command `python -m pola_gnt.analyze`
(it loads the checkpoint) and the library it calls, `pola_gnt.evaluation.attention_analysis` (recording,
summaries, plots, `analysis.json`)."""

from __future__ import annotations

import json
import math

import imageio.v3 as iio
import pytest
import torch
from helpers import TINY_OVERRIDES, assert_one_error_line, run_in_process, run_module
from omegaconf import OmegaConf

from pola_gnt.analyze import analyze
from pola_gnt.attention.diagnostics import attention_entropy, softmax_weights
from pola_gnt.attention.modules import PolaRayAttention, split_heads
from pola_gnt.core.errors import UserError
from pola_gnt.evaluation.attention_analysis import (
    ENTROPY_METHODS,
    gate_projection,
    recording_attention,
    summary_lines,
    temperature_pairs,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES = ("attention_temperatures.png", "attention_gates_pca.png", "attention_entropy.png")


def _tiny(key: str) -> int:
    return int(next(o for o in TINY_OVERRIDES if o.startswith(f"{key}=")).split("=")[1])


@pytest.mark.slow  # about 1 min of a 2-core CPU with its run's setup
def test_analyze_pola_checkpoint_writes_figures_and_numbers(tiny_runs, tmp_path):
    checkpoint = tiny_runs["pola_gnt"] / "checkpoints" / "last.ckpt"
    result = run_module("analyze", f"ckpt_path={checkpoint}", "analyze.n_rays=64", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]

    for name in FIGURES:
        path = tmp_path / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE, name
        assert iio.imread(path).shape[0] > 200, name

    document = json.loads((tmp_path / "analysis.json").read_text())
    assert document["model"] == "pola_gnt" and document["n_rays"] == 64
    n_blocks, n_samples, n_views = (
        _tiny("model.net.n_blocks"),
        _tiny("render.n_samples"),
        _tiny("data.num_source_views"),
    )
    layers = document["layers"]
    assert [layer["name"].split(".")[2] for layer in layers] == ["view_block", "ray_block"] * n_blocks
    for layer in layers:
        entropy = layer["entropy"]
        expected_keys = n_views if layer["name"].endswith("view_block.attention") else n_samples
        assert entropy["n_keys"] == expected_keys
        assert entropy["max_entropy"] == pytest.approx(math.log(expected_keys))
        assert entropy["rows"] > 0
        for method in ENTROPY_METHODS:
            mean = entropy[method]["mean"]
            assert math.isfinite(mean) and 0.0 <= mean <= entropy["max_entropy"] + 1e-6, (layer["name"], method)
            assert 0.0 <= entropy[method]["dead_row_fraction"] <= 1.0
        # Softmax never has a dead row; every row has at least two keys, so its entropy is positive.
        assert entropy["softmax"]["dead_row_fraction"] == 0.0 and entropy["softmax"]["mean"] > 0.0
        for stream in ("same_sign", "opposite_sign"):
            stats = layer["temperature"][stream]
            assert 0.0 < stats["min"] <= stats["mean"] <= stats["max"] < 1.0
        gates = layer["gates"]
        assert gates["tokens"] > 0 and math.isfinite(gates["separation"]) and gates["separation"] >= 0.0
        assert 0.0 <= sum(gates["pca_explained_variance"]) <= 1.0 + 1e-9


def test_analyze_gnt_checkpoint_is_one_error_line(tiny_runs, tmp_path):
    checkpoint = tiny_runs["gnt"] / "checkpoints" / "last.ckpt"
    result = run_in_process("analyze", f"ckpt_path={checkpoint}", f"hydra.run.dir={tmp_path}")
    assert_one_error_line(result, "model=pola_gnt")
    assert not (tmp_path / "analysis.json").exists()


def test_corrupt_checkpoint_is_a_user_error(tmp_path):
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"not a checkpoint" * 10)
    cli = OmegaConf.create({"ckpt_path": str(corrupt), "seed": 0, "analyze": {"n_rays": 8, "test_view": 0}})
    with pytest.raises(UserError, match="corrupt.ckpt: cannot read checkpoint"):
        analyze(cli, tmp_path, overrides=[])
    cli.analyze.n_rays = 0
    with pytest.raises(UserError, match="analyze.n_rays"):
        analyze(cli, tmp_path, overrides=[])


# ------------------------------------------------------------------------------------------------
# The library: pola_gnt.evaluation.attention_analysis


def test_recording_sees_the_module_inputs_and_changes_nothing():
    torch.manual_seed(0)
    module = PolaRayAttention(dim=16, heads=2, lepe=True).eval()
    tokens = torch.randn(5, 7, 16)  # [rays, samples, dim]
    mask = torch.rand(5, 7) > 0.3
    mask[0] = False  # a ray no view sees: no row of it counts
    mask[1] = False
    mask[1, 2] = True  # one visible sample: entropy is 0 for every method, so the row is skipped
    with torch.no_grad():
        plain = module(tokens, mask)
        with recording_attention(module) as recorded:
            output = module(tokens, mask)
    assert torch.equal(plain, output)
    assert module.recorder is None  # recording ends with the block

    record = recorded.layers[""]
    assert recorded.gates[""].shape == (5 * 7, 16)  # one gate row per token
    counted = mask & (mask.sum(dim=-1, keepdim=True) >= 2)  # used queries of rays with >= 2 keys
    assert record.rows == 2 * int(counted.sum())  # x heads
    assert torch.equal(record.used(), mask.flatten())
    # The softmax entropies are those of the q, k the module projects internally.
    q, k, _, _ = module.to_qkvg(tokens).chunk(4, dim=-1)
    q, k = split_heads(q, 2), split_heads(k, 2)
    key_mask = mask[:, None, :].expand(5, 2, 7)
    expected = attention_entropy(softmax_weights(q, k, key_mask), key_mask)[counted[:, None, :].expand(5, 2, 7)]
    torch.testing.assert_close(record.entropies("softmax"), expected.detach())


def test_gate_projection_separates_distinct_streams_only():
    generator = torch.Generator().manual_seed(0)
    heads, head_dim, tokens = 2, 8, 400
    noise = torch.randn(tokens, heads, head_dim, generator=generator)
    shifted = noise.clone()
    shifted[..., head_dim // 2 :] += 5.0  # opposite-sign channels far from the same-sign ones: separation 5
    apart = gate_projection(shifted.flatten(1), heads)
    together = gate_projection(noise.flatten(1), heads)
    assert apart.summary["separation"] > 4.0 and together.summary["separation"] < 0.5
    assert apart.same.shape == (tokens, 2) and apart.opp.shape == (tokens, 2)
    assert apart.explained_variance[0] > 0.8  # the shift is the main axis
    # On that axis the two streams fall on opposite sides.
    assert (apart.same[:, 0].mean() * apart.opp[:, 0].mean()) < 0


def test_temperature_pairs_follow_the_feature_maps():
    # temp_same acts on [q+, q-]; temp_opp on [q-, q+]: q+ meets temp_opp's second half.
    temp_same = torch.tensor([[0.1, 0.2, 0.3, 0.4]])  # [heads=1, 2d=4]
    temp_opp = torch.tensor([[0.5, 0.6, 0.7, 0.8]])
    pairs = temperature_pairs(temp_same, temp_opp)
    assert torch.equal(pairs["halves_same"][0], torch.tensor([0.1, 0.2]))
    assert torch.equal(pairs["halves_same"][1], torch.tensor([0.3, 0.4]))
    assert torch.equal(pairs["streams_pos"][1], torch.tensor([0.7, 0.8]))
    assert torch.equal(pairs["streams_neg"][0], torch.tensor([0.3, 0.4]))
    assert torch.equal(pairs["streams_neg"][1], torch.tensor([0.5, 0.6]))


def test_summary_lines_align_the_layers_and_mark_missing_numbers(tmp_path):
    entropy = {"n_keys": 3, **{m: {"mean": 0.5} for m in ENTROPY_METHODS}}
    entropy["relu_linear"] = {"mean": None}  # every row dead
    document = {
        "scene": "fern",
        "view": {"index": 4, "name": "IMG_4.png"},
        "n_rays": 64,
        "psnr_on_rays": 21.456,
        "layers": [
            {"label": "block 0, view attention", "entropy": entropy, "gates": {"separation": 1.234}},
            {"label": "block 0, ray attention", "entropy": entropy, "gates": {"separation": None}},
        ],
    }
    lines = summary_lines(document, tmp_path)
    assert lines[0] == "fern view IMG_4.png, 64 rays, PSNR on these rays 21.46 dB"
    assert lines[1].split() == ["layer", "keys", *ENTROPY_METHODS, "gate", "sep."]
    assert lines[2] == f"{'block 0, view attention':<28}{3:>5}" + f"{'0.500':>13}" * 3 + f"{'n/a':>13}{'1.23':>11}"
    assert lines[3].endswith(f"{'n/a':>13}{'n/a':>11}")
    assert len({len(line) for line in lines[1:4]}) == 1  # columns line up
    assert lines[4].endswith(f"attention_entropy.png and analysis.json to {tmp_path}")
