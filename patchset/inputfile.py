"""The one bounded reader for input files (manifest, inventory, patches, policy data,
saved runs, reports, known_hosts), as the controller's errors.

An input path may name anything: a FIFO (a plain `open` blocks forever), `/dev/zero` or a
huge file (a plain `read` exhausts memory), a directory. Every input is opened without
blocking, must be a regular file, and is read up to a size bound; anything else is a
one-line `file: (file): ...` error (exit 2) before a byte of it is used. The reading
itself is patchset/agent/lib/bounded.py's, which the hosts run too.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from patchset.agent.lib import bounded
from patchset.agent.lib.bounded import KIB, MIB, size_text  # noqa: F401 - the limits' units, re-exported
from .errors import ManifestError

MANIFEST_LIMIT = 4 * MIB        # patches.yaml; the shipped one is 15 KiB
INVENTORY_LIMIT = 1 * MIB       # hosts.yaml
PATCH_LIMIT = 4 * MIB           # one patch file; the largest shipped one is 13 KiB
SERIES_LIMIT = 32 * MIB         # all patch files of one series together
DATA_LIMIT = 4 * MIB            # policy data, quilt series files, headers, reports
KNOWN_HOSTS_LIMIT = 16 * MIB    # a known_hosts of ~30000 keys


@contextmanager
def as_manifest_error() -> Iterator[None]:
    """An InputError of the bounded reader as the controller's bad-input error (exit 2)."""
    try:
        yield
    except bounded.InputError as exc:
        raise ManifestError(exc.source, exc.line, exc.field, exc.message) from None


def read_bytes(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The bytes of regular file `path`, at most `limit` of them, or a ManifestError."""
    with as_manifest_error():
        return bounded.read_bytes(path, limit, what)


def read_json(path: str | Path, limit: int, what: str = "file") -> Any:
    """A JSON file, bounded as a file and as a document (patchset/agent/lib/bounded.py)."""
    with as_manifest_error():
        return bounded.read_json(path, limit, what)


def read_text(path: str | Path, limit: int, what: str = "file") -> str:
    """UTF-8 text without NUL bytes (a binary file is refused, not half-parsed)."""
    with as_manifest_error():
        return bounded.read_text(path, limit, what)
