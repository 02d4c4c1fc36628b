"""A rollout's plan as typed records: the change, the steps, the gate settings.

Each has ONE validator, and both of its sources go through it: the command's options
when a rollout starts, and the `plan` line of its log when `--resume` reads it back. A
log is a file anyone can edit (or a disk can damage), so what it says is checked exactly
as hard as what the command line says: a setting the command would refuse, a change
naming a patch the series lacks, a step that `make_plan` could not have made, is bad
input (exit 2) before any host is touched, never a gate that silently judges less.

`Where` is how an error names a field: the option (`--max-throughput-drop`) for the
command line, `LOG:1: settings.max_drop` for a log.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from patchset.errors import UsageError
from patchset.isolate.measure.driftdecide import MAX_REPLAYS, MIN_REPLAYS

from patchset.isolate.search import hoststate
from patchset.isolate.search.hoststate import HostState

Where = Callable[[str], str]
ON_UNKNOWN = ("stop", "continue")


def _as_option(name: str) -> str:
    return OPTIONS.get(name, name)


# ---------------------------------------------------------------- the change

@dataclass(frozen=True)
class Change:
    """What the rollout changes on each host. `select`: the exact patches every host
    then carries (a selection, dependency-closed); `revert`: these and their dependents
    leave each host's own set; `gate_off`: these applied patches run with their gate
    unset (an env change, no code change)."""

    select: tuple[str, ...] | None = None
    revert: tuple[str, ...] = ()
    gate_off: tuple[str, ...] = ()
    label: str = ""

    def target(self, series: Any, saved: HostState) -> HostState:
        """The state `saved` is rolled to."""
        applied = list(self.select) if self.select is not None else list(saved.applied)
        for name in self.revert:
            gone = {name, *hoststate.dependents(series, applied, name)}
            applied = [n for n in applied if n not in gone]
        gates = sorted(set(saved.gates_off) | {g for g in self.gate_off if g in applied})
        return HostState(saved.host, tuple(p.name for p in series.patches
                                           if p.name in applied), tuple(gates))

    def to_json(self) -> dict:
        return asdict(self)

    def check(self, series: Any, where: Where = _as_option) -> "Change":
        """Exactly one kind of change, every name one of the series' patches, a gate flip
        only of a patch that has a gate, a selection dependency-closed and free of
        conflicts (what `plan` makes of --only)."""
        kinds = [k for k, given in (("select", self.select is not None),
                                    ("revert", bool(self.revert)),
                                    ("gate_off", bool(self.gate_off))) if given]
        if len(kinds) != 1:
            raise UsageError(f"{where('change')}: give one change: a selection "
                             "(--tier/--path/--only/--exclude), --revert or --gate-off")
        known = series.by_name()
        for key in ("select", "revert", "gate_off"):
            for name in getattr(self, key) or ():
                if name not in known:
                    raise UsageError(f"{where(key)}: no patch named {name!r} in "
                                     f"{series.manifest} (see `patchset list`)")
        for name in self.gate_off:
            if known[name].gate is None:
                raise UsageError(f"{where('gate_off')} {name}: that patch has no gate")
        if self.select is not None:
            _check_closed(series, self.select, where)
        return self

    @classmethod
    def from_json(cls, data: Any, where: Where, series: Any) -> "Change":
        """A logged change, typed and then checked as the command's options are."""
        _mapping(data, "change", where, {"select", "revert", "gate_off", "label"})
        select = data.get("select")
        change = cls(None if select is None else _names(select, "change.select", where),
                     _names(data.get("revert", []), "change.revert", where),
                     _names(data.get("gate_off", []), "change.gate_off", where),
                     _typed(data.get("label", ""), str, "change.label", where))
        return change.check(series, lambda key: where(
            "change" if key == "change" else f"change.{key}"))


def _check_closed(series: Any, names: tuple[str, ...], where: Where) -> None:
    from patchset.series.selection import Selection, plan
    chosen = plan(series, Selection(only=tuple(names)))
    missing = [n for n in chosen.names if n not in names]
    if missing:
        raise UsageError(f"{where('select')}: not dependency-closed: "
                         f"{', '.join(missing)} must come too")


# ---------------------------------------------------------------- the steps

@dataclass(frozen=True)
class Step:
    """One step: the hosts (and, for a role canary, the roles) it changes."""

    number: int
    kind: str                           # canary | batch
    hosts: tuple[str, ...]
    roles: dict[str, list[str]] = field(default_factory=dict)   # host -> only these roles

    def to_json(self) -> dict:
        return {"number": self.number, "kind": self.kind, "hosts": list(self.hosts),
                "roles": dict(self.roles)}

    @classmethod
    def from_json(cls, data: Any, where: Where, i: int) -> "Step":
        at = f"steps[{i}]"
        _mapping(data, at, where, {"number", "kind", "hosts", "roles"},
                 required=("number", "kind", "hosts"))
        roles = _mapping(data.get("roles", {}), f"{at}.roles", where, None)
        return cls(_typed(data["number"], int, f"{at}.number", where),
                   _typed(data["kind"], str, f"{at}.kind", where),
                   _names(data["hosts"], f"{at}.hosts", where),
                   {h: list(_names(r, f"{at}.roles.{h}", where)) for h, r in roles.items()})


def make_plan(hosts: list[str], canary: str | None, batch: int,
              roles_of: Callable[[str], list[str]]) -> list[Step]:
    """Canary (`HOST` or `HOST:ROLE`, default the first host), then batches of `batch`
    hosts in the given order; a role canary's host finishes in the first batch."""
    if batch < 1:
        raise UsageError("--batch: at least 1 host a step")
    if not hosts:
        raise UsageError("no hosts to roll out to")
    if len(set(hosts)) != len(hosts):
        raise UsageError(f"hosts: {', '.join(sorted({h for h in hosts if hosts.count(h) > 1}))}"
                         " named twice")
    bare = [h for h in hosts if not roles_of(h)]
    if bare:
        raise UsageError(f"{', '.join(bare)}: no prefill or decode role in the inventory: "
                         "nothing serves the tree there to gate on")
    name, _, role = (canary or hosts[0]).partition(":")
    if name not in hosts:
        raise UsageError(f"--canary {canary}: not one of the hosts rolled out to "
                         f"({', '.join(hosts)})")
    if role and role not in roles_of(name):
        raise UsageError(f"--canary {canary}: {name} has no {role!r} role "
                         f"(it has {', '.join(roles_of(name)) or 'none'})")
    steps = [Step(0, "canary", (name,), {name: [role]} if role else {})]
    rest = [h for h in hosts if h != name]
    if role:
        rest.insert(0, name)          # its other roles still run the old code
    for i in range(0, len(rest), batch):
        steps.append(Step(len(steps), "batch", tuple(rest[i:i + batch])))
    return check_steps(steps, roles_of, lambda key: key)


def check_steps(steps: list[Step], roles_of: Callable[[str], list[str]],
                where: Where) -> list[Step]:
    """What every plan `make_plan` makes is: numbered 0.. in order, a canary of one host
    (a role canary: one of its roles, its host then in a batch), then batches of hosts
    each changed once, every host with a server role to gate on."""
    if not steps:
        raise UsageError(f"{where('steps')}: no steps")
    seen: list[str] = []
    for i, step in enumerate(steps):
        at = f"steps[{i}]"
        if step.number != i or step.kind != ("canary" if i == 0 else "batch"):
            raise UsageError(f"{where(at)}: step {step.number} {step.kind!r} where step {i} "
                             f"{'canary' if i == 0 else 'batch'} belongs")
        if not step.hosts or (i == 0 and len(step.hosts) != 1):
            raise UsageError(f"{where(at + '.hosts')}: {len(step.hosts)} hosts (a canary "
                             "has one, a batch at least one)")
        _check_roles(step, roles_of, where, at)
        again = [h for h in step.hosts if h in seen]
        if again:
            raise UsageError(f"{where(at + '.hosts')}: {', '.join(again)} changed twice")
        seen += [h for h in step.hosts if not step.roles.get(h)]
    canary = steps[0].hosts[0]
    if canary not in seen:
        raise UsageError(f"{where('steps')}: the role canary's host {canary} is in no batch")
    return steps


def _check_roles(step: Step, roles_of: Callable[[str], list[str]], where: Where,
                 at: str) -> None:
    for host in step.hosts:
        if not roles_of(host):
            raise UsageError(f"{where(at + '.hosts')}: {host}: no prefill or decode role in "
                             "the inventory: nothing serves the tree there to gate on")
    for host, roles in step.roles.items():
        if step.number != 0 or host not in step.hosts or len(roles) != 1 \
                or roles[0] not in roles_of(host):
            raise UsageError(f"{where(at + '.roles')}: {host}: {roles} is not one role of "
                             "the canary host")


# ---------------------------------------------------------------- the gate settings

# field -> (type, lowest, highest, the command's option); the one table of their ranges
BOUNDS: dict[str, tuple[type, float, float, str]] = {
    "max_drop": (float, 0.0, 1.0, "--max-throughput-drop"),
    "parallel": (int, 1, 64, "--load"),
    "health_timeout": (float, 0, 7 * 24 * 3600, "--health-timeout"),
    "drift.output_tokens": (int, 1, 32768, "--output-tokens"),
    "drift.repeats": (int, MIN_REPLAYS, MAX_REPLAYS, "--repeats"),
    "drift.timeout": (float, 0.001, 24 * 3600, "--probe-timeout"),
    "drift.k": (float, 0.5, 10.0, "--sigmas"),
    "drift.tolerance": (float, 1e-12, 10.0, "--tolerance"),
    "drift.confidence": (float, 0.5, 0.9999, "--confidence"),
}
OPTIONS = {**{k: v[3] for k, v in BOUNDS.items()}, "baseline": "--baseline",
           "baseline_sha256": "--baseline", "api_key_env": "--api-key-env",
           "select": "the selection", "revert": "--revert", "gate_off": "--gate-off",
           "change": "the change", "on_unknown": "--on-unknown"}
DRIFT_KEYS = ("output_tokens", "repeats", "timeout", "k", "tolerance", "confidence")


@dataclass(frozen=True)
class DriftSettings:
    """The drift gate's replay of the baseline (isolate/measure/drift.py DriftSpec's fields)."""

    output_tokens: int = 256
    repeats: int = 3
    timeout: float = 600.0
    k: float = 3.0
    tolerance: float = 0.002
    confidence: float = 0.99


@dataclass(frozen=True)
class Settings:
    """How the gates judge, logged with the plan so a resume gates as the run started:
    `baseline` is an absolute path and `baseline_sha256` pins its content."""

    baseline: str | None = None
    baseline_sha256: str | None = None
    max_drop: float = 0.5
    parallel: int = 4
    api_key_env: str | None = None
    health_timeout: float | None = None
    drift: DriftSettings = DriftSettings()

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: Where = _as_option) -> "Settings":
        """THE validator of the gate settings, for the options and for a log alike."""
        keys = {f for f in cls.__dataclass_fields__}
        _mapping(data, "settings", where, keys, required=tuple(keys))
        _mapping(data["drift"], "drift", where, set(DRIFT_KEYS), required=DRIFT_KEYS)
        drift = DriftSettings(**{k: _bounded(data["drift"][k], f"drift.{k}", where)
                                 for k in DRIFT_KEYS})
        baseline, sha = data["baseline"], data["baseline_sha256"]
        _typed(baseline, (str, type(None)), "baseline", where)
        _typed(sha, (str, type(None)), "baseline_sha256", where)
        if baseline is not None and not baseline.startswith("/"):
            raise UsageError(f"{where('baseline')}: {baseline!r} is not an absolute path")
        if (baseline is None) != (sha is None) or (sha is not None and (
                len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha))):
            raise UsageError(f"{where('baseline_sha256')}: the baseline's content is not "
                             "pinned by a sha256")
        api_key_env = _typed(data["api_key_env"], (str, type(None)), "api_key_env", where)
        if api_key_env == "":
            raise UsageError(f"{where('api_key_env')}: an empty variable name")
        timeout = data["health_timeout"]
        return cls(baseline, sha, _bounded(data["max_drop"], "max_drop", where),
                   _bounded(data["parallel"], "parallel", where), api_key_env,
                   None if timeout is None else _bounded(timeout, "health_timeout", where),
                   drift)


def _bounded(value: Any, key: str, where: Where) -> Any:
    kind, lo, hi, _ = BOUNDS[key]
    _typed(value, (int, float) if kind is float else int, key, where)
    if not lo <= value <= hi:                      # False for nan too
        raise UsageError(f"{where(key)}: {value!r} is not within {lo:g} to {hi:g}")
    return kind(value)


# ---------------------------------------------------------------- typing JSON

def _typed(value: Any, kinds: type | tuple, key: str, where: Where) -> Any:
    """`value` if its exact type is one of `kinds` (`true` is no number)."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if type(value) not in kinds:
        wanted = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise UsageError(f"{where(key)}: expected {wanted}, found {type(value).__name__}")
    return value


def _names(value: Any, key: str, where: Where) -> tuple[str, ...]:
    """A list of distinct non-empty strings."""
    _typed(value, list, key, where)
    for i, name in enumerate(value):
        if type(name) is not str or not name:
            raise UsageError(f"{where(f'{key}[{i}]')}: expected a non-empty string")
    if len(set(value)) != len(value):
        raise UsageError(f"{where(key)}: a name given twice")
    return tuple(value)


def _mapping(value: Any, key: str, where: Where, allowed: set[str] | None,
             required: tuple[str, ...] = ()) -> dict:
    """A JSON object with string keys, only `allowed` ones (None: any), `required` there."""
    _typed(value, dict, key, where)
    extra = sorted(set(value) - allowed) if allowed is not None else []
    missing = [k for k in required if k not in value]
    if extra or missing:
        raise UsageError(f"{where(key)}: " + "; ".join(
            ([f"unknown key(s) {', '.join(extra)}"] if extra else []) +
            ([f"missing {', '.join(missing)}"] if missing else [])))
    return value
