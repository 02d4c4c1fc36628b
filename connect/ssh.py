"""The SSH transport: the agent, shipped to the host with its data in one transfer.

One fabric Connection per host for the life of the transport. Each operation is one SFTP
upload of a tar (patchset/transport.py `bundle`: the agent + request + data files) into a
fresh private directory and one command (the one BOOTSTRAP) that unpacks, runs and
removes it. Host keys are checked against known_hosts
(fabric accepts any key by default): unknown keys are refused unless accept_new, changed
keys always. Every argument of the remote command line is shlex-quoted.
"""

from __future__ import annotations

import io
import os
import secrets
import shlex
import socket
import threading
from pathlib import Path
from typing import Any, Mapping

from patchset import inputfile
from patchset import transport as wire
from patchset.agent.lib import bounded
from patchset.agent.lib.wire import Failure, Request, Result
from patchset.errors import Unreachable, PatchsetError

from .inventory import Host

CONNECT_TIMEOUT = 15


class HostKeyRefused(Unreachable):
    """The host's key is unknown (without --accept-new) or changed."""


def known_hosts_files() -> list[Path]:
    """$PATCHSET_KNOWN_HOSTS if set (tests, CI), else the system and user files."""
    if os.environ.get("PATCHSET_KNOWN_HOSTS"):
        return [Path(os.environ["PATCHSET_KNOWN_HOSTS"])]
    return [Path("/etc/ssh/ssh_known_hosts"), Path.home() / ".ssh" / "known_hosts"]


def _policies(known_hosts: Path, accept_new: bool):
    import paramiko

    class RejectUnknown(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            raise HostKeyRefused(
                f"{hostname}: unknown host key ({key.get_name()} "
                f"SHA256:{_fingerprint(key)}); check it out of band, then rerun with "
                f"--accept-new to record it in {known_hosts}")

    class AcceptNew(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with open(known_hosts, "a", encoding="ascii") as handle:
                handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            client.get_host_keys().add(hostname, key.get_name(), key)

    return AcceptNew() if accept_new else RejectUnknown()


def ssh_config_files() -> list[Path]:
    """The ssh_config files fabric reads: $PATCHSET_SSH_CONFIG alone when set (tests),
    else the system's and the user's."""
    runtime = os.environ.get("PATCHSET_SSH_CONFIG")
    return [Path(runtime)] if runtime else [Path("/etc/ssh/ssh_config"),
                                             Path.home() / ".ssh" / "config"]


def checked(file: Path, what: str) -> bytes | None:
    """`file`'s bytes through the bounded reader (None: absent); a FIFO, a device, a
    directory or a huge file is bad input naming it (exit 2), before any library opens it
    (fabric and paramiko open ssh_config, keys and known_hosts themselves, blocking)."""
    with inputfile.as_manifest_error():
        try:
            return bounded.read_bytes(file, inputfile.KNOWN_HOSTS_LIMIT, what)
        except bounded.Missing:
            return None


def load_known_hosts(keys: Any, file: Path) -> None:
    """Add `file`'s keys to paramiko HostKeys `keys`, as HostKeys.load would, from text
    the bounded reader checked: paramiko's own `open` would block on a FIFO and read
    /dev/zero until memory runs out. A missing file holds no keys."""
    import paramiko
    with inputfile.as_manifest_error():
        text = bounded.text_of(checked(file, "known_hosts file") or b"", str(file),
                               "known_hosts file")
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError):
            continue                        # a line it cannot read (as OpenSSH skips it)
        if entry is None:
            continue
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)


def _fingerprint(key: Any) -> str:
    import base64
    import hashlib
    return base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


class SshTransport:
    """Runs the engine on one SSH host; `target` is the tree path on that host."""

    provisions = True   # a missing tree on a host is provisioned there from the pin

    def __init__(self, host: Host, target: str, accept_new: bool = False,
                 python: str | None = None) -> None:
        self.host = host.name
        self.spec = host
        self.target = target
        self.accept_new = accept_new
        self.python = python
        self._conn = None
        self._lock = threading.Lock()   # probes may open channels from several threads
        self.sudo = False
        self.round_trips = 0      # agent commands run (what the benchmarks count)
        self.bytes_sent = 0       # bundle bytes uploaded

    # ------------------------------------------------------------ connection

    def connection(self):
        with self._lock:
            if self._conn is None:
                self._conn = self._open()
        return self._conn

    def open_channel(self, host: str, port: int, timeout: float = CONNECT_TIMEOUT):
        """A `direct-tcpip` channel to host:port as the host itself sees it, on this
        transport's one connection (host key checked, ProxyJump hops included): how
        connect/tunnel.py reaches a server bound to the host's loopback, or a host known
        only by an ssh-config alias. Only bytes travel; no command or shell is involved."""
        import paramiko
        conn = self.connection()
        where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        try:
            session = conn.client.get_transport()
            if session is None or not session.is_active():
                raise paramiko.SSHException("the SSH session is closed")
            return session.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0),
                                        timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if isinstance(exc, paramiko.ChannelException):     # RFC 4254 reason codes
                reason = {1: "the host's sshd does not forward there (AllowTcpForwarding, "
                             "PermitOpen)",
                          2: "connect failed: nothing listens there, or the host cannot "
                             "reach it"}.get(exc.code, exc.text or "open failed")
            else:
                reason = str(exc) or type(exc).__name__
            raise Unreachable(f"{self.host}: cannot reach {where} from the host through "
                                  f"ssh ({reason.rstrip('.')})") from None

    def _open(self):
        from fabric import Config, Connection
        for file in ssh_config_files():
            checked(file, "ssh_config file")
        config = Config(runtime_ssh_path=os.environ.get("PATCHSET_SSH_CONFIG"))
        h = self.spec
        kwargs: dict[str, Any] = {}
        if h.identity_file:
            kwargs["key_filename"] = [os.path.expanduser(h.identity_file)]
            checked(Path(kwargs["key_filename"][0]), "identity file")
        gateway = Connection(h.proxy_jump, config=config) if h.proxy_jump else None
        conn = Connection(h.address, user=h.user, port=h.port, config=config,
                          connect_timeout=CONNECT_TIMEOUT, connect_kwargs=kwargs,
                          gateway=gateway)
        self._secure(conn)
        try:
            conn.open()
        except Unreachable:
            raise
        except Exception as exc:  # noqa: BLE001 - every connect failure means unreachable
            raise self._unreachable(exc) from None
        return conn

    def _secure(self, conn) -> None:
        """Load known_hosts and refuse unknown keys, on the host and every gateway hop."""
        files = known_hosts_files()
        user_file = conn.ssh_config.get("userknownhostsfile")
        if user_file and not os.environ.get("PATCHSET_KNOWN_HOSTS"):
            files = [Path(os.path.expanduser(user_file.split()[0]))]
        for file in files:
            load_known_hosts(conn.client.get_host_keys(), file)
        conn.client.set_missing_host_key_policy(_policies(files[-1], self.accept_new))
        if conn.gateway is not None and not isinstance(conn.gateway, str):
            self._secure(conn.gateway)

    def _unreachable(self, exc: BaseException) -> Unreachable:
        import paramiko
        if isinstance(exc, paramiko.BadHostKeyException):
            return HostKeyRefused(
                f"{self.host}: host key CHANGED (got {exc.key.get_name()} "
                f"SHA256:{_fingerprint(exc.key)}); this may be an attack. If the host was "
                "reinstalled, remove the old key with `ssh-keygen -R HOST` and reconnect "
                "with --accept-new")
        if isinstance(exc, paramiko.AuthenticationException):
            return Unreachable(f"{self.host}: SSH authentication failed ({exc}); check "
                                   "the user and key (inventory identity_file or ~/.ssh/config)")
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, (socket.timeout, TimeoutError)):
            reason = f"timed out after {CONNECT_TIMEOUT}s"
        return Unreachable(f"{self.host}: unreachable ({reason})")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ------------------------------------------------------------ the agent

    def call(self, request: Request, files: Mapping[str, Path] | None = None,
             on_event: wire.EventSink | None = None) -> Result | Failure:
        """One SFTP upload of the bundle into a fresh 0700 directory, one command that
        unpacks, runs and removes it; events stream back while it runs."""
        conn = self.connection()
        request = wire.stamp(request, self.target, self.python)
        remote = f"/tmp/{wire.workdir_name(request, secrets.token_hex(8))}"
        sink, errors = wire.LineSink(on_event), io.StringIO()
        try:
            sftp = conn.sftp()
            sftp.mkdir(remote, 0o700)
            payload = wire.bundle(request, files)
            sftp.putfo(io.BytesIO(payload), f"{remote}/bundle.tar")
            self.bytes_sent += len(payload)
            argv = (["sudo", "-n"] if self.sudo else []) + [
                "env", *(f"{k}={v}" for k, v in _remote_env().items()),
                "python3", "-c", wire.BOOTSTRAP, remote]
            result = conn.run(shlex.join(argv), hide=True, warn=True, pty=False,
                              in_stream=False, out_stream=sink, err_stream=errors,
                              encoding="utf-8")
            self.round_trips += 1
        except PatchsetError:
            raise
        except (OSError, EOFError) as exc:
            raise self._unreachable(exc) from None
        except Exception as exc:  # noqa: BLE001 - paramiko raises SSHException subclasses
            import paramiko
            if isinstance(exc, paramiko.SSHException):
                raise self._unreachable(exc) from None
            raise
        sink.close()
        return sink.outcome(self.host, result.exited, errors.getvalue(), request.op,
                            shell=True)

    def elevate(self) -> None:
        """Root through `sudo -n` from now on (the agent said it does not run as root)."""
        self.sudo = True


def _remote_env() -> dict[str, str]:
    """A UTF-8 locale, plus the engine's fault-injection hook when a test sets it."""
    env = dict(wire.REMOTE_ENV)
    if os.environ.get("PATCHSET_TEST_CRASH_AT"):
        env["PATCHSET_TEST_CRASH_AT"] = os.environ["PATCHSET_TEST_CRASH_AT"]
    return env
