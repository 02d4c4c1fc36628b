"""systemd: which SGLang units exist, how systemd runs them, and the files they name."""

from __future__ import annotations

import re
import shlex
from typing import Any

from .base import Command, Fact, Unavailable, ok_output

SHOW_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "MainPID",
                   "NRestarts", "ExecMainStartTimestampMonotonic", "FragmentPath",
                   "DropInPaths", "NeedDaemonReload", "Environment", "EnvironmentFiles",
                   "ExecStart", "LimitNOFILE", "TimeoutStartUSec", "ControlGroup", "User")
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

    def process(self, raw: dict) -> list[str]:
        if raw.get("exit_code") == 1 and not (raw.get("stdout") or "").strip():
            return []               # systemctl exits 1 when nothing matches
        return _names(ok_output(raw))


class LoadedUnits(Fact):
    """Units systemd has loaded matching the pattern, active or not (transient ones too)."""

    def command(self, pattern: str = UNIT_PATTERN, **kwargs: Any) -> Command:
        return Command("run", ("systemctl", "list-units", "--all", "--plain", "--no-legend",
                               "--no-pager", "--type=service", pattern))

    def process(self, raw: dict) -> list[str]:
        return _names(ok_output(raw))


class UnitShow(Fact):
    """`systemctl show UNIT -p ...` -> properties, plus parsed `environment` (Environment=),
    `environment_files` [(path, optional)] and `exec_argv` (ExecStart's argv)."""

    def command(self, unit: str = "", **kwargs: Any) -> Command:
        return Command("run", ("systemctl", "show", "--no-pager",
                               "-p", ",".join(SHOW_PROPERTIES), "--", unit))

    def process(self, raw: dict) -> dict:
        props: dict[str, Any] = {}
        files: list[tuple[str, bool]] = []
        for line in ok_output(raw).splitlines():
            key, sep, value = line.partition("=")
            if not sep:
                continue
            if key == "EnvironmentFiles":
                files += _environment_files(value)
            else:
                props[key] = value
        if props.get("LoadState") == "not-found":
            raise Unavailable(f"unit {props.get('Id', '?')} not found")
        props["environment"] = parse_assignments(props.get("Environment", ""))
        props["environment_files"] = files
        props["exec_argv"] = _exec_argv(props.get("ExecStart", ""))
        props["MainPID"] = int(props.get("MainPID") or 0)
        return props


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

    def process(self, raw: dict) -> dict:
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
    """An EnvironmentFile= as systemd reads it -> {"values": {NAME: value}, "stat": ...}.

    KEY=VALUE lines; `#`/`;` comments; single or double quotes removed (backslash escapes
    inside double quotes); a trailing backslash continues the line.
    """

    def command(self, path: str = "", **kwargs: Any) -> Command:
        return Command("read", target=path, limit=1 << 20)

    def process(self, raw: dict) -> dict:
        text = ok_output(raw).replace("\\\n", "")
        values: dict[str, str] = {}
        for line in text.splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            name, sep, value = line.partition("=")
            if not sep:
                continue
            values[name.strip()] = _unquote(value.strip())
        return {"values": values, "stat": raw.get("stat")}


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        inner = value[1:-1]
        return re.sub(r"\\(.)", r"\1", inner) if value[0] == '"' else inner
    return value
