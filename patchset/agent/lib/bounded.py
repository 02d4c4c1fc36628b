"""The one bounded reader of files and of JSON, for the controller and the hosts alike.

Why here: the agent (this package) runs on hosts with the standard library only, and it
reads what others wrote (the target's state file, the request, a tracer's records, a
server's /server_info, a checkpoint's header); the controller reads saved runs, reports,
known_hosts and servers' answers. One implementation serves both: the controller wraps
`InputError` into its own errors (patchset/inputfile.py, patchset/jsonsrc.py), the
agent into its error results.

Files: a path may name a FIFO (a plain `open` blocks forever), `/dev/zero` or a huge
file (a plain `read` exhausts memory), a directory, a symlink to any of those. A file is
opened without blocking, must be a regular file (checked on the open descriptor, so a
swap after a check is caught), and is read up to a size bound.

JSON: `json.loads` bounds nothing. It recurses per level (100k `[` is a RecursionError,
not a ValueError), turns a 5000-digit integer into a ValueError only on Python >= 3.11,
takes `NaN`, `Infinity` and `1e999` (an inf) as numbers, keeps the last of duplicate
keys, and `true` reads as 1 wherever a caller checks `isinstance(x, int)`. `loads`
refuses all of these with one `InputError`, and `expect` checks a value's exact type.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from typing import Any, BinaryIO

KIB, MIB = 1024, 1024 * 1024
MAX_DEPTH = 64             # the deepest JSON the tool reads (a drift run) is 5 levels
MAX_INT_DIGITS = 30        # token ids, sizes, pids, times: 20 digits hold any 64-bit value
JSON_LIMIT = 64 * MIB      # a server's answer (connect/tunnel.py MAX_BODY) and most files


class InputError(ValueError):
    """Input that is refused: `source` (a file, a host's answer), the 1-based `line` when
    known, the `field` path inside it, and why, in one line."""

    def __init__(self, source: str, line: int | None, field: str, message: str,
                 errno: int | None = None) -> None:
        self.source, self.line, self.field, self.message = source, line, field, message
        self.errno = errno           # the OSError's, for a caller that reports it as one
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {field}: {message}")


class Missing(InputError):
    """The file does not exist (a caller may take that as "none yet")."""


# ---------------------------------------------------------------- files

def read_bytes(path: Any, limit: int, what: str = "file") -> bytes:
    """The bytes of regular file `path`, at most `limit` of them, or an InputError."""
    return read_file(path, limit, what)[0]


def read_file(path: Any, limit: int, what: str = "file",
              clip: bool = False) -> tuple[bytes, os.stat_result]:
    """The bytes of regular file `path` and its stat; more than `limit` bytes is an
    InputError, or (`clip`: a host's /proc files and env files, read for facts) the
    first `limit` of them."""
    name = str(path)
    with open_regular(name, what) as handle:
        info = os.fstat(handle.fileno())
        if info.st_size > limit and not clip:
            raise _too_big(name, what, limit)
        try:
            data = _read_up_to(handle.fileno(), limit + 1)
        except OSError as exc:
            raise _os_error(name, exc) from None
    if len(data) > limit:        # /proc files say size 0; or the file grew as we read it
        if not clip:
            raise _too_big(name, what, limit)
        data = data[:limit]
    return data, info


def open_regular(path: Any, what: str = "file") -> BinaryIO:
    """`path` opened for reading if it is a regular file (checked on the descriptor),
    else an InputError: opened without blocking, so a FIFO cannot hang the open."""
    name = str(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise _os_error(name, exc) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(name, None, "(file)", f"not a regular file ({_kind(info)}): "
                             f"a {what} must be a plain file", errno.EINVAL)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _os_error(name: str, exc: OSError) -> InputError:
    if exc.errno == errno.ENOENT:
        return Missing(name, None, "(file)", "not found", exc.errno)
    return InputError(name, None, "(file)", f"cannot read: {exc.strerror}", exc.errno)


def read_text(path: Any, limit: int, what: str = "file") -> str:
    """UTF-8 text without NUL bytes (a binary file is refused, not half-parsed)."""
    return text_of(read_bytes(path, limit, what), str(path), what)


def text_of(data: bytes, source: str, what: str = "file") -> str:
    if b"\0" in data:
        raise InputError(source, None, "(file)", f"binary data: a {what} is text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputError(source, line, "(file)", "not UTF-8 text") from None


def size_text(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit >= MIB else f"{limit // KIB} KiB"


def _too_big(name: str, what: str, limit: int) -> InputError:
    return InputError(name, None, "(file)", f"larger than the {size_text(limit)} a {what} "
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


# ---------------------------------------------------------------- JSON

def read_json(path: Any, limit: int = JSON_LIMIT, what: str = "JSON file") -> Any:
    """A JSON file through both bounds: the file's, then the document's."""
    return loads(read_bytes(path, limit, what), str(path), limit)


class _Refused(Exception):
    """Raised inside json's hooks; `loads` turns it into an InputError."""


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _Refused(f"integer with {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"number {text[:20]!r} overflows a double")
    return value


def _constant(text: str) -> Any:
    raise _Refused(f"{text} is not a JSON number")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"duplicate key {key[:40]!r}")
            seen.add(key)
    return out


_DECODER = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant,
                            object_pairs_hook=_pairs)
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def loads(data: bytes | str, source: str, limit: int = JSON_LIMIT) -> Any:
    """One JSON document of at most `limit` bytes, within the module's bounds."""
    if len(data) > limit:
        raise InputError(source, None, "(json)", f"larger than the {size_text(limit)} "
                         "allowed here")
    text = text_of(data, source, "JSON document") if isinstance(data, bytes) else data
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise InputError(source, exc.lineno, "(json)", f"not JSON ({exc.msg})") from None
    except _Refused as exc:
        raise InputError(source, None, "(json)", f"refused: {exc}") from None
    except RecursionError:
        raise InputError(source, None, "(json)",
                         f"refused: nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, OverflowError) as exc:
        raise InputError(source, None, "(json)", f"refused: {exc}") from None
    _check_tree(value, source, bool(_ESCAPED_SURROGATE.search(text)))
    return value


def _check_tree(value: Any, source: str, surrogates: bool) -> None:
    """Depth, and (only when the text escapes one) lone surrogates, which no UTF-8 output
    can carry: level by level, so no depth can overflow the stack here."""
    if surrogates and type(value) is str:
        _no_surrogate([value], source)
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(MAX_DEPTH):
        deeper = []
        for item in level:
            children = list(item.values()) if isinstance(item, dict) else item
            if surrogates:
                _no_surrogate([c for c in children if type(c) is str]
                              + (list(item) if isinstance(item, dict) else []), source)
            deeper += [c for c in children if isinstance(c, (dict, list))]
        if not deeper:
            return
        level = deeper
    raise InputError(source, None, "(json)", f"refused: nested deeper than {MAX_DEPTH} levels")


def _no_surrogate(strings: list[str], source: str) -> None:
    if any(_SURROGATE.search(s) for s in strings):
        raise InputError(source, None, "(json)", "refused: a string holds an unpaired "
                         "surrogate")


# ---------------------------------------------------------------- typed access

NUMBER = (int, float)         # exactly these types: bool is an int subclass, and refused
_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
          list: "a list", dict: "an object", type(None): "null"}


def expect(value: Any, kinds: type | tuple[type, ...], source: str,
           path: tuple[str | int, ...] = ()) -> Any:
    """`value` when its exact type is one of `kinds` (so `true` is no number, and `1` no
    `true`), else an InputError naming `path` (`("choices", 0, "message")`). A float
    among `kinds` must be finite (a value built in code, not parsed, may not be)."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if type(value) not in kinds:
        names = [_NAMES.get(k, k.__name__) for k in kinds if not (k is int and float in kinds)]
        wanted = " or ".join(names)
        raise InputError(source, None, field_name(path), f"expected {wanted}, found "
                         f"{_NAMES.get(type(value), type(value).__name__)}")
    if type(value) is float and not math.isfinite(value):
        raise InputError(source, None, field_name(path), "not a finite number")
    return value


def field_name(path: tuple[str | int, ...]) -> str:
    """`("choices", 0, "message")` -> `choices[0].message`."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"
