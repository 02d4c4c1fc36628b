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

On the host a `Redactor` replaces a value with `<redacted:TAG>`, TAG an HMAC of the value
under a key made fresh for that one gathering and never sent: two processes holding the
same secret show the same TAG (so "the env file and the process disagree" can still be
checked), but nothing about the value can be learned from it, across runs included.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Any

SECRET_LAST = ("KEY", "KEYS", "TOKEN", "SECRET", "SECRETS", "PASSWORD",
               "PASSWD", "CREDENTIAL", "CREDENTIALS")
SECRET_ANYWHERE = ("SECRET", "PASSWORD", "PASSWD")
SECRET_SUFFIXES = ("KEY", "TOKEN", "SECRET", "PASSWORD")
MARK = "<redacted"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# NAME=value, NAME="value", NAME='value' (env files, Environment=, environ, journal lines)
_ASSIGN = re.compile(r"(?P<name>" + _NAME + r")=(?P<value>\"[^\"]*\"|'[^']*'|[^\s\0\"',;]+)")
# --flag value / --flag=value, with space or NUL (a /proc cmdline) between
_FLAG = re.compile(r"(?P<flag>--[A-Za-z0-9][A-Za-z0-9_-]*)(?P<sep>=|[ \t]+|\0)"
                   r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s\0\"']+)")
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


class Redactor:
    """Replaces secret values; `tagged` (host side) keeps equal secrets comparable."""

    def __init__(self, tagged: bool = False) -> None:
        self._key = secrets.token_bytes(32) if tagged else None

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

        def assign(m: re.Match) -> str:
            if not is_secret_name(m["name"]) or is_redacted(m["value"]):
                return m[0]
            return f"{m['name']}={self.mask(m['value'].strip(chr(34) + chr(39)))}"

        def flag(m: re.Match) -> str:
            if not is_secret_name(m["flag"]) or is_redacted(m["value"]):
                return m[0]
            return f"{m['flag']}{m['sep']}{self.mask(m['value'].strip(chr(34) + chr(39)))}"

        def json_pair(m: re.Match) -> str:
            if not is_secret_name(m["name"]) or is_redacted(m["value"]) or not m["value"]:
                return m[0]
            return f"\"{m['name']}\"{m['sep']}\"{self.mask(m['value'])}\""

        text = _JSON.sub(json_pair, text)
        text = _FLAG.sub(flag, text)
        text = _ASSIGN.sub(assign, text)
        for shape in _SHAPES:
            text = shape.sub(lambda m: m[0] if is_redacted(m[0]) else self.mask(m[0]), text)
        return text

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


def redact(value: Any) -> Any:
    """Controller-side redaction of anything about to be shown (idempotent)."""
    return _PLAIN.value(value)


def redact_text(text: str) -> str:
    return _PLAIN.text(text)
