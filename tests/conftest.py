"""Shared fixtures: the real pinned upstream (SGLang 0.5.14), provisioned once per machine.

The base lives in the default cache (`cache_root()`, i.e. $PATCHSET_CACHE or
~/.cache/patchset), so only the first run needs the network; later runs are offline.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:          # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

from patchset.model import GitPin, PypiPin, UpstreamPin  # noqa: E402
from patchset.upstream import BaseTree, fetch_wheel, provision  # noqa: E402

SGLANG_PIN = UpstreamPin(
    name="sglang",
    version="0.5.14",
    git=GitPin(url="https://github.com/sgl-project/sglang.git", ref="v0.5.14"),
    pypi=PypiPin(
        requirement="sglang==0.5.14",
        file="sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl",
        sha256="4fe16056b45c8aca00f5f90ceb174dc3a62a3f5dccf159c791370795cd00fc99",
        python_version="3.11",
        platform="manylinux_2_34_x86_64",
    ),
    git_prefix="python/",
)


@pytest.fixture(scope="session")
def pinned_pin() -> UpstreamPin:
    """The manifest's upstream pin for SGLang 0.5.14, built in code (no manifest parsing)."""
    return SGLANG_PIN


@pytest.fixture(scope="session")
def pinned_base(pinned_pin: UpstreamPin) -> BaseTree:
    """The pinned upstream in the shared cache (git where reachable, else the wheel)."""
    return provision(pinned_pin)


@pytest.fixture(scope="session")
def pinned_wheel(pinned_pin: UpstreamPin) -> Path:
    """The verified 0.5.14 wheel in the shared cache; copy it, never modify it."""
    return fetch_wheel(pinned_pin)
