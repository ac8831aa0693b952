"""Pola-GNT: GNT with polarity-aware linear attention."""

import os

# OpenMP workers that spin between parallel regions take the CPU from whatever else runs, and when
# the machine is shared a worker that lost its core stalls every following region of the pass: on a
# 2-core machine with one other busy process, a 4K-token polarity attention forward took 3.1 s
# instead of 0.04 s, and a quick-size training step 0.92 s (GNT) / 1.68 s (Pola-GNT) instead of
# 0.42 s / 0.71 s. Sleeping waiters avoid that, at a cost on an otherwise idle machine (there the same
# steps take 0.28 s / 0.47 s instead of 0.22 s / 0.38 s): on a dedicated machine, `OMP_WAIT_POLICY=ACTIVE`.
# It must be set before OpenMP starts, i.e. before torch is imported: `python -m pola_gnt.<command>`
# and the benchmark scripts import this package first. A value set by the user is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
