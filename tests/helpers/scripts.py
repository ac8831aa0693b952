"""The project's `scripts/` as modules, for the tests that check what a script computes."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from pola_gnt.core.paths import PROJECT_ROOT


def load_script(name: str) -> ModuleType:
    """`scripts/NAME.py` imported as a module (its `main` not run)."""
    spec = importlib.util.spec_from_file_location(name, PROJECT_ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as `import` does: dataclasses and pickle look their module up there
    spec.loader.exec_module(module)
    return module
