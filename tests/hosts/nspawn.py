"""Real test hosts: systemd as PID 1 plus sshd, in systemd-nspawn containers.

Why: deploy/audit code talks to real hosts over SSH and drives real systemd
(daemon-reload, restart, unit state).  Mocks cannot tell us whether that works,
so integration tests boot throw-away Debian hosts instead.

Layout
------
* One **base rootfs** per machine, debootstrapped once by :func:`build_base`
  into ``/var/cache/patchset-test/rootfs-bookworm-v1`` (env
  ``PATCHSET_TEST_ROOTFS`` overrides).  A marker file inside it records the
  recipe digest; a changed recipe rebuilds it.  Built in a temp dir and renamed
  into place under a file lock, so parallel pytest workers never race.
* Every **host** boots that base with ``--volatile=overlay``: writes go to a
  tmpfs overlay, the base is never modified, and *everything a test wrote is
  gone after* :meth:`TestHost.stop` (also across :meth:`TestHost.restart`).
  Tests needing persistence across a host restart must re-create their state
  (or use their own rootfs copy; none does so far).
* Hosts share the machine's network namespace (nspawn's default): each sshd
  listens on ``127.0.0.1:<free port>``.  Consequence: any *other* TCP service
  started inside a host binds on the machine too, so concurrent hosts must use
  distinct ports for their services.
* ``--register=no --keep-unit`` are required here (no systemd/machined on the
  machine running the tests), so ``machinectl`` does not see these hosts:
  stop/exec go through the nspawn process and ``nsenter``.

Needs root, ``systemd-nspawn``, ``debootstrap``, ``ssh``/``ssh-keygen``
(``.ci/install-host-deps`` installs them).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, ClassVar, Iterable, Iterator, NoReturn, Sequence

from tests.hosts.ports import reserve_port

# --------------------------------------------------------------------------
# Base rootfs recipe.  Any change here changes RECIPE_DIGEST -> rebuild.
# Bump RECIPE_VERSION (and the default dir name) for incompatible changes.
# --------------------------------------------------------------------------

RECIPE_VERSION = 1
SUITE = "bookworm"
DEFAULT_ROOTFS = Path("/var/cache/patchset-test/rootfs-bookworm-v1")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
MARKER = "etc/patchset-test-recipe"

#: Packages in the base.  python3-venv: deploy tests create the SGLang venv;
#: curl: /health checks from inside the host; procps: ps/pgrep for audits.
PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-venv",
    "git",
    "iproute2",
    "curl",
    "ca-certificates",
    "procps",
)

#: Run in a chroot after debootstrap.  Host keys are removed (each host gets
#: its own, bind-mounted), machine-id/hostname are emptied so each host gets
#: the ones nspawn passes in (``--uuid``, ``--machine``), apt caches dropped.
CUSTOMIZE_SCRIPT = r"""
set -eu
rm -f /etc/ssh/ssh_host_*
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id
ln -s /etc/machine-id /var/lib/dbus/machine-id
rm -f /etc/hostname
install -d -m 0700 /root/.ssh
systemctl enable ssh.service
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
"""

RECIPE_DIGEST = hashlib.sha256(
    json.dumps([RECIPE_VERSION, SUITE, PACKAGES, CUSTOMIZE_SCRIPT]).encode()
).hexdigest()[:16]

BUILD_TIMEOUT_S = 1800.0
BOOT_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0

# Paths inside the container.
_CTR_SSH_DIR = "/etc/ssh/patchset-test"
_CTR_SSHD_DROPIN = "/etc/ssh/sshd_config.d/patchset-test.conf"


class HostError(RuntimeError):
    """A test host could not be built, booted, reached or stopped."""


# --------------------------------------------------------------------------
# Prerequisites
# --------------------------------------------------------------------------


def missing_prerequisites() -> list[str]:
    """Why test hosts cannot run here (empty list: they can).

    Fixtures use this to fail with a clear message
    instead of an obscure nspawn error.
    """
    problems = []
    if os.geteuid() != 0:
        problems.append("must run as root (systemd-nspawn, debootstrap)")
    for tool in ("systemd-nspawn", "debootstrap", "ssh", "ssh-keygen", "nsenter"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} not found (run .ci/install-host-deps)")
    return problems


# --------------------------------------------------------------------------
# Base rootfs
# --------------------------------------------------------------------------


def rootfs_path() -> Path:
    """Where the cached base rootfs lives (env PATCHSET_TEST_ROOTFS wins)."""
    return Path(os.environ.get("PATCHSET_TEST_ROOTFS") or DEFAULT_ROOTFS)


def _marker_text() -> str:
    return json.dumps({"version": RECIPE_VERSION, "digest": RECIPE_DIGEST}) + "\n"


def base_is_current(path: Path) -> bool:
    """True when *path* holds a finished rootfs built from this recipe."""
    try:
        return (path / MARKER).read_text() == _marker_text()
    except OSError:
        return False


def build_base(
    path: Path | None = None,
    *,
    mirror: str | None = None,
    timeout: float = BUILD_TIMEOUT_S,
) -> Path:
    """Return a ready base rootfs, debootstrapping it once if needed.

    Cheap when cached (one small file read).  Building happens in a sibling
    temp dir and is renamed into place only when complete, under an exclusive
    file lock: a crash leaves no half-built base, and concurrent callers
    (pytest-xdist workers, parallel CI jobs) wait for one build.
    """
    path = Path(path) if path is not None else rootfs_path()
    if base_is_current(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(path.parent / f".{path.name}.lock", timeout):
        if base_is_current(path):
            return path
        _remove_stale_builds(path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.build-", dir=path.parent))
        try:
            tmp.chmod(0o755)  # becomes the hosts' "/": mkdtemp's 0700 would lock out non-root users
            mirror = mirror or os.environ.get("PATCHSET_TEST_MIRROR") or DEFAULT_MIRROR
            _debootstrap(tmp, mirror, timeout)
            _customize(tmp)
            (tmp / MARKER).write_text(_marker_text())
            _swap_into_place(tmp, path)
        except BaseException:
            _remove_tree(tmp)
            raise
    return path


@contextlib.contextmanager
def _file_lock(lock_path: Path, timeout: float) -> Iterator[None]:
    """Exclusive flock with a deadline (a stuck builder must not hang CI)."""
    with open(lock_path, "a+") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise HostError(f"timed out after {timeout:.0f}s waiting for {lock_path}") from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_stale_builds(path: Path) -> None:
    """Delete leftovers of killed builds (safe: we hold the build lock)."""
    for pattern in (f".{path.name}.build-*", f".{path.name}.old-*"):
        for stale in path.parent.glob(pattern):
            _remove_tree(stale)


def _debootstrap(target: Path, mirror: str, timeout: float) -> None:
    argv = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        SUITE,
        str(target),
        mirror,
    ]
    _run_logged(argv, timeout, what="debootstrap")


def _customize(root: Path) -> None:
    _run_logged(["chroot", str(root), "/bin/sh", "-c", CUSTOMIZE_SCRIPT], 300, what="rootfs customize")


def _run_logged(argv: Sequence[str], timeout: float, *, what: str) -> None:
    """Run a build step; on failure raise with the tail of its output."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}
    try:
        res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise HostError(f"{what} timed out after {timeout:.0f}s: {argv}") from exc
    if res.returncode != 0:
        raise HostError(f"{what} failed (rc={res.returncode}): {argv}\n{res.stdout[-4000:]}")


def _swap_into_place(tmp: Path, path: Path) -> None:
    """Atomically publish *tmp* as *path*, retiring a stale one first."""
    old = None
    if path.exists():
        old = path.parent / f".{path.name}.old-{secrets.token_hex(4)}"
        os.rename(path, old)
    os.rename(tmp, path)
    if old is not None:
        _remove_tree(old)


def _mounts_below(directory: Path) -> list[str]:
    prefix = str(directory.resolve()).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4] for line in fh]
    return [p for p in points if p.startswith(prefix)]


def _remove_tree(directory: Path) -> None:
    """rm -rf that first unmounts anything debootstrap left mounted inside.

    Why: a killed debootstrap can leave proc/sys mounted in the target, and
    rmtree must never descend into those.
    """
    if not directory.exists():
        return
    for point in sorted(_mounts_below(directory), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    if _mounts_below(directory):
        raise HostError(f"refusing to delete {directory}: still has mounts below it")
    shutil.rmtree(directory)


# --------------------------------------------------------------------------
# Keys and ssh helpers
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientKey:
    """An ed25519 client keypair generated for one test run."""

    private: Path
    public_line: str


def _keygen(path: Path, comment: str) -> str:
    """Generate an ed25519 key at *path* (replacing any) and return its public line."""
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    return path.with_name(path.name + ".pub").read_text().strip()


def make_client_key(directory: Path, name: str = "id_ed25519") -> ClientKey:
    """Create a fresh client keypair in *directory* (per run, never reused)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = directory / name
    return ClientKey(private=private, public_line=_keygen(private, "patchset-test-client"))


def ssh_argv(
    host: TestHost,
    *,
    known_hosts: Path,
    identity: Path | None = None,
    user: str = "root",
    connect_timeout: int = 10,
) -> list[str]:
    """argv prefix for plain OpenSSH to *host*, strict host-key checking on.

    ``-F /dev/null`` and the global known_hosts set to /dev/null keep the
    developer's own ssh config and keys out of the test.
    """
    return [
        "ssh",
        "-F", "/dev/null",
        "-p", str(host.port),
        "-i", str(identity or host.client_key),
        "-o", "IdentitiesOnly=yes",
        "-o", "IdentityAgent=none",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", "ControlMaster=no",
        "-o", "LogLevel=ERROR",
        f"{user}@{host.ip}",
    ]


def run_ssh(
    host: TestHost,
    command: str,
    *,
    known_hosts: Path | None = None,
    identity: Path | None = None,
    timeout: float = 60,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run *command* on *host* via plain ssh; known_hosts defaults to its current key."""
    kh = known_hosts or write_known_hosts([host], host.state_dir / "known_hosts")
    argv = [*ssh_argv(host, known_hosts=kh, identity=identity), command]
    return subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=check
    )


def write_known_hosts(hosts: Iterable[TestHost], path: Path) -> Path:
    """Write an OpenSSH known_hosts for *hosts* (``[127.0.0.1]:PORT ssh-ed25519 ...``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(h.known_hosts_line() + "\n" for h in hosts))
    os.replace(tmp, path)
    return path


def _free_port() -> int:
    """A free loopback TCP port for one host's sshd, reserved machine-wide (tests.hosts.ports).

    Hosts share the machine's netns, so this is a machine-wide resource.
    Chosen at random *below* the kernel's ephemeral range, so an outgoing
    connection's source port can never squat it between now and boot, and
    away from 30000-30999 (SGLang's default ports, used by fake servers, and
    the stand-ins' ports).
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    lo, hi = (20000, min(low, 30000)) if low > 21000 else (low // 2, low)
    try:
        return reserve_port(lo, hi)
    except RuntimeError as exc:
        raise HostError(str(exc)) from None


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _ssh_banner(port: int, timeout: float = 3.0) -> bool:
    """True if an SSH server answers on *port* (cheap probe before running ssh).

    Why: a port someone else listens on would make every ssh attempt hang for
    its whole ConnectTimeout; this keeps the boot-wait loop responsive.
    """
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


# --------------------------------------------------------------------------
# Hosts
# --------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LIVE_HOSTS: "weakref.WeakSet[TestHost]" = weakref.WeakSet()


def _die_with_parent() -> None:
    """preexec: SIGTERM nspawn (= clean container shutdown) if pytest dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _tracking_hierarchies() -> list[tuple[Path, str]]:
    """(mount point, our cgroup path) of the hierarchies systemd tracks units in.

    That is the named ``name=systemd`` v1 hierarchy (legacy/hybrid hosts) and
    the unified v2 one.  Controller hierarchies (memory, cpu...) are left
    alone: nspawn mounts them read-only in the container, and moving out of
    our memory cgroup would escape the sandbox's accounting.
    """
    mounts: dict[str, str] = {}
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, right = line.split(" - ", 1)
            fstype, _src, opts = right.split()[:3]
            point = left.split()[4]
            if fstype == "cgroup2":
                mounts.setdefault("unified", point)
            elif fstype == "cgroup" and "name=systemd" in opts.split(","):
                mounts.setdefault("name=systemd", point)
    found = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        key = "unified" if (hid == "0" and ctrls == "") else ctrls
        if key in mounts:
            found.append((Path(mounts[key]), path))
    return found


def host_cgroups(name: str) -> list[Path]:
    """Per-host cgroup dirs (``<our cgroup>/patchset-test/<name>``).

    Why: with ``--keep-unit --register=no`` nspawn runs the container in the
    caller's own cgroup, so concurrent hosts' systemds would create and delete
    the *same* ``system.slice/...`` cgroups and units fail with 219/CGROUP.
    """
    return [mount / path.lstrip("/") / "patchset-test" / name for mount, path in _tracking_hierarchies()]


def _enter_cgroups(dirs: Sequence[Path]) -> None:
    """preexec: move the forked nspawn into its per-host cgroups."""
    pid = str(os.getpid())
    for d in dirs:
        (d / "cgroup.procs").write_text(pid)


def _remove_cgroups(dirs: Sequence[Path], timeout: float = 10.0) -> None:
    """rmdir per-host cgroups leaf-first, retrying while dying processes exit.

    Best effort: a cgroup still holding a process cannot be removed (EBUSY),
    and leaving an empty directory behind is harmless.
    """
    deadline = time.monotonic() + timeout
    while True:
        for d in dirs:
            for sub, _dirs, _files in sorted(os.walk(d), key=lambda t: len(t[0]), reverse=True):
                with contextlib.suppress(OSError):
                    os.rmdir(sub)
        if not any(d.exists() for d in dirs) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for d in dirs:
        with contextlib.suppress(OSError):
            os.rmdir(d.parent)  # shared "patchset-test" dir; fails while others live


def _cgroup_has_processes(d: Path) -> bool:
    for sub, _dirs, _files in os.walk(d):
        with contextlib.suppress(OSError):
            if Path(sub, "cgroup.procs").read_text().strip():
                return True
    return False


def _reap_stale_cgroups(parent: Path, min_age: float = 60.0) -> None:
    """Remove per-host cgroups of hosts whose owner died (e.g. pytest SIGKILLed).

    Only trees with no process anywhere and older than *min_age* (so a host
    another worker is creating right now is never touched).
    """
    if not parent.is_dir():
        return
    for d in parent.iterdir():
        with contextlib.suppress(OSError):
            if d.is_dir() and time.time() - d.stat().st_mtime > min_age and not _cgroup_has_processes(d):
                _remove_cgroups([d], timeout=0)


def _wait_gone(proc: tuple[int, str] | None, timeout: float) -> None:
    """Wait for a process we cannot waitpid() (reparented container init) to vanish."""
    deadline = time.monotonic() + timeout
    while proc is not None and _proc_start_time(proc[0]) == proc[1] and time.monotonic() < deadline:
        time.sleep(0.05)


def _sshd_dropin(port: int, ip: str) -> str:
    return (
        "# written by tests/hosts/nspawn.py\n"
        f"Port {port}\n"
        f"ListenAddress {ip}\n"
        f"HostKey {_CTR_SSH_DIR}/ssh_host_ed25519_key\n"
        f"AuthorizedKeysFile .ssh/authorized_keys {_CTR_SSH_DIR}/authorized_keys\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UseDNS no\n"
    )


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat: guards kill() against PID reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            kids += [int(x) for x in (task / "children").read_text().split()]
    return kids


@dataclass(eq=False)
class TestHost:
    """One booted (or stoppable/restartable) nspawn test host.

    ``ip``/``port`` address its sshd; ``host_key`` is its current public host
    key line; ``client_key`` is the private key authorized for root;
    ``root`` is the read-only base rootfs it boots from; ``state_dir`` holds
    its sshd drop-in, host key, authorized_keys and ``console.log``.
    """

    __test__: ClassVar[bool] = False  # not a pytest test class

    name: str
    ip: str
    port: int
    host_key: str
    client_key: Path
    root: Path
    state_dir: Path
    machine_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _leader: tuple[int, str] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)
    _term_sent: bool = field(default=False, repr=False)

    # -- construction ------------------------------------------------------

    @classmethod
    def prepare(cls, name: str, base: Path, client: ClientKey, workdir: Path) -> TestHost:
        """Create the per-host state dir (keys, sshd config); does not boot."""
        state = workdir / name
        (state / "ssh").mkdir(parents=True, mode=0o755)
        port = _free_port()
        host_key = _keygen(state / "ssh" / "ssh_host_ed25519_key", f"root@{name}")
        (state / "ssh" / "authorized_keys").write_text(client.public_line + "\n")
        (state / "sshd.conf").write_text(_sshd_dropin(port, "127.0.0.1"))
        return cls(name=name, ip="127.0.0.1", port=port, host_key=host_key,
                   client_key=client.private, root=base, state_dir=state)

    # -- lifecycle ---------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def nspawn_argv(self) -> list[str]:
        """The exact systemd-nspawn command (useful when debugging by hand)."""
        return [
            "systemd-nspawn",
            "--quiet",
            f"--directory={self.root}",
            "--volatile=overlay",
            "--register=no",
            "--keep-unit",
            "--boot",
            f"--machine={self.name}",
            f"--uuid={self.machine_id}",
            "--console=read-only",
            "--link-journal=no",
            f"--bind-ro={self.state_dir / 'sshd.conf'}:{_CTR_SSHD_DROPIN}",
            f"--bind-ro={self.state_dir / 'ssh'}:{_CTR_SSH_DIR}",
        ]

    def spawn(self) -> None:
        """Start booting without waiting (lets several hosts boot in parallel)."""
        if self.is_running:
            return
        cgroups = host_cgroups(self.name)
        for d in cgroups:
            _reap_stale_cgroups(d.parent)
        _remove_cgroups(cgroups, timeout=0)  # leftovers of a previous boot of this host
        for d in cgroups:
            d.mkdir(parents=True, exist_ok=True)

        def preexec() -> None:
            _die_with_parent()
            _enter_cgroups(cgroups)

        self._log = open(self.state_dir / "console.log", "ab")
        self._proc = subprocess.Popen(
            self.nspawn_argv(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            preexec_fn=preexec, start_new_session=True,
        )
        self._leader = None
        _LIVE_HOSTS.add(self)

    def start(self, timeout: float = BOOT_TIMEOUT_S, *, wait_booted: bool = True) -> TestHost:
        """Boot the host and wait until sshd accepts our key (and boot finished)."""
        self.spawn()
        self.wait_ready(timeout, wait_booted=wait_booted)
        return self

    def wait_ready(self, timeout: float = BOOT_TIMEOUT_S, *, wait_booted: bool = True) -> None:
        """Poll until key login works; then optionally until systemd finished startup.

        On timeout the console output and journal go into the error, because
        "ssh never came up" alone is undiagnosable in CI.
        """
        start = time.monotonic()
        deadline = start + timeout
        next_probe = start + 2.0
        while not self._ssh_ok():
            now = time.monotonic()
            if not self.is_running:
                rc = self._proc.returncode if self._proc else None
                self._fail(f"systemd-nspawn exited rc={rc}")
            if now > deadline:
                self._fail(f"sshd not reachable on port {self.port} after {timeout:.0f}s")
            if now > next_probe:  # fail fast instead of waiting out the timeout
                next_probe = now + 2.0
                if self._ssh_unit_failed():
                    self._fail(f"ssh.service failed (port {self.port} taken?)")
            time.sleep(0.25)
        self._remember_leader()
        if wait_booted:
            left = max(5.0, deadline - time.monotonic())
            try:
                res = run_ssh(self, "systemctl is-system-running --wait", timeout=left)
            except subprocess.TimeoutExpired:
                self._fail(f"boot not finished after {timeout:.0f}s")
            if res.stdout.strip() not in ("running", "degraded"):
                self._fail(f"boot did not finish: {res.stdout!r} {res.stderr!r}")

    def _fail(self, why: str) -> NoReturn:
        raise HostError(f"{self.name}: {why}\n{self.diagnostics()}")

    def _ssh_unit_failed(self) -> bool:
        leader = self._find_leader()
        if leader is None:
            return False
        self._leader = leader
        with contextlib.suppress(Exception):
            res = self.exec(["systemctl", "is-failed", "ssh.service"], timeout=20)
            return res.stdout.strip() == "failed"
        return False

    def _ssh_ok(self) -> bool:
        if not _ssh_banner(self.port):
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            return run_ssh(self, "true", timeout=15).returncode == 0
        return False

    def _find_leader(self) -> tuple[int, str] | None:
        """(pid, start time) of the container's PID 1: nspawn's child process."""
        if self._proc is None:
            return None
        own_ns = os.readlink("/proc/self/ns/pid")
        for pid in _children(self._proc.pid):
            with contextlib.suppress(OSError):
                # nspawn's short-lived helper children share our PID namespace
                if os.readlink(f"/proc/{pid}/ns/pid") != own_ns:
                    start = _proc_start_time(pid)
                    if start is not None:
                        return (pid, start)
        return None

    def _remember_leader(self) -> None:
        """Record the container's PID 1 for nsenter/kill (must be running)."""
        self._leader = self._find_leader()
        if self._leader is None:
            raise HostError(f"{self.name}: cannot find container PID 1 under systemd-nspawn")

    @property
    def leader_pid(self) -> int:
        """Host PID of the container's init (valid while running)."""
        if not self.is_running or self._leader is None:
            raise HostError(f"{self.name} is not running")
        return self._leader[0]

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Shut down cleanly; SIGKILL after *timeout*.  Idempotent.

        SIGTERM to nspawn makes it send SIGRTMIN+3 to the container's systemd
        (orderly poweroff).  If that hangs we kill the container's PID 1 (which
        takes its whole PID namespace with it) and nspawn.
        """
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._request_stop()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_hard(proc)
        self._proc = None
        self._leader = None
        self._term_sent = False
        _remove_cgroups(host_cgroups(self.name))
        with contextlib.suppress(OSError):  # nspawn refuses to rm it on a non-tmpfs /run
            os.rmdir(f"/run/systemd/nspawn/propagate/{self.name}")
        if self._log is not None:
            self._log.close()
            self._log = None
        _LIVE_HOSTS.discard(self)

    def _request_stop(self) -> None:
        """SIGTERM nspawn once: a second SIGTERM means "terminate immediately"."""
        if self._proc is not None and not self._term_sent:
            self._term_sent = True
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)

    def _kill_hard(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the container's PID 1 (kills its whole PID namespace), then nspawn."""
        leader = self._find_leader() or self._leader
        if leader is not None and _proc_start_time(leader[0]) == leader[1]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(leader[0], signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(30)
        _wait_gone(leader, 15)

    def restart(self, timeout: float = BOOT_TIMEOUT_S) -> TestHost:
        """Stop then start (same port, keys, machine id; overlay writes are lost)."""
        self.stop()
        return self.start(timeout)

    # -- keys --------------------------------------------------------------

    def known_hosts_line(self) -> str:
        """``[127.0.0.1]:PORT ssh-ed25519 AAAA...`` for the current host key."""
        keytype, blob = self.host_key.split()[:2]
        return f"[{self.ip}]:{self.port} {keytype} {blob}"

    def rotate_host_key(self, timeout: float = 60) -> str:
        """Give the host a new host key (for "changed host key" tests).

        The key dir is bind-mounted, so the new file is visible inside at once;
        a running sshd is reloaded (SIGHUP re-exec reads keys again) and we wait
        until it serves the new key.  Returns the new public line.
        """
        self.host_key = _keygen(self.state_dir / "ssh" / "ssh_host_ed25519_key", f"root@{self.name}")
        if self.is_running:
            self.exec(["systemctl", "reload", "ssh.service"], check=True)
            self.wait_ready(timeout, wait_booted=False)
        return self.host_key

    # -- direct access (no ssh) ---------------------------------------------

    def exec(
        self, argv: Sequence[str], *, check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run *argv* inside the host via nsenter (works even when sshd is broken)."""
        cmd = ["nsenter", f"--target={self.leader_pid}", "--all", "--", *argv]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "SYSTEMD_PAGER": "", "TERM": "dumb"}
        return subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=check, env=env
        )

    @property
    def live_root(self) -> Path:
        """The host's merged (overlay) root as seen from the machine."""
        return Path(f"/proc/{self.leader_pid}/root")

    def console_log(self, tail: int = 8000) -> str:
        """Boot/shutdown console output, ANSI colours and CRs removed."""
        try:
            text = (self.state_dir / "console.log").read_text(errors="replace")
        except OSError:
            return ""
        text = _ANSI.sub("", text).replace("\r", "")
        return re.sub(r"\n{2,}", "\n", text)[-tail:]

    def diagnostics(self) -> str:
        """Console tail + journal tail (+ failed units), for error messages."""
        parts = [f"--- nspawn: {' '.join(self.nspawn_argv())}", "--- console.log (tail):", self.console_log()]
        if self.is_running and self._leader is None:
            with contextlib.suppress(HostError):
                self._remember_leader()
        if self.is_running and self._leader is not None:
            for argv in (["systemctl", "--failed", "--no-legend"], ["journalctl", "--no-pager", "-n", "80"]):
                with contextlib.suppress(Exception):
                    res = self.exec(argv, timeout=20)
                    parts += [f"--- {' '.join(argv)}:", res.stdout + res.stderr]
        return "\n".join(parts)


# --------------------------------------------------------------------------
# Fleets
# --------------------------------------------------------------------------


def start_hosts(
    n: int,
    *,
    workdir: Path,
    client_key: ClientKey | None = None,
    base: Path | None = None,
    prefix: str = "pst",
    timeout: float = BOOT_TIMEOUT_S,
) -> list[TestHost]:
    """Boot *n* hosts in parallel from the (cached) base; all or nothing.

    Each gets a distinct machine name (= hostname), machine id, sshd port and
    host key.  *client_key* defaults to a new key in *workdir*.  If any host
    fails to come up, all are stopped before the error propagates.
    """
    base = build_base(base)
    client_key = client_key or make_client_key(workdir / "client")
    run_id = secrets.token_hex(3)
    hosts = [TestHost.prepare(f"{prefix}-{run_id}-{i}", base, client_key, workdir) for i in range(n)]
    try:
        for h in hosts:
            h.spawn()
        _wait_all(hosts, timeout)
    except BaseException:
        stop_hosts(hosts)
        raise
    return hosts


def _wait_all(hosts: Sequence[TestHost], timeout: float) -> None:
    """Wait for all hosts concurrently (threads: each wait is mostly ssh I/O)."""
    errors: list[BaseException] = []

    def wait(h: TestHost) -> None:
        try:
            h.wait_ready(timeout)
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=wait, args=(h,), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 60)
    if errors:
        raise errors[0]


def stop_hosts(hosts: Iterable[TestHost], timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop several hosts; shutdowns run concurrently (SIGTERM all, then wait)."""
    hosts = list(hosts)
    for h in hosts:
        if h.is_running:
            h._request_stop()
    for h in hosts:
        h.stop(timeout)


@atexit.register
def _stop_leftovers() -> None:
    """Last resort if a caller forgot stop(): no booted container outlives us."""
    stop_hosts(list(_LIVE_HOSTS), timeout=20)


# --------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------


def host_memory_bytes(host: TestHost) -> int:
    """Proportional set size (PSS) of all processes in the host's PID namespace.

    Excludes the tmpfs overlay (files the host wrote), which is small here.
    """
    ns = os.readlink(f"/proc/{host.leader_pid}/ns/pid")
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(proc / "ns" / "pid") != ns:
                continue
            for line in (proc / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
    return total
