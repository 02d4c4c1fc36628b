"""The checkpoint's tensor dtypes are what the active patches and the quantization
format assume (read from safetensors headers: 8 + N bytes per shard, never the weights).

A patch that computes in a narrower dtype than the checkpoint stores (e.g. F32
hyper-connection weights consumed by a bf16 GEMM) throws away the checkpoint's own
precision on every call: not wrong by itself, but the first place to look when quality
drops. A quantized checkpoint whose tensors are not the format's dtypes is not the
checkpoint the server thinks it runs. Declared in auditor/data/tensors.yaml.
"""

from __future__ import annotations

import fnmatch

from ..facttable import resolve
from ..model import Evidence, Finding, HostReport
from ..policy import DTYPE_BITS
from ..states import holds
from .base import AuditContext, Reporter

ID = "checkpoint-dtypes"
SEVERITY = "medium"
TAGS = ("checkpoint", "numerics")
SUB_TAGS = ("narrowed",)   # and each tensor expectation's id (the policy's)
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    for host in ctx.hosts:
        seen: set[str] = set()
        for server in host.facts.sglang_servers:
            ckpt = host.facts.checkpoints.get(server.model or "")
            if ckpt is None or ckpt.model in seen:
                continue
            seen.add(ckpt.model)
            out += _assumptions(ctx, host, ckpt)
            out += _expectations(ctx, host, server, ckpt)
    return out


def _active_in(host: HostReport, patch: str) -> list[str]:
    return [s.server or "host" for s in host.states if s.patch == patch and s.state == "active"]


def _assumptions(ctx: AuditContext, host: HostReport, ckpt) -> list[Finding]:
    out = []
    for a in ctx.policy.assumptions:
        if a.patch not in ctx.series.by_name():
            continue
        subject = f"{ckpt.model} {', '.join(a.tensors)} for {a.patch}"
        ev = [Evidence.of("safetensors headers", ckpt.tensors,
                          f"{len(ckpt.header_reads)} header(s), "
                          f"{sum(r['bytes_read'] for r in ckpt.header_reads)} bytes read")]
        where = _active_in(host, a.patch)
        if not ckpt.tensors.known:
            out.append(finding(host.host, subject, f"<= {a.computes_in}", "unknown", "unknown",
                               ckpt.tensors.reason, ev, patches=[a.patch]))
            continue
        hits = {n: t["dtype"] for n, t in ckpt.tensors.value.items()
                if any(fnmatch.fnmatchcase(n, p) for p in a.tensors)}
        if not hits:
            out.append(finding(host.host, subject, f"<= {a.computes_in}", "no such tensors",
                               "unknown", "no tensor of the checkpoint matches", ev,
                               patches=[a.patch]))
            continue
        dtypes = sorted(set(hits.values()))
        wider = [d for d in dtypes if DTYPE_BITS.get(d, 0) > DTYPE_BITS[a.computes_in]]
        found = f"{len(hits)} tensor(s) {'/'.join(dtypes)}"
        if wider and where:
            out.append(finding(host.host, subject, f"<= {a.computes_in}", found, "warn",
                               f"{'/'.join(wider)} tensors consumed in {a.computes_in} by "
                               f"{a.patch} (active in {', '.join(where)}): {a.why}", ev,
                               sub="narrowed", patches=[a.patch]))
        else:
            note = "" if where else f"{a.patch} is not active here"
            out.append(finding(host.host, subject, f"<= {a.computes_in} while active",
                               found, "pass", note, ev, sub="narrowed"))
    return out


def _expectations(ctx: AuditContext, host: HostReport, server, ckpt) -> list[Finding]:
    out = []
    c = ctx.context(host, server)
    for e in ctx.policy.expectations:
        cond = resolve(e.when.fact, c)
        if not cond.known or not holds(e.when.op, cond.value, e.when.value):
            continue
        if not ckpt.tensors.known:
            out.append(finding(host.host, f"{ckpt.model} {e.id}", "format dtypes", "unknown",
                               "unknown", ckpt.tensors.reason, sub=e.id))
            continue
        for pattern, dtype in e.tensors.items():
            hits = {n: t["dtype"] for n, t in ckpt.tensors.value.items()
                    if fnmatch.fnmatchcase(n, pattern)}
            ev = [Evidence.of("safetensors headers", ckpt.tensors,
                              ", ".join(f"{n}={d}" for n, d in sorted(hits.items())[:4]))]
            subject = f"{ckpt.model} {pattern}"
            if not hits:
                out.append(finding(host.host, subject, dtype, "no such tensors", "unknown",
                                   f"no tensor matches {pattern}", ev, sub=e.id))
                continue
            bad = sorted({d for d in hits.values() if d != dtype})
            out.append(finding(host.host, subject, dtype, "/".join(sorted(set(hits.values()))),
                               "fail" if bad else "pass", f"{e.why}" if bad else "", ev,
                               sub=e.id))
    return out
