"""Where patchset keeps things on the controller; every location can be overridden."""

from __future__ import annotations

import os
from pathlib import Path

from patchset.pin.model import UpstreamPin


def data_home() -> Path:
    """$PATCHSET_HOME, else $XDG_DATA_HOME/patchset, else ~/.local/share/patchset."""
    if os.environ.get("PATCHSET_HOME"):
        return Path(os.environ["PATCHSET_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "patchset"


def default_target(pin: UpstreamPin) -> Path:
    """The tree `patchset apply ... localhost` manages when no --target is given."""
    return data_home() / "targets" / f"{pin.name}-{pin.version}"


def default_series() -> Path:
    """patches.yaml in the current directory, unless $PATCHSET_SERIES says otherwise."""
    return Path(os.environ.get("PATCHSET_SERIES", "patches.yaml"))


def remote_default_target(pin: UpstreamPin) -> str:
    """The tree on an SSH host with no inventory `tree:`; `~` is expanded on the host."""
    return f"~/.local/share/patchset/targets/{pin.name}-{pin.version}"
