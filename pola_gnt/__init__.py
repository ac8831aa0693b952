"""Pola-GNT: GNT with polarity-aware linear attention.

Importing the package changes nothing in the process: the commands' process-wide settings (OpenMP's
wait policy, the allocator) are applied by the entry points (`pola_gnt.core.process`)."""

import os

# The tests (tests/conftest.py) set POLA_GNT_CHECK_SHAPES=1: every function and dataclass of the
# numeric core (geometry, data, attention, model) imported from then on checks its annotations,
# tensor shapes included (jaxtyping's `Float[Tensor, "rays samples 3"]`), with beartype, in the test
# process and in the commands it starts. (The layers above take values from the command line and
# check them themselves, with one `error:` line.) Unset (any normal run), nothing is checked and
# nothing is imported for it.
CHECKED_PACKAGES = ("pola_gnt.geometry", "pola_gnt.data", "pola_gnt.attention", "pola_gnt.model")
if os.environ.get("POLA_GNT_CHECK_SHAPES") == "1":
    from jaxtyping import install_import_hook

    # An int passes for a float, as in static typing (PEP 484's numeric tower).
    install_import_hook(CHECKED_PACKAGES, "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))")

__version__ = "0.1.0"

# The Python API (`pola_gnt.api`, docs/python_api.md), imported on first use of one of its names:
# `import pola_gnt` itself stays cheap (no torch, no Lightning). `pola_gnt.api.__all__` holds the same
# names (tests/test_api.py).
API_NAMES = (
    "Camera",
    "Evaluation",
    "Model",
    "PointCloud",
    "Progress",
    "RenderCancelled",
    "Rendering",
    "Scene",
    "UserError",
    "fine_tune",
    "load_model",
    "load_scene",
)


def __getattr__(name: str):
    if name in API_NAMES:
        from pola_gnt import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API_NAMES])
