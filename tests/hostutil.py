"""Helpers shared by the tests that drive the CLI against nspawn test hosts."""

from __future__ import annotations

import socket

from patchset.cli import main
from tests.hosts.nspawn import TestHost, run_ssh


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `patchset ARGV` in-process; (exit code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def on_host(host: TestHost, command: str) -> str:
    """Run a shell command on a test host over plain ssh; it must succeed."""
    proc = run_ssh(host, command)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def free_ports(n: int) -> list[int]:
    """Loopback ports free on the machine (the hosts share its network namespace), away
    from SGLang's default 30000-30099."""
    out: list[int] = []
    socks = []
    try:
        while len(out) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            port = s.getsockname()[1]
            if not 30000 <= port < 30100:
                out.append(port)
    finally:
        for s in socks:
            s.close()
    return out
