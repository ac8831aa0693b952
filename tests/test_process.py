"""Process-wide settings (`pola_gnt/core/process.py`) belong to the commands: importing the library
changes nothing in the importing process, and an entry point applies them before torch loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pola_gnt.core.paths import PROJECT_ROOT

# Runs in a clean interpreter: every later `ctypes.CDLL(...)` is recorded, so a `mallopt` reached
# through it (the allocator setting) shows up, as does a changed environment.
PROBE = """
import ctypes, json, os, sys
looked_up = []
class RecordingCDLL(ctypes.CDLL):
    def __getattr__(self, name):
        looked_up.append(name)
        return super().__getattr__(name)
ctypes.CDLL = RecordingCDLL
before = dict(os.environ)
exec(sys.argv[1])
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(json.dumps({"changed": changed, "looked_up": looked_up}))
"""


def _probe(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.pop("POLA_GNT_CHECK_SHAPES", None)  # the library as a user imports it
    result = subprocess.run(
        [sys.executable, "-c", PROBE, code], capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_the_library_leaves_the_process_alone():
    found = _probe(
        "import pola_gnt.attention, pola_gnt.model, pola_gnt.data.datamodule, pola_gnt.evaluation.image_metrics"
    )
    assert found["changed"] == []
    assert "mallopt" not in found["looked_up"]


def test_an_entry_point_sets_the_wait_policy_and_the_allocator():
    """The positive control: the same probe sees what `prepare_process` (each entry point's first
    step, before torch) does."""
    found = _probe("from pola_gnt.core.process import prepare_process; prepare_process()")
    assert found["changed"] == ["OMP_WAIT_POLICY"]
    assert "mallopt" in found["looked_up"] or not sys.platform.startswith("linux")


def test_entry_points_prepare_the_process_before_their_other_imports():
    """Each command module applies the settings under `__main__` before any import that can load torch."""
    for path in sorted((PROJECT_ROOT / "pola_gnt").glob("*.py")):
        source = path.read_text()
        if "@entry_point" not in source:
            continue
        lines = source.splitlines()
        prepared = lines.index("    prepare_process()")
        heavy = [
            i for i, line in enumerate(lines) if line.startswith(("import ", "from ")) and "__future__" not in line
        ]
        heavy = [
            i
            for i in heavy
            if "pola_gnt.core.process" not in lines[i] and lines[i] not in ("import os", "import signal", "import sys")
        ]
        assert heavy and prepared < min(heavy), path.name
