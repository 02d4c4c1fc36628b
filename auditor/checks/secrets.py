"""Credentials are not exposed: not on a command line (every local user reads it in
`ps`), not in a world-readable env file, not served by /server_info.

The audit never shows a secret's value (it is redacted on the host, with a tag that only
says whether two places hold the same one); this check says where secrets live.
"""

from __future__ import annotations

from ..model import Evidence, Finding
from ..redact import is_secret_name
from .base import AuditContext, Reporter

ID = "secrets"
SEVERITY = "medium"
TAGS = ("security",)
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
                                   " and ps; pass it in the env file instead", ev,
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
        for unit in host.facts.units.values():
            for path, fact in unit.env_files.items():
                if not fact.known:
                    continue
                names = sorted(n for n in fact.value["values"] if is_secret_name(n))
                mode = (fact.value.get("stat") or {}).get("mode")
                if names and mode and int(mode, 8) & 0o004:
                    out.append(finding(host.host, path, "mode without o+r",
                                       f"mode {mode} holding {', '.join(names)}", "fail",
                                       "world-readable env file with credentials: chmod 0640",
                                       [Evidence.of("env file", fact, f"mode {mode}")],
                                       sub="env-file", severity="high"))
    return out
