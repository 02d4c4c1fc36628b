"""HOST arguments -> transports, through the inventory.

`localhost` runs the engine in this process on a local tree (the provisioned default one
unless --target says otherwise); anything else is an SSH host. Connections opened here
are closed when the resolver's `with` block ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from patchset.errors import UsageError
from patchset.model import Series
from patchset.paths import default_target, remote_default_target
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
        tree = str(self.target) if self.target else host.tree or remote_default_target(
            self.series.upstream)
        transport = SshTransport(host, tree, accept_new=self.accept_new, python=host.python)
        self.opened.append(transport)
        return transport

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        for transport in self.opened:
            transport.close()


def local_target(series: Series, provision: bool, progress: Progress) -> Path:
    """The default local tree; provisioned from the pin on first use when `provision`."""
    path = default_target(series.upstream)
    if path.exists():
        return path
    if not provision:
        raise UsageError(f"localhost: no tree at {path} yet; run "
                         "`patchset apply --tier safe localhost` to provision it")
    from patchset.upstream import materialize, provision as provision_pin
    base = provision_pin(series.upstream, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    with progress.task(f"provisioning {series.upstream.name} {series.upstream.version} "
                       f"at {path}"):
        materialize(base, path, layout="git")
    return path


def base_provider(series: Series, progress: Progress) -> Callable[[], tuple[str, Path]]:
    """Ships the pinned base to a host that has no tree and cannot fetch it itself."""
    def provide() -> tuple[str, Path]:
        from patchset.basebundle import base_bundle
        from patchset.upstream import provision
        base = provision(series.upstream, progress=progress)
        return base.commit, base_bundle(base)
    return provide
