"""HOST arguments -> transports, through the inventory.

`localhost` runs the engine in this process on a local tree (the provisioned default one
unless --target says otherwise); anything else is an SSH host. `endpoint` gives a host's
HTTP server, through the same SSH connection. Connections opened here are closed when the
resolver's `with` block ends.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

from patchset.agent.lib import bounded
from patchset.errors import UsageError
from patchset.series.model import Series
from patchset.pin.paths import default_target, remote_default_target
from patchset.progress import NullProgress, Progress

from . import inventory as inv
from .local import LocalTransport


class Hosts:
    """Resolves HOST specs for one command; `target` overrides every host's tree."""

    def __init__(self, series: Series, inventory: Path | None, target: Path | None,
                 accept_new: bool = False, progress: Progress | None = None) -> None:
        self.series, self.target, self.accept_new = series, target, accept_new
        self.progress = progress or NullProgress()
        self.inventory = inv.load(inventory)
        self.opened: list = []

    def default(self) -> str:
        """The inventory's default host, else localhost."""
        return self.inventory.default or "localhost"

    def transport(self, spec: str, provision_local: bool = True):
        host = self.inventory.resolve(spec)
        if host.local:
            tree = self.target or (Path(host.tree) if host.tree else None)
            return LocalTransport(tree or local_target(self.series, provision_local,
                                                       self.progress))
        if self.target is not None and not inv.REMOTE_PATH.ok(str(self.target)):
            raise UsageError(f"--target {str(self.target)!r}: use an absolute path (or ~/...) "
                             f"of letters, digits and _./+@- on {spec}")
        from .ssh import SshTransport
        remote = str(self.target) if self.target else host.tree or remote_default_target(
            self.series.upstream)
        transport = SshTransport(host, remote, accept_new=self.accept_new, python=host.python)
        self.opened.append(transport)
        return transport

    def audit_transport(self, spec: str):
        """The transport `status` would use; a localhost without its default tree still
        gets audited (the tree is then a fact that says it is missing)."""
        try:
            return self.transport(spec, provision_local=False)
        except UsageError:
            host = self.inventory.resolve(spec)
            if not host.local:
                raise
            return LocalTransport(Path(default_target(self.series.upstream)))

    def endpoint(self, spec: str, roles: tuple[str, ...] | None = None,
                 at: tuple[str, int] | None = None):
        """The HTTP endpoint (connect/tunnel.py) of `spec`'s role (router, else decode;
        or `at`, an address and port as seen from the host), through the SSH connection
        this resolver already holds for it, so there is one connection and one host-key
        check per host; closed with the resolver."""
        from . import tunnel
        host = self.inventory.resolve(spec)
        roles = roles or tunnel.ROLE_PREFERENCE
        if host.local:
            return tunnel.endpoint_for(host, roles, at=at)
        from .ssh import SshTransport
        held = next((t for t in self.opened
                     if isinstance(t, SshTransport) and t.host == host.name), None)
        if held is None:
            held = SshTransport(host, "", accept_new=self.accept_new, python=host.python)
            self.opened.append(held)
        return tunnel.endpoint_for(host, roles, at=at, transport=held)

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        for transport in self.opened:
            transport.close()


# In the default tree's .git: the whole pin it was provisioned from (its path names only
# name-version, so a pin edited in place must not keep using a tree made from another).
PIN_RECORD = "patchset-pin.json"


def local_target(series: Series, provision: bool, progress: Progress) -> Path:
    """The default local tree; provisioned from the pin on first use when `provision`.
    An existing one is used only for the pin it was made from (check_tree_pin)."""
    path = default_target(series.upstream)
    if path.exists():
        check_tree_pin(series.upstream, path)
        return path
    if not provision:
        raise UsageError(f"localhost: no tree at {path} yet; run "
                         "`patchset apply --tier safe localhost` to provision it")
    from patchset.pin.upstream import materialize, provision as provision_pin
    base = provision_pin(series.upstream, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    with progress.task(f"provisioning {series.upstream.name} {series.upstream.version} "
                       f"at {path}"):
        materialize(base, path, layout="git")
    (path / ".git" / PIN_RECORD).write_text(json.dumps(
        {"pin": dataclasses.asdict(series.upstream), "commit": base.commit}, indent=2,
        sort_keys=True) + "\n")
    return path


def check_tree_pin(pin, path: Path) -> None:
    """Read-only: refuse (exit 2, `file:line: upstream.FIELD`) a pin whose sha256 the
    cached wheel disagrees with, or that is not the pin the default tree at `path` was
    provisioned from (the first field that differs, both values shown)."""
    from patchset.pin import pinrules
    from patchset.pin.upstream import verify_cached_wheel
    verify_cached_wheel(pin)
    try:
        recorded = bounded.read_json(path / ".git" / PIN_RECORD, bounded.MIB, "pin record")["pin"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # a tree provisioned before the record existed: the engine checks its files
    current = dataclasses.asdict(pin)
    if recorded == current:
        return
    field, old, new = _first_difference(recorded, current)
    raise pinrules.pin_error(pin, field, (
        f"{path} was provisioned from {'.'.join(field)} {old!r}, the manifest says {new!r}; "
        f"nothing was changed - correct the pin, or remove {path} to provision it again"))


def _first_difference(old: dict, new: dict) -> tuple[tuple[str, ...], object, object]:
    names = {"git_prefix": ("layout", "git_prefix")}
    for key in ("name", "version", "git", "pypi", "git_prefix"):
        a, b = (old or {}).get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            for sub in sorted(set(a) | set(b)):
                if a.get(sub) != b.get(sub):
                    return (key, sub), a.get(sub), b.get(sub)
        return names.get(key, (key,)), a, b
    return ("version",), old, new


def base_provider(series: Series, progress: Progress) -> Callable[[], tuple[str, Path]]:
    """Ships the pinned base to a host that has no tree and cannot fetch it itself."""
    def provide() -> tuple[str, Path]:
        from patchset.pin.basebundle import base_bundle
        from patchset.pin.upstream import provision
        base = provision(series.upstream, progress=progress)
        return base.commit, base_bundle(base)
    return provide
