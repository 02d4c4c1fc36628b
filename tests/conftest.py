"""Shared fixtures: the real pinned upstream (SGLang 0.5.14), provisioned once per machine.

Tests never see the user's real home: before anything else is imported, HOME and the XDG
directories point into a fresh session directory, and the pinned wheel is shared through
an explicit test cache ($PATCHSET_TEST_CACHE, default /var/cache/patchset-test/upstream
next to the test rootfs, else .cache/test-upstream in the checkout), so only the first
run on a machine needs the network. An audit hook records every file operation under the
real ~/.cache/patchset, ~/.local/share/patchset and ~/.ssh; any such access fails the
session (pytest_sessionfinish) and tests/unit/test_isolation.py proves the hook sees one.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _test_cache() -> Path:
    explicit = os.environ.get("PATCHSET_TEST_CACHE")
    if explicit:
        return Path(explicit)
    shared = Path("/var/cache/patchset-test/upstream")
    try:
        shared.mkdir(parents=True, exist_ok=True)
        if os.access(shared, os.W_OK):
            return shared
    except OSError:
        pass
    return ROOT / ".cache" / "test-upstream"


# pytest-xdist workers inherit the controller's environment, whose HOME already points
# into the controller's session directory: the real home travels in its own variable.
os.environ.setdefault("PATCHSET_TEST_REAL_HOME", os.path.expanduser("~"))
REAL_HOME = Path(os.environ["PATCHSET_TEST_REAL_HOME"]).resolve()
PROTECTED = tuple(str(REAL_HOME / p) for p in (".cache/patchset", ".local/share/patchset",
                                                ".ssh"))
SESSION_HOME = Path(tempfile.mkdtemp(prefix="patchset-test-home-"))
for _var, _sub in (("XDG_CACHE_HOME", ".cache"), ("XDG_DATA_HOME", ".local/share"),
                   ("XDG_STATE_HOME", ".local/state"), ("XDG_CONFIG_HOME", ".config")):
    os.environ[_var] = str(SESSION_HOME / _sub)
os.environ["HOME"] = str(SESSION_HOME)
os.environ["PATCHSET_HOME"] = str(SESSION_HOME / "patchset-home")
os.environ["PATCHSET_CACHE"] = str(_test_cache())
os.environ.pop("PATCHSET_SERIES", None)
os.environ.pop("PATCHSET_INVENTORY", None)

TOUCHED: list[str] = []      # accesses to PROTECTED paths, by this process


def _audit(event: str, args: tuple) -> None:
    if event not in ("open", "os.listdir", "os.remove", "os.rename", "os.mkdir", "os.rmdir",
                     "os.chmod", "os.scandir", "shutil.rmtree", "os.truncate", "os.symlink",
                     "os.utime"):
        return
    target = args[0] if args else None
    if isinstance(target, (str, bytes, os.PathLike)):
        path = os.fsdecode(target)
        if os.path.isabs(path) and path.startswith(PROTECTED):
            TOUCHED.append(f"{event} {path}")


sys.addaudithook(_audit)


WORKERS_TOUCHED: list[str] = []   # what xdist workers reported (controller only)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run on any access to the real home; an xdist worker hands its list to the
    controller (workeroutput), which fails the whole run (a worker's status is not)."""
    real = [t for t in TOUCHED if not t.endswith(".patchset-isolation-probe")]
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["patchset_touched"] = real
        return
    real += WORKERS_TOUCHED
    if real:
        print("\nTESTS TOUCHED THE USER'S REAL FILES:\n  " + "\n  ".join(real[:20]),
              file=sys.stderr)
        session.exitstatus = 1


def pytest_testnodedown(node, error) -> None:
    """xdist hook (controller): collect what a finished worker saw of the real home."""
    WORKERS_TOUCHED.extend(getattr(node, "workeroutput", {}).get("patchset_touched", []))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order of the files, as they declare themselves (pytestmark): the `long` files
    first, then the files of `hosts` tests, the most host tests first. Under --dist loadfile
    a long file dealt out last keeps one worker busy while the others idle. A stable sort,
    so each file's tests stay together and in their written order."""
    host_tests: dict[Path, int] = {}
    long_files: set[Path] = set()
    for item in items:
        host_tests[item.path] = (host_tests.get(item.path, 0)
                                 + (item.get_closest_marker("hosts") is not None))
        if item.get_closest_marker("long") is not None:
            long_files.add(item.path)
    items.sort(key=lambda item: (item.path not in long_files, -host_tests[item.path]))


pytest_plugins = ["tests.hosts.fixtures"]   # real nspawn test hosts

from patchset.pin.model import GitPin, PypiPin, UpstreamPin  # noqa: E402
from patchset.pin.upstream import BaseTree, fetch_wheel, provision  # noqa: E402

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
    from tests.seriesfactory import build_series, default_patches

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
    from tests.audit_facts import synth
    return synth.real_series(tmp_path_factory.mktemp("series"))


@pytest.fixture()
def seed() -> dict:
    """The seed deployment's facts (tests/audit_facts/seed.yaml), a private copy per test."""
    import copy

    from tests.audit_facts import synth
    return copy.deepcopy(synth.load("seed.yaml"))


@pytest.fixture(scope="module")
def hostile_root(tmp_path_factory: pytest.TempPathFactory, request) -> Path:
    """One world per hostile-input module (tests/hostile.py), shared by its cases."""
    return tmp_path_factory.mktemp("hostile-" + request.module.__name__.rpartition(".")[2])


@pytest.fixture()
def world(series_template: Path, hostile_root: Path, capsys, monkeypatch):
    """A series, an applied default tree, the cache and the home for a bad-input case:
    `world.refuse(argv, message)` asserts the whole contract (tests/hostile.py)."""
    from tests.hostile import make_world
    return make_world(series_template, hostile_root, capsys, monkeypatch)


@pytest.fixture()
def remote_env(series_dir: Path, patchset_home: Path, monkeypatch, tmp_path: Path,
               known_hosts_file):
    """cwd = a series; an inventory + known_hosts for the given hosts; no user ssh config."""
    monkeypatch.chdir(series_dir)
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("")
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(ssh_config))

    from tests.hostutil import inventory

    def setup(hosts: list, **extra) -> Path:
        monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(known_hosts_file(hosts)))
        return inventory(series_dir / "hosts.yaml", hosts, **extra)
    return setup
