"""Loopback ports reserved machine-wide, for test hosts' sshd and stand-in servers.

Why: the nspawn hosts share the machine's network namespace, and pytest-xdist workers (and
other test runs on the same machine) pick ports at the same moment. "Bind, close, hand
out" alone lets two processes pick the same free port before either server binds it. So a
port is handed out only while this process holds an exclusive flock on a file named after
it (fcntl: released by the kernel when the process exits, even on SIGKILL), and never twice
by one process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import socket
from pathlib import Path

LOCK_DIR = Path(os.environ.get("PATCHSET_TEST_PORT_LOCKS", "/tmp/patchset-test-ports"))

_held: dict[int, int] = {}      # port -> fd of its lock file, kept open for our lifetime


def reserve_port(lo: int, hi: int, *, span: int = 1) -> int:
    """A port in [lo, hi - span] whose `span` consecutive ports are free now and held by
    no other process's reservation; raises RuntimeError if none is found."""
    rng = secrets.SystemRandom()
    for _ in range(500):
        port = rng.randrange(lo, hi - span + 1)
        ports = range(port, port + span)
        if any(p in _held for p in ports) or not all(_bindable(p) for p in ports):
            continue
        if _lock_all(ports):
            return port
    raise RuntimeError(f"no free loopback port in {lo}-{hi}")


def _bindable(port: int) -> bool:
    with contextlib.closing(socket.socket()) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _lock_all(ports: range) -> bool:
    """Lock every port's file, or none of them."""
    taken: list[int] = []
    for port in ports:
        fd = _try_lock(port)
        if fd is None:
            for p in taken:
                os.close(_held.pop(p))
            return False
        _held[port] = fd
        taken.append(port)
    return True


def _try_lock(port: int) -> int | None:
    """The fd of the port's lock file, exclusively locked; None if another process holds it."""
    LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(LOCK_DIR / f"{port}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
