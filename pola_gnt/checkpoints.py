"""Finding and checking checkpoints: `ckpt_path=last|PATH`, and refusing one from another model."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from pola_gnt.errors import UserError

CHECKPOINT_DIR = "checkpoints"


def resolve_checkpoint(ckpt_path: str | None, run_dir: Path) -> Path | None:
    """`None` -> None; `last` -> `<run_dir>/checkpoints/last.ckpt`; otherwise the given file."""
    if not ckpt_path:
        return None
    if str(ckpt_path) == "last":
        path = run_dir / CHECKPOINT_DIR / "last.ckpt"
        if not path.is_file():
            raise UserError(f"ckpt_path=last: no checkpoint at {path} (pass hydra.run.dir=RUN_DIR of the run to resume)")
        return path
    path = Path(ckpt_path).expanduser()
    if not path.is_file():
        raise UserError(f"ckpt_path: {path}: not found")
    return path


def checkpoint_config(path: Path) -> DictConfig:
    """The run config stored in a Pola-GNT checkpoint."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        raise UserError(f"{path}: cannot read checkpoint ({type(err).__name__}: {err})") from None
    config = checkpoint.get("hyper_parameters", {}).get("config") if isinstance(checkpoint, dict) else None
    if not isinstance(config, dict) or "model" not in config:
        raise UserError(f"{path}: not a Pola-GNT checkpoint (no run config inside)")
    return OmegaConf.create(config)


def check_compatible(path: Path, cfg: DictConfig) -> DictConfig:
    """Refuse a checkpoint whose model differs from `cfg.model`; return its config."""
    stored = checkpoint_config(path)
    if stored.model.name != cfg.model.name:
        raise UserError(f"{path}: checkpoint of model {stored.model.name!r}, but model={cfg.model.name} was asked for")
    stored_net = OmegaConf.to_container(stored.model.net, resolve=True)
    wanted_net = OmegaConf.to_container(cfg.model.net, resolve=True)
    if stored_net != wanted_net:
        differing = sorted(k for k in set(stored_net) | set(wanted_net) if stored_net.get(k) != wanted_net.get(k))
        details = ", ".join(f"model.net.{k}={stored_net.get(k)!r} (asked {wanted_net.get(k)!r})" for k in differing)
        raise UserError(f"{path}: checkpoint model config differs: {details}")
    return stored
