"""GNT's training recipe beyond the network: several target views per step, the weighted
source pool, the target as its own source, GNT's crop placement, dropout, and what `paper` resolves to."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from helpers import TINY_OVERRIDES, compose_config, scene_and_data, system_of

from pola_gnt.data.datamodule import TrainSteps
from pola_gnt.data.sampling import GNT_CROP_MARGINS, draw_crop_position
from pola_gnt.data.scene_loading import load_scene
from pola_gnt.data.source_views import POOL_FACTORS, random_training_views
from pola_gnt.runs.config.read import read_run_settings


def test_paper_resolves_to_gnts_recipe():
    settings = read_run_settings(compose_config("experiment=paper"))
    data, net = settings.data, settings.model.net
    assert (data.targets_per_step, data.rays_per_step) == (8, 512)
    assert data.source_pool_weights == (0.2, 0.45, 0.35) and data.target_as_source_rate == 0.005
    assert data.crop_placement == "gnt" and net.dropout == 0.1
    assert settings.trainer.precision == "32-true"
    standard = read_run_settings(compose_config("experiment=standard"))
    assert standard.model.net.dropout == 0.1 and standard.data.targets_per_step == 4


def test_one_step_draws_distinct_targets_each_with_its_own_views():
    cfg = compose_config(*TINY_OVERRIDES, "data.targets_per_step=8", "data.num_source_views=2")
    settings = read_run_settings(cfg)
    scene = load_scene(*scene_and_data(cfg))
    assert len(scene.train_ids) >= 8
    steps = TrainSteps(scene, settings.data, 4, seed=0, rank=0)
    for step in range(4):
        batch = steps[step]
        views = [target.view for target in batch.targets]
        assert len(views) == 8 and len(set(views)) == 8, views
        assert batch.n_rays == 8 * settings.data.rays_per_step
        for target in batch.targets:
            assert target.view not in target.sources.ids.tolist() and target.step == step
            # each target's colours are pixels of its own image
            pixels = scene.images[target.view].reshape(-1, 3)
            assert (target.rgb[:, None, :] == pixels[None]).all(-1).any(1).all()
    again = TrainSteps(scene, settings.data, 4, seed=0, rank=0)[2]
    assert [t.view for t in again.targets] == [t.view for t in steps[2].targets]
    # the first target of a step is the step's only target when there is one: the random stream is shared
    single = TrainSteps(
        scene, read_run_settings(compose_config(*TINY_OVERRIDES, "data.num_source_views=2")).data, 4, 0, 0
    )
    assert single[2].targets[0].view == steps[2].targets[0].view


def test_the_step_loss_is_the_mean_of_the_targets_losses():
    cfg = compose_config(*TINY_OVERRIDES, "data.targets_per_step=3")
    scene = load_scene(*scene_and_data(cfg))
    batch = TrainSteps(scene, read_run_settings(cfg).data, 1, seed=0, rank=0)[0]
    torch.manual_seed(0)
    system = system_of(cfg)
    system.log = lambda *args, **kwargs: None  # no trainer attached
    losses = [torch.nn.functional.mse_loss(system.render_batch(t).rgb, t.rgb) for t in batch.targets]
    assert torch.allclose(system.training_step(batch, 0), torch.stack(losses).mean())


def test_pool_factors_follow_their_weights_and_the_target_joins_its_sources_at_its_rate():
    centers = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    ids = list(range(40))

    def pool_sizes(weights, n=4000):
        rng = np.random.default_rng(0)
        sizes = Counter()
        for _ in range(n):
            chosen = random_training_views(centers[0], centers, ids, 4, 0, rng, weights)
            # the views drawn lie in the pool: the farthest chosen view's rank bounds the pool size
            ranks = torch.linalg.norm(centers[1:] - centers[0], dim=-1).argsort().tolist()
            farthest = max(ranks.index(v - 1) for v in chosen)
            sizes[next(k for k in POOL_FACTORS if farthest < 4 * k)] += 1
        return sizes

    weights = (0.2, 0.45, 0.35)
    sizes = pool_sizes(weights)
    # the smallest pool holding every view drawn is at most the drawn one: pools of 3 views x k
    # show as k or less; compare the cumulative shares, which are exact lower bounds
    assert sizes[3] / 4000 <= 0.35 + 0.03 and sizes[1] / 4000 >= 0.2 - 0.03
    assert pool_sizes((0.0, 0.0, 1.0))[3] > 0.8 * 4000 - 1
    assert set(pool_sizes((1.0, 0.0, 0.0))) == {1}

    rng = np.random.default_rng(1)
    always = [random_training_views(centers[0], centers, ids, 4, 5, rng, None, 1.0) for _ in range(50)]
    assert all(views.count(5) == 1 for views in always)
    never = [random_training_views(centers[0], centers, ids, 4, 5, rng, None, 0.0) for _ in range(200)]
    assert all(5 not in views for views in never)
    rate = np.mean([5 in random_training_views(centers[0], centers, ids, 4, 5, rng, None, 0.1) for _ in range(4000)])
    assert abs(rate - 0.1) < 0.02


def test_gnt_crop_placement_keeps_its_margins_and_anywhere_reaches_the_edges():
    rng = np.random.default_rng(0)
    image, crop = (20, 30), (10, 12)
    gnt = [draw_crop_position(rng, crop, image, "gnt") for _ in range(3000)]
    tops, lefts = {p[0] for p in gnt if p}, {p[1] for p in gnt if p}
    low, high = GNT_CROP_MARGINS
    assert tops == set(range(low, image[0] - crop[0] - high + 1))
    assert lefts == set(range(low, image[1] - crop[1] - high + 1))
    anywhere = [draw_crop_position(rng, crop, image, "anywhere") for _ in range(3000)]
    assert {p[0] for p in anywhere if p} == set(range(image[0] - crop[0] + 1))
    assert draw_crop_position(rng, (18, 12), image, "gnt") is None  # no room for the margins
    assert draw_crop_position(rng, (18, 12), image, "anywhere") is not None


@pytest.mark.parametrize("model", ["pola_gnt", "gnt"])
def test_dropout_acts_in_training_only_and_leaves_the_parameters_alone(model):
    # quick's read-out starts from the source colours with a zero colour layer: the transformer's
    # output would not reach the colours of an untrained network
    base = [f"model={model}", *TINY_OVERRIDES, "model.net.readout_source_colour=false"]
    scene = load_scene(*scene_and_data(compose_config(*base)))
    cfg = compose_config(*base, "data.targets_per_step=1")
    batch = TrainSteps(scene, read_run_settings(cfg).data, 1, seed=0, rank=0)[0].targets[0]
    torch.manual_seed(0)
    plain = system_of(compose_config(*base))
    torch.manual_seed(0)
    dropped = system_of(compose_config(*base, "model.net.dropout=0.1"))
    assert plain.state_dict().keys() == dropped.state_dict().keys()  # checkpoints do not depend on it
    for name, value in plain.state_dict().items():
        assert torch.equal(value, dropped.state_dict()[name])
    plain.eval()
    dropped.eval()
    with torch.no_grad():
        assert torch.equal(plain.render_batch(batch).rgb, dropped.render_batch(batch).rgb)
    plain.train()
    dropped.train()
    with torch.no_grad():
        torch.manual_seed(1)
        first = dropped.render_batch(batch).rgb
        torch.manual_seed(2)
        second = dropped.render_batch(batch).rgb
        assert not torch.allclose(first, second)
        plain.eval()
        evaluated = plain.render_batch(batch).rgb
        plain.train()
        assert torch.allclose(plain.render_batch(batch).rgb, evaluated, atol=1e-6)  # rate 0: training = eval


def test_the_gnt_protocol_scores_with_vgg_unquantised_wherever_it_is_used():
    """The training run's test phase reads the same settings as eval: GNT's protocol means LPIPS-VGG on
    the unquantised predictions unless a key says otherwise."""
    gnt = read_run_settings(compose_config("metrics.protocol=gnt")).metrics
    assert (gnt.lpips_net, gnt.quantize_8bit) == ("vgg", False)
    standard = read_run_settings(compose_config()).metrics
    assert (standard.lpips_net, standard.quantize_8bit) == ("alex", True)
    mixed = read_run_settings(compose_config("metrics.protocol=gnt", "metrics.lpips_net=alex")).metrics
    assert (mixed.lpips_net, mixed.quantize_8bit) == ("alex", False)
