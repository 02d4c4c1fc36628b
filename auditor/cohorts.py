"""Cohorts: servers that serve together (a prefill/decode pair, the hosts of one model
group) and what each of them runs, so that the check cohort-parity and the exporter can
compare them.

Why: a patch applied on one host of a cohort and not on the other does not crash, it
serves subtly wrong output (a prefill/decode wire that one side speaks differently).
What a server runs is read from the audit's facts, never assumed: the patches applied on
its tree (name and hash), its tree (base, applied series, edited files), the gate values
in its process's environment and the patches the process loaded (PATCHSET_PATCHES). A
fact that cannot be had stays unknown, with why.

The cohorts come from the inventory (connect/inventory.py: `hosts.<name>.cohort`,
`cohorts.<name>.compatible`; Ansible: `patchset_cohort`); this read-only package does
not import the inventory, it takes `CohortSpec` records (`from_inventory` reads any
object with the inventory's shape).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from patchset.errors import ManifestError
from patchset.series.model import Patch, Series
from patchset.agent.lib.staleness import runs_in

from .facttable import Context, role as role_of
from .model import HostReport, Server
from .observed import loaded

UNKNOWN = "unknown"


@dataclass(frozen=True)
class CohortSpec:
    """One cohort as the inventory declares it: its hosts and the patches whose mismatch
    inside it is declared compatible."""

    name: str
    hosts: tuple[str, ...]
    compatible: tuple[str, ...] = ()


@dataclass(frozen=True)
class Aspect:
    """One compared value of one server: `value` when known, else None and `reason`."""

    value: Any = None
    reason: str = ""

    @property
    def known(self) -> bool:
        return not self.reason


@dataclass(frozen=True)
class ServerRun:
    """What one server of a cohort runs, as the audit's facts show it."""

    host: str
    server: str                      # unit or "pid N"; "-" when no server runs there
    role: str                        # prefill | decode | router | null | unknown
    cohort: str
    applied: Aspect                  # {patch: sha256[:12]} on its tree
    tree: Aspect                     # digest of base, applied series, edited files
    gates: Aspect                    # {env: value} of the series' gates in its process
    loaded: Aspect                   # {patch: sha12} its process loaded

    @property
    def label(self) -> str:
        return f"{self.host}/{self.server}"

    def digest(self) -> str:
        """The hash of what it runs (exporter label): applied, tree, gates and loaded
        together; `unknown` when any of them is unknown."""
        parts = (self.applied, self.tree, self.gates, self.loaded)
        if not all(p.known for p in parts):
            return UNKNOWN
        text = json.dumps([p.value for p in parts], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def from_inventory(inventory: Any, series: Series | None = None) -> tuple[CohortSpec, ...]:
    """The cohorts an inventory declares; a `compatible` patch the series does not have is
    bad input, reported at its line in the inventory."""
    names = {p.name for p in series.patches} if series else None
    out = []
    for c in getattr(inventory, "cohorts", {}).values():
        for patch in c.compatible:
            if names is not None and patch not in names:
                raise ManifestError(str(inventory.path), c.line,
                                    f"cohorts.{c.name}.compatible",
                                    f"{patch!r} is not a patch of the series")
        out.append(CohortSpec(c.name, tuple(c.hosts), tuple(c.compatible)))
    return tuple(out)


def cohort_of(cohorts: tuple[CohortSpec, ...], host: str) -> CohortSpec | None:
    return next((c for c in cohorts if host in c.hosts), None)


def runs(series: Series, hosts: list[HostReport], cohorts: tuple[CohortSpec, ...]
         ) -> list[ServerRun]:
    """One record per server of every audited host in a cohort (one per host without a
    running server, so its tree is still compared)."""
    out: list[ServerRun] = []
    for h in hosts:
        spec = cohort_of(cohorts, h.host)
        if spec is None:
            continue
        if not h.facts.reachable or h.facts.error:
            why = h.facts.error or "host unreachable"
            gone = Aspect(reason=f"{h.host}: {why}")
            out.append(ServerRun(h.host, "-", UNKNOWN, spec.name, gone, gone, gone, gone))
            continue
        servers: list[Server | None] = [*h.facts.sglang_servers] or [None]
        for srv in servers:
            out.append(server_run(series, h, srv, spec.name))
    return out


def server_run(series: Series, host: HostReport, srv: Server | None, cohort: str) -> ServerRun:
    r = role_of(Context(host.facts, srv))
    applied, tree = _tree(host)
    return ServerRun(host.host, srv.id if srv else "-", str(r.value) if r.known else UNKNOWN,
                     cohort, applied, tree, _gates(series, srv, r.value if r.known else None),
                     _loaded(srv))


def _tree(host: HostReport) -> tuple[Aspect, Aspect]:
    tree = host.facts.tree
    if not tree.known:
        gone = Aspect(reason=f"the tree's state is unknown: {tree.reason}")
        return gone, gone
    status = tree.value
    if not status.get("managed"):
        return Aspect({}), Aspect("unmanaged")
    applied = [(a["name"], str(a.get("sha256") or "")[:12]) for a in status.get("applied") or []]
    base = (status.get("base") or {}).get("commit")
    edited = sorted(str(d.get("path", d) if isinstance(d, dict) else d)
                    for d in (status.get("drift") or []) + (status.get("dirty") or []))
    text = json.dumps([base, applied, edited], sort_keys=True)
    return Aspect(dict(applied)), Aspect(hashlib.sha256(text.encode()).hexdigest()[:12])


def _gates(series: Series, srv: Server | None, role: Any) -> Aspect:
    """{env: value} of each gate whose patch runs in this server's role (a gate of a
    decode-only patch is not expected in a prefill server); None: not set."""
    if srv is None:
        return Aspect(reason="no SGLang server runs there")
    env = srv.main.environ
    if not env.known:
        return Aspect(reason=f"the environ of pid {srv.main.pid} is unknown: {env.reason}")
    return Aspect({p.gate.env: env.value.get(p.gate.env) for p in series.patches
                   if p.gate and runs_in(p.path, role)})


def _loaded(srv: Server | None) -> Aspect:
    if srv is None:
        return Aspect(reason="no SGLang server runs there")
    words = loaded(srv)
    if words is None:
        return Aspect(reason=f"what pid {srv.main.pid} loaded is unknown (no "
                      "PATCHSET_PATCHES in its environ, no tracer record)")
    return Aspect({w.split(":")[0]: w.partition(":")[2] for w in words})


def patch_value(run: ServerRun, aspect: str, patch: Patch) -> Aspect | None:
    """This patch's value in one aspect of a server: its hash or `absent` (applied,
    loaded), its gate value (gates; None when the gate does not concern the server)."""
    a: Aspect = getattr(run, aspect)
    if aspect == "gates":
        if patch.gate is None or (a.known and patch.gate.env not in a.value):
            return None
        if not a.known:
            return a
        value = a.value[patch.gate.env]
        return Aspect("on" if value == patch.gate.on else f"off ({value or 'unset'})")
    if not a.known:
        return a
    return Aspect(a.value.get(patch.name, "absent"))
