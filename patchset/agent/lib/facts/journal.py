"""The journal: what a server logged at its start.

SGLang logs `server_args=ServerArgs(field=value, ...)` once per start
(entrypoints/engine.py:784, after ServerArgs.__post_init__ resolved it), API keys
included. The gatherer reads the newest such line of the running process (its unit and
pid, this boot: one line, however large the journal) and the runner redacts it on the host
before it leaves; the parser here reads the dataclass repr with the ast module (each value
a Python literal, or left out), never with eval.
"""

from __future__ import annotations

import ast
import math
from typing import Any

from ..redact import MARK, Redactor
from .base import RawRecord, Command, Fact, Unavailable, failure

PREFIX = "server_args=ServerArgs("
GREP = r"server_args=ServerArgs\("       # journalctl --grep: PCRE2, case-sensitive (capitals)
MAX_TEXT = 1 << 20                       # journald splits lines at LineMax (48K) anyway
MAX_FIELDS = 4096
_OPEN, _CLOSE = "([{<", ")]}>"
_FLOATS = ("inf", "-inf", "nan")        # a float repr JSON cannot hold: kept as the string


class ServerArgsLog(Fact):
    """`journalctl -b -u UNIT _PID=PID --grep 'server_args=ServerArgs\\(' -n 1 -o cat` ->
    {"args": {field: value}, "unparsed": [fields whose value is no literal], "truncated":
    bool} of the ServerArgs the process logged when it started (secrets redacted)."""

    def command(self, unit: str = "", pid: int = 0, **kwargs: Any) -> Command:
        return Command("run", ("journalctl", "--no-pager", "--quiet", "--boot", "--output=cat",
                               "--lines=1", f"--grep={GREP}", f"--unit={unit}",
                               f"_PID={int(pid)}"))

    def process(self, raw: RawRecord) -> dict[str, Any]:
        out = raw.get("stdout") or ""
        if raw.get("exit_code") == 1 and not out.strip():
            err = (raw.get("stderr") or "").strip().splitlines()
            if err:            # "No journal files were opened due to insufficient permissions."
                raise Unavailable(f"`{raw.get('command')}`: {err[-1]} (audit as root or as a "
                                  "member of systemd-journal)")
            raise Unavailable(f"`{raw.get('command')}` found no server_args= line in this "
                              "boot's journal (rotated away, or the process has not logged "
                              "it yet)")
        why = failure(raw)
        if why:
            raise Unavailable(why)
        lines = [line for line in out.splitlines() if PREFIX in line]
        if not lines:
            raise Unavailable(f"`{raw.get('command')}` printed no server_args= line")
        return parse_server_args(lines[-1])


def parse_server_args(line: str) -> dict[str, Any]:
    """`... server_args=ServerArgs(a=1, b='x', c=Conf(...))` -> {"args": {"a": 1, "b": "x"},
    "unparsed": ["c"], "truncated": False}. Tolerant: a value that is not a literal (a nested
    dataclass, an enum's `<X.Y: 1>`) is named in `unparsed`; a line cut short (journald's
    LineMax) keeps the fields before the cut. Secret-named values come back redacted."""
    at = line.find(PREFIX)
    if at < 0:
        raise Unavailable("no server_args=ServerArgs( in the line")
    text = line[at + len(PREFIX):][:MAX_TEXT]
    args: dict[str, Any] = {}
    unparsed: list[str] = []
    items, closed = _items(text)
    for item in items[:MAX_FIELDS]:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name.isidentifier():
            continue
        parsed, ok = _literal(value)
        if ok:
            args[name] = parsed
        else:
            unparsed.append(name)
    if not args and not unparsed:
        raise Unavailable("the server_args= line holds no field")
    return {"args": Redactor().value(args), "unparsed": unparsed, "truncated": not closed}


def _items(text: str) -> tuple[list[str], bool]:
    """Split the call's arguments at top-level commas; (items, whether its `)` was seen)."""
    items, start, depth, quote, i = [], 0, 0, "", 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE and depth:
            depth -= 1
        elif ch == ")":                      # the call's own closing parenthesis
            items.append(text[start:i])
            return [t for t in items if t.strip()], True
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        i += 1
    return [t for t in items if t.strip()], False      # cut short: the last item is partial


def _literal(value: str) -> tuple[Any, bool]:
    if value.startswith(MARK):             # a secret the host redacted without its quotes
        return value, True
    if value in _FLOATS:
        return value, True
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None, False
    return (parsed, True) if _plain(parsed) else (None, False)


def _plain(value: Any) -> bool:
    """A literal JSON can carry (no set, bytes, complex or infinite number)."""
    if value is None or isinstance(value, (str, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False
