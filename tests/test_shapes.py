"""The jaxtyping shape annotations are checked while the tests run (tests/conftest.py sets
POLA_GNT_CHECK_SHAPES=1, so `pola_gnt` installs jaxtyping's import hook with beartype), and only then."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from jaxtyping import TypeCheckError

from pola_gnt.attention.linear.op import polarity_attention
from pola_gnt.core.paths import PROJECT_ROOT
from pola_gnt.geometry.rays import Rays, points_along_rays


def test_dataclass_fields_are_checked_together():
    Rays(torch.zeros(4, 3), torch.zeros(4, 3))
    with pytest.raises(TypeCheckError, match="rays"):
        Rays(torch.zeros(4, 3), torch.zeros(5, 3))


def test_function_arguments_share_their_dimensions():
    rays = Rays(torch.zeros(4, 3), torch.ones(4, 3))
    assert points_along_rays(rays, torch.ones(4, 7)).shape == (4, 7, 3)
    with pytest.raises(TypeCheckError):
        points_along_rays(rays, torch.ones(4, 7, 1))  # depths [rays, samples], not [rays, samples, 1]


def test_attention_head_dims_must_agree():
    q, k = torch.zeros(2, 5, 4), torch.zeros(2, 6, 4)
    temps = torch.full((1, 8), 0.5)
    assert polarity_attention(q, k, k, temps, temps).shape == (2, 5, 4)
    with pytest.raises(TypeCheckError):
        polarity_attention(q, k, k, torch.full((1, 6), 0.5), torch.full((1, 6), 0.5))  # temperatures need 2d


def test_nothing_is_checked_outside_the_tests():
    code = (
        "import torch; from pola_gnt.geometry.rays import Rays; Rays(torch.zeros(4, 3), torch.zeros(5, 3)); "
        "import sys; print('beartype' in sys.modules, 'jaxtyping._import_hook' in str(sys.meta_path))"
    )
    env = {key: value for key, value in os.environ.items() if key != "POLA_GNT_CHECK_SHAPES"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=PROJECT_ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False"]
