"""systemd: which SGLang units exist, how systemd runs them, and the files they name."""

from __future__ import annotations

import re
import shlex
from typing import Any

from .base import RawRecord, Command, Fact, Unavailable, ok_output

SHOW_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "MainPID",
                   "NRestarts", "ExecMainStartTimestampMonotonic", "ExecMainStatus",
                   "ExecMainCode", "UnitFileState", "FragmentPath", "DropInPaths",
                   "NeedDaemonReload", "Environment", "EnvironmentFiles", "ExecStart",
                   "LimitNOFILE", "TimeoutStartUSec", "ControlGroup", "User")
UNIT_PATTERN = "sglang*"


def _names(out: str) -> list[str]:
    names = []
    for line in out.splitlines():
        cells = line.replace("\u25cf", " ").split()
        if cells and cells[0].endswith(".service"):
            names.append(cells[0])
    return sorted(set(names))


class UnitFiles(Fact):
    """Installed unit files matching the pattern (`systemctl list-unit-files`)."""

    def command(self, pattern: str = UNIT_PATTERN, **kwargs: Any) -> Command:
        return Command("run", ("systemctl", "list-unit-files", "--no-legend", "--no-pager",
                               "--type=service", pattern))

    def process(self, raw: RawRecord) -> list[str]:
        if raw.get("exit_code") == 1 and not (raw.get("stdout") or "").strip():
            return []               # systemctl exits 1 when nothing matches
        return _names(ok_output(raw))


class LoadedUnits(Fact):
    """Units systemd has loaded matching the pattern, active or not (transient ones too)."""

    def command(self, pattern: str = UNIT_PATTERN, **kwargs: Any) -> Command:
        return Command("run", ("systemctl", "list-units", "--all", "--plain", "--no-legend",
                               "--no-pager", "--type=service", pattern))

    def process(self, raw: RawRecord) -> list[str]:
        return _names(ok_output(raw))


class UnitShow(Fact):
    """`systemctl show UNIT -p ...` -> properties, plus parsed `environment` (Environment=),
    `environment_files` [(path, optional)] and `exec_argv` (ExecStart's argv)."""

    def command(self, unit: str = "", **kwargs: Any) -> Command:
        return Command("run", ("systemctl", "show", "--no-pager",
                               "-p", ",".join(SHOW_PROPERTIES), "--", unit))

    def process(self, raw: RawRecord) -> dict[str, Any]:
        props = parse_show(ok_output(raw))
        if props.get("LoadState") == "not-found":
            raise Unavailable(f"unit {props.get('Id', '?')} not found")
        return props


def parse_show(text: str) -> dict[str, Any]:
    """The one parser of `systemctl show` output (the deploy runner and the engine's
    `status` use it on the host, the audit on the controller)."""
    props: dict[str, Any] = {}
    files: list[tuple[str, bool]] = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "EnvironmentFiles":
            files += _environment_files(value)
        else:
            props[key] = value
    props["environment"] = parse_assignments(props.get("Environment", ""))
    props["environment_files"] = files
    props["exec_argv"] = _exec_argv(props.get("ExecStart", ""))
    pid = str(props.get("MainPID") or "0")
    props["MainPID"] = int(pid) if pid.isascii() and pid.isdigit() else 0
    return props


def main_started(props: dict[str, Any], now: float, monotonic: float) -> float | None:
    """When the unit's main process started (epoch seconds), from systemd's
    ExecMainStartTimestampMonotonic (CLOCK_MONOTONIC microseconds, Python's clock too)."""
    value = str(props.get("ExecMainStartTimestampMonotonic") or "")
    if not props.get("MainPID") or not (value.isascii() and value.isdigit()) \
            or int(value) == 0:
        return None
    return now - (monotonic - int(value) / 1e6)


def _environment_files(value: str) -> list[tuple[str, bool]]:
    """`/etc/a.env (ignore_errors=no)`; a leading `-` in the unit means optional."""
    out = []
    for m in re.finditer(r"(\S+) \(ignore_errors=(yes|no)\)", value):
        out.append((m.group(1), m.group(2) == "yes"))
    return out


def parse_assignments(value: str) -> dict[str, str]:
    """systemd's Environment= list: `A=1 "B=two words"`."""
    out: dict[str, str] = {}
    try:
        words = shlex.split(value)
    except ValueError:
        words = value.split()
    for word in words:
        name, sep, val = word.partition("=")
        if sep:
            out[name] = val
    return out


def _exec_argv(value: str) -> list[str]:
    m = re.search(r"argv\[\]=(.*?) ;", value)
    if not m:
        return []
    try:
        return shlex.split(m.group(1))
    except ValueError:
        return m.group(1).split()


class UnitFile(Fact):
    """The unit's fragment file -> {section: {key: [values]}} (X-Patchset-* keys included:
    deploy records the role, tree and health URL there for the audit)."""

    def command(self, path: str = "", **kwargs: Any) -> Command:
        return Command("read", target=path, limit=1 << 20)

    def process(self, raw: RawRecord) -> dict[str, Any]:
        sections: dict[str, dict[str, list[str]]] = {}
        current = sections.setdefault("", {})
        text = ok_output(raw).replace("\\\n", " ")
        for line in text.splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                current = sections.setdefault(line[1:-1], {})
                continue
            key, sep, value = line.partition("=")
            if sep:
                current.setdefault(key.strip(), []).append(value.strip())
        return {"sections": sections, "stat": raw.get("stat")}


class EnvironmentFile(Fact):
    """An EnvironmentFile= as systemd reads it -> {"values": {NAME: value}, "stat": ...}."""

    def command(self, path: str = "", **kwargs: Any) -> Command:
        return Command("read", target=path, limit=1 << 20)

    def process(self, raw: RawRecord) -> dict[str, Any]:
        return {"values": parse_env_file(ok_output(raw)), "stat": raw.get("stat")}


def parse_env_file(text: str) -> dict[str, str]:
    """What systemd's EnvironmentFile= parser makes of `text`: KEY=plain (a backslash
    escapes the next character), KEY="double-quoted" (backslash escapes only `"\\`$`,
    any other backslash is kept), KEY='single' (no escapes), `#`/`;` comment lines, a
    trailing backslash continues the line. The one parser: deploy compares the env file
    it renders with the installed one by it, the audit reads the installed one by it."""
    out: dict[str, str] = {}
    for raw in text.replace("\\\n", "").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, rest = line.partition("=")
        if not sep:
            continue
        key, rest = key.strip(), rest.strip()
        if rest.startswith('"') and '"' in rest[1:]:
            out[key] = _double_quoted(rest)
        elif rest.startswith("'") and "'" in rest[1:]:
            out[key] = rest[1:rest.index("'", 1)]
        else:
            out[key] = re.sub(r"\\(.)", r"\1", rest)
    return out


def _double_quoted(rest: str) -> str:
    value, i = [], 1
    while i < len(rest) and rest[i] != '"':
        if rest[i] == "\\" and i + 1 < len(rest):
            nxt = rest[i + 1]
            value.append(nxt if nxt in '"\\`$' else "\\" + nxt)
            i += 2
            continue
        value.append(rest[i])
        i += 1
    return "".join(value)
