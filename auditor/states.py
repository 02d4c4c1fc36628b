"""The effective state of every patch in every server, with its reason.

A patch is live only when it is applied (and intact), its gate is on in the processes
that run the kernels, the server runs a path the patch serves, and every condition it
declares in `requires` holds. All of that comes from the series (path, gate, requires)
evaluated against facts through the fact table; nothing here knows a patch by name.

    not-applied  not in the tree's state, or the tree is not managed by patchset
    drifted      applied, but a file it touches was edited since, or another version of
                 the patch is applied than the series has
    gated-off    applied, its env gate is not set to its `on` value in the server
    inert        applied and gated on, but its code never runs here: the server imports
                 another tree, serves only the other path, or a `requires` condition fails
    unknown      a fact needed to decide is unknown (named, with why)
    active       all of the above hold
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from patchset.series.model import Patch, Requirement, Series

from patchset.agent.lib.facts.base import FactValue
from .facttable import Context, resolve, role
from .model import Condition, HostFacts, PatchState, Server
from .observed import describe, loaded, modes_ran, observe, word_for
from .staleness import stale
from .values import same, shown
from patchset.agent.lib.staleness import runs_in, served_paths


def evaluate_host(series: Series, facts: HostFacts) -> list[PatchState]:
    """States per (patch, server); a host with no running server gets host-level states."""
    servers: list[Server | None] = [*facts.sglang_servers] or [None]
    out: list[PatchState] = []
    for srv in servers:
        out += Evaluator(series, facts, srv).all()
    return out


class Evaluator:
    """Evaluates the series for one server; `patch.X` facts recurse through it."""

    def __init__(self, series: Series, facts: HostFacts, server: Server | None) -> None:
        self.series, self.facts, self.server = series, facts, server
        self.ctx = Context(facts, server, patch_state=self._patch_fact)
        self.done: dict[str, PatchState] = {}
        self.busy: set[str] = set()
        self._stale = False

    def all(self) -> list[PatchState]:
        return [self.state(p) for p in self.series.patches]

    def _patch_fact(self, name: str) -> FactValue:
        patch = self.series.by_name().get(name)
        if patch is None:
            return FactValue.unknown(f"no patch {name!r} in the series")
        if name in self.busy:
            return FactValue.unknown(f"patch.{name} requires itself (a cycle of requires)")
        st = self.state(patch)
        return FactValue(st.state, source=f"patch {name}: {st.reason}")

    def state(self, patch: Patch) -> PatchState:
        if patch.name not in self.done:
            self.busy.add(patch.name)
            try:
                self.done[patch.name] = self._state(patch)
            finally:
                self.busy.discard(patch.name)
        return self.done[patch.name]

    def _make(self, patch: Patch, state: str, reason: str,
              conditions: tuple[Condition, ...] = ()) -> PatchState:
        return PatchState(patch.name, self.facts.host, self.server.id if self.server else None,
                          state, reason, conditions)

    def _state(self, patch: Patch) -> PatchState:
        tree = self.facts.tree
        if not tree.known:
            return self._make(patch, "unknown", f"the tree's state is unknown: {tree.reason}")
        status = tree.value
        where = status.get("target", "the tree")
        if not status.get("managed"):
            return self._make(patch, "not-applied", f"{where} is not managed by patchset "
                              "(no .patchset/state.json)")
        applied = {a["name"]: a for a in status.get("applied") or []}
        if patch.name not in applied:
            carried = self._loaded_as(patch.name)
            if carried:            # reverted on disk, still in the running process
                assert self.server is not None          # carried: its records said so
                st = self._runtime(patch)
                return self._observe(patch, replace(st, reason=(
                    f"loaded by pid {self.server.main.pid} ({carried}), no longer on disk: "
                    f"restart to unload; {st.reason}")))
            return self._make(patch, "not-applied", f"not applied on {where} (applied: "
                              f"{', '.join(applied) or 'none'})")
        if status.get("interrupted"):
            interrupted = status["interrupted"]
            return self._make(patch, "unknown", f"an interrupted {interrupted['op']} on "
                              f"{where}: {interrupted.get('next') or 'see patchset status'}")
        drifted = _drift(patch, status, applied[patch.name])
        if drifted:
            return self._make(patch, "drifted", drifted)
        if self.server is None:
            return self._make(patch, "unknown", f"applied on {where}, but no SGLang server "
                              f"is running on {self.facts.host}")
        live = self._live_code(status)
        if live:
            return self._make(patch, live[0], live[1])
        word = f"{patch.name}:{str(applied[patch.name].get('sha256') or '')[:12]}"
        served = role(self.ctx)
        runs_here = runs_in(patch.path, served.value if served.known else None)
        if self._stale and runs_here and word not in (loaded(self.server) or []):
            carried = self._loaded_as(patch.name)
            if not carried:
                return self._make(patch, "not-applied", (
                    f"applied on {where} after pid {self.server.main.pid} started: not loaded "
                    "by it (restart to load)"))
            st = self._runtime(patch)
            return self._observe(patch, replace(st, reason=(
                f"pid {self.server.main.pid} loaded {carried}, the tree has {word}: restart "
                f"to load it; {st.reason}")))
        return self._observe(patch, self._runtime(patch))

    def _loaded_as(self, name: str) -> str | None:
        """The `name:sha12` the server loaded for this patch name, if any."""
        words = loaded(self.server) if self.server else None
        return next((w for w in words or [] if w.split(":")[0] == name), None)

    def _observe(self, patch: Patch, st: PatchState) -> PatchState:
        """The declared state, corrected by what the tracer saw (auditor/observed.py):
        only a call that returned or a forward pass in the process that would run the
        code overrides it; no evidence leaves it as declared, and says why."""
        word = word_for(self.server, patch.name) if self.server else None
        gated = patch.gate is not None
        if not word or self.server is None:
            return st
        obs = observe(self.server, word, self._paths(patch), gated)
        if obs is None:
            return st
        modes = tuple(sorted(modes_ran(self.server, word, gated)))
        if obs.ran:
            ran = "; ".join(describe(e) for e in obs.ran[:3])
            if st.state in ("inert", "gated-off"):
                return replace(st, state="active", evidence="observed", ran=obs.ran,
                               declared=st.state, contradiction="inert-but-ran", modes=modes,
                               reason=f"declared {st.state} ({st.reason}), but it ran: {ran}")
            if st.state == "unknown":        # a fact or an undeclared guard: it ran
                return replace(st, state="active", evidence="observed", ran=obs.ran,
                               declared="unknown", modes=modes,
                               reason=f"declared unknown ({st.reason}), but it ran: {ran}")
            return replace(st, evidence="observed", ran=obs.ran, modes=modes,
                           reason=f"{st.reason}; observed: {ran}")
        if obs.observed_not_run:
            proc = obs.not_run[0]
            where = f"pid {proc['pid']} ({proc['title']}) returned {proc['forwards']}"
            if st.state == "active":
                return replace(st, state="inert", evidence="observed", declared="active",
                               contradiction="declared-active-not-run", modes=modes,
                               reason=(f"declared active ({st.reason}), but none of its code "
                                       f"ran while {where}, watching all of it: its requires "
                                       "miss a dispatch condition"))
            return replace(st, evidence="observed", modes=modes,
                           reason=f"{st.reason}; observed: none of its code ran while {where}")
        if obs.weak and st.state == "active":  # corroborates what is declared, no more
            ran = "; ".join(describe(e) for e in obs.weak[:3])
            return replace(st, evidence="observed", ran=obs.weak, modes=modes,
                           reason=f"{st.reason}; observed: its changed function {ran}")
        return replace(st, observation=f"no evidence yet: {obs.none}", modes=modes)

    def _paths(self, patch: Patch) -> tuple[str, ...]:
        """The paths this patch's code would run in here: its tag's, of the ones the
        server serves (both, when the role is unknown)."""
        served = role(self.ctx)
        paths = served_paths(served.value) if served.known else ("prefill", "decode")
        return tuple(p for p in paths if patch.path in (None, "both", p))

    def _live_code(self, status: dict) -> tuple[str, str] | None:
        """Does the server run the managed tree? Sets `_stale` (started before the last
        change): then what it loaded (PATCHSET_PATCHES) decides, not the tree on disk."""
        srv = self.server
        assert srv is not None
        if not srv.imports.known:
            return "unknown", f"which tree {srv.id} imports is unknown: {srv.imports.reason}"
        pin = self.series.upstream
        managed = managed_package_dir(status, pin.git_prefix, pin.name)
        origin = srv.imports.value["origin"]
        if managed and os.path.dirname(origin) != managed:
            return "inert", (f"{srv.id} imports {origin}, not the managed tree "
                             f"{managed}: patching it is a silent no-op")
        served = role(self.ctx)
        is_stale, why = stale(srv, status, str(served.value) if served.known else None)
        self._stale = bool(is_stale)
        if is_stale and loaded(srv) is None:
            return "unknown", f"{srv.id} {why} (restart it)"
        return None

    def _runtime(self, patch: Patch) -> PatchState:
        srv = self.server
        assert srv is not None
        unknown: list[str] = []
        false: list[str] = []
        conditions: list[Condition] = []
        gate_off = None
        if patch.gate is not None:
            value = resolve(f"env.{patch.gate.env}", self.ctx)
            cond = _condition(Requirement(f"env.{patch.gate.env}", "eq", patch.gate.on,
                                          "the patch's env gate"), value)
            conditions.append(cond)
            if cond.ok is False:
                setting = " unset" if value.value is None else f"={value.value}"
                gate_off = (f"gate {patch.gate.env}{setting} in {srv.id} ({value.source}); "
                            f"the patch runs with {patch.gate.env}={patch.gate.on}")
            elif cond.ok is None:
                unknown.append(f"env.{patch.gate.env}: {value.reason}")
        if patch.path != "both":
            served = role(self.ctx)
            cond = Condition("unit.role", "serves", patch.path, served.value if served.known
                             else None, None if not served.known else
                             runs_in(patch.path, served.value),
                             f"a {patch.path}-path patch", served.source, served.reason)
            conditions.append(cond)
            if cond.ok is False:
                false.append(f"path {patch.path}: {srv.id} serves "
                             f"{'/'.join(served_paths(served.value))} "
                             f"only ({served.source}: {served.value})")
            elif cond.ok is None:
                unknown.append(f"unit.role: {served.reason}")
        for req in patch.requires:
            value = resolve(req.fact, self.ctx)
            cond = _condition(req, value)
            conditions.append(cond)
            if cond.ok is False:
                false.append(f"requires {req.fact} {req.op} {shown(req.value)}"
                             f"{' (' + req.why + ')' if req.why else ''}; live: "
                             f"{shown(value.value)} ({value.source or 'fact'})")
            elif cond.ok is None:
                unknown.append(f"{req.fact}: {value.reason}")
        conds = tuple(conditions)
        if gate_off:
            return self._make(patch, "gated-off", gate_off, conds)
        if false:
            return self._make(patch, "inert", false[0], conds)
        if unknown:
            return self._make(patch, "unknown", "unknown " + "; ".join(unknown), conds)
        from .guards import undeclared        # a call-path test no requires declares
        guarded = undeclared(self.series, patch, self.ctx)
        if guarded:
            return self._make(patch, "unknown", guarded, conds)
        gate = f"gate {patch.gate.env}={patch.gate.on} on, " if patch.gate else "unconditional, "
        return self._make(patch, "active", f"{gate}{len(patch.requires)} condition(s) hold "
                          f"in {srv.id}", conds)


def _condition(req: Requirement, value: FactValue) -> Condition:
    if not value.known:
        return Condition(req.fact, req.op, req.value, None, None, req.why, value.source,
                         value.reason)
    return Condition(req.fact, req.op, req.value, value.value, holds(req.op, value.value,
                                                                     req.value),
                     req.why, value.source)


def holds(op: str, found: Any, expected: Any) -> bool:
    """eq / ne / in / not_in, with None meaning unset and scalars compared loosely
    ("12.0" == 12.0, "256" == 256): env values are strings, JSON values are typed."""
    if op == "eq":
        return same(found, expected)
    if op == "ne":
        return not same(found, expected)
    if op == "in":
        return any(same(found, e) for e in expected)
    if op == "not_in":
        return not any(same(found, e) for e in expected)
    raise ValueError(f"unknown op {op!r}")


def _drift(patch: Patch, status: dict, applied: dict) -> str | None:
    touched = {c.path for c in patch.files}
    for item in status.get("drift") or []:
        if item["path"] in touched:
            found = (item.get("found") or "absent")[:12]
            return (f"{item['path']} was edited since the apply (expected blob "
                    f"{(item.get('expected') or 'absent')[:12]}, found {found})")
    if applied.get("sha256") and patch.sha256 and applied["sha256"] != patch.sha256:
        return (f"the applied version (sha256 {applied['sha256'][:12]}) is not the series' "
                f"(sha256 {patch.sha256[:12]}): re-apply")
    return None


def managed_package_dir(status: dict, git_prefix: str = "python/",
                        package: str = "sglang") -> str | None:
    """The directory `import sglang` must resolve to for the managed tree to be live."""
    target = status.get("target")
    if not target:
        return None
    prefix = git_prefix if status.get("layout") == "git" else ""
    return os.path.normpath(os.path.join(target, prefix, package))
