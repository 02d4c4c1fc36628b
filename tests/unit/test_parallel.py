"""What makes the suite safe on pytest-xdist workers (make test: -n TEST_WORKERS --dist
loadfile): machine-wide port reservations, a private cache per hostile world, the
real-home guard across workers, the long files and then host-heavy files first."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest
from tests.hosts import ports

HOLD = """
import sys
from pathlib import Path
from tests.hosts import ports
ports.LOCK_DIR = Path(sys.argv[3])
ports._bindable = lambda port: True
print(ports.reserve_port(int(sys.argv[1]), int(sys.argv[2]), span=2), flush=True)
sys.stdin.read()
"""


def test_a_port_another_process_reserved_is_never_handed_out(tmp_path, monkeypatch) -> None:
    """Two workers cannot get one port: the other process's reservation (flock) holds
    both ports of its span although nothing listens on them.

    Only the reservation is under test: both processes use a private lock folder and take
    every port as bindable, so a real listener elsewhere on the machine (CI once had one in
    the range) cannot decide the outcome."""
    monkeypatch.setattr(ports, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(ports, "_bindable", lambda port: True)
    monkeypatch.setattr(ports, "_held", {})
    lo = 38000
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lo), str(lo + 2), str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=conftest.ROOT)
    try:
        held = int(holder.stdout.readline())
        assert held == lo
        assert ports._try_lock(lo) is None and ports._try_lock(lo + 1) is None
        with pytest.raises(RuntimeError, match=f"{lo}-{lo + 2}"):
            ports.reserve_port(lo, lo + 2)
    finally:
        holder.communicate("")
    port = ports.reserve_port(lo, lo + 2, span=2)     # released when the holder exited
    assert port == lo and {lo, lo + 1} <= ports._held.keys()
    assert ports.reserve_port(lo, lo + 3) == lo + 2   # never twice in one process
    for fd in ports._held.values():
        os.close(fd)


def test_a_port_something_listens_on_is_never_handed_out(tmp_path, monkeypatch) -> None:
    """The other half of a reservation: a port bound by any process (a server that is not
    one of ours) is skipped although no lock file names it."""
    monkeypatch.setattr(ports, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(ports, "_held", {})
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"{port}-{port + 1}"):
            ports.reserve_port(port, port + 1)
    assert not ports._held


def test_each_hostile_world_has_its_own_cache(world) -> None:
    shared = conftest._test_cache()
    assert world.cache != shared and world.cache.is_dir()
    assert {p.name for p in shared.iterdir()} - {"tmp"} <= {p.name for p in world.cache.iterdir()}
    # the fixture's monkeypatch points the commands at the private copy
    assert os.environ["PATCHSET_CACHE"] == str(world.cache)


def test_a_worker_touching_the_real_home_fails_the_whole_run() -> None:
    """A worker's own exit status does not reach the controller: its list does."""
    worker = SimpleNamespace(config=SimpleNamespace(workeroutput={}), exitstatus=0)
    conftest.TOUCHED.append("open /root/.ssh/id_rsa")
    try:
        conftest.pytest_sessionfinish(worker, 0)
    finally:
        conftest.TOUCHED.pop()
    assert worker.config.workeroutput["patchset_touched"] == ["open /root/.ssh/id_rsa"]
    controller = SimpleNamespace(config=SimpleNamespace(), exitstatus=0)
    conftest.pytest_testnodedown(SimpleNamespace(workeroutput=worker.config.workeroutput),
                                 None)
    try:
        conftest.pytest_sessionfinish(controller, 0)
    finally:
        conftest.WORKERS_TOUCHED.clear()
    assert controller.exitstatus == 1


def test_long_then_host_heavy_files_are_scheduled_first_and_stay_together() -> None:
    """The order comes from the marks the files declare (`long`, `hosts`), not names."""
    def item(path: str, *marks: str) -> SimpleNamespace:
        return SimpleNamespace(path=Path(path), name=path,
                               get_closest_marker=lambda mark: mark if mark in marks else None)
    items = [item("unit.py"), item("one.py", "hosts"), item("unit.py"),
             item("fleet.py", "hosts"), item("fleet.py", "hosts"), item("one.py"),
             item("kills.py", "long"), item("kills.py")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [str(i.path) for i in items] == ["kills.py", "kills.py", "fleet.py", "fleet.py",
                                            "one.py", "one.py", "unit.py", "unit.py"]


def test_the_real_home_is_the_same_in_every_worker() -> None:
    """Workers inherit the controller's HOME (a session directory): the guard must still
    protect the real one."""
    assert conftest.REAL_HOME != conftest.SESSION_HOME
    assert os.environ["PATCHSET_TEST_REAL_HOME"] != os.environ["HOME"]
    assert not str(conftest.REAL_HOME).startswith(str(Path(conftest.SESSION_HOME).parent)
                                                  + "/patchset-test-home-")
