"""What a fact is: a command to run on the host plus a parser of its output (pyinfra's shape).

Standard library only: the gatherer on the host uses the same classes to run the commands
(and to parse what it needs for its next step, e.g. a unit's MainPID), the controller uses
them to parse the raw records that come back. A fact never opens a connection itself.

A raw record is what one command produced, with its provenance:
    {"command": "nvidia-smi --query-gpu=...", "exit_code": 0, "duration_ms": 41.2,
     "stdout": "...", "stderr": "", "error": null, ...kind-specific extras}
`collect(raw)` turns it into a FactValue: the parsed value, or `unknown` with the reason.
"""

from __future__ import annotations

import errno
import shlex
from dataclasses import dataclass
from typing import Any, ClassVar, Dict

FACTS: dict[str, type[Fact]] = {}

# A raw record, as the module's docstring says: JSON-shaped, with extras by kind.
RawRecord = Dict[str, Any]


@dataclass(frozen=True)
class Command:
    """One thing the gatherer does on the host. `kind` is the primitive that runs it:
    run (a process, argv, no shell), read (a file, up to `limit` bytes), http (GET, local
    only), st-header (a safetensors header: 8 + N bytes), engine (patchset's engine op)."""

    kind: str
    argv: tuple[str, ...] = ()
    target: str = ""
    limit: int = 0
    cwd: str = ""
    env: tuple[tuple[str, str], ...] = ()

    def render(self) -> str:
        """How the command is shown as provenance (secrets are redacted by the caller)."""
        if self.kind == "run":
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
            where = f"(cd {shlex.quote(self.cwd)} && " if self.cwd else ""
            line = (f"env {env} " if env else "") + shlex.join(self.argv)
            return f"{where}{line})" if where else line
        if self.kind == "read":
            return f"read {self.target}"
        if self.kind == "http":
            return f"GET {self.target}"
        if self.kind == "st-header":
            return f"safetensors-header {self.target}"
        if self.kind == "trace-dir":
            return f"read {self.target}/*.json"
        if self.kind == "engine":
            return f"patchset-engine {' '.join(self.argv)} {self.target}".strip()
        return f"{self.kind} {self.target}".strip()


@dataclass(frozen=True)
class Provenance:
    command: str
    exit_code: int | None
    duration_ms: float


@dataclass(frozen=True)
class FactValue:
    """A parsed fact, or why it could not be had (`known` False, `reason` says why)."""

    value: Any = None
    known: bool = True
    reason: str = ""
    provenance: Provenance | None = None
    source: str = ""          # human label of where it came from ("scheduler TP0 environ")

    @classmethod
    def unknown(cls, reason: str, provenance: Provenance | None = None,
                source: str = "") -> FactValue:
        return cls(None, False, reason, provenance, source)

    def with_source(self, source: str) -> FactValue:
        return FactValue(self.value, self.known, self.reason, self.provenance, source)


class Unavailable(Exception):
    """Raised by a parser when the output does not hold the fact (the reason is shown)."""


class Fact:
    """Subclasses set `command(**kwargs)` and `process(raw) -> value`."""

    name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        area = cls.__module__.rsplit(".", 1)[-1]
        cls.name = f"{area}.{cls.__name__}"
        if not cls.__name__.startswith("_"):      # _Bases share code, are not facts
            FACTS[cls.name] = cls

    def command(self, **kwargs: Any) -> Command:
        raise NotImplementedError

    def process(self, raw: RawRecord) -> Any:
        raise NotImplementedError

    def collect(self, raw: RawRecord | None) -> FactValue:
        """Parse a raw record; every failure becomes `unknown` with its reason, never a crash."""
        if raw is None:
            return FactValue.unknown("not gathered")
        prov = Provenance(raw.get("command", "?"), raw.get("exit_code"),
                          float(raw.get("duration_ms") or 0.0))
        try:
            return FactValue(self.process(raw), provenance=prov)
        except Unavailable as exc:
            return FactValue.unknown(str(exc), prov)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return FactValue.unknown(f"unparsable output of `{prov.command}`: "
                                     f"{type(exc).__name__}: {exc}", prov)


def failure(raw: RawRecord) -> str | None:
    """Why a raw record holds no output, in words (None when it ran fine)."""
    if raw.get("error"):
        return str(raw["error"])
    code = raw.get("exit_code")
    if code in (None, 0):
        return None
    if raw.get("kind") in ("read", "st-header", "trace-dir"):
        return f"{errno.errorcode.get(code, code)}: {_strerror(code)} ({raw.get('command')})"
    tail = (raw.get("stderr") or raw.get("stdout") or "").strip().splitlines()
    if code == 127:
        return f"`{raw.get('command')}`: command not found"
    return f"`{raw.get('command')}` exited {code}" + (f": {tail[-1]}" if tail else "")


def ok_output(raw: RawRecord) -> str:
    """stdout of a record that ran fine; Unavailable with the reason otherwise."""
    why = failure(raw)
    if why:
        raise Unavailable(why)
    return raw.get("stdout") or ""


def _strerror(code: int) -> str:
    import os
    try:
        return os.strerror(code)
    except (ValueError, OverflowError):
        return "error"
