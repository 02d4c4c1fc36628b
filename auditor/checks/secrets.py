"""Credentials are not exposed: not on a command line (every local user reads it in
`ps`), not in a unit file (world-readable, and `systemctl show` prints its Environment= and
ExecStart= to anyone), not in a world-readable env file or `--config` file, not served by
/server_info.

The audit never shows a secret's value (it is redacted on the host, with a tag that only
says whether two places hold the same one); this check says where secrets live.
"""

from __future__ import annotations

import re

from ..model import Evidence, Finding, Server, Unit
from patchset.agent.lib.redact import MARK, is_secret_name
from .base import AuditContext, Reporter

ID = "secrets"
SEVERITY = "medium"
TAGS = ("security",)
SUB_TAGS = ("cmdline", "server-info", "env-file", "config-file", "unit-file")
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    for host in ctx.hosts:
        for server in host.facts.servers:
            flags = [a.partition("=")[0] for a in server.argv
                     if a.startswith("--") and is_secret_name(a.partition("=")[0])]
            ev = [Evidence.of("command line", server.main.cmdline)] if server.main.cmdline \
                else []
            if flags:
                out.append(finding(host.host, f"{server.id} command line",
                                   "no credentials on the command line", ", ".join(flags),
                                   "warn", "readable by every local user in /proc/PID/cmdline"
                                   " and ps; set api_key in hosts.yaml (patchset deploy writes "
                                   "it to a root-only --config file) instead", ev,
                                   sub="cmdline"))
            else:
                out.append(finding(host.host, f"{server.id} command line",
                                   "no credentials on the command line", "none", "pass", "",
                                   ev, sub="cmdline"))
            info = server.server_info
            if info.known:
                leaked = sorted(k for k, v in info.value.items()
                                if is_secret_name(k) and isinstance(v, str) and v)
                if leaked:
                    out.append(finding(host.host, f"{server.id} /server_info",
                                       "no credentials served", ", ".join(leaked), "warn",
                                       "any client that reaches the port reads them "
                                       "(sglang#30166): firewall the port or use a fixed "
                                       "version", [Evidence.of("server_info", info, "redacted")],
                                       sub="server-info"))
            if server.config_file is not None:
                out += _config_file(host.host, server)
        for name, unit in host.facts.units.items():
            out += _unit_file(host.host, name, unit)
            for path, fact in unit.env_files.items():
                if not fact.known:
                    continue
                names = sorted(n for n in fact.value["values"] if is_secret_name(n))
                mode = (fact.value.get("stat") or {}).get("mode")
                if names and _world_readable(mode):
                    out.append(finding(host.host, path, "mode without o+r",
                                       f"mode {mode} holding {', '.join(names)}", "fail",
                                       "world-readable env file with credentials: chmod 0600",
                                       [Evidence.of("env file", fact, f"mode {mode}")],
                                       sub="env-file", severity="high"))
                elif names and mode:
                    out.append(finding(host.host, path, "mode without o+r",
                                       f"mode {mode} holding {', '.join(names)}", "pass", "",
                                       [Evidence.of("env file", fact, f"mode {mode}")],
                                       sub="env-file"))
    return out


def _world_readable(mode: str | None) -> bool:
    return bool(mode and int(mode, 8) & 0o004)


def _config_file(host: str, server: Server) -> list[Finding]:
    """The server's `--config FILE` (SGLang reads credentials from it): root only."""
    fact = server.config_file
    assert fact is not None                 # the caller checks it is there
    flag = [a for a in server.argv[server.argv.index("--config") + 1:][:1]] \
        if "--config" in server.argv else []
    subject = f"{server.id} --config {flag[0] if flag else ''}".rstrip()
    if not fact.known:
        return [finding(host, subject, "mode without o+r", "unknown", "unknown",
                        f"the --config file could not be read: {fact.reason}", [],
                        sub="config-file")]
    names = [k for k in fact.value.get("keys", []) if is_secret_name(k)]
    stat = fact.value.get("stat") or {}
    mode = stat.get("mode")
    if not names or not mode:
        return []
    ev = [Evidence.of("config file", fact, f"mode {mode}, uid {stat.get('uid')}, keys "
                      f"{', '.join(fact.value.get('keys', []))}")]
    if _world_readable(mode):
        return [finding(host, subject, "mode without o+r", f"mode {mode} holding "
                        f"{', '.join(names)}", "fail", "world-readable --config file with "
                        "credentials: chmod 0600 (patchset deploy writes it 0600 root)", ev,
                        sub="config-file", severity="high")]
    return [finding(host, subject, "mode without o+r", f"mode {mode} holding "
                    f"{', '.join(names)}", "pass", "", ev, sub="config-file")]


_HELD = re.compile(r"(--?[A-Za-z0-9][A-Za-z0-9_-]*|[A-Za-z_][A-Za-z0-9_]*)(?:=|[ \t]+)\"?"
                   + re.escape(MARK))


def _unit_file(host: str, name: str, unit: Unit) -> list[Finding]:
    """Credentials in the unit itself (ExecStart=, Environment=): the gathered text is
    redacted, so a redaction mark there means a credential was."""
    held: set[str] = set()
    if unit.file is not None and unit.file.known:
        for values in unit.file.value["sections"].values():
            for key, lines in values.items():
                for line in lines:
                    if MARK in line:
                        held |= {n for n in _HELD.findall(line) if is_secret_name(n)} or {key}
    if unit.show.known:
        held |= {n for n in unit.show.value.get("environment", {}) if is_secret_name(n)}
    if not held:
        return []
    mode = ((unit.file.value.get("stat") or {}).get("mode")
            if unit.file is not None and unit.file.known else None)
    ev = [Evidence.of("unit file", unit.file, f"mode {mode}")] if unit.file else []
    readable = _world_readable(mode)
    return [finding(host, f"{name} unit file", "no credentials in the unit",
                    f"{'mode ' + mode + ' ' if mode else ''}holding {', '.join(sorted(held))}",
                    "fail" if readable else "warn",
                    ("world-readable unit file with credentials" if readable else
                     "a unit with credentials") + ": `systemctl show` prints Environment= and "
                    "ExecStart= to every local user; set api_key in hosts.yaml (a root-only "
                    "--config file) or the value in the 0600 env file", ev,
                    sub="unit-file", severity="high" if readable else None)]
