"""Reading a run's `metrics.json`: the tests' one reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

METRICS_FILE = "metrics.json"


def read_metrics(path: Path) -> dict:
    """The `metrics.json` of a run folder `path` (or the file `path` itself) as a dict. The file must
    be strict JSON, as the package writes it: a NaN or infinity constant fails the test."""
    file = path / METRICS_FILE if path.is_dir() else path
    return json.loads(file.read_text(), parse_constant=lambda name: pytest.fail(f"{file}: non-strict JSON {name}"))
