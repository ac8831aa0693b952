"""Reading runs: every `metrics.json` below the given paths, one `Row` each (its mode, condition,
seed and timings), and the newest file of each run."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

from pola_gnt.core.errors import UserError
from pola_gnt.evaluation.study.rows import (
    FINE_TUNED,
    METRICS,
    METRICS_FILE,
    MODES,
    PER_SCENE,
    UNKNOWN_CONDITION,
    ZERO_SHOT,
    Row,
)


def find_metrics_files(paths: Iterable[Path]) -> list[Path]:
    """Every `metrics.json` named or found below `paths`, each once, in a stable order."""
    found: dict[Path, None] = {}
    for path in paths:
        if not path.exists():
            raise UserError(f"{path}: not found")
        if path.is_file():
            if path.name != METRICS_FILE:
                raise UserError(f"{path}: expected a run folder or a {METRICS_FILE} file")
            candidates = [path]
        else:
            candidates = sorted(path.rglob(METRICS_FILE))
            if not candidates:
                raise UserError(f"{path}: no {METRICS_FILE} found in this folder or below")
        found.update(dict.fromkeys(p.resolve() for p in candidates))
    return list(found)


def _metric_value(value, where: str, allow_null: bool) -> float | None:
    if value is None and allow_null:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _scores(section, where: str) -> dict[str, float | None]:
    if not isinstance(section, dict):
        raise ValueError(f"{where}: missing or not an object")
    # PSNR and SSIM are always computed; LPIPS is null when no weights were available.
    return {name: _metric_value(section.get(name), f"{where}.{name}", allow_null=name == "lpips") for name in METRICS}


def load_run(path: Path) -> Row:
    """The scene-mean row of one `metrics.json` (docs/interface.md format)."""
    try:
        document = json.loads(path.read_text())
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        header = {}
        for key in ("scene", "model", "protocol", "lpips_net"):
            if not isinstance(document.get(key), str):
                raise ValueError(f"{key}: missing or not a string")
            header[key] = document[key]
        scores = _scores(document.get("mean"), "mean")
        baseline = _scores(document.get("baseline"), "baseline")
        per_image = document.get("per_image")
        n_images = len(per_image) if isinstance(per_image, list) and per_image else None
        study = _study_fields(document)
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(f"{path}: malformed {METRICS_FILE} ({err})") from None
    return Row(
        "run",
        header["model"],
        header["scene"],
        header["protocol"],
        header["lpips_net"],
        scores,
        baseline,
        source=str(path),
        mtime=path.stat().st_mtime,
        n_images=n_images,
        **study,
    )


def _optional(document: dict, key: str, kind: type | tuple[type, ...], where: str = ""):
    value = document.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{where}{key}: unexpected value {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}{key}: not finite")
    return value


def run_mode(document: dict) -> str:
    """The run's mode: "mode" when given, else derived (older files, without these fields: per-scene).
    Bad values are a ValueError naming the field."""
    init_from = document.get("init_from")
    if init_from is not None and not isinstance(init_from, dict):
        raise ValueError(f"init_from: expected null or an object, got {init_from!r}")
    seen = document.get("seen_in_training")
    if seen is not None and not isinstance(seen, bool):
        raise ValueError(f"seen_in_training: expected true, false or null, got {seen!r}")
    scenes = document.get("training_scenes")
    if scenes is not None and not (isinstance(scenes, list) and all(isinstance(s, str) for s in scenes)):
        raise ValueError(f"training_scenes: expected a list of scene names, got {scenes!r}")
    mode = document.get("mode")
    if mode is None:
        return FINE_TUNED if init_from is not None else ZERO_SHOT if seen is False else PER_SCENE
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


def _study_fields(document: dict) -> dict:
    """Seed, mode, condition and timings of a run (absent in older files: None / per-scene / "budget
    n/a"). A zero-shot run's budget is its checkpoint's pretraining, not a budget on the scored scene:
    its condition is "zero-shot" (and the settings), so zero-shot Pola-GNT and GNT runs are grouped and
    paired whatever their pretraining budgets; their steps and times stay the checkpoint's."""
    mode = run_mode(document)
    budget = document.get("budget")
    if budget is not None and not (isinstance(budget, dict) and isinstance(budget.get("label"), str)):
        raise ValueError("budget: expected an object with a label")
    training = document.get("training") or {}
    if not isinstance(training, dict):
        raise ValueError("training: expected an object")
    number = (int, float)
    settings = [_optional(document, key, int) for key in ("factor", "n_samples", "num_source_views")]
    condition = ZERO_SHOT if mode == ZERO_SHOT else budget["label"] if budget is not None else UNKNOWN_CONDITION
    if all(value is not None for value in settings):
        condition += "; factor {}, {} samples, {} views".format(*settings)
    steps = _optional(training, "steps", int, "training.")
    return {
        "seed": _optional(document, "seed", int),
        "condition": condition,
        "mode": mode,
        "steps": steps if steps is not None else _optional(document, "global_step", int),
        "train_time_s": _optional(training, "wall_time_s", number, "training."),
        "steps_per_s": _optional(training, "steps_per_s", number, "training."),
        "test_time_s": _optional(document, "test_time_s", number),
        "stopped_by": _optional(training, "stopped_by", str, "training."),
    }


def keep_newest(rows: list[Row]) -> tuple[list[Row], list[str]]:
    """One row per `Row.key` (scene, model, mode, protocol, LPIPS net, condition, seed): the newest file
    wins. Returns the rows and a note per ignored file. (An LPIPS-VGG evaluation of a run is kept next to
    its LPIPS-Alex one.)"""
    newest: dict[tuple[str, ...], Row] = {}
    for row in sorted(rows, key=lambda r: r.mtime):
        newest[row.key] = row  # later files overwrite earlier ones
    notes = [
        f"duplicate {' / '.join(row.key)}: kept {newest[row.key].source} (newest), ignored {row.source}"
        for row in rows
        if newest[row.key] is not row
    ]
    return list(newest.values()), notes
