"""The seeded study: per-condition statistics over seeds (`GroupStats`) and the paired differences
(`PairedDifference`): Pola-GNT minus GNT by scene and seed within one mode, and fine-tuned minus
trained from scratch by model, scene, seed and condition, each with a Student t interval."""

from __future__ import annotations

from dataclasses import dataclass

from pola_gnt.evaluation.stats import Summary, summarize
from pola_gnt.evaluation.study.rows import (
    CONFIDENCE,
    FINE_TUNED,
    METRICS,
    MODEL_COMPARISON,
    PAIR,
    PER_SCENE,
    SCRATCH_COMPARISON,
    SCRATCH_PAIR,
    Row,
    complete_mean,
    mode_order,
    model_label,
    model_order,
    scene_order,
    seed_order,
)


@dataclass
class GroupStats:
    """One (scene, model, mode, condition, protocol, LPIPS net) over its seeds."""

    scene: str
    model: str
    condition: str
    protocol: str
    lpips_net: str
    seeds: list[int | None]
    metrics: dict[str, Summary | None]  # None when a run lacks the metric (LPIPS without weights)
    steps: float | None
    train_time_s: float | None
    steps_per_s: float | None
    test_time_s: float | None
    mode: str = PER_SCENE


@dataclass
class PairedDifference:
    """`first - second` over runs paired by scene and seed within one condition: `PAIR[0] - PAIR[1]`
    within one mode (`comparison` MODEL_COMPARISON), or one model fine-tuned minus trained from
    scratch (SCRATCH_COMPARISON)."""

    scene: str  # a scene, or "all N scenes" pooling every (scene, seed) pair
    condition: str
    protocol: str
    lpips_net: str
    pairs: list[tuple[str, int]]  # (scene, seed)
    metrics: dict[str, Summary | None]
    comparison: str = MODEL_COMPARISON
    model: str = MODEL_COMPARISON  # the models compared, or the one model of a fine-tuned - scratch pair
    mode: str = PER_SCENE  # the mode both runs share, or SCRATCH_COMPARISON


def _summary(values: list[float | None]) -> Summary | None:
    present = [v for v in values if v is not None]
    return None if not values or len(present) != len(values) else summarize(present, CONFIDENCE)


def study_groups(runs: list[Row]) -> list[GroupStats]:
    groups: dict[tuple, list[Row]] = {}
    for row in runs:
        key = (row.scene, row.model, row.mode, row.condition, row.protocol, row.lpips_net)
        groups.setdefault(key, []).append(row)
    stats = []
    for key in sorted(groups, key=lambda k: (scene_order(k[0]), mode_order(k[2]), *k[3:], model_order(k[1]))):
        scene, model, mode, condition, protocol, lpips_net = key
        members = sorted(groups[key], key=seed_order)
        stats.append(
            GroupStats(
                scene,
                model,
                condition,
                protocol,
                lpips_net,
                seeds=[r.seed for r in members],
                metrics={m: _summary([r.scores[m] for r in members]) for m in METRICS},
                steps=complete_mean([r.steps for r in members]),
                train_time_s=complete_mean([r.train_time_s for r in members]),
                steps_per_s=complete_mean([r.steps_per_s for r in members]),
                test_time_s=complete_mean([r.test_time_s for r in members]),
                mode=mode,
            )
        )
    return stats


# A pairing cell: the runs that may be paired with each other, by side (a model or a mode), then seed.
Cells = dict[tuple, dict[str, dict[int, Row]]]


def paired_differences(runs: list[Row]) -> tuple[list[PairedDifference], list[str]]:
    """`PAIR[0] - PAIR[1]` per (scene, mode, condition, protocol, LPIPS net), paired by seed; then pooled
    over the scenes of a (mode, condition, protocol, LPIPS net) when there are several. Returns the
    differences and a note per run left without a partner (no seed, or its seed missing for the other
    model)."""
    cells: Cells = {}
    notes = []
    for row in runs:
        if row.model not in PAIR:
            continue
        if row.seed is None:
            notes.append(f"not paired (no seed in its metrics.json): {row.source}")
            continue
        key = (row.scene, row.mode, row.condition, row.protocol, row.lpips_net)
        cells.setdefault(key, {}).setdefault(row.model, {})[row.seed] = row
    differences = []
    per_condition: dict[tuple, list[tuple[str, int, Row, Row]]] = {}
    for key in sorted(cells, key=lambda k: (scene_order(k[0]), mode_order(k[1]), k[2], k[3], k[4])):
        scene, mode, condition, protocol, lpips_net = key
        where = f"{scene}, {condition}"
        pairs = _pairs(cells[key], PAIR, where, {model: model_label(model, mode) for model in PAIR}, notes)
        if not pairs:
            continue
        per_condition.setdefault((mode, condition, protocol, lpips_net), []).extend(pairs)
        differences.append(_difference(scene, condition, protocol, lpips_net, pairs, mode=mode))
    for (mode, condition, protocol, lpips_net), pairs in per_condition.items():
        scenes = {scene for scene, *_ in pairs}
        if len(scenes) > 1:
            differences.append(
                _difference(f"all {len(scenes)} scenes", condition, protocol, lpips_net, pairs, mode=mode)
            )
    return differences, notes


def scratch_differences(runs: list[Row]) -> tuple[list[PairedDifference], list[str]]:
    """Fine-tuned minus per-scene (trained from scratch) per (scene, model, condition, protocol, LPIPS
    net), paired by seed; then pooled over the scenes of a (model, condition, protocol, LPIPS net) when
    there are several. Notes name the runs left without a partner, only where a scene, model and
    condition has a fine-tuned run (a report of per-scene runs alone has nothing to pair)."""
    cells: Cells = {}
    notes = []
    for row in runs:
        if row.mode not in SCRATCH_PAIR:
            continue
        if row.seed is None:
            if row.mode == FINE_TUNED:
                notes.append(f"not paired with a from-scratch run (no seed in its metrics.json): {row.source}")
            continue
        key = (row.scene, row.model, row.condition, row.protocol, row.lpips_net)
        cells.setdefault(key, {}).setdefault(row.mode, {})[row.seed] = row
    differences = []
    per_condition: dict[tuple, list[tuple[str, int, Row, Row]]] = {}
    for key in sorted(cells, key=lambda k: (scene_order(k[0]), model_order(k[1]), k[2], k[3], k[4])):
        if FINE_TUNED not in cells[key]:
            continue
        scene, model, condition, protocol, lpips_net = key
        pairs = _pairs(cells[key], SCRATCH_PAIR, f"{scene}, {model}, {condition}", {}, notes)
        if not pairs:
            continue
        per_condition.setdefault((model, condition, protocol, lpips_net), []).extend(pairs)
        differences.append(_scratch_difference(scene, model, condition, protocol, lpips_net, pairs))
    for (model, condition, protocol, lpips_net), pairs in per_condition.items():
        scenes = {scene for scene, *_ in pairs}
        if len(scenes) > 1:
            pooled = f"all {len(scenes)} scenes"
            differences.append(_scratch_difference(pooled, model, condition, protocol, lpips_net, pairs))
    return differences, notes


def _pairs(
    cell: dict[str, dict[int, Row]], sides: tuple[str, str], where: str, names: dict[str, str], notes: list[str]
) -> list[tuple[str, int, Row, Row]]:
    """(scene, seed, first, second) for each seed both sides of a cell have; a note per seed only one has
    (`names` spells a side in it, when not as it is)."""
    a, b = cell.get(sides[0], {}), cell.get(sides[1], {})
    for seed in sorted(set(a) ^ set(b)):
        missing = sides[1] if seed in a else sides[0]
        notes.append(f"not paired: {where}, seed {seed} has no {names.get(missing, missing)} run")
    return [(row.scene, seed, row, b[seed]) for seed, row in sorted(a.items()) if seed in b]


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _difference(
    scene: str, condition: str, protocol: str, lpips_net: str, pairs: list[tuple[str, int, Row, Row]], **labels: str
) -> PairedDifference:
    metrics = {}
    for m in METRICS:
        values = [_minus(x.scores[m], y.scores[m]) for _, _, x, y in pairs]
        metrics[m] = _summary(values)
    pair_list = [(s, seed) for s, seed, _, _ in pairs]
    return PairedDifference(scene, condition, protocol, lpips_net, pair_list, metrics, **labels)


def _scratch_difference(
    scene: str, model: str, condition: str, protocol: str, lpips_net: str, pairs: list[tuple[str, int, Row, Row]]
) -> PairedDifference:
    labels = {"comparison": SCRATCH_COMPARISON, "model": model, "mode": SCRATCH_COMPARISON}
    return _difference(scene, condition, protocol, lpips_net, pairs, **labels)
