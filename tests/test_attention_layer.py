"""`PolarityAttention`, the drop-in polarity attention layer: against the layer's math written out
naively in fp64 (the attention core from `reference.polarity_attention_reference`, every other step
here), in each form the CPU has (PyTorch, the fused C++ kernels; the Triton kernels in the interpreter:
`test_triton_layer.py`), with negative controls; mask semantics; half precision; gradients; and the
layer swapped into ViT blocks (a minimal pre-norm block, torchvision's `vit_b_16` encoder block)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pola_gnt.attention import PolarityAttention, cpu_extension
from pola_gnt.attention.ray import op as ray_op
from pola_gnt.attention.reference import polarity_attention_reference

# --------------------------------------------------------------------------------------------------
# The layer's math, naively, in fp64


def layer_reference(
    layer: PolarityAttention,
    x: Tensor,
    context: Tensor | None = None,
    mask: Tensor | None = None,
    grid: tuple[int, int] | None = None,
    *,
    temperature_shift: float = 0.0,
    swap_streams: bool = False,
) -> Tensor:
    """`layer(x, context, mask, grid)` in fp64 from its parameters, step by step (module docstring of
    `pola_gnt.attention.layer`); differentiable w.r.t. the layer's parameters and the inputs. The two
    keyword arguments break it on purpose (the negative controls): shift the same-sign temperatures'
    logits, or exchange the same- and opposite-sign streams."""
    p = {name: t.double() for name, t in layer.named_parameters()}
    x = x.double()
    heads, dim = layer.heads, layer.dim
    source = x if context is None else context.double()

    def linear(t: Tensor, name: str) -> Tensor:
        return t @ p[f"{name}.weight"].t() + p.get(f"{name}.bias", torch.zeros((), dtype=torch.float64))

    q, gate = linear(x, "to_qg").chunk(2, dim=-1)
    k, v = linear(source, "to_kv").chunk(2, dim=-1)

    def heads_first(t: Tensor) -> Tensor:  # [B, n, dim] -> [B, heads, n, d]
        return t.reshape(t.shape[0], t.shape[1], heads, dim // heads).permute(0, 2, 1, 3)

    temp_same, temp_opp = torch.sigmoid(p["s1"] + temperature_shift), torch.sigmoid(p["s2"])
    if swap_streams:
        temp_same, temp_opp = temp_opp, temp_same
    key_mask = None if mask is None else mask[:, None, :]
    attended = polarity_attention_reference(
        heads_first(q), heads_first(k), heads_first(v), temp_same[:, None, :], temp_opp[:, None, :], key_mask
    )  # [B, heads, N, d]
    attended = attended.permute(0, 2, 1, 3).reshape(x.shape)
    if context is None and layer.lepe is not None:
        values = v if mask is None else v * mask[..., None]
        weight, bias = p["lepe.weight"], p["lepe.bias"]
        taps, pad = weight.shape[-1], weight.shape[-1] // 2
        lepe = torch.zeros_like(values) + bias
        if layer.lepe_kind == "1d":  # lepe[i] = sum_t w[t] v[i + t - pad], zero outside
            for i in range(values.shape[1]):
                for t in range(taps):
                    j = i + t - pad
                    if 0 <= j < values.shape[1]:
                        lepe[:, i] = lepe[:, i] + weight[:, 0, t] * values[:, j]
        else:
            assert grid is not None
            height, width = grid
            image = values.reshape(x.shape[0], height, width, dim)
            out = lepe.reshape(x.shape[0], height, width, dim)
            for a in range(height):
                for b in range(width):
                    for s in range(taps):
                        for t in range(taps):
                            i, j = a + s - pad, b + t - pad
                            if 0 <= i < height and 0 <= j < width:
                                out[:, a, b] = out[:, a, b] + weight[:, 0, s, t] * image[:, i, j]
            lepe = out.reshape(values.shape)
        attended = attended + lepe
    return linear(gate * attended, "proj")


def randomised(layer: PolarityAttention, seed: int = 0) -> PolarityAttention:
    """`layer` with every parameter drawn at random (temperatures spread over (0, 1), not all 0.5)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in layer.named_parameters():
            scale = 1.5 if name in ("s1", "s2") else 0.4
            param.copy_(scale * torch.randn(param.shape, generator=gen))
    return layer


def inputs(batch: int, tokens: int, dim: int, seed: int = 1, scale: float = 1.0) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(batch, tokens, dim, generator=gen)).requires_grad_()


def random_mask(batch: int, tokens: int, seed: int = 2) -> Tensor:
    mask = torch.rand(batch, tokens, generator=torch.Generator().manual_seed(seed)) > 0.3
    mask[:, 0] = True
    return mask


def relative_error(actual: Tensor, expected: Tensor) -> float:
    expected = expected.detach().double()
    return ((actual.detach().double() - expected).abs().max() / expected.abs().max().clamp_min(1e-12)).item()


def leaves_of(layer: nn.Module, *tensors: Tensor | None) -> list[Tensor]:
    return [*(t for t in tensors if t is not None and t.requires_grad), *layer.parameters()]


def assert_matches(layer, x, context=None, mask=None, grid=None, rel=2e-5, **broken):
    """The layer's output and the gradients of one random output gradient w.r.t. every leaf (inputs
    and parameters) agree with `layer_reference` to `rel` of each tensor's scale; returns the errors."""
    out = layer(x, context, mask, grid)
    expected = layer_reference(layer, x, context, mask, grid, **broken)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    leaves = leaves_of(layer, x, context)
    got = torch.autograd.grad(out, leaves, grad.to(out.dtype), allow_unused=True)
    want = torch.autograd.grad(expected, leaves, grad, allow_unused=True)
    errors = {"output": relative_error(out, expected)}
    names = ["x", "context"][: len(leaves) - len(list(layer.parameters()))] + [n for n, _ in layer.named_parameters()]
    for name, g, w in zip(names, got, want):
        assert (g is None) == (w is None), name
        if g is not None:
            errors[name] = relative_error(g, w)
    worst = max(errors, key=errors.__getitem__)
    assert errors[worst] <= rel, (worst, errors)
    return errors


# --------------------------------------------------------------------------------------------------
# Forms


@pytest.fixture(params=["pytorch", "cpp"])
def cpu_form(request, monkeypatch):
    """Each CPU form of the attention and the 1-D LePE, with a count of the C++ kernels' calls."""
    calls = {"attention": 0, "lepe": 0}
    if request.param == "pytorch":
        monkeypatch.setattr(cpu_extension, "usable", lambda *args: False)
    elif not cpu_extension.available():
        pytest.skip("the fused CPU kernels are not built here (no C++ compiler)")
    attention, conv = ray_op.polarity_ray_attention_cpu, ray_op.samples_conv_cpu

    def counted_attention(*args):
        calls["attention"] += 1
        return attention(*args)

    def counted_conv(*args):
        calls["lepe"] += 1
        return conv(*args)

    monkeypatch.setattr(ray_op, "polarity_ray_attention_cpu", counted_attention)
    monkeypatch.setattr(ray_op, "samples_conv_cpu", counted_conv)
    return request.param, calls


CASES = {
    # name: (layer arguments, batch, tokens, context tokens (None: self-attention), masked, grid)
    "self_lepe1d": (dict(lepe="1d"), 2, 13, None, True, None),
    "self_no_lepe_unmasked": (dict(lepe=None), 3, 9, None, False, None),
    "self_lepe2d": (dict(lepe="2d", lepe_kernel=3), 2, 12, None, True, (3, 4)),
    "cross_masked": (dict(qkv_bias=False), 2, 7, 11, True, None),
    "cross_one_query": (dict(), 1, 1, 6, False, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_fp64_reference_in_every_cpu_form(case, cpu_form):
    """Values and the gradients of every input and parameter, fp32 forms vs the naive fp64 math; the
    C++ kernels do run where they take the inputs (self-attention, the 1-D LePE)."""
    form, calls = cpu_form
    kwargs, batch, tokens, ctx_tokens, masked, grid = CASES[case]
    torch.manual_seed(0)
    layer = randomised(PolarityAttention(32, heads=2, **kwargs))
    x = inputs(batch, tokens, 32)
    context = None if ctx_tokens is None else inputs(batch, ctx_tokens, 32, seed=4)
    mask = random_mask(batch, ctx_tokens or tokens) if masked else None
    assert_matches(layer, x, context, mask, grid)
    self_attention = ctx_tokens is None
    assert (calls["attention"] > 0) == (form == "cpp" and self_attention), calls
    assert (calls["lepe"] > 0) == (form == "cpp" and self_attention and kwargs.get("lepe", "1d") == "1d"), calls


@pytest.mark.parametrize("broken", [dict(temperature_shift=0.3), dict(swap_streams=True)])
def test_negative_controls_fail_the_comparison(broken):
    """A reference with shifted temperatures, or with the same- and opposite-sign streams exchanged,
    differs from the layer far beyond the tolerance that the correct one meets."""
    layer = randomised(PolarityAttention(32, heads=2))
    x, mask = inputs(2, 13, 32, scale=2.0), random_mask(2, 13)
    errors = assert_matches(layer, x, mask=mask)
    assert max(errors.values()) < 2e-5
    with pytest.raises(AssertionError):
        assert_matches(layer, x, mask=mask, rel=1e-2, **broken)


# --------------------------------------------------------------------------------------------------
# Masks


def test_masked_context_tokens_equal_removed_ones():
    """Cross-attention: each batch item's output with some context tokens masked equals its output
    over the context without them."""
    layer = randomised(PolarityAttention(32, heads=4))
    x, context, mask = inputs(3, 5, 32), inputs(3, 9, 32, seed=4), random_mask(3, 9)
    out = layer(x, context, mask)
    for b in range(3):
        kept = layer(x[b : b + 1], context[b : b + 1, mask[b]])
        torch.testing.assert_close(out[b : b + 1], kept, rtol=1e-5, atol=1e-6)


def test_masked_tokens_in_self_attention_equal_removed_ones_without_lepe():
    """Self-attention without LePE: the kept tokens' outputs equal those of the sequence of the kept
    tokens alone (the masked ones are still queries, but nobody's keys)."""
    layer = randomised(PolarityAttention(32, heads=2, lepe=None))
    x, mask = inputs(2, 12, 32), random_mask(2, 12)
    out = layer(x, mask=mask)
    for b in range(2):
        kept = layer(x[b : b + 1, mask[b]])
        torch.testing.assert_close(out[b : b + 1, mask[b]], kept, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lepe, grid", [("1d", None), ("2d", (3, 4))])
def test_masked_tokens_reach_no_other_token(lepe, grid):
    """With LePE (which shifts the neighbours when tokens are removed), changing the masked tokens
    changes no kept token's output; unmasked, the same change does (control)."""
    layer = randomised(PolarityAttention(32, heads=2, lepe=lepe))
    x, mask = inputs(2, 12, 32).detach(), random_mask(2, 12)
    changed = torch.where(mask[..., None], x, 5.0 * torch.randn_like(x))
    kept = mask[..., None].expand_as(x)
    first, second = layer(x, mask=mask, grid=grid), layer(changed, mask=mask, grid=grid)
    torch.testing.assert_close(first[kept], second[kept], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(layer(x, grid=grid)[kept], layer(changed, grid=grid)[kept], atol=1e-3)


def test_all_keys_masked_is_finite_with_finite_gradients():
    layer = randomised(PolarityAttention(32, heads=2))
    x = inputs(2, 6, 32)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    for context in (None, inputs(2, 4, 32, seed=4)):
        out = layer(x, context, mask[:, : 6 if context is None else 4])
        grads = torch.autograd.grad(out.sum(), leaves_of(layer, x, context), allow_unused=True)
        assert torch.isfinite(out).all() and all(g is None or torch.isfinite(g).all() for g in grads)


def test_bad_inputs_are_refused():
    """ValueErrors; under the tests' shape checks (jaxtyping) the annotated shapes fail first (TypeError)."""
    layer = PolarityAttention(32, heads=2)
    with pytest.raises((ValueError, TypeError), match="x must be|batch tokens dim"):
        layer(torch.zeros(4, 32))
    with pytest.raises((ValueError, TypeError), match="context must be|batch ctx_tokens dim"):
        layer(torch.zeros(2, 4, 32), torch.zeros(3, 4, 32))
    with pytest.raises(ValueError, match="mask must be"):
        layer(torch.zeros(2, 4, 32), mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="grid"):
        layer(torch.zeros(2, 4, 32), grid=(2, 2))
    with pytest.raises(ValueError, match="grid"):
        PolarityAttention(32, heads=2, lepe="2d")(torch.zeros(2, 6, 32), grid=(2, 2))
    with pytest.raises(ValueError, match="even head dim"):
        PolarityAttention(30, heads=2)


# --------------------------------------------------------------------------------------------------
# Shapes, precision, gradients


@pytest.mark.parametrize("batch, tokens", [(0, 5), (3, 0), (1, 1), (2, 2100)])
def test_any_batch_and_token_count(batch, tokens):
    """Empty batches and sequences, one token, and a sequence past the short linear form's length."""
    layer = PolarityAttention(32, heads=4)
    x = torch.randn(batch, tokens, 32, requires_grad=True)
    out = layer(x, mask=torch.ones(batch, tokens, dtype=torch.bool))
    assert out.shape == x.shape and torch.isfinite(out).all()
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cross", [False, True])
def test_half_precision_is_finite_and_close(dtype, cross):
    """bf16 / fp16 modules and inputs, at a scale where fp16's exp would overflow (exponent inputs
    past 11): the feature maps run in fp32, outputs and gradients are finite and near fp32's."""
    layer = randomised(PolarityAttention(32, heads=2))
    x = inputs(2, 10, 32, scale=8.0).detach()
    context = inputs(2, 7, 32, seed=4, scale=8.0).detach() if cross else None
    expected = layer(x, context)
    half = randomised(PolarityAttention(32, heads=2)).to(dtype)
    x_half = x.to(dtype).requires_grad_()
    out = half(x_half, None if context is None else context.to(dtype))
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert relative_error(out, expected) < (5e-2 if dtype == torch.bfloat16 else 1e-2)
    out.float().sum().backward()
    assert x_half.grad is not None and torch.isfinite(x_half.grad).all()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in half.parameters())


def test_bf16_autocast_of_an_fp32_layer():
    layer = randomised(PolarityAttention(32, heads=2))
    x = inputs(2, 10, 32, scale=8.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x, mask=random_mask(2, 10))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    out.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert relative_error(out, layer(x, mask=random_mask(2, 10))) < 5e-2


@pytest.mark.parametrize("lepe, grid", [("1d", None), ("2d", (2, 4))])
def test_gradients_reach_every_parameter_and_the_inputs(lepe, grid):
    """Self-attention: every parameter and x; cross-attention: every parameter but the LePE's, x and
    the context."""
    layer = PolarityAttention(32, heads=2, lepe=lepe)  # default initialisation: temperatures 0.5
    x = inputs(2, 8, 32)
    grads = torch.autograd.grad(layer(x, grid=grid).square().sum(), [x, *layer.parameters()])
    names = ["x", *(n for n, _ in layer.named_parameters())]
    assert all(g.abs().sum() > 0 for g in grads), [n for n, g in zip(names, grads) if not g.abs().sum() > 0]
    context = inputs(2, 5, 32, seed=4)
    out = layer(x, context)
    grads = torch.autograd.grad(out.square().sum(), [x, context, *layer.parameters()], allow_unused=True)
    for name, g in zip(["x", "context", *(n for n, _ in layer.named_parameters())], grads):
        assert (g is None) == name.startswith("lepe."), name
        assert g is None or g.abs().sum() > 0, name


# --------------------------------------------------------------------------------------------------
# In a ViT block


class PreNormBlock(nn.Module):
    """A minimal pre-norm transformer block (ViT's): `x + attn(norm(x))`, `x + mlp(norm(x))`."""

    def __init__(self, dim: int, heads: int, attention: nn.Module | None = None):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = attention or PolarityAttention(dim, heads, lepe="2d", lepe_kernel=3)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        x = x + self.attention(self.norm1(x), grid=grid)
        return x + self.mlp(self.norm2(x))


def test_in_a_minimal_pre_norm_vit_block():
    """Patch tokens of a 4 x 6 grid through two blocks: shapes kept, every parameter gets a gradient."""
    blocks = nn.ModuleList([PreNormBlock(32, 4) for _ in range(2)])
    image = torch.randn(3, 3, 16, 24, requires_grad=True)
    patches = nn.Conv2d(3, 32, kernel_size=4, stride=4)
    x = patches(image).flatten(2).transpose(1, 2)  # [3, 24 tokens, 32]
    for block in blocks:
        x = block(x, grid=(4, 6))
    assert x.shape == (3, 24, 32) and torch.isfinite(x).all()
    x.square().mean().backward()
    assert image.grad is not None and image.grad.abs().sum() > 0
    for name, param in blocks.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


class MultiheadAttentionAdapter(nn.Module):
    """`nn.MultiheadAttention`'s call (batch first) on a `PolarityAttention`: `(query, key, value,
    key_padding_mask=None, need_weights=..., attn_mask=None) -> (out, None)`. Self-attention only
    (query is key is value); `key_padding_mask` is True where a key is *ignored*, as in PyTorch."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attention = PolarityAttention(dim, heads)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=False, attn_mask=None):
        if attn_mask is not None or not (query is key is value):
            raise ValueError("the adapter takes self-attention without attn_mask")
        mask = None if key_padding_mask is None else ~key_padding_mask
        return self.attention(query, mask=mask), None


def test_in_torchvision_vit_encoder_block():
    """torchvision's `vit_b_16` encoder block (`EncoderBlock`, at a small width) with its
    `self_attention` replaced by the adapter: shapes kept, gradients reach every parameter."""
    vision_transformer = pytest.importorskip("torchvision.models.vision_transformer")
    block = vision_transformer.EncoderBlock(
        num_heads=4, hidden_dim=32, mlp_dim=64, dropout=0.0, attention_dropout=0.0, norm_layer=nn.LayerNorm
    )
    block.self_attention = MultiheadAttentionAdapter(32, 4)  # pyright: ignore[reportAttributeAccessIssue]
    x = torch.randn(2, 17, 32, requires_grad=True)  # class token + 16 patches
    out = block(x)
    assert out.shape == x.shape and torch.isfinite(out).all()
    F.mse_loss(out, torch.zeros_like(out)).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, param in block.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
