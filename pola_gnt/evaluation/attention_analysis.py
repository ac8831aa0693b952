"""Attention diagnostics of a trained Pola-GNT network, as the PolaFormer++ paper plots them: the
library behind `python -m pola_gnt.analyze`.

Renders random rays of a held-out view while recording what every polarity-attention module sees
(`recording_attention`), and summarises and plots per layer:

- the learned temperatures `sigmoid(s)` per channel: the `x+` half against the `x-` half of each
  stream, and the same-sign against the opposite-sign stream for the same query part
  (`attention_temperatures.png`);
- the gate values of the same-sign ("Gs") and opposite-sign ("Go") channels, one point per token and
  stream, projected on their two principal axes (`attention_gates_pca.png`);
- the distribution of the row entropies of the trained polarity weights (both streams) and of softmax
  and ReLU-linear weights computed on the *same* q, k (`attention_entropy.png`);
- the per-layer numbers behind the plots (`analysis.json`).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor, nn

from pola_gnt.attention.diagnostics import (
    attention_entropy,
    learned_temperatures,
    pola_modules,
    polarity_attention_weights,
    recording,
    relu_linear_weights,
    softmax_weights,
    split_gates,
)
from pola_gnt.attention.modules import PolaAttentionBase, PolaRayAttention, PolaViewAttention
from pola_gnt.core.errors import UserError
from pola_gnt.core.files import write_atomic
from pola_gnt.data.datamodule import eval_source_ids, source_batch
from pola_gnt.data.scene import Scene
from pola_gnt.evaluation.image_metrics import LOGGED_MIN_MSE, mse_to_psnr
from pola_gnt.geometry.rays import pixel_grid, pixel_rays
from pola_gnt.model.gnt import GNT
from pola_gnt.model.renderer import render_rays
from pola_gnt.model.sampler import DepthSampler

ENTROPY_METHODS = ("pola_same", "pola_opp", "softmax", "relu_linear")
ENTROPY_LABELS = {
    "pola_same": "polarity, same-sign stream",
    "pola_opp": "polarity, opposite-sign stream",
    "softmax": "softmax (same q, k)",
    "relu_linear": "ReLU linear (same q, k)",
}
# Explicit `[..., Nq, Nk]` weight tensors are built this many elements at a time (bounds memory).
WEIGHT_ELEMENTS_PER_CHUNK = 2**22
# Points per stream drawn in a gate PCA scatter (the numbers use every token).
PLOTTED_GATE_POINTS = 3000


# ------------------------------------------------------------------------------------------------
# Recording the attention inputs (through `diagnostics.recording`: the weights are recomputed
# explicitly from the q, k each pola module's attention gets, so the model's computation is unchanged)


@dataclass
class LayerRecord:
    """What one pola module saw during the forwards: row entropies per method and the used tokens."""

    n_keys: int = 0
    values: dict[str, list[Tensor]] = field(default_factory=lambda: {m: [] for m in ENTROPY_METHODS})
    dead_rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENTROPY_METHODS, 0))
    rows: int = 0
    max_entropy: list[Tensor] = field(default_factory=list)  # log(#visible keys) per row: uniform weights
    used_tokens: list[Tensor] = field(default_factory=list)  # bool per query token, in forward order

    def entropies(self, method: str) -> Tensor:
        return torch.cat(self.values[method]) if self.values[method] else torch.zeros(0)

    def used(self) -> Tensor:
        """Bool `[tokens]` over every query token of every forward (the gates' rows)."""
        return torch.cat(self.used_tokens)


def used_queries(module: PolaAttentionBase, key_mask: Tensor | None, batch: int, n_queries: int) -> Tensor:
    """Bool `[B, Nq]`: queries whose output can reach the rendered colour.

    View attention: a point seen by at least one view (others get zeros). Ray self-attention: the
    queries are the samples themselves, and an unseen sample is neither a key, nor in the LePE, nor
    in the read-out.
    """
    if key_mask is None:
        return torch.ones(batch, n_queries, dtype=torch.bool)
    if isinstance(module, PolaRayAttention):
        return key_mask
    return key_mask.any(dim=-1, keepdim=True).expand(batch, n_queries)


def record_attention(
    record: LayerRecord, module: PolaAttentionBase, q: Tensor, k: Tensor, key_mask: Tensor | None
) -> None:
    """Add the row entropies of every method on q `[B, heads, Nq, d]`, k `[B, heads, Nk, d]`.

    `key_mask` `[B, Nk]` (True = key may be attended) is the mask the module received. Only rows of
    used queries (`used_queries`) with at least two visible keys count (with one key every method
    has entropy 0). A row with keys but no weight (e.g. ReLU of an all-negative q) is a dead row of
    that method, not an entropy of 0.
    """
    temp_same, temp_opp = (t.detach().float().unsqueeze(-2) for t in module.temperatures())  # [heads, 1, 2d]
    q, k = q.detach().float(), k.detach().float()
    batch, heads, n_queries, _ = q.shape
    n_keys = k.shape[-2]
    record.n_keys = max(record.n_keys, n_keys)
    used = used_queries(module, key_mask, batch, n_queries).to(q.device)  # [B, Nq]
    record.used_tokens.append(used.flatten().cpu())
    mask = None if key_mask is None else key_mask.unsqueeze(-2).expand(batch, heads, n_keys)  # [B, heads, Nk]
    chunk = max(1, WEIGHT_ELEMENTS_PER_CHUNK // (heads * n_queries * n_keys))
    for start in range(0, batch, chunk):
        q_chunk, k_chunk = q[start : start + chunk], k[start : start + chunk]
        m_chunk = None if mask is None else mask[start : start + chunk]
        n_visible = (
            torch.full(k_chunk.shape[:-1], n_keys, device=q.device) if m_chunk is None else m_chunk.sum(dim=-1)
        )  # [b, heads]
        rows = used[start : start + chunk, None, :] & (n_visible[..., None] >= 2)  # [b, heads, Nq]
        w_same, w_opp = polarity_attention_weights(q_chunk, k_chunk, temp_same, temp_opp, m_chunk)
        weights = {
            "pola_same": w_same,
            "pola_opp": w_opp,
            "softmax": softmax_weights(q_chunk, k_chunk, m_chunk),
            "relu_linear": relu_linear_weights(q_chunk, k_chunk, m_chunk),
        }
        for method, w in weights.items():
            alive = rows & (w.sum(dim=-1) > 0)
            record.values[method].append(attention_entropy(w, m_chunk)[alive].cpu())
            record.dead_rows[method] += int((rows & ~alive).sum())
        record.rows += int(rows.sum())
        record.max_entropy.append(torch.log(n_visible[..., None].expand_as(rows)[rows].float()).cpu())


@dataclass
class RecordedAttention:
    layers: dict[str, LayerRecord]  # module name -> row entropies of every method, used tokens
    gates: dict[str, Tensor]  # module name -> [tokens, dim]


@contextlib.contextmanager
def recording_attention(model: nn.Module) -> Iterator[RecordedAttention]:
    """Record what every pola module of `model` computes during the forwards in the block: its gates,
    and the row entropies of every method on the heads-split q, k its attention gets (after the
    projections and the relative-direction embedding), through `diagnostics.recording`. The weights
    are recomputed explicitly from the same q, k, so nothing in the model's own computation changes."""
    layers = {name: LayerRecord() for name, _ in pola_modules(model)}

    def on_inputs(name: str, module: PolaAttentionBase, q: Tensor, k: Tensor, key_mask: Tensor | None) -> None:
        record_attention(layers[name], module, q, k, key_mask)

    with recording(model, on_inputs) as recorded:
        yield RecordedAttention(layers=layers, gates=recorded.gates)


# ------------------------------------------------------------------------------------------------
# Summaries


def layer_label(name: str, module: PolaAttentionBase) -> str:
    """`blocks.0.view_block.attention` -> `block 0, view attention`."""
    parts = name.split(".")
    kind = "view" if isinstance(module, PolaViewAttention) else "ray"
    block = parts[1] if len(parts) > 1 and parts[0] == "blocks" else name
    return f"block {block}, {kind} attention"


def _stats(x: Tensor) -> dict[str, float]:
    x = x.double()
    return {"mean": float(x.mean()), "std": float(x.std(correction=0)), "min": float(x.min()), "max": float(x.max())}


def temperature_pairs(temp_same: Tensor, temp_opp: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """Scatter pairs from temperatures `[heads, 2d]`, flattened over heads and channels.

    - `halves_same` / `halves_opp`: channels `[0, d)` against `[d, 2d)` of each stream's 2d vector;
    - `streams_pos` / `streams_neg`: the temperature that acts on `q+` (or `q-`) of a channel in the
      same-sign stream against the one acting on that same part in the opposite-sign stream. The
      opposite-sign features are `expm1(temp_opp * [q-, q+])`, so `q+` meets `temp_opp[d:]`.
    """
    d = temp_same.shape[-1] // 2
    return {
        "halves_same": (temp_same[:, :d].flatten(), temp_same[:, d:].flatten()),
        "halves_opp": (temp_opp[:, :d].flatten(), temp_opp[:, d:].flatten()),
        "streams_pos": (temp_same[:, :d].flatten(), temp_opp[:, d:].flatten()),
        "streams_neg": (temp_same[:, d:].flatten(), temp_opp[:, :d].flatten()),
    }


def temperature_summary(temp_same: Tensor, temp_opp: Tensor) -> dict:
    """Statistics of both streams and how far the paired temperatures are from the diagonal."""
    pairs = temperature_pairs(temp_same, temp_opp)
    return {
        "same_sign": _stats(temp_same),
        "opposite_sign": _stats(temp_opp),
        # mean |x - y| over the points of each scatter: 0 = on the diagonal
        "mean_abs_offset_from_diagonal": {name: float((x - y).abs().mean()) for name, (x, y) in pairs.items()},
    }


@dataclass
class GateProjection:
    same: Tensor  # [tokens, 2] same-sign gates on the two principal axes
    opp: Tensor  # [tokens, 2]
    explained_variance: list[float]  # fraction of the total variance along each axis
    summary: dict


def _mean_squared_deviation(points: Tensor) -> float:
    """Mean squared distance of `points` `[n, c]` to their mean."""
    return float(((points - points.mean(dim=0)) ** 2).sum(dim=-1).mean())


def gate_projection(gates: Tensor, heads: int) -> GateProjection:
    """PCA of the same-sign and opposite-sign gate channels (gates `[tokens, dim]`) and their separation.

    Each token gives one point per stream, in `R^(dim/2)`; both point sets share one PCA. The
    separation is the distance between the two means over the pooled standard deviation (root mean
    squared distance of the points to their own mean), in the full space.
    """
    same, opp = (g.double() for g in split_gates(gates, heads))  # [tokens, dim / 2] each
    points = torch.cat([same, opp])
    centred = points - points.mean(dim=0)
    _, singular, basis = torch.linalg.svd(centred, full_matrices=False)
    projected = centred @ basis[:2].T  # [2 tokens, 2]
    total = float((singular**2).sum())
    pooled_std = math.sqrt((_mean_squared_deviation(same) + _mean_squared_deviation(opp)) / 2)
    distance = float((same.mean(dim=0) - opp.mean(dim=0)).norm())
    explained = [float(s**2) / total if total > 0 else 0.0 for s in singular[:2]]
    return GateProjection(
        same=projected[: len(same)].float(),
        opp=projected[len(same) :].float(),
        explained_variance=explained,
        summary={
            "tokens": len(same),
            "mean_distance": distance,
            "pooled_std": pooled_std,
            # None: every gate of both streams is identical, there is no spread to compare with
            "separation": distance / pooled_std if pooled_std > 0 else None,
            "pca_explained_variance": explained,
        },
    )


def entropy_summary(record: LayerRecord) -> dict:
    """`max_entropy` = log(n_keys) bounds every row; `uniform_entropy_mean` is the mean over the counted
    rows of log(#visible keys), the entropy of uniform weights (fewer keys where some are masked)."""
    summary = {
        "n_keys": record.n_keys,
        "max_entropy": math.log(record.n_keys),
        "rows": record.rows,
        "uniform_entropy_mean": float(torch.cat(record.max_entropy).double().mean()) if record.rows else None,
    }
    for method in ENTROPY_METHODS:
        values = record.entropies(method).double()
        summary[method] = {
            "mean": float(values.mean()) if len(values) else None,
            "median": float(values.median()) if len(values) else None,
            "dead_row_fraction": record.dead_rows[method] / record.rows if record.rows else None,
        }
    return summary


@dataclass
class LayerDiagnostics:
    """Everything plotted and summarised for one pola module."""

    name: str  # module path in the network, e.g. blocks.0.view_block.attention
    label: str
    heads: int
    head_dim: int
    temp_same: Tensor  # [heads, 2 * head_dim]
    temp_opp: Tensor  # [heads, 2 * head_dim]
    gates: GateProjection
    record: LayerRecord

    def summary(self) -> dict:
        return {
            "name": self.name,
            "label": self.label,
            "heads": self.heads,
            "head_dim": self.head_dim,
            "entropy": entropy_summary(self.record),
            "temperature": temperature_summary(self.temp_same, self.temp_opp),
            "gates": self.gates.summary,
        }


def layer_diagnostics(
    net: nn.Module, gates: dict[str, Tensor], records: dict[str, LayerRecord]
) -> list[LayerDiagnostics]:
    """Per pola module, in network order, from the gates and records of the same forwards."""
    modules = dict(pola_modules(net))
    layers = []
    for row in learned_temperatures(net):
        name, module = row["name"], modules[row["name"]]
        record = records[name]
        layers.append(
            LayerDiagnostics(
                name=name,
                label=layer_label(name, module),
                heads=module.heads,
                head_dim=module.head_dim,
                temp_same=row["temp_same"].float(),
                temp_opp=row["temp_opp"].float(),
                # Only the gates of tokens that reach the output (unseen points all share one constant gate).
                gates=gate_projection(gates[name].cpu()[record.used()], module.heads),
                record=record,
            )
        )
    return layers


def dead_rows_note(record: LayerRecord, method: str) -> str:
    fraction = record.dead_rows[method] / record.rows if record.rows else 0.0
    return f", {100 * fraction:.2g}% dead rows" if fraction > 0 else ""


# ------------------------------------------------------------------------------------------------
# Plots


def _square_limits(*values: Tensor) -> tuple[float, float]:
    """Equal x and y limits around all points, padded, so the diagonal is the true y = x."""
    every = torch.cat([v.flatten() for v in values])
    low, high = float(every.min()), float(every.max())
    pad = max(0.02, 0.08 * (high - low))
    return low - pad, high + pad


# (series key, legend, colour) of each temperature panel, then axis labels and title.
TEMPERATURE_PANELS = (
    (
        (("halves_same", "same-sign stream", "C0"), ("halves_opp", "opposite-sign stream", "C1")),
        "x+ half (channels [0, d))",
        "x- half (channels [d, 2d))",
        "positive vs negative half",
    ),
    (
        (("streams_pos", "acting on q+", "C2"), ("streams_neg", "acting on q-", "C3")),
        "same-sign stream",
        "opposite-sign stream",
        "same-sign vs opposite-sign stream",
    ),
)


def plot_temperatures(layers: list[LayerDiagnostics], path: Path) -> None:
    figure = Figure(figsize=(9.0, 4.0 * len(layers)), layout="constrained")
    grid = figure.subplots(len(layers), len(TEMPERATURE_PANELS), squeeze=False)
    for row, layer in zip(grid, layers):
        pairs = temperature_pairs(layer.temp_same, layer.temp_opp)
        for axes, (series, xlabel, ylabel, title) in zip(row, TEMPERATURE_PANELS):
            offset = torch.cat([(pairs[key][0] - pairs[key][1]).abs() for key, _, _ in series]).mean()
            low, high = _square_limits(*(t for key, _, _ in series for t in pairs[key]))
            axes.plot([low, high], [low, high], color="grey", lw=1, linestyle="--", label="y = x")
            for key, label, colour in series:
                x, y = pairs[key]
                axes.scatter(x.numpy(), y.numpy(), s=14, alpha=0.75, color=colour, label=label)
            axes.set_xlim(low, high)
            axes.set_ylim(low, high)
            axes.set_aspect("equal")
            axes.set_xlabel(f"temperature, {xlabel}")
            axes.set_ylabel(f"temperature, {ylabel}")
            axes.set_title(f"{layer.label}\n{title}, mean |x - y| = {float(offset):.2g}", fontsize=10)
            axes.legend(fontsize=8)
    figure.suptitle("Learned per-channel temperatures sigmoid(s) (initialised at 0.5)")
    figure.savefig(path, dpi=100)


def plot_gates(layers: list[LayerDiagnostics], path: Path, seed: int) -> None:
    columns = min(4, len(layers))
    rows = math.ceil(len(layers) / columns)
    figure = Figure(figsize=(4.2 * columns, 4.0 * rows), layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False).flatten()
    generator = torch.Generator().manual_seed(seed)
    for axes, layer in zip(grid, layers):
        projection = layer.gates
        for points, colour, label in (
            (projection.same, "C0", "Gs (same-sign channels)"),
            (projection.opp, "C3", "Go (opposite-sign channels)"),
        ):
            shown = points[torch.randperm(len(points), generator=generator)[:PLOTTED_GATE_POINTS]]
            axes.scatter(
                shown[:, 0].numpy(), shown[:, 1].numpy(), s=3, alpha=0.35, color=colour, label=label, rasterized=True
            )
        explained = projection.explained_variance
        axes.set_xlabel(f"PC 1 ({100 * explained[0]:.0f}% var.)")
        axes.set_ylabel(f"PC 2 ({100 * explained[1]:.0f}% var.)" if len(explained) > 1 else "PC 2")
        separation = projection.summary["separation"]
        axes.set_title(
            f"{layer.label}\nseparation {'n/a' if separation is None else f'{separation:.2f}'}"
            " (mean distance / pooled std)",
            fontsize=10,
        )
        axes.legend(fontsize=7, markerscale=3)
    for axes in grid[len(layers) :]:
        axes.set_visible(False)
    figure.suptitle("Polarity gates under PCA: same-sign vs opposite-sign channels, one point per token")
    figure.savefig(path, dpi=100)


def plot_entropies(layers: list[LayerDiagnostics], path: Path) -> None:
    columns = min(2, len(layers))
    rows = math.ceil(len(layers) / columns)
    figure = Figure(figsize=(6.5 * columns, 3.8 * rows), layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False).flatten()
    colours = dict(zip(ENTROPY_METHODS, ("C0", "C1", "C2", "C7")))
    for axes, layer in zip(grid, layers):
        record = layer.record
        top = math.log(record.n_keys)
        bins = torch.linspace(0.0, top * 1.02, 41).numpy()
        for method in ENTROPY_METHODS:
            values = record.entropies(method)
            if len(values) == 0:
                continue
            axes.hist(
                values.numpy(),
                bins=bins,
                density=True,
                histtype="step",
                lw=1.6,
                color=colours[method],
                label=f"{ENTROPY_LABELS[method]}: mean {float(values.mean()):.2f}{dead_rows_note(record, method)}",
            )
        axes.axvline(top, color="black", linestyle="--", lw=1, label=f"uniform over {record.n_keys} keys: {top:.2f}")
        axes.set_xlabel("row entropy (nats)")
        axes.set_ylabel("density")
        axes.set_title(layer.label, fontsize=10)
        axes.legend(fontsize=7, loc="upper left")
    for axes in grid[len(layers) :]:
        axes.set_visible(False)
    figure.suptitle("Attention entropy on the same q, k: trained polarity weights vs softmax and ReLU-linear")
    figure.savefig(path, dpi=100)


# ------------------------------------------------------------------------------------------------
# One view, end to end


@dataclass
class RecordedView:
    view: int
    n_rays: int
    psnr: float  # of the rendered rays against the ground truth (a sanity check of the checkpoint)
    gates: dict[str, Tensor]  # module name -> [tokens, dim]
    records: dict[str, LayerRecord]


def render_recorded(
    net: GNT,
    scene: Scene,
    view: int,
    n_rays: int,
    seed: int,
    num_source_views: int,
    sampler: DepthSampler,
    chunk_rays: int,
) -> RecordedView:
    """Render `n_rays` random pixels of `view` from its evaluation source views, recording the attention."""
    device = next(net.parameters()).device
    height, width = scene.resolution
    chosen = torch.randperm(height * width, generator=torch.Generator().manual_seed(seed))[:n_rays]
    rays = pixel_rays(scene.cameras.c2w[view], scene.cameras.intrinsics[view], pixel_grid(height, width)[chosen])
    batch = source_batch(scene, eval_source_ids(scene, view, num_source_views))
    with torch.no_grad():
        sources = net.source_views(batch.images.to(device), batch.c2w.to(device), batch.intrinsics.to(device))
    with recording_attention(net) as recorded:
        rgb, _ = render_rays(net, rays.to(device), sources, scene.depth_range, sampler, chunk_rays)
    if not any(bool(record.used().any()) for record in recorded.layers.values()):
        raise UserError(
            f"analyze.n_rays: no sample of the {len(rays)} rays of view {scene.image_names[view]} "
            f"is seen by a source view; nothing to analyse"
        )
    target = scene.images[view].reshape(-1, 3)[chosen].to(device)
    psnr = float(mse_to_psnr(((rgb - target) ** 2).mean(), LOGGED_MIN_MSE))
    return RecordedView(view=view, n_rays=len(rays), psnr=psnr, gates=recorded.gates, records=recorded.layers)


def analyse_view(
    net: GNT,
    scene: Scene,
    view: int,
    n_rays: int,
    seed: int,
    num_source_views: int,
    sampler: DepthSampler,
    chunk_rays: int,
    out_dir: Path,
    header: dict,
) -> dict:
    """Render and record `n_rays` random pixels of `view` (`render_recorded`), write the three figures
    and `analysis.json` into `out_dir`; return that document. `header`: its first keys (what was
    analysed: the checkpoint, the model)."""
    recorded = render_recorded(net, scene, view, n_rays, seed, num_source_views, sampler, chunk_rays)
    layers = layer_diagnostics(net, recorded.gates, recorded.records)
    plot_temperatures(layers, out_dir / "attention_temperatures.png")
    plot_gates(layers, out_dir / "attention_gates_pca.png", seed)
    plot_entropies(layers, out_dir / "attention_entropy.png")
    document = {
        **header,
        "scene": scene.name,
        "view": {"index": recorded.view, "name": scene.image_names[recorded.view]},
        "n_rays": recorded.n_rays,
        "n_samples": sampler.n_samples,
        "num_source_views": num_source_views,
        "psnr_on_rays": recorded.psnr,
        "layers": [layer.summary() for layer in layers],
    }
    write_atomic(out_dir / "analysis.json", (json.dumps(document, indent=2) + "\n").encode())
    return document


def summary_lines(document: dict, out_dir: Path) -> list[str]:
    """What `python -m pola_gnt.analyze` prints: the view, then per layer the mean row entropy of every
    method and the gate separation, then the files written."""
    lines = [
        f"{document['scene']} view {document['view']['name']}, {document['n_rays']} rays, "
        f"PSNR on these rays {document['psnr_on_rays']:.2f} dB",
        f"{'layer':<28}{'keys':>5}" + "".join(f"{m:>13}" for m in ENTROPY_METHODS) + f"{'gate sep.':>11}",
    ]
    for layer in document["layers"]:
        entropy = layer["entropy"]
        means = (entropy[m]["mean"] for m in ENTROPY_METHODS)
        cells = "".join(f"{'n/a' if mean is None else f'{mean:.3f}':>13}" for mean in means)
        separation = layer["gates"]["separation"]
        lines.append(
            f"{layer['label']:<28}{entropy['n_keys']:>5}{cells}"
            f"{'n/a' if separation is None else f'{separation:.2f}':>11}"
        )
    lines.append(
        f"(mean row entropies in nats) wrote attention_temperatures.png, attention_gates_pca.png, "
        f"attention_entropy.png and analysis.json to {out_dir}"
    )
    return lines
