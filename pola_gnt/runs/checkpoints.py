"""Finding and reading checkpoint files: `ckpt_path=last|PATH`, one line for a file that is no
Pola-GNT checkpoint or whose weights do not fit. (The run config stored in one: `runs.config`.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pola_gnt.core.errors import UserError
from pola_gnt.core.paths import pretrained_dir

CHECKPOINT_DIR = "checkpoints"
PRETRAINED_PREFIX = "pretrained:"


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a training run resumes from, and the global step it holds."""

    path: Path
    step: int


def shipped_checkpoints() -> list[str]:
    """The names of the checkpoints shipped in the package (`pretrained:NAME`)."""
    folder = pretrained_dir()
    return sorted(path.stem for path in folder.glob("*.ckpt")) if folder.is_dir() else []


def pretrained_checkpoint(spec: str, key: str = "ckpt_path") -> Path:
    """`pretrained:NAME` -> the shipped checkpoint file `pola_gnt/pretrained/NAME.ckpt`."""
    name = spec[len(PRETRAINED_PREFIX) :]
    path = pretrained_dir() / f"{name}.ckpt"
    if not name or "/" in name or not path.is_file():
        available = ", ".join(f"{PRETRAINED_PREFIX}{n}" for n in shipped_checkpoints()) or "none are installed"
        raise UserError(f"{key}: {spec}: no such shipped checkpoint (available: {available})")
    return path


def resolve_checkpoint(ckpt_path: str | None, run_dir: Path, key: str = "ckpt_path") -> Path | None:
    """`None` -> None; `last` -> `<run_dir>/checkpoints/last.ckpt`; `pretrained:NAME` -> a checkpoint
    shipped in the package; otherwise the given file. `key`: the config key it came from, for messages."""
    if not ckpt_path:
        return None
    if str(ckpt_path).startswith(PRETRAINED_PREFIX):
        return pretrained_checkpoint(str(ckpt_path), key)
    if str(ckpt_path) == "last":
        path = run_dir / CHECKPOINT_DIR / "last.ckpt"
        if not path.is_file():
            raise UserError(f"{key}=last: no checkpoint at {path} (pass hydra.run.dir=RUN_DIR of the training run)")
        return path
    path = Path(ckpt_path).expanduser()
    if path.is_dir():
        hint = path / CHECKPOINT_DIR / "last.ckpt" if (path / CHECKPOINT_DIR).is_dir() else path / "last.ckpt"
        raise UserError(
            f"{key}: {path} is a folder, not a checkpoint file{f' (did you mean {hint}?)' if hint.is_file() else ''}"
        )
    if not path.is_file():
        raise UserError(f"{key}: {path}: not found")
    return path


def is_state_dict_mismatch(err: BaseException) -> bool:
    return isinstance(err, RuntimeError) and str(err).startswith("Error(s) in loading state_dict")


def state_dict_mismatch(path: Path, err: BaseException) -> UserError:
    """One line for weights that do not fit the model: PyTorch's whole multi-line message, joined."""
    details = " ".join(line.strip() for line in str(err).splitlines()[1:] if line.strip()) or type(err).__name__
    if len(details) > 400:
        details = details[:397] + "..."
    return UserError(f"{path}: weights do not fit the model of its run config ({details})")


def read_checkpoint(path: Path) -> dict:
    """The whole checkpoint dictionary (on the CPU) of a Pola-GNT checkpoint file."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        raise UserError(f"{path}: cannot read checkpoint ({type(err).__name__}: {err})") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise UserError(f"{path}: not a Pola-GNT checkpoint (no model weights inside)")
    stored_config_dict(checkpoint, path)  # refuse a checkpoint without our run config up front
    return checkpoint


def stored_config_dict(checkpoint: dict, path: Path) -> dict:
    """The run config saved in a checkpoint dictionary by `GNTSystem` (its hyper-parameters), as stored."""
    hyper_parameters = checkpoint.get("hyper_parameters")
    config = hyper_parameters.get("config") if isinstance(hyper_parameters, dict) else None
    if not isinstance(config, dict) or "model" not in config:
        raise UserError(f"{path}: not a Pola-GNT checkpoint (no run config inside)")
    return config


# The checkpoint's record of what its weights were trained on (`GNTSystem.on_save_checkpoint`).
TRAINING_RECORD = "pola_gnt_training"


def checkpoint_training_scenes(checkpoint: dict) -> list[str]:
    """The scenes a checkpoint's weights were trained on: its record, or for a checkpoint from before
    collections its stored run config's one scene."""
    record = checkpoint.get(TRAINING_RECORD)
    if isinstance(record, dict) and isinstance(record.get("training_scenes"), list):
        return [str(name) for name in record["training_scenes"]]
    config = (checkpoint.get("hyper_parameters") or {}).get("config") or {}
    name = (config.get("scene") or {}).get("name")
    return [str(name)] if name else []


def checkpoint_init_from(checkpoint: dict) -> dict | None:
    """The `init_from` record of a fine-tuned checkpoint (None: trained from random weights)."""
    record = checkpoint.get(TRAINING_RECORD)
    init = record.get("init_from") if isinstance(record, dict) else None
    return dict(init) if isinstance(init, dict) else None
