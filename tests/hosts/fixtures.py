"""pytest fixtures for real nspawn test hosts (load with ``pytest_plugins``).

Scopes, and why:

* ``host_base`` (session): the debootstrapped rootfs; built once per
  *machine* (cached on disk), so this is a cheap check after the first run.
* ``host_factory`` (session): boots hosts on demand, stops every host it
  started at session end (also on failures/KeyboardInterrupt).
* ``one_host`` / ``fleet`` (module-shared, healed per test): booting is cheap
  (~1 s) but not free, so a module shares them.  Before each test any host a
  previous test stopped is started again.  Files a test wrote on them *do*
  leak to later tests of the same module; they vanish when the module ends.
* ``fresh_host`` / ``fresh_fleet`` (function): private hosts for tests that
  break things (stop sshd, rotate keys, fill disks) or need a clean rootfs.

Prerequisites missing (not root, no systemd-nspawn...) fail the tests, so CI
can never silently skip them; ``make test-fast`` deselects them instead (``-m "not
hosts"``: every test that uses one of these fixtures is marked ``hosts``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.hosts.nspawn import (
    ClientKey,
    TestHost,
    build_base,
    make_client_key,
    missing_prerequisites,
    start_hosts,
    stop_hosts,
    write_known_hosts,
)

FLEET_SIZE = 3
# The fixtures that boot hosts or need what booting needs (root, systemd-nspawn: host_base
# fails the test where they are missing). A test that uses one is marked `hosts` and lives
# in tests/system (tests/unit/test_test_layout.py checks both).
HOST_FIXTURES = frozenset({"host_base", "host_factory", "one_host", "fleet", "fresh_host",
                           "fresh_fleet"})


class HostFactory:
    """Boots hosts from the cached base; remembers them so teardown is certain."""

    def __init__(self, base: Path, workdir: Path, client_key: ClientKey) -> None:
        self.base = base
        self.workdir = workdir
        self.client_key = client_key
        self._started: list[TestHost] = []

    def start(self, n: int = 1, *, prefix: str = "pst") -> list[TestHost]:
        """Boot *n* hosts in parallel and wait until each accepts ssh."""
        hosts = start_hosts(n, workdir=self.workdir, client_key=self.client_key, base=self.base, prefix=prefix)
        self._started += hosts
        return hosts

    def stop(self, hosts: list[TestHost]) -> None:
        stop_hosts(hosts)

    def stop_all(self) -> None:
        stop_hosts(self._started)
        self._started.clear()


def _require_host_support() -> None:
    problems = missing_prerequisites()
    if not problems:
        return
    msg = "nspawn test hosts unavailable: " + "; ".join(problems)
    pytest.fail(msg + " (run .ci/install-host-deps as root)", pytrace=False)


def _heal(hosts: list[TestHost]) -> list[TestHost]:
    """Restart shared hosts a previous test stopped (cheap no-op otherwise)."""
    for h in hosts:
        if not h.is_running:
            h.start()
    return hosts


@pytest.fixture(scope="session")
def host_base() -> Path:
    """Path of the cached base rootfs (debootstrapped on first use, ~1 min)."""
    _require_host_support()
    return build_base()


@pytest.fixture(scope="session")
def host_client_key(tmp_path_factory: pytest.TempPathFactory) -> ClientKey:
    """The per-run client keypair authorized for root on every host."""
    return make_client_key(tmp_path_factory.mktemp("host-client"))


@pytest.fixture(scope="session")
def host_factory(
    host_base: Path, host_client_key: ClientKey, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HostFactory]:
    """Start hosts on demand: ``host_factory.start(n, prefix=...)``."""
    factory = HostFactory(host_base, tmp_path_factory.mktemp("hosts"), host_client_key)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="module")
def _module_one_host(host_factory: HostFactory) -> Iterator[TestHost]:
    [host] = host_factory.start(1, prefix="one")
    yield host
    host_factory.stop([host])


@pytest.fixture(scope="module")
def _module_fleet(host_factory: HostFactory) -> Iterator[list[TestHost]]:
    hosts = host_factory.start(FLEET_SIZE, prefix="fleet")
    yield hosts
    host_factory.stop(hosts)


@pytest.fixture
def one_host(_module_one_host: TestHost) -> TestHost:
    """A running host shared within the module (see module docstring)."""
    return _heal([_module_one_host])[0]


@pytest.fixture
def fleet(_module_fleet: list[TestHost]) -> list[TestHost]:
    """Three running hosts shared within the module."""
    return _heal(_module_fleet)


@pytest.fixture
def fresh_host(host_factory: HostFactory) -> Iterator[TestHost]:
    """A private host for this test only; safe to stop, break or re-key."""
    [host] = host_factory.start(1, prefix="fresh")
    yield host
    host_factory.stop([host])


@pytest.fixture
def fresh_fleet(host_factory: HostFactory) -> Iterator[list[TestHost]]:
    """Three private hosts for this test only."""
    hosts = host_factory.start(FLEET_SIZE, prefix="ffleet")
    yield hosts
    host_factory.stop(hosts)


@pytest.fixture
def known_hosts_file(tmp_path: Path) -> Callable[..., Path]:
    """``known_hosts_file(hosts) -> Path``: known_hosts with the hosts' *current* keys.

    Written once per call; rotating a key afterwards makes it stale, which is
    exactly what "changed host key" tests want.
    """

    def make(hosts: list[TestHost], name: str = "known_hosts") -> Path:
        return write_known_hosts(hosts, tmp_path / name)

    return make
