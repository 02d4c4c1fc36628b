"""Prefill and decode servers agree on what the KV cache means: the same model,
quantization, kv_cache_dtype, page_size and transfer backend (and, preferably, TP size).

Under P/D disaggregation the decode server reads KV pages the prefill server wrote: a
different model, KV dtype or page size does not crash, it silently decodes from a cache
it misreads. Different TP sizes are allowed by SGLang but a known source of failures.
Pairs are formed across every host of the audit.
"""

from __future__ import annotations

from ..facttable import resolve, role
from ..model import Evidence, Finding
from .base import AuditContext, Reporter, shown

ID = "pd-consistency"
SEVERITY = "high"
TAGS = ("pd", "server")
finding = Reporter(ID, SEVERITY)
FIELDS = (("server.model_path", "fail"), ("checkpoint.model_type", "fail"),
          ("server.quantization", "fail"), ("checkpoint.quant_algo", "fail"),
          ("server.kv_cache_dtype", "fail"), ("server.page_size", "fail"),
          ("server.disaggregation_transfer_backend", "fail"), ("server.tp_size", "warn"))
SUB_TAGS = tuple(fact.partition(".")[2] for fact, _ in FIELDS)   # one per field


def check(ctx: AuditContext) -> list[Finding]:
    sides: dict[str, list] = {"prefill": [], "decode": []}
    for host, server in ctx.servers():
        c = ctx.context(host, server)
        r = role(c)
        if r.known and r.value in sides:
            sides[r.value].append((host, server, c))
    out: list[Finding] = []
    for ph, ps, pc in sides["prefill"]:
        for dh, ds, dc in sides["decode"]:
            pair = f"{ph.host}/{ps.id} -> {dh.host}/{ds.id}"
            for fact, bad in FIELDS:
                p, d = resolve(fact, pc), resolve(fact, dc)
                ev = [Evidence.of(f"prefill {fact}", p), Evidence.of(f"decode {fact}", d)]
                name = fact.partition(".")[2]
                if not (p.known and d.known):
                    out.append(finding(ph.host, f"{pair} {name}", "equal", "unknown", "unknown",
                                       p.reason or d.reason, ev, sub=name))
                elif p.value != d.value:
                    out.append(finding(ph.host, f"{pair} {name}", f"prefill {shown(p.value)}",
                                       f"decode {shown(d.value)}", bad,
                                       f"prefill and decode differ on {name}", ev, sub=name,
                                       severity="high" if bad == "fail" else "medium"))
                else:
                    out.append(finding(ph.host, f"{pair} {name}", shown(p.value),
                                       shown(d.value), "pass", "", ev, sub=name))
    return out
