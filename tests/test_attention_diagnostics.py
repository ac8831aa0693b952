"""Attention entropy, effective weights, learned temperatures and gate capture."""

from __future__ import annotations

import math

import torch
from torch import nn

from pola_gnt.attention import build_ray_attention, build_view_attention, polarity_attention
from pola_gnt.attention.diagnostics import (
    attention_entropy,
    learned_temperatures,
    polarity_attention_weights,
    recording,
    relu_linear_weights,
    softmax_weights,
    split_gates,
)

DIM, HEADS = 16, 2


def test_entropy_of_known_distributions():
    weights = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 5.0, 0.0, 0.0], [2.0, 6.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    expected = torch.tensor([math.log(4), 0.0, -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), 0.0])
    torch.testing.assert_close(attention_entropy(weights), expected)
    mask = torch.tensor([True, True, False, True])
    torch.testing.assert_close(attention_entropy(weights, mask)[0], torch.tensor(math.log(3)))


def test_weights_reproduce_polarity_attention_and_are_normalised():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 8, generator=gen, dtype=torch.float64) for n in (5, 7, 7))
    temp_same, temp_opp = (torch.rand(1, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = torch.tensor([True, False, True, True, False, True, True]).expand(2, 7)
    w_same, w_opp = polarity_attention_weights(q, k, temp_same, temp_opp, mask)
    out = polarity_attention(q, k, v, temp_same, temp_opp, mask)
    torch.testing.assert_close(torch.cat([w_same @ v[..., :4], w_opp @ v[..., 4:]], dim=-1), out)
    for weights in (w_same, w_opp, relu_linear_weights(q, k, mask), softmax_weights(q, k, mask)):
        assert (weights >= 0).all()
        assert torch.equal(weights[..., ~mask[0]], torch.zeros_like(weights[..., ~mask[0]]))
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(softmax_weights(q, k), torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), -1))


def test_larger_temperatures_give_lower_entropy_than_smaller_ones_and_relu():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 64, 16, generator=gen)
    k = torch.randn(4, 256, 16, generator=gen)
    entropies = []
    for temp in (0.05, 0.2, 0.5, 1.0):
        temps = torch.full((32,), temp)
        w_same, w_opp = polarity_attention_weights(q, k, temps, temps)
        entropies.append((attention_entropy(w_same).mean(), attention_entropy(w_opp).mean()))
    for smaller, larger in zip(entropies, entropies[1:]):
        assert larger[0] < smaller[0] and larger[1] < smaller[1]
    relu_entropy = attention_entropy(relu_linear_weights(q, k)).mean()
    # From the initial temperature 0.5 on, both streams are sharper than ReLU linear attention.
    for same, opp in entropies[2:]:
        assert same < relu_entropy and opp < relu_entropy


def test_learned_temperatures_walks_pola_modules():
    model = nn.ModuleDict(
        {
            "view": build_view_attention("pola", DIM, HEADS),
            "ray": build_ray_attention("pola", DIM, HEADS),
            "baseline": build_view_attention("softmax", DIM, HEADS),
        }
    )
    with torch.no_grad():
        model["ray"].s1[1, 3] = 2.0
    rows = learned_temperatures(model)
    assert [row["name"] for row in rows] == ["view", "ray"]
    for row in rows:
        assert row["temp_same"].shape == row["temp_opp"].shape == (HEADS, 2 * DIM // HEADS)
    assert rows[1]["temp_same"][1, 3] == torch.sigmoid(torch.tensor(2.0))
    assert rows[1]["temp_same"][0, 0] == 0.5 and rows[0]["temp_opp"][1, 7] == 0.5


def test_recording_gives_gates_and_attention_inputs_of_every_forward_and_changes_nothing():
    torch.manual_seed(0)
    model = nn.ModuleDict(
        {"view": build_view_attention("pola", DIM, HEADS), "ray": build_ray_attention("pola", DIM, HEADS)}
    )
    query, tokens = torch.randn(3, DIM), torch.randn(3, 4, DIM)
    rel_dirs, mask = torch.randn(3, 4, 4), torch.ones(3, 4, dtype=torch.bool)
    samples = torch.randn(2, 5, DIM)
    unrecorded = model["view"](query, tokens, rel_dirs, mask)
    inputs = []

    def on_inputs(name, module, q, k, key_mask):
        assert module is model[name]
        inputs.append((name, tuple(q.shape), tuple(k.shape), None if key_mask is None else tuple(key_mask.shape)))

    with recording(model, on_inputs) as recorded:
        assert torch.equal(model["view"](query, tokens, rel_dirs, mask), unrecorded)
        model["view"](query[:2], tokens[:2], rel_dirs[:2], mask[:2])  # a second chunk
        model["ray"](samples, None)
    gates = recorded.gates
    assert set(gates) == {"view", "ray"}
    assert gates["view"].shape == (5, DIM) and gates["ray"].shape == (10, DIM)
    expected_gate = model["view"].to_qg(query).chunk(2, dim=-1)[1].detach()
    torch.testing.assert_close(gates["view"][:3], expected_gate)
    torch.testing.assert_close(gates["view"][3:], expected_gate[:2])
    head_dim = DIM // HEADS  # heads-split inputs: one query per point over 4 views; 5 samples per ray
    assert inputs == [
        ("view", (3, HEADS, 1, head_dim), (3, HEADS, 4, head_dim), (3, 4)),
        ("view", (2, HEADS, 1, head_dim), (2, HEADS, 4, head_dim), (2, 4)),
        ("ray", (2, HEADS, 5, head_dim), (2, HEADS, 5, head_dim), None),
    ]
    # Recording stops with the block.
    model["view"](query, tokens, rel_dirs, mask)
    assert gates["view"].shape == (5, DIM) and len(inputs) == 3
    assert model["view"].recorder is None and model["ray"].recorder is None


def test_split_gates_separates_stream_channels_per_head():
    gates = torch.arange(2 * 8, dtype=torch.float32).reshape(2, 8)  # 2 tokens, 2 heads x 4 channels
    same, opp = split_gates(gates, heads=2)
    torch.testing.assert_close(same, torch.tensor([[0.0, 1.0, 4.0, 5.0], [8.0, 9.0, 12.0, 13.0]]))
    torch.testing.assert_close(opp, torch.tensor([[2.0, 3.0, 6.0, 7.0], [10.0, 11.0, 14.0, 15.0]]))
