"""Secret redaction, applied on the host before anything leaves it and again in every report.

Standard library only (shipped to hosts). Two layers, because either alone leaks:

* by name: an environment variable, command-line flag, JSON key or `NAME=value` pair whose
  name (split on `_`/`-`, trailing numbers dropped) ends in KEY(S), TOKEN, SECRET(S),
  PASSWORD, PASSWD or CREDENTIAL(S), or a word ending so (APIKEY, HFTOKEN), or has a
  SECRET/PASSWORD/PASSWD part anywhere -> its string value is replaced. So `api_key`,
  `HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`, `--ssl-keyfile-password` are secrets, while SGLang's
  own `tokenizer_path`, `max_total_tokens`, `speculative_token_map`,
  `bucket_time_to_first_token` and `--ssl-keyfile` (a path) stay visible: matching
  KEY/TOKEN anywhere in a name would hide facts the audit needs. Numbers and lists of
  numbers are never credentials;
* by shape: values that look like credentials wherever they appear (`hf_...`, `sk-...`,
  `Bearer ...`, `user:password@` in URLs).

A third layer where the values are known (deploy knows the keys it renders and the ones
the installed files hold): `Redactor(known=...)` masks each such value, and its escaped
spellings (JSON, repr, systemd env and unit quoting), wherever it appears, whatever the
syntax around it (a journal line, a traceback, a diff).

On the host a `Redactor` replaces a value with `<redacted:TAG>`, TAG an HMAC of the value
under a key made fresh for that one gathering and never sent: two processes holding the
same secret show the same TAG (so "the env file and the process disagree" can still be
checked), but nothing about the value can be learned from it, across runs included.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from typing import Any, Iterable

SECRET_LAST = ("KEY", "KEYS", "TOKEN", "SECRET", "SECRETS", "PASSWORD",
               "PASSWD", "CREDENTIAL", "CREDENTIALS")
SECRET_ANYWHERE = ("SECRET", "PASSWORD", "PASSWD")
SECRET_SUFFIXES = ("KEY", "TOKEN", "SECRET", "PASSWORD")
MARK = "<redacted"
KNOWN_MIN = 4          # a known value shorter than this is masked by name and shape only
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# A value: double- or single-quoted (backslash escapes inside), else a plain run; an
# unterminated quote runs to the next blank. A secret's plain value is then extended to
# the next blank (`KEY=a,b`, `--api-key a"b`), a non-secret's is scanned again (it may
# hold `NAME=value` itself).
_DQ, _SQ = r"\"(?:[^\"\\\n]|\\.)*\"", r"'(?:[^'\\\n]|\\.)*'"
# NAME=value, NAME="value", NAME='value' (env files, Environment=, environ, journal lines)
_ASSIGN = re.compile(r"(?P<name>" + _NAME + r")(?P<sep>=)(?P<value>" + _DQ + "|" + _SQ +
                     r"|[^\s\0\"',;]+|[\"'][^\s\0,;]*)")
# --flag value / --flag=value, with space or NUL (a /proc cmdline) between
_FLAG = re.compile(r"(?P<flag>--[A-Za-z0-9][A-Za-z0-9_-]*)(?P<sep>=|[ \t]+|\0)"
                   r"(?P<value>" + _DQ + "|" + _SQ + r"|[^\s\0\"']+|[\"'][^\s\0]*)")
# name: value (YAML such as a --config file, a repr'd dict, `X-Api-Key: v` headers). The
# name is quoted or has a `_`/`-` in it: prose ("credentials: chmod ...") is left alone.
_COLON = re.compile(r"(?<![A-Za-z0-9_.])(?:(?P<q>[\"'])(?P<qname>[A-Za-z_][A-Za-z0-9_.-]*)(?P=q)"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9.]*[_-][A-Za-z0-9_.-]*))"
                    r"(?P<sep>[ \t]*:[ \t]*)(?P<value>" + _DQ + "|" + _SQ +
                    r"|[^\s\0\"']+|[\"'][^\n\0]*)")
_LITERAL = re.compile(r"(?i)(?:null|none|true|false|~|[-+]?[0-9]+(?:\.[0-9]+)?)[,}\])]*")
_NULL = re.compile(r"(?:None|null)[,;}\])]*")
_TO_BLANK = re.compile(r"[^\s\0]*")
_TO_EOL = re.compile(r"[^\n\0]*")
# "key": "value" in JSON text
_JSON = re.compile(r"\"(?P<name>[^\"\\]{1,80})\"(?P<sep>\s*:\s*)\"(?P<value>(?:[^\"\\]|\\.)*)\"")
_SHAPES = (
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"(?i)(?<=bearer )[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"),     # user:password@host
)


def is_secret_name(name: str) -> bool:
    """Whether a variable, flag or field of this name holds a credential."""
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", name.upper()) if p]
    while parts and parts[-1].isdigit():
        parts.pop()
    if not parts:
        return False
    last = parts[-1]
    return (last in SECRET_LAST or (len(last) > 3 and last.endswith(SECRET_SUFFIXES))
            or any(p in SECRET_ANYWHERE for p in parts))


def is_redacted(value: str) -> bool:
    return value.startswith(MARK) or value.strip("\"'").startswith(MARK)


def spellings(value: str) -> set[str]:
    """A value as it may be written: raw, JSON-escaped, repr'd, in a systemd env file
    (backslash-escaped) or a unit file (`%%`, `$$`)."""
    env = re.sub(r'(["\\`$])', r"\\\1", value)
    out = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
           repr(value)[1:-1], env, value.replace("%", "%%").replace("$", "$$"),
           env.replace("%", "%%").replace("$", "$$")}
    return {v for v in out if v}


class Redactor:
    """Replaces secret values; `tagged` (host side) keeps equal secrets comparable;
    `known` values are masked wherever they appear (see the module docstring)."""

    def __init__(self, tagged: bool = False, known: Iterable[str] = ()) -> None:
        self._key = secrets.token_bytes(32) if tagged else None
        forms = {f for v in known if isinstance(v, str) and len(v) >= KNOWN_MIN
                 for f in spellings(v) if len(f) >= KNOWN_MIN}
        self._known = sorted(forms, key=lambda f: (-len(f), f))

    def mask(self, value: str) -> str:
        if is_redacted(value):
            return value
        if self._key is None or not value:
            return f"{MARK}>"
        tag = hmac.new(self._key, value.encode("utf-8", "replace"), hashlib.sha256)
        return f"{MARK}:{tag.hexdigest()[:8]}>"

    def text(self, text: str) -> str:
        """Redact secrets inside free text (env files, command lines, JSON, logs)."""
        if not text:
            return text
        for form in self._known:
            if form in text:
                text = text.replace(form, self.mask(form))

        def json_pair(m: re.Match[str]) -> str:
            if not is_secret_name(m["name"]) or is_redacted(m["value"]) or not m["value"]:
                return m[0]
            return f"\"{m['name']}\"{m['sep']}\"{self.mask(m['value'])}\""

        text = _JSON.sub(json_pair, text)
        text = self._scan(_FLAG, text, "flag", _TO_BLANK)
        text = self._scan(_ASSIGN, text, "name", _TO_BLANK)
        text = self._scan(_COLON, text, "name", _TO_EOL)
        for shape in _SHAPES:
            text = shape.sub(lambda m: m[0] if is_redacted(m[0]) else self.mask(m[0]), text)
        return text

    def _scan(self, pattern: re.Pattern[str], text: str, group: str, tail: re.Pattern[str]) -> str:
        """`NAME<sep>value` pairs: a secret's value masked (a plain one up to `tail`),
        anything else kept and scanned again from its value on."""
        out, pos = [], 0
        while True:
            m = pattern.search(text, pos)
            if m is None:
                out.append(text[pos:])
                return "".join(out)
            name = m[group] if m[group] is not None else m["qname"]
            value = m["value"]
            if not is_secret_name(name) or is_redacted(value) or _NULL.fullmatch(value) or (
                    pattern is _COLON and _LITERAL.fullmatch(value)):
                out.append(text[pos:m.end("sep")])
                pos = m.end("sep")
                continue
            quote = value[0] if value[0] in "\"'" else ""
            if quote and len(value) > 1 and value.endswith(quote):      # closed quotes
                end, shown = m.end(), quote + self.mask(value[1:-1]) + quote
            else:                                  # plain or unterminated: up to `tail`
                rest = tail.match(text, m.start("value"))
                assert rest is not None            # `tail` matches the empty string too
                end = rest.end()
                shown = self.mask(text[m.start("value"):end].lstrip("\"'"))
            out.append(text[pos:m.start("value")] + shown)
            pos = end

    def argv(self, argv: list[str]) -> list[str]:
        """Redact a command line given as a list (`--api-key VALUE`, `--api-key=VALUE`)."""
        out: list[str] = []
        hide_next = False
        for arg in argv:
            if hide_next:
                out.append(self.mask(arg))
                hide_next = False
                continue
            if arg.startswith("--") and "=" in arg:
                flag, _, value = arg.partition("=")
                out.append(f"{flag}={self.mask(value)}" if is_secret_name(flag) and value
                           else self.text(arg))
                continue
            if arg.startswith("--") and is_secret_name(arg):
                hide_next = True
            out.append(self.text(arg))
        return out

    def value(self, value: Any, name: str = "") -> Any:
        """Redact a JSON-like value: secret-named keys by name, every string by shape."""
        if isinstance(value, dict):
            return {k: self.value(v, str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v, name) for v in value]
        if isinstance(value, str):
            if name and is_secret_name(name) and value:
                return self.mask(value)
            return self.text(value)
        return value                      # numbers, booleans, null: never credentials


_PLAIN = Redactor()


def redact(value: Any, known: Iterable[str] = ()) -> Any:
    """Controller-side redaction of anything about to be shown (idempotent); `known`:
    secret values to mask wherever they appear."""
    return (Redactor(known=known) if known else _PLAIN).value(value)


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    return (Redactor(known=known) if known else _PLAIN).text(text)
