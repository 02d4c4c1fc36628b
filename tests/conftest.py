"""Shared fixtures: the real pinned upstream (SGLang 0.5.14), provisioned once per machine.

The base lives in the default cache (`cache_root()`, i.e. $PATCHSET_CACHE or
~/.cache/patchset), so only the first run needs the network; later runs are offline.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
for _p in (ROOT, TESTS):
    if str(_p) not in sys.path:  # run from a checkout without `pip install -e .`
        sys.path.insert(0, str(_p))

pytest_plugins = ["tests.hosts.fixtures"]   # real nspawn test hosts

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


@pytest.fixture(scope="session")
def series_template(pinned_base: BaseTree, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A five-patch series of real edits to real 0.5.14 files (see seriesfactory)."""
    from seriesfactory import build_series, default_patches

    root = tmp_path_factory.mktemp("series-template")
    build_series(pinned_base, root, default_patches())
    return root


@pytest.fixture()
def series_dir(series_template: Path, tmp_path: Path) -> Path:
    """A private, mutable copy of the template series."""
    import shutil

    dest = tmp_path / "series"
    shutil.copytree(series_template, dest, ignore=shutil.ignore_patterns("authoring"))
    return dest


@pytest.fixture()
def patchset_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Isolate the default local target per test."""
    home = tmp_path / "home"
    monkeypatch.setenv("PATCHSET_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory):
    """The project's real series, in a scratch copy (audit tests evaluate it on facts)."""
    from audit_facts import synth
    return synth.real_series(tmp_path_factory.mktemp("series"))


@pytest.fixture()
def seed() -> dict:
    """The seed deployment's facts (DOMAIN.md section 1), a private copy per test."""
    import copy

    from audit_facts import synth
    return copy.deepcopy(synth.load("seed.yaml"))


@pytest.fixture()
def remote_env(series_dir: Path, patchset_home: Path, monkeypatch, tmp_path: Path,
               known_hosts_file):
    """cwd = a series; an inventory + known_hosts for the given hosts; no user ssh config."""
    monkeypatch.chdir(series_dir)
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("")
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(ssh_config))

    from hostutil import inventory

    def setup(hosts: list, **extra) -> Path:
        monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(known_hosts_file(hosts)))
        return inventory(series_dir / "hosts.yaml", hosts, **extra)
    return setup
