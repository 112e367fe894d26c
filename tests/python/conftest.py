"""Fixtures of the Python tests (skip markers live in support.py)."""

import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A generator seeded per test, so every test draws the same data on every run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
