"""Real test hosts for integration tests: systemd + sshd in systemd-nspawn.

Public API lives in :mod:`tests.hosts.nspawn` (library) and
:mod:`tests.hosts.fixtures` (pytest fixtures, loaded via ``pytest_plugins``).
"""

from tests.hosts.nspawn import (
    ClientKey,
    HostError,
    TestHost,
    base_is_current,
    build_base,
    host_memory_bytes,
    make_client_key,
    missing_prerequisites,
    rootfs_path,
    run_ssh,
    ssh_argv,
    start_hosts,
    stop_hosts,
    write_known_hosts,
)

__all__ = [
    "ClientKey",
    "HostError",
    "TestHost",
    "base_is_current",
    "build_base",
    "host_memory_bytes",
    "make_client_key",
    "missing_prerequisites",
    "rootfs_path",
    "run_ssh",
    "ssh_argv",
    "start_hosts",
    "stop_hosts",
    "write_known_hosts",
]
