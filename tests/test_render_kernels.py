"""The rendering network's fused pieces against their definitions: the oneDNN linear layers with their
epilogues (`model.fused_linear`), the C++ render kernels (`model.render_kernels`: each against its
PyTorch form in fp64, fp32 and bf16), every block's keys and values in one matmul, and `render_rays`
with several chunks at once (the same pixels, cancellation, progress, the worker count).

Each kernel test counts the kernel's calls (`helpers.kernel_calls`): a build that failed, or an input
the kernel does not take, would otherwise compare the PyTorch form with itself. Where the kernels
cannot be built the file skips, which CI turns into failures (conftest's `CI_ALLOWED_SKIPS`)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers.kernel_calls import count_kernel_calls
from helpers.networks import perturbed_quick_net, random_target_rig
from torch import nn

from pola_gnt.attention.modules import SoftmaxRayAttention, SubtractionViewAttention, keys_values_with_directions
from pola_gnt.model import render_kernels
from pola_gnt.model.fused_linear import FusedLinear, fuse_linear_layers, fused_linear
from pola_gnt.model.inference import FastRenderNetwork, ViewKeysValues
from pola_gnt.model.render_memory import bytes_per_ray, render_workers
from pola_gnt.model.renderer import RenderCancelled, chunk_threads, render_image, render_rays, tile_order
from pola_gnt.model.sampler import DepthSampler
from pola_gnt.model.settings import RenderSettings

pytestmark = pytest.mark.skipif(not render_kernels.available(), reason="no C++ compiler for the render kernels")


def _pytorch_forms(monkeypatch) -> None:
    monkeypatch.setattr(render_kernels, "_built", False)


@pytest.fixture
def kernel_calls(monkeypatch):
    """Calls of the render kernels' operators during the test, by operator."""
    return count_kernel_calls(monkeypatch, "pola_gnt_render")


# --------------------------------------------------------------------------------------------------
# Linear layers with their epilogue inside the matmul


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_linear_is_linear_then_relu_or_add(dtype):
    """fp32: F.linear's values (1e-6); bf16: one rounding of the fp64 result (F.linear rounds twice)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 70, 24, generator=generator)
    weight, bias = torch.randn(40, 24, generator=generator) / 5, torch.randn(40, generator=generator)
    residual = torch.randn(3, 70, 40, generator=generator)
    low = [t.to(dtype) for t in (x, weight, bias, residual)]
    tolerance = {"rtol": 1e-6, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 2**-6}
    x_, w_, b_, r_ = (t.double() for t in low)
    reference = F.linear(x_, w_, b_)
    with torch.inference_mode():
        plain = fused_linear(low[0], low[1], low[2])
        relu = fused_linear(low[0], low[1], low[2], relu=True)
        added = fused_linear(low[0], low[1], low[2], residual=low[3])
    assert plain.dtype == relu.dtype == added.dtype == dtype and plain.shape == (3, 70, 40)
    torch.testing.assert_close(plain.double(), reference, **tolerance)
    torch.testing.assert_close(relu.double(), reference.relu(), **tolerance)
    torch.testing.assert_close(added.double(), reference + r_, **tolerance)
    with pytest.raises(ValueError, match="not both"):
        fused_linear(low[0], low[1], low[2], relu=True, residual=low[3])


def test_fusing_the_layers_of_a_module_keeps_its_function_and_parameters():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 9), nn.ReLU(), nn.Linear(9, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    x = torch.randn(11, 6)
    with torch.inference_mode():
        expected = module(x)
        fused = fuse_linear_layers(module)
        got = fused(x)
    assert isinstance(fused[0], FusedLinear) and fused[0].relu and isinstance(fused[1], nn.Identity)
    assert isinstance(fused[2], FusedLinear) and not fused[2].relu
    assert isinstance(fused[3][0], FusedLinear) and fused[3][0].relu
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert len(list(fused.parameters())) == 6


# --------------------------------------------------------------------------------------------------
# The C++ render kernels against their PyTorch forms


def _token_inputs_case(dtype_in=torch.float32):
    generator = torch.Generator().manual_seed(3)
    views, width, h, w, points = 3, 32, 7, 9, 400
    projected = torch.randn(views, width, h, w, generator=generator).to(dtype_in)
    projected = projected.contiguous(memory_format=torch.channels_last)
    grid = (torch.rand(views, points, 2, generator=generator) * 2.6 - 1.3).to(dtype_in)  # beyond the edges too
    grid[0, :4] = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [1.0, -1.0], [-1.0, 1.0]])  # the corners exactly
    visible = torch.rand(views, points, generator=generator) > 0.3
    rgb = torch.rand(views, 3, points, generator=generator).to(dtype_in) * visible[:, None, :]
    rgb_weight = torch.randn(width, 3, generator=generator).to(dtype_in)
    bias = torch.randn(width, generator=generator).to(dtype_in)
    return projected, grid, visible, rgb, rgb_weight, bias


def _token_inputs_pytorch(monkeypatch, *args, dtype):
    with monkeypatch.context() as patch:
        _pytorch_forms(patch)
        return render_kernels.view_token_inputs(*args, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_view_token_inputs_kernel_equals_its_definition(monkeypatch, kernel_calls, dtype):
    """grid_sample's bilinear read (border padding, align_corners) of the projected maps, the colour
    term and the bias, ReLU, in the token layout: against the PyTorch form in fp64."""
    case = _token_inputs_case()
    with torch.inference_mode():
        got = render_kernels.view_token_inputs(*case, dtype=dtype)
        exact = _token_inputs_pytorch(
            monkeypatch, *(t.double() if t.is_floating_point() else t for t in case), dtype=torch.float64
        )
    assert got.shape == (400, 3, 32) and got.dtype == dtype
    assert kernel_calls == {"view_token_inputs": 1}
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-8, "atol": 1e-2}
    torch.testing.assert_close(got.double(), exact, **tolerance)


def test_masked_max_over_views_is_exact_and_zero_where_no_view_sees(monkeypatch, kernel_calls):
    generator = torch.Generator().manual_seed(4)
    tokens = torch.randn(300, 4, 32, generator=generator).bfloat16()
    mask = torch.rand(300, 4, generator=generator) > 0.5
    mask[:5] = False
    with torch.inference_mode():
        got = render_kernels.masked_max_over_views(tokens, mask)
        with monkeypatch.context() as patch:
            _pytorch_forms(patch)
            expected = render_kernels.masked_max_over_views(tokens, mask)
    assert torch.equal(got, expected) and got.dtype == torch.bfloat16
    assert kernel_calls == {"masked_max_views": 1}
    assert torch.equal(got[:5], torch.zeros(5, 32, dtype=torch.bfloat16))


@pytest.mark.parametrize("width", [32, 48])  # 32: a compiled width; 48: any width
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_rows_equals_layer_norm_of_the_sum(kernel_calls, dtype, width):
    generator = torch.Generator().manual_seed(5)
    norm = nn.LayerNorm(width)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(width, generator=generator))
        norm.bias.copy_(torch.randn(width, generator=generator))
    x = (torch.randn(257, width, generator=generator) * 3 + 1).to(dtype)
    residual = torch.randn(257, width, generator=generator).to(dtype)
    with torch.inference_mode():
        normed, same = render_kernels.layer_norm(norm, x)
        normed_sum, summed = render_kernels.layer_norm(norm, x, residual)
    assert same is x and normed.dtype == dtype
    assert kernel_calls == {"layer_norm_rows": 2}
    assert torch.equal(summed, x + residual)  # the sum rounded as a separate add rounds it
    exact_norm = nn.LayerNorm(width).double()
    exact_norm.load_state_dict(norm.state_dict())
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 2**-6}
    with torch.inference_mode():
        torch.testing.assert_close(normed.double(), exact_norm(x.double()), **tolerance)
        torch.testing.assert_close(normed_sum.double(), exact_norm(summed.double()), **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_subtraction_attention_kernel_equals_the_module(kernel_calls, dtype):
    """GNT's view attention from its keys and values: the fused kernel against the module's forward in
    fp64, with points that see no view (the attention gives them zeros, so the output layer its bias)
    and keys and values read in place from a wider tensor, as the fast network passes them."""
    torch.manual_seed(6)
    attention = SubtractionViewAttention(32).eval()
    points, views = 300, 5
    query = torch.randn(points, 32)
    view_tokens, rel_dirs = torch.randn(points, views, 32), torch.randn(points, views, 4)
    mask = torch.rand(points, views) > 0.4
    mask[:7] = False
    with torch.inference_mode():
        kv = keys_values_with_directions(view_tokens, rel_dirs, *attention.kv_projection(), attention.pos_fc)
        wider = torch.cat([kv, torch.randn(points, views, 16)], dim=-1)[..., :64]
        exact = attention.double()(query.double(), view_tokens.double(), rel_dirs.double(), mask)
        attention.to(dtype)
        got = render_kernels.view_attention(attention, query.to(dtype), wider.to(dtype), mask)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert torch.equal(got[:7], attention.out_fc.bias.expand(7, 32))
    assert kernel_calls == {"subtraction_view_attention": 1}
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-6, "atol": 0.05}
    torch.testing.assert_close(got.double(), exact, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, samples", [(4, 32), (2, 7), (8, 32)])
def test_the_softmax_ray_attention_kernel_equals_the_module(kernel_calls, dtype, heads, samples):
    """GNT's ray attention: the fused kernel between the projections against the module's forward in
    fp64, with rays whose mask keeps no sample (zeros, so the output projection's bias) and rays that
    keep one."""
    torch.manual_seed(7)
    attention = SoftmaxRayAttention(32, heads).eval()
    rays = 40
    tokens = torch.randn(rays, samples, 32) * 2
    mask = torch.rand(rays, samples) > 0.3
    mask[:3] = False
    mask[3:5] = False
    mask[3:5, 1] = True
    with torch.inference_mode():
        exact = attention.double()(tokens.double(), mask)
        attention.to(dtype)
        attention.forward = lambda *args: pytest.fail("the module ran instead of the kernel")
        got = render_kernels.ray_attention(attention, tokens.to(dtype), mask)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert torch.equal(got[:3], attention.proj.bias.expand(3, samples, 32))
    assert kernel_calls == {"softmax_ray_attention": 1}
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-6, "atol": 0.05}
    torch.testing.assert_close(got.double(), exact, **tolerance)


def test_every_blocks_keys_and_values_in_one_matmul():
    """`ViewKeysValues` against `keys_values_with_directions` block by block (fp32, 1e-5)."""
    for kind in ("pola_gnt", "gnt"):
        net = perturbed_quick_net(kind, n_blocks=3)
        generator = torch.Generator().manual_seed(7)
        view_tokens = torch.randn(50, 4, 32, generator=generator)
        rel_dirs = torch.randn(50, 4, 4, generator=generator)
        with torch.inference_mode():
            got = ViewKeysValues(net, torch.float32)(view_tokens, rel_dirs)
            for block, kv in zip(net.blocks, got, strict=True):
                attention = block.view_block.attention
                expected = keys_values_with_directions(
                    view_tokens, rel_dirs, *attention.kv_projection(), attention.pos_fc
                )
                torch.testing.assert_close(kv, expected, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# Several chunks at once


@pytest.mark.parametrize("fast", [False, True])
def test_chunks_rendered_at_once_give_the_same_pixels(kernel_calls, fast):
    """Each chunk is computed as it would be alone, on one thread: workers change no pixel (fp32
    network and bf16 fast network), and the caller's thread count comes back afterwards."""
    net = perturbed_quick_net("pola_gnt")
    sources, rays, _ = random_target_rig(net)
    network = FastRenderNetwork(net) if fast else net
    threads = torch.get_num_threads()
    progress: list[tuple[int, int]] = []
    alone = render_rays(network, rays, sources, (1.0, 12.0), DepthSampler(16), 100)
    together = render_rays(
        network, rays, sources, (1.0, 12.0), DepthSampler(16), 100, workers=3, progress=lambda *a: progress.append(a)
    )
    assert torch.equal(alone[0], together[0]) and torch.equal(alone[1], together[1])
    assert torch.get_num_threads() == threads
    assert progress == [(min(start + 100, len(rays)), len(rays)) for start in range(0, len(rays), 100)]
    assert bool(kernel_calls) == fast  # the fast network through the kernels, in every worker


def test_tiles_cover_every_pixel_once_in_squares():
    order = tile_order(7, 10, 9)  # squares of 3 x 3
    assert sorted(order.tolist()) == list(range(70))
    assert order[:9].tolist() == [0, 1, 2, 10, 11, 12, 20, 21, 22]  # the first square, row by row
    assert order[9:12].tolist() == [3, 4, 5]  # then the square beside it
    assert order[-1].item() == 69 and torch.equal(tile_order(4, 5, 1), torch.arange(20))


@pytest.mark.parametrize("fast", [False, True])
def test_an_image_rendered_in_tiles_is_the_image_in_row_order(fast):
    """`render_image` renders square tiles of the image (several chunks at once here, the last tiles
    partial): the pixels of rendering the rays in row order, bit for bit (fp32 network and bf16 network)."""
    net = perturbed_quick_net("pola_gnt")
    sources, rays, _ = random_target_rig(net)  # the rig's rays: every pixel of its 40 x 48 image, row by row
    network = FastRenderNetwork(net) if fast else net
    intrinsics = torch.tensor([[0.8 * 48, 0.0, 24.0], [0.0, 0.8 * 48, 20.0], [0.0, 0.0, 1.0]])
    rows = render_rays(network, rays, sources, (1.0, 12.0), DepthSampler(16), 100)
    tiled = render_image(
        network, torch.eye(4), intrinsics, 40, 48, sources, (1.0, 12.0), DepthSampler(16), 100, workers=2
    )
    assert torch.equal(tiled.rgb, rows[0].reshape(40, 48, 3)) and torch.equal(tiled.depth, rows[1].reshape(40, 48))


def test_work_done_ahead_of_a_render_runs_on_a_chunks_threads(monkeypatch):
    """`chunk_threads(workers)`: the intra-op threads a chunk of `render_rays` runs on (one where several
    workers render at once, the process's otherwise), restored afterwards; the prior's per-image part
    computed ahead of a render takes them, so its convolutions sum in a chunk's order (on fern at 2
    threads, computing it on both threads moved fp32 colours by 6e-7, on one it was bit for bit)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        net = perturbed_quick_net("gnt")
        sources, rays, _ = random_target_rig(net)
        seen = []
        forward = type(net).forward

        def recording_forward(self, *args, **kwargs):
            seen.append(torch.get_num_threads())
            return forward(self, *args, **kwargs)

        monkeypatch.setattr(type(net), "forward", recording_forward)
        render_rays(net, rays, sources, (1.0, 12.0), DepthSampler(16), 100, workers=2)
        assert set(seen) == {1}
        with chunk_threads(2):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with chunk_threads(1):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_a_cancelled_render_stops_between_chunks():
    net = perturbed_quick_net("gnt")
    sources, rays, _ = random_target_rig(net)
    asked = []

    def cancelled() -> bool:
        asked.append(threading.current_thread().name)
        return len(asked) > 2

    threads = torch.get_num_threads()
    with pytest.raises(RenderCancelled):
        render_rays(net, rays, sources, (1.0, 12.0), DepthSampler(16), 100, workers=2, cancelled=cancelled)
    assert len(asked) == 3 and torch.get_num_threads() == threads


def test_the_worker_count_follows_the_threads_and_the_memory_budget():
    settings = perturbed_quick_net("pola_gnt").settings
    render = RenderSettings(n_samples=32, chunk_rays=1024, max_memory_mb=None, precision="auto", workers=None)
    cpu = torch.device("cpu")
    assert render_workers(render, settings, 4, 1024, cpu) == torch.get_num_threads()
    one_pass_mb = 1024 * bytes_per_ray(settings, 32, 4) / 2**20
    assert render_workers(replace(render, max_memory_mb=1.5 * one_pass_mb), settings, 4, 1024, cpu) == 1
    fixed = replace(render, workers=3)
    assert render_workers(fixed, settings, 4, 1024, cpu) == 3
    assert render_workers(fixed, settings, 4, 1024, torch.device("cuda")) == 1
