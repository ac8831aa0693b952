"""Finding and reading checkpoint files: `ckpt_path=last|PATH`, one line for a file that is no
Pola-GNT checkpoint or whose weights do not fit. (The run config stored in one: `runs.config`.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pola_gnt.core.errors import UserError

CHECKPOINT_DIR = "checkpoints"


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a training run resumes from, and the global step it holds."""

    path: Path
    step: int


def resolve_checkpoint(ckpt_path: str | None, run_dir: Path) -> Path | None:
    """`None` -> None; `last` -> `<run_dir>/checkpoints/last.ckpt`; otherwise the given file."""
    if not ckpt_path:
        return None
    if str(ckpt_path) == "last":
        path = run_dir / CHECKPOINT_DIR / "last.ckpt"
        if not path.is_file():
            raise UserError(f"ckpt_path=last: no checkpoint at {path} (pass hydra.run.dir=RUN_DIR of the training run)")
        return path
    path = Path(ckpt_path).expanduser()
    if path.is_dir():
        hint = path / CHECKPOINT_DIR / "last.ckpt" if (path / CHECKPOINT_DIR).is_dir() else path / "last.ckpt"
        raise UserError(
            f"ckpt_path: {path} is a folder, not a checkpoint file"
            f"{f' (did you mean {hint}?)' if hint.is_file() else ''}"
        )
    if not path.is_file():
        raise UserError(f"ckpt_path: {path}: not found")
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
