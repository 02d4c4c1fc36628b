"""The one bounded reader for input files (manifest, inventory, patches, policy data).

An input path may name anything: a FIFO (a plain `open` blocks forever), `/dev/zero` or a
huge file (a plain `read` exhausts memory), a directory. Every input is opened without
blocking, must be a regular file, and is read up to a size bound; anything else is a
one-line `file: (file): ...` error (exit 2) before a byte of it is used.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import ManifestError

KIB, MIB = 1024, 1024 * 1024
MANIFEST_LIMIT = 4 * MIB        # patches.yaml; the shipped one is 15 KiB
INVENTORY_LIMIT = 1 * MIB       # hosts.yaml
PATCH_LIMIT = 4 * MIB           # one patch file; the largest shipped one is 13 KiB
SERIES_LIMIT = 32 * MIB         # all patch files of one series together
DATA_LIMIT = 4 * MIB            # policy data, quilt series files, headers


def read_bytes(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The bytes of regular file `path`, at most `limit` of them, or a ManifestError."""
    name = str(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ManifestError(name, None, "(file)", "not found") from None
    except OSError as exc:
        raise ManifestError(name, None, "(file)", f"cannot read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ManifestError(name, None, "(file)", f"not a regular file ({_kind(info)}): "
                                f"a {what} must be a plain file")
        if info.st_size > limit:
            raise _too_big(name, what, limit)
        data = _read_up_to(fd, limit + 1)
    except OSError as exc:
        raise ManifestError(name, None, "(file)", f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > limit:        # the file grew while we read it
        raise _too_big(name, what, limit)
    return data


def read_text(path: str | Path, limit: int, what: str = "file") -> str:
    """UTF-8 text without NUL bytes (a binary file is refused, not half-parsed)."""
    data = read_bytes(path, limit, what)
    if b"\0" in data:
        raise ManifestError(str(path), None, "(file)", f"binary data: a {what} is text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ManifestError(str(path), line, "(file)", "not UTF-8 text") from None


def size_text(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit >= MIB else f"{limit // KIB} KiB"


def _too_big(name: str, what: str, limit: int) -> ManifestError:
    return ManifestError(name, None, "(file)", f"larger than the {size_text(limit)} a {what} "
                         "may have")


def _read_up_to(fd: int, count: int) -> bytes:
    chunks, left = [], count
    while left > 0:
        chunk = os.read(fd, min(left, 1 * MIB))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _kind(info: os.stat_result) -> str:
    mode = info.st_mode
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"
