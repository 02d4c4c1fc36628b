"""What the queue needs from a transport: run the engine on a request where the tree is.

Implementations live in deploy/ (local, SSH); patchset/ only knows this protocol, so the
queue and engine never import the transports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Transport(Protocol):
    host: str          # what the user typed (inventory name, user@host, localhost)

    def run_engine(self, request: dict, files: dict[str, Path]) -> dict:
        """Ship `files` (bundle-relative name -> local path) and run the engine on `request`.

        Returns the engine's JSON result; raises HostUnreachable when the host is not there.
        """
        ...
