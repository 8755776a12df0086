"""Fixtures of the distributed tests: `run_ranks(worker, out[, nproc])` runs a worker script of this
folder on gloo ranks (two unless told) and returns its JSON report (see gloo_ranks.py, which the workers import too)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import gloo_ranks  # noqa: E402


@pytest.fixture(scope="session")
def run_ranks():
    return gloo_ranks.run_ranks
