"""Each server runs the flags it was started with: for every ServerArgs field of
auditor/data/resolved_args.yaml, what the server was asked for (its command line, else its
--config file, else the field's default) against what it runs.

SGLang rewrites some flags at startup (ServerArgs.__post_init__ and the model hooks): on
sm_120 with DeepSeek-V4 `--moe-runner-backend auto` becomes marlin, and DeepSeek-V4 runs
attention backend dsv4 and page size 256 whatever the command line says. An unset or auto
flag that resolved is a note with both values (and the rewrite of the pinned source that
explains it); an explicit value the server does not run is a warning, since the unit asks
for something it does not get. What runs is read from /server_info, then from the
scheduler's own copy (its internal_states), then from the server_args= line the server
logged at startup (its unit's journal, redacted on the host) before it is called unknown.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..facttable import argv_flag, resolve
from ..model import Evidence, Finding, HostReport, Server
from ..resolved import Flag
from ..running import running
from ..states import holds, same
from .base import AuditContext, Reporter, shown

ID = "resolved-args"
SEVERITY = "medium"
TAGS = ("server", "backends")
SUB_TAGS = ()   # each flag's name (the policy's resolved_args)
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    for host, server in ctx.servers():
        for flag in ctx.policy.resolved_args:
            out.append(_flag(ctx, host, server, flag))
    return out


def requested(server: Server, flag: Flag) -> tuple[Any, str, str]:
    """(value, where it comes from, kind): kind `explicit` (a value on the command line),
    `unset` (not given, or given as a value that means "decide it": auto) or `unread` (set
    in the --config file, whose values the audit never reads, or the command line could
    not be read)."""
    cmdline = server.main.cmdline
    if cmdline is None or not cmdline.known:
        return None, "the command line could not be read (" + (
            cmdline.reason if cmdline is not None else "not gathered") + ")", "unread"
    raw = argv_flag(server.argv, flag.name)
    if raw is not None:
        value = flag.aliases.get(str(raw), raw)
        how = f"{flag.option} {raw} on the command line" + (
            f" (an alias of {shown(value)})" if str(raw) in flag.aliases else "")
        return value, how, "explicit" if _decided(flag, value) else "unset"
    keys = server.config_file.value.get("keys", []) if server.config_file is not None and \
        server.config_file.known else []
    if flag.option[2:] in keys or flag.name in keys:
        return None, "set in the --config file (the audit reads its key names only)", "unread"
    return flag.default, f"not on the command line (default {shown(flag.default)}, " \
                         f"{flag.default_at})", "unset"


def _decided(flag: Flag, value: Any) -> bool:
    return not any(same(value, u) for u in flag.unresolved)


def _rewrite(ctx: AuditContext, host: HostReport, server: Server, flag: Flag, want: Any,
             got: Any) -> tuple[str, list[Evidence]]:
    """The rewrite of the pinned source that turns `want` into `got` here, in words."""
    c = ctx.context(host, server)
    maybe = ""
    for rw in flag.rewrites:
        if not rw.explains(want, got, same):
            continue
        values = [(req, resolve(req.fact, c)) for req in rw.when]
        ev = [Evidence.of(f"{req.fact} {req.op} {shown(req.value)}", v) for req, v in values]
        if any(v.known and not holds(req.op, v.value, req.value) for req, v in values):
            continue
        unknown = [f"{req.fact}: {v.reason}" for req, v in values if not v.known]
        if not unknown:
            return f"sglang {rw.at}: {rw.why}", ev
        maybe = maybe or f"possibly sglang {rw.at} ({rw.why}; unknown {'; '.join(unknown)})"
    return maybe or "no rewrite of the pinned sglang that resolved_args.yaml lists explains " \
                    "it", []


def _flag(ctx: AuditContext, host: HostReport, server: Server, flag: Flag) -> Finding:
    want, how, kind = requested(server, flag)
    run = running(server, flag.name, flag.unresolved)
    got, source, whys, evidence = run.value, run.source, run.whys, list(run.evidence)
    subject = f"{server.id} {flag.name}"
    evidence.insert(0, Evidence.of("requested", server.main.cmdline, how))

    def report(outcome: str, expected: Any, found: Any, message: str,
               extra: Sequence[Evidence] = ()) -> Finding:
        o = flag.report[outcome]
        return finding(host.host, subject, expected, found, o.status, message,
                       evidence + list(extra), sub=flag.name, severity=o.severity)

    if not source:
        why = "; ".join(whys)
        if kind == "unread":
            return report("unread", "unknown", "unknown", f"{how}; and what runs is not "
                          f"shown: {why}")
        if kind == "explicit":
            return report("unverified", shown(want), "unknown",
                          f"{how}, but what runs is not shown: {why}")
        later = f"; {flag.later}" if flag.later else ""
        return report("unknown", shown(want), "unknown",
                      f"{how}; what it became is not shown: {why}{later}")
    found = f"{shown(got)} ({source})"
    if kind == "unread":
        return report("unread", "unknown", found, f"{how}: runs {shown(got)}")
    if same(want, got):
        return finding(host.host, subject, shown(want), found, "pass",
                       f"{how}; runs it", evidence, sub=flag.name,
                       severity=flag.report["overridden"].severity)
    explained, ev = _rewrite(ctx, host, server, flag, want, got)
    if kind == "explicit":
        return report("overridden", shown(want), found,
                      f"{how}, but the server runs {shown(got)}: {explained}. The unit asks "
                      "for what it does not get: change the flag to what the server can run, "
                      "or find what overrides it", ev)
    return report("resolved", shown(want), found,
                  f"{how}; resolved at startup to {shown(got)}: {explained}", ev)
