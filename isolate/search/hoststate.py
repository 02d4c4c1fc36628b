"""A host's state as patchset can put it back exactly: which of the series' patches its
tree carries, which gates its units render off, and units as `patchset deploy` renders
them. Shared by bisect (test states, always restored) and rollout (a failed gate rolls
the changed hosts back): one save, one converge, one restore.

Why a saved state must be checked when it is taken: the restore re-applies the series'
own files and re-renders the units, so a host running anything else (a patch file that
is not the series', hand-edited units) could not be put back as it was; that is refused
before any change, never discovered after one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from patchset import api
from patchset.agent.lib.bounded import InputError, expect
from patchset.agent.lib.records import Event, StatusRecord
from patchset.errors import TargetError, UsageError
from patchset.series.model import Series
from patchset.series.selection import Plan, Selection
from patchset.transport import Transport

SERVER_ROLES = ("prefill", "decode")


@dataclass
class DrivenHost:
    """One host as bisect and rollout drive it: its transport (apply, revert and deploy
    all go through it) and its inventory entry."""

    series: Series
    host: Any                 # connect.inventory.Host
    transport: Transport
    health_timeout: float | None = None
    on_event: Callable[[Event], None] | None = None

    @property
    def tree(self) -> str:
        return str(self.transport.target)

    @property
    def roles(self) -> list[str]:
        return [r for r in SERVER_ROLES if r in self.host.roles]


@dataclass(frozen=True)
class HostState:
    """What a host runs, as far as patchset can restore it: the applied patches (the
    series' files, series order) and the gates its units render off."""

    host: str
    applied: tuple[str, ...]
    gates_off: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"host": self.host, "applied": list(self.applied),
                "gates_off": list(self.gates_off)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "HostState":
        """A state from a log or record, checked whole (a damaged file is a TargetError)."""
        try:
            expect(data, dict, where)
            expect(data.get("host"), str, where, ("host",))
            for key in ("applied", "gates_off"):
                for i, name in enumerate(expect(data.get(key, []), list, where, (key,))):
                    expect(name, str, where, (key, i))
        except InputError as exc:
            raise TargetError(f"{exc} (damaged)") from None
        return cls(data["host"], tuple(data.get("applied", [])),
                   tuple(data.get("gates_off", [])))


def status_record(t: DrivenHost) -> StatusRecord:
    """The host's status record (api.status raises when it cannot be had)."""
    record = api.status(t.series, t.transport).record
    assert record is not None
    return record


def starting(t: DrivenHost, status: StatusRecord) -> list[str]:
    """The host's applied patches, which must be the series' own files: the restore
    re-applies them from the series, so it must be able to reproduce them exactly."""
    known = t.series.by_name()
    names = []
    for a in status.applied:
        patch = known.get(a.name)
        if patch is None or patch.sha256 != a.sha256:
            raise UsageError(f"{t.host.name}: it runs {a.name} sha256 "
                             f"{a.sha256[:12]}, which is not the series' "
                             f"{'file' if patch else 'patch'} ({t.series.manifest}); apply "
                             "the series there first so it can be restored exactly")
        names.append(a.name)
    if not status.managed:
        raise UsageError(f"{t.host.name}: {t.tree} is not managed by patchset: apply first")
    return names


def require_deployed(t: DrivenHost, what: str = "the bisect") -> None:
    """The units must be what deploy renders and running: the restore re-renders them,
    so anything else would be lost (or could not be told apart from the test states)."""
    from patchset.deploy.deploy import deploy_units
    if not t.roles:
        raise UsageError(f"{t.host.name}: no prefill or decode role in hosts.yaml: nothing "
                         "serves the tree, so there is nothing to probe")
    result = deploy_units(t.host, t.transport, t.tree, roles=t.roles, dry_run=True,
                          git_prefix=t.series.upstream.git_prefix,
                          package=t.series.upstream.name)
    off = [f"{r.unit} ({r.restart})" for r in result.roles if r.changed or r.restart]
    if off:
        raise TargetError(f"{t.host.name}: the units are not as `patchset deploy` renders and "
                          f"runs them: {', '.join(off)}; run `patchset deploy "
                          f"{t.host.name}` first, so {what} can restore them exactly")


def save(t: DrivenHost, what: str = "the rollout") -> HostState:
    """The host's state now, refused unless it can be restored exactly."""
    names = starting(t, status_record(t))
    require_deployed(t, what)
    return HostState(t.host.name, tuple(names))


def converge(t: DrivenHost, applied: list[str], gates_off: list[str],
             restarted: list[str] | None = None, bisect_id: str | None = None,
             roles: list[str] | None = None) -> list[str]:
    """Make the host run exactly `applied` with `gates_off` unset (idempotent: a host
    already there is neither changed nor restarted); the roles restarted (appended to
    `restarted` as each restart begins). `roles`: restart only these (a role canary)."""
    from patchset.deploy.deploy import deploy_units
    counted = restarted if restarted is not None else []
    [result] = api.apply(t.series, plan_of(t.series, applied), [t.transport],
                         bisect=bisect_id)
    if not result.ok:
        raise TargetError(result.error or f"{t.host.name}: apply failed")

    def on_event(event: Event) -> None:
        if event.event == "restart" and event.role:
            counted.append(event.role)
        if t.on_event:
            t.on_event(event)

    done = deploy_units(t.host, t.transport, t.tree, roles=roles or t.roles,
                        timeout=t.health_timeout, on_event=on_event,
                        git_prefix=t.series.upstream.git_prefix,
                        package=t.series.upstream.name, bisect=bisect_id,
                        gates_off=frozenset(gates_off))
    if not done.ok:
        raise TargetError(done.error or f"{t.host.name}: deploy failed")
    return counted


def restore(t: DrivenHost, state: HostState, bisect_id: str | None = None) -> list[str]:
    """Put the host back to `state` (every role); the roles restarted."""
    return converge(t, list(state.applied), list(state.gates_off), bisect_id=bisect_id)


def plan_of(series: Series, names: list[str]) -> Plan:
    """Exactly `names` (dependency-closed by construction), in series order."""
    return Plan(selection=Selection(only=tuple(names)), decisions=(),
                patches=tuple(p for p in series.patches if p.name in names))


def dependents(series: Series, applied: list[str], name: str) -> list[str]:
    """The applied patches that depend on `name`, directly or not (series order)."""
    gone, out = {name}, []
    for p in series.patches:
        if p.name in applied and p.name not in gone and set(p.depends) & gone:
            gone.add(p.name)
            out.append(p.name)
    return out

