"""The checkpoints shipped in the package (`pola_gnt/pretrained/`): slimming a training run's checkpoint
to what evaluation and fine-tuning read, and the manifest that records how each was made and what it
scored. `scripts/ship_pretrained.py` uses both; the tests check the files against the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pola_gnt.core.errors import UserError
from pola_gnt.core.files import file_sha256, write_atomic
from pola_gnt.core.paths import pretrained_dir
from pola_gnt.model.backbone import frozen_conv_count, omit_frozen_convs
from pola_gnt.runs.checkpoints import TRAINING_RECORD, read_checkpoint, stored_config_dict
from pola_gnt.runs.training_budget import TIMER_STATE_KEY

MANIFEST = "manifest.json"
MAX_BYTES = 10 * 2**20  # the package ships checkpoints of at most 10 MB
# What eval, render_video, analyze and init_from read; the optimiser, scheduler and loop states are
# only for resuming the training run, which the run folder keeps.
KEPT_KEYS = ("state_dict", "hyper_parameters", "global_step", "epoch", "pytorch-lightning_version", TRAINING_RECORD)


def slim_checkpoint(checkpoint: dict, path: Path) -> dict:
    """The checkpoint (read from `path`) without its training state (the Timer's stored training time
    is kept) and without a frozen ImageNet backbone's weights, which loading finds as the LPIPS
    weights are."""
    slim = {key: checkpoint[key] for key in KEPT_KEYS if key in checkpoint}
    timers = {k: v for k, v in (checkpoint.get("callbacks") or {}).items() if TIMER_STATE_KEY in str(k)}
    if timers:
        slim["callbacks"] = timers
    n_frozen = frozen_conv_count(stored_config_dict(checkpoint, path)["model"]["net"].get("encoder") or {})
    return omit_frozen_convs(slim, n_frozen) if n_frozen else slim


def manifest_path(folder: Path | None = None) -> Path:
    return (folder or pretrained_dir()) / MANIFEST


def read_manifest(folder: Path | None = None) -> dict:
    path = manifest_path(folder)
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def ship_checkpoint(source: Path, name: str, entry: dict, folder: Path | None = None) -> dict:
    """Write `source` slimmed as `<folder>/<name>.ckpt` and its manifest entry (`entry` plus the file's
    name, size and sha256); -> the entry. Refuses a file over `MAX_BYTES`."""
    folder = folder or pretrained_dir()
    slim = slim_checkpoint(read_checkpoint(source), source)
    target = folder / f"{name}.ckpt"
    staging = folder / f".{name}.ckpt.tmp"
    torch.save(slim, staging)
    size = staging.stat().st_size
    if size > MAX_BYTES:
        staging.unlink()
        raise UserError(
            f"{source}: the slimmed checkpoint is {size / 2**20:.2f} MB, over the package's limit of "
            f"{MAX_BYTES / 2**20:g} MB"
        )
    staging.replace(target)
    entry = {"file": target.name, "bytes": size, "sha256": file_sha256(target), **entry}
    manifest = read_manifest(folder)
    manifest[name] = entry
    write_atomic(manifest_path(folder), (json.dumps(manifest, indent=2) + "\n").encode())
    return entry
