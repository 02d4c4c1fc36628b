"""``yaml.safe_load`` for the YAML a ``--config`` file holds, where PyYAML is not installed.

The stand-in venv is standard library only, but SGLang's ``ConfigArgumentMerger``
(``srt/server_args_config_parser.py``) reads ``--config`` with ``yaml.safe_load``.  derive.py
runs that class from the tree with ``yaml`` bound to PyYAML when the venv has it, else to
this module.  It reads what PyYAML reads the same way, and refuses the rest loudly (a
stand-in that guessed would hide a config the real server reads differently):

* a top-level block mapping, one ``key: value`` per line, ``#`` comments, blank lines,
  an optional ``---`` first;
* values: double-quoted scalars (escapes ``\\\\ \\" \\/ \\n \\t \\r \\b \\f \\0 \\e \\xXX \\uXXXX
  \\UXXXXXXXX``), single-quoted ones (``''`` is a quote), plain scalars resolved as YAML 1.1
  core does for the common cases (``~``/``null``/empty -> None, true/false/yes/no/on/off ->
  bool, decimal ints and floats), and block sequences of such scalars (``- item`` lines);
* anything else (flow collections, anchors, tags, multi-line scalars, nested mappings,
  octal/hex/sexagesimal numbers, ...) raises :class:`YAMLError`.
"""

from __future__ import annotations

import re
from typing import Any, TextIO

__all__ = ["YAMLError", "safe_load"]


class YAMLError(ValueError):
    """The text is not in the subset this module reads."""


_KEY = re.compile(r"(?P<key>[A-Za-z0-9_][A-Za-z0-9_.-]*)[ \t]*:(?:[ \t]+(?P<value>.*))?")
_ITEM = re.compile(r"[ \t]+-(?:[ \t]+(?P<value>.*))?|-(?:[ \t]+(?P<value2>.*))?")
_BOOL = {v: True for v in ("true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON")}
_BOOL.update({v: False for v in ("false", "False", "FALSE", "no", "No", "NO", "off", "Off",
                                 "OFF")})
_NULL = ("", "~", "null", "Null", "NULL")
_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[-+]?(?:[0-9][0-9]*)?\.[0-9]+(?:[eE][-+][0-9]+)?")
_NUMERICISH = re.compile(r"[-+]?(?:\.?[0-9]|\.(?:inf|Inf|INF|nan|NaN|NAN)$)")
_ESCAPES = {"\\": "\\", '"': '"', "/": "/", "n": "\n", "t": "\t", "r": "\r", "b": "\b",
            "f": "\f", "0": "\0", "e": "\x1b", " ": " "}
_HEX = {"x": 2, "u": 4, "U": 8}
_INDICATORS = "-?:,[]{}#&*!|>'\"%@`"


def safe_load(stream: str | bytes | TextIO) -> Any:
    """The subset above; None for an empty document (as PyYAML)."""
    text = stream.read() if hasattr(stream, "read") else stream
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    text = text.lstrip("\ufeff")
    out: dict[str, Any] = {}
    current: str | None = None          # the key whose block sequence is open
    seen_content = False
    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw, number).rstrip()
        if not line.strip():
            continue
        if not seen_content and line.strip() == "---":
            seen_content = True
            continue
        seen_content = True
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YAMLError(f"line {number}: a tab in the indentation")
        item = _ITEM.fullmatch(line)
        if item is not None and current is not None:
            value = item["value"] if item["value"] is not None else item["value2"]
            if out[current] is None:
                out[current] = []
            out[current].append(_scalar(value or "", number))
            continue
        if line[0] in " \t":
            raise YAMLError(f"line {number}: nested structure (only a flat mapping is read)")
        m = _KEY.fullmatch(line)
        if m is None:
            raise YAMLError(f"line {number}: not a `key: value` line")
        key, value = m["key"], m["value"]
        if key in out:
            raise YAMLError(f"line {number}: duplicate key {key!r}")
        if value is None or not value.strip():
            out[key], current = None, key
            continue
        out[key], current = _scalar(value, number), None
    return out if seen_content else None


def _strip_comment(line: str, number: int) -> str:
    """The line without a ` #...` comment (outside quotes)."""
    quote = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote == '"':
            if c == "\\":
                i += 2
                continue
            if c == '"':
                quote = None
        elif quote == "'":
            if c == "'":
                if line[i + 1: i + 2] == "'":
                    i += 2
                    continue
                quote = None
        elif c in "\"'" and (i == 0 or line[i - 1] in " \t:-"):
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
        i += 1
    if quote is not None:
        raise YAMLError(f"line {number}: unterminated {quote}-quoted scalar (multi-line "
                        "scalars are not read)")
    return line


def _scalar(value: str, number: int) -> Any:
    value = value.strip()
    if value.startswith('"'):
        return _double(value, number)
    if value.startswith("'"):
        if len(value) < 2 or not value.endswith("'"):
            raise YAMLError(f"line {number}: unterminated single-quoted scalar")
        inner = value[1:-1]
        if re.search(r"(?<!')'(?!')", inner.replace("''", "")):
            raise YAMLError(f"line {number}: text after a single-quoted scalar")
        return inner.replace("''", "'")
    if value in _NULL:
        return None
    if value in _BOOL:
        return _BOOL[value]
    if _INT.fullmatch(value):
        return int(value)
    if _FLOAT.fullmatch(value):
        return float(value)
    if _NUMERICISH.match(value) or value[0] in _INDICATORS or ": " in value or \
            value.endswith(":") or " #" in value:
        raise YAMLError(f"line {number}: plain scalar {value!r} is not in the subset read "
                        "here (quote it)")
    return value


def _double(value: str, number: int) -> str:
    out: list[str] = []
    i = 1
    while i < len(value):
        c = value[i]
        if c == '"':
            if value[i + 1:].strip():
                raise YAMLError(f"line {number}: text after a double-quoted scalar")
            return "".join(out)
        if c == "\\":
            nxt = value[i + 1: i + 2]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            if nxt in _HEX:
                digits = value[i + 2: i + 2 + _HEX[nxt]]
                if len(digits) != _HEX[nxt] or not re.fullmatch(r"[0-9A-Fa-f]+", digits):
                    raise YAMLError(f"line {number}: bad \\{nxt} escape")
                out.append(chr(int(digits, 16)))
                i += 2 + _HEX[nxt]
                continue
            raise YAMLError(f"line {number}: escape \\{nxt} is not read here")
        out.append(c)
        i += 1
    raise YAMLError(f"line {number}: unterminated double-quoted scalar")
