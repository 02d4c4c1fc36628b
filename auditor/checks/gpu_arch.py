"""The GPUs each server sees are one architecture, named unambiguously, and the one the
applied patches are written for.

The sm_120 kernels are chosen at runtime by compute capability: on another architecture
the patches that `require` it are applied but never run. CUDA_VISIBLE_DEVICES by index
means nvidia-smi's order only with CUDA_DEVICE_ORDER=PCI_BUS_ID.
"""

from __future__ import annotations

from ..facttable import env, gpu
from ..model import Evidence, Finding
from .base import AuditContext, Reporter, shown

ID = "gpu-arch"
SEVERITY = "medium"
TAGS = ("gpu",)
SUB_TAGS = ("device-order", "patches")
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    for host, server in ctx.servers():
        c = ctx.context(host, server)
        cap = gpu("compute_cap", c)
        ev = [Evidence.of("compute_cap", cap)]
        subject = f"{server.id} GPUs"
        if not cap.known:
            out.append(finding(host.host, subject, "one known architecture", "unknown",
                               "unknown", cap.reason, ev))
            continue
        visible, order = env("CUDA_VISIBLE_DEVICES", c), env("CUDA_DEVICE_ORDER", c)
        if visible.known and visible.value and order.known and order.value != "PCI_BUS_ID":
            out.append(finding(host.host, subject, "CUDA_DEVICE_ORDER=PCI_BUS_ID",
                               f"CUDA_DEVICE_ORDER={shown(order.value)}", "warn",
                               f"CUDA_VISIBLE_DEVICES={visible.value} counts GPUs in CUDA's "
                               "order, not nvidia-smi's", [Evidence.of("env", order)],
                               sub="device-order", severity="low"))
        wrong = []
        for state in ctx.states(host, server).values():
            for cond in state.conditions:
                if cond.fact.startswith("gpu.") and cond.ok is False:
                    wrong.append((state.patch, cond))
        if wrong:
            names = sorted({p for p, _ in wrong})
            want = sorted({str(cd.value) for _, cd in wrong})
            out.append(finding(host.host, subject, f"compute_cap {', '.join(want)}",
                               f"compute_cap {cap.value}", "warn",
                               f"{', '.join(names)} applied for another GPU architecture: "
                               "inert here", ev, sub="patches", patches=names))
        else:
            out.append(finding(host.host, subject, "what the applied patches require",
                               f"compute_cap {cap.value} ({cap.source})", "pass", "", ev))
    return out
