"""`patchset deploy`: render the units of a host's roles and run them there, or roll back.

Two round trips per host:
  1. facts: the tree (layout, state: applied patches with gates and paths), the unit and
     env files installed now, the units' state (running? stale?). Read-only.
  2. deploy: the rendered files with the agent (patchset/agent/deployer.py) through the
     host's Transport; it verifies, installs, reloads, enables, restarts and waits
     for /health on the host, streaming JSON-line progress back, and rolls back there.
A dry run stops after 1 with the diff of every file and what would be restarted.

Every value in the files comes from the inventory (validated in deploy/units.py) or from
the state on the host (gates, patch names: validated again before rendering). Nothing is
installed unless every file rendered and `systemd-analyze verify` printed nothing.

Credentials (api_key, admin_api_key, secret flags of extra_args) go to a root-only
`--config` file, never the unit or the command line. Whatever a deploy returns, streams or
raises passes one redaction point (`Scrub`, patchset/agent/lib/redact.py): the diffs, the
journal tail of a failed unit, errors and progress events never show a secret.
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from patchset.agent.lib.records import Event
from patchset import __version__
from patchset.agent.lib import wire
from patchset.agent.lib.redact import Redactor, is_secret_name
from patchset.errors import BisectPending, Exit, PatchsetError, TargetError, UsageError
from patchset.transport import EventSink, Transport, raise_for

from patchset.connect import settings
from patchset.connect.inventory import Host

from . import units

# ---------------------------------------------------------------- results

@dataclass
class RoleReport:
    role: str
    unit: str
    unit_path: str
    env_path: str
    changed: bool                      # unit or env file differs from the installed one
    restart: str | None                # why it is (or would be) restarted
    actions: list[str] = field(default_factory=list)
    diff: str = ""
    active: str | None = None
    stale: bool = False
    gates: dict[str, str] = field(default_factory=dict)
    patches: str = ""
    health_url: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass
class DeployResult:
    host: str
    ok: bool
    dry_run: bool = False
    changed: bool = False
    tree: str | None = None
    roles: list[RoleReport] = field(default_factory=list)
    failed: dict | None = None
    rollback: list[dict] | None = None
    recovered: list[dict] | None = None    # an interrupted deploy rolled back first
    error: str | None = None
    details: str = ""
    exit_code: int = Exit.OK
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- the library call

def select_roles(host: Host, roles: list[str] | None) -> list[str]:
    """Requested roles (default: every role the host has), in restart order."""
    for role in roles or []:
        if role not in settings.ROLES:
            raise UsageError(f"--role {role!r}: expected one of {', '.join(settings.ROLES)}")
        if role not in host.roles:
            raise UsageError(f"{host.name}: no role {role!r} in hosts.yaml "
                             f"(hosts.{host.name}.roles has: {', '.join(host.roles) or 'none'})")
    wanted = set(roles) if roles else set(host.roles)
    if not wanted:
        raise UsageError(f"{host.name}: no roles in hosts.yaml (hosts.{host.name}.roles: "
                         "prefill, decode, router) - nothing to deploy")
    return [r for r in settings.ROLES if r in wanted]


def deploy_units(host: Host, transport: Transport, tree: str, roles: list[str] | None = None,
                 dry_run: bool = False, timeout: float | None = None, lock_wait: float = 0.0,
                 on_event: EventSink | None = None, git_prefix: str = "python/",
                 package: str = "sglang",
                 bisect: str | None = None,
                 gates_off: frozenset[str] = frozenset()) -> DeployResult:
    """Render, diff, verify, install, restart in order and wait for /health (or roll back).

    Bad settings raise UsageError before the host is contacted; an unreachable host
    raises Unreachable; an unfinished bisect there raises BisectPending; everything
    the host refuses or fails is in the result. `gates_off` (a bisect step, id `bisect`)
    renders those applied patches without their gate, so their code path is not taken.
    The result, the events and the errors are redacted (`Scrub`)."""
    scrub = Scrub(inventory_secrets(host))
    try:
        result = _deploy(host, transport, tree, roles, dry_run, timeout, lock_wait,
                         scrub.events(on_event), git_prefix, package, bisect,
                         gates_off, scrub)
    except PatchsetError as exc:
        raise scrub.error(exc)
    return scrub.result(result)


def _deploy(host: Host, transport: Transport, tree: str, roles: list[str] | None, dry_run: bool,
            timeout: float | None, lock_wait: float, on_event: EventSink | None,
            git_prefix: str, package: str, bisect: str | None,
            gates_off: frozenset[str], scrub: "Scrub") -> DeployResult:
    chosen = select_roles(host, roles)
    # Everything that can be checked without the host is checked first (exit 2).
    units.render(host, units.resolve(host, chosen, tree, None, None, git_prefix))
    base = {"tree": tree, "git_prefix": git_prefix, "package": package,
            "tool_version": __version__}
    facts = _facts(transport, wire.FactsRequest(**base, roles=_names(chosen)))
    if not facts.tree:
        raise TargetError(f"{host.name}: no SGLang tree at {tree}: run `patchset apply` there "
                          "first (the units serve that tree)")
    t = facts.tree
    pending = t.get("bisect")
    if pending and pending.get("id") != bisect and not dry_run:
        exc = BisectPending(f"{host.name}: a bisect (started {pending.get('started')} by "
                            f"{pending.get('by')}) holds the host in a test state")
        exc.record = pending
        raise exc
    state = {"applied": [dict(a, gate=None) if a.get("name") in gates_off else a
                         for a in t["applied"]], "trace": t.get("trace") or {}} \
        if t["managed"] else None
    resolved = units.resolve(host, chosen, t["root"], state, t["layout"], git_prefix)
    if timeout is not None:
        resolved = {r: replace(u, health_timeout=timeout) for r, u in resolved.items()}
    rendered = units.render(host, resolved)
    scrub.add(rendered_secrets(resolved))
    for r in chosen:
        info = facts.roles[r]
        scrub.add(installed_secrets(info.get("unit_text"), info.get("env_text"),
                                    info.get("config_text")))
    reports = [_report(r, resolved[r], rendered[r], facts.roles[r]) for r in chosen]
    result = DeployResult(host=host.name, ok=True, dry_run=dry_run, tree=t["root"],
                          roles=reports, notes=_notes(facts),
                          changed=any(r.changed or r.restart for r in reports))
    if dry_run:
        return result
    if not facts.systemd:
        return _failed(result, f"{host.name}: systemd is not running there", Exit.FAILED)
    request = wire.DeployRequest(
        **base, state_sha256=t["state_sha256"], lock_wait=lock_wait,
        bisect=bisect, redact=sorted(scrub.known),
        roles={r: {**_names([r])[r], "unit_text": rendered[r].unit_text,
                   "env_text": rendered[r].env_text,
                   "config_text": rendered[r].config_text,
                   "effective": _effective(facts.roles[r], rendered[r]),
                   "health_url": resolved[r].health_url,
                   "health_timeout": resolved[r].health_timeout} for r in chosen})
    return _outcome(result, transport.call(request, on_event=on_event))


def _names(roles: list[str]) -> dict[str, dict]:
    return {r: {"unit": units.unit_name(r), "unit_path": f"{units.UNIT_DIR}/{units.unit_name(r)}",
                "env_path": f"{units.ENV_DIR}/{r}.env", "config_path": units.config_path(r)}
            for r in roles}


# ---------------------------------------------------------------- redaction

class Scrub:
    """The one redaction point of deploy output. Everything `deploy_units` returns (the diffs,
    the failed unit's journal lines, the error and its details, notes), every progress
    event it streams and every error it raises passes here, through patchset/agent/lib/redact.py:
    by name (`HF_TOKEN=...`, `--api-key ...`, `api-key: ...`), by shape (`hf_...`), and
    every value known to be a secret (the inventory's, the rendered files', the installed
    files') wherever and however it is quoted."""

    def __init__(self, known: set[str] | None = None) -> None:
        self.known: set[str] = set()
        self.red = Redactor()
        self.add(known or set())

    def add(self, values: set[str]) -> None:
        fresh = {v for v in values if isinstance(v, str) and v} - self.known
        if fresh:
            self.known |= fresh
            self.red = Redactor(known=self.known)

    def text(self, text: str) -> str:
        return self.red.text(text)

    def result(self, result: DeployResult) -> DeployResult:
        data = self.red.value(asdict(result))
        roles = [RoleReport(**r) for r in data.pop("roles")]
        return DeployResult(**data, roles=roles)

    def error(self, exc: PatchsetError) -> PatchsetError:
        exc.args = tuple(self.red.text(a) if isinstance(a, str) else a for a in exc.args)
        for name in ("details", "message"):
            if isinstance(getattr(exc, name, None), str):
                setattr(exc, name, self.red.text(getattr(exc, name)))
        return exc

    def events(self, sink: EventSink | None) -> EventSink | None:
        if sink is None:
            return None
        return lambda event: sink(Event.from_json(self.red.value(event.to_json())))


def _secret_args(words: list[str]) -> set[str]:
    """Values of secret flags in an argv (`--api-key V`, `--api-key=V`)."""
    out: set[str] = set()
    for i, word in enumerate(words):
        if not word.startswith("--") or not is_secret_name(word.split("=", 1)[0]):
            continue
        if "=" in word:
            out.add(word.split("=", 1)[1])
        elif i + 1 < len(words):
            out.add(words[i + 1])
    return out


def _secrets_in(value: Any, name: str = "") -> set[str]:
    """Secret values in an inventory/settings mapping: secret-named keys, secret flags."""
    if isinstance(value, dict):
        return set().union(*(_secrets_in(v, str(k)) for k, v in value.items()))
    if isinstance(value, list):
        words = [str(v) for v in value if isinstance(v, (str, int, float))]
        return _secret_args(words) | set().union(*(_secrets_in(v, name) for v in value
                                                   if isinstance(v, (dict, list))))
    if name and is_secret_name(name) and isinstance(value, (str, int)) and \
            not isinstance(value, bool):
        return {str(value)}
    return set()


def inventory_secrets(host: Host) -> set[str]:
    """Every secret the inventory gives this host (before anything is validated)."""
    roles = getattr(host, "roles", None) or {}
    return _secrets_in({"serving": getattr(host, "serving", None) or {},
                        "roles": roles if isinstance(roles, dict) else {}})


def rendered_secrets(resolved: dict[str, units.RoleUnit]) -> set[str]:
    out: set[str] = set()
    for u in resolved.values():
        out |= set(u.config.values()) | {v for k, v in u.env.items() if is_secret_name(k)}
        out |= _secret_args(u.argv)
    return out


def installed_secrets(unit_text: str | None, env_text: str | None,
                      config_text: str | None) -> set[str]:
    """The secrets the files installed now hold (an old key shows in the diff's - lines)."""
    out = {v for k, v in units.parse_env_file(env_text or "").items() if is_secret_name(k)}
    for line in (unit_text or "").splitlines():
        key, _, rest = line.strip().partition("=")
        if key not in ("ExecStart", "Environment"):
            continue
        try:
            words = shlex.split(rest)
        except ValueError:
            words = rest.split()
        words = [w.replace("%%", "%").replace("$$", "$") for w in words]
        out |= _secret_args(words) if key == "ExecStart" else {
            w.split("=", 1)[1] for w in words if "=" in w and is_secret_name(w.split("=")[0])}
    if config_text:
        import yaml
        try:
            data = yaml.safe_load(config_text)
        except yaml.YAMLError:
            data = None
        out |= _secrets_in(data if isinstance(data, dict) else {})
        out |= {line.split(":", 1)[1].strip().strip("\"'") for line in config_text.splitlines()
                if ":" in line and is_secret_name(line.split(":", 1)[0].strip())}
    return {v for v in out if v}


def _notes(facts: wire.FactsResult) -> list[str]:
    t, notes = facts.tree or {}, []
    if t.get("trace_error"):
        notes.append(f"the tracer watches only the markers of served work: the patches' "
                     f"trace targets could not be derived ({t['trace_error']})")
    if not t["managed"]:
        notes.append(f"{t['root']} is not managed by patchset (no state): no patch gates to set")
    if facts.interrupted:
        i = facts.interrupted
        notes.append(f"a deploy interrupted since {i.get('since')} (pid {i.get('pid')}) left "
                     "files behind; the next deploy rolls it back first")
    return notes


def _outcome(result: DeployResult, answer: wire.Result | wire.Failure) -> DeployResult:
    """Fold the runner's answer into the result: actions, recovery, failure + rollback."""
    try:
        raw = raise_for(result.host, answer)
    except BisectPending:
        raise
    except PatchsetError as exc:
        return _failed(result, str(exc), exc.exit_code, exc.details)
    assert isinstance(raw, wire.DeployResult)
    for report in result.roles:
        report.actions = raw.actions.get(report.role, [])
        report.restart = raw.restart_reasons.get(report.role)
    result.changed = raw.changed
    if raw.recovered is not None:
        result.recovered = raw.recovered
        undone = "; ".join(f"{r['unit']} {r['action']}" for r in raw.recovered)
        result.notes = [n for n in result.notes if "interrupted" not in n]
        result.notes.append(f"rolled back an interrupted deploy first: "
                            f"{undone or 'nothing to undo'}")
    failed = raw.failed
    if not failed:
        return result
    result.failed, result.rollback = failed, raw.rollback
    back = "; ".join(f"{r['unit']} {r['action']}"
                     + ("" if r.get("healthy") in (None, True)
                        else f" but NOT healthy: {r.get('error')}")
                     for r in raw.rollback or []) or "nothing had been restarted"
    journal = failed.get("journal") or []
    details = "\n".join([f"last journal lines of {failed['unit']}:"]
                        + [f"  {line}" for line in journal]) if journal else ""
    return _failed(result, f"{result.host}: {failed['reason']}; rolled back: previous unit "
                   f"files restored, {back}", Exit.FAILED, details)


def _facts(transport: Transport, request: wire.FactsRequest) -> wire.FactsResult:
    raw = raise_for(transport.host, transport.call(request))
    if isinstance(raw, wire.FactsResult) and not raw.root:
        transport.elevate()            # env files are root-only: read them as root
        try:
            raw = raise_for(transport.host, transport.call(request))
        except TargetError:
            raise TargetError(f"{transport.host}: deploy needs root there (it writes "
                              "/etc/systemd/system and runs systemctl): connect as root or "
                              "allow passwordless sudo") from None
    assert isinstance(raw, wire.FactsResult)
    return raw


def _failed(result: DeployResult, message: str, code: int, details: str = "") -> DeployResult:
    result.ok, result.error, result.exit_code, result.details = False, message, code, details
    return result


def _effective(facts: dict, r: units.Rendered) -> bool:
    """Would the new files change the running process? Not when only comments (or the
    order of lines) differ, or only a file's mode: then the files are rewritten without a
    restart."""
    old_env = facts.get("env_text")
    return facts.get("unit_text") != r.unit_text or old_env is None or \
        units.parse_env_file(old_env) != units.parse_env_file(r.env_text) or \
        facts.get("config_text") != r.config_text


def _report(role: str, u: units.RoleUnit, r: units.Rendered, facts: dict) -> RoleReport:
    old_unit, old_env = facts.get("unit_text"), facts.get("env_text")
    old_config = facts.get("config_text")
    insecure = facts.get("insecure") or []
    changed = (old_unit, old_env, old_config) != (r.unit_text, r.env_text, r.config_text) \
        or bool(insecure)
    active = (facts.get("systemd") or {}).get("ActiveState")
    stale = bool(facts.get("stale"))
    restart = ("unit or env file changed" if changed and _effective(facts, r)
               else "not running" if active != "active"
               else "stale: started before the tree changed" if stale else None)
    config_path = r.config_path or units.config_path(role) or ""
    diff = "".join(_diff(old_unit, r.unit_text, r.unit_path)
                   + _diff(old_env, r.env_text, r.env_path)
                   + _diff(old_config, r.config_text, config_path))
    notes = list(u.notes) + [f"{x['path']} is mode {x['mode']} owned by uid {x['uid']}: "
                             "rewritten root-only (0600)" for x in insecure]
    return RoleReport(role=role, unit=r.unit, unit_path=r.unit_path, env_path=r.env_path,
                      changed=changed, restart=restart, diff=diff, active=active, stale=stale,
                      gates=dict(u.gates), patches=u.patches, health_url=u.health_url,
                      notes=notes)


def _diff(old: str | None, new: str | None, path: str) -> list[str]:
    """Unified diff of one file (None: the file is absent, or is to be removed)."""
    if old == new:
        return []
    lines = difflib.unified_diff((old or "").splitlines(keepends=True),
                                 (new or "").splitlines(keepends=True),
                                 "/dev/null" if old is None else f"a{path}",
                                 "/dev/null" if new is None else f"b{path}")
    return [line if line.endswith("\n") else line + "\n" for line in lines]


# ---------------------------------------------------------------- after apply

def affected_roles(host: Host, transport: Transport, tree: str, git_prefix: str = "python/",
                   package: str = "sglang") -> tuple[list[str], wire.FactsResult | None]:
    """Installed server roles whose patches or gates differ from the tree's state now, or
    whose process is stale: what `apply --restart` redeploys. Returns (roles, facts)."""
    candidates = [r for r in settings.SERVER_ROLES if r in host.roles]
    if not candidates:
        return [], None
    facts = _facts(transport, wire.FactsRequest(tree=tree, git_prefix=git_prefix,
                                                package=package, roles=_names(candidates)))
    t = facts.tree
    if not t:
        return [], facts
    out = []
    for role in candidates:
        info = facts.roles[role]
        if info.get("unit_text") is None:
            continue
        running = units.parse_env_file(info.get("env_text") or "")
        u = units.resolve(host, [role], t["root"], {"applied": t["applied"],
                                                    "trace": t.get("trace") or {}},
                          t["layout"], git_prefix)[role]
        # the gates as rendered (hosts.yaml may override one); a removed gated patch
        # changes PATCHSET_PATCHES too
        now = {k: u.env[k] for k in ("PATCHSET_PATCHES", *u.gates)}
        if {k: running.get(k) for k in now} != now or info.get("stale"):
            out.append(role)
    return out, facts


def restart_after_apply(series, inventory, specs, transports, results, timeout, lock_wait,
                        on_event, on_host=lambda name: None) -> list[DeployResult | None]:
    """After apply: redeploy, host by host, the server roles whose patches or gates changed
    (or whose process is stale). Stops at the first host that fails (it is rolled back)."""
    out: list[DeployResult | None] = []
    stopped: str | None = None
    for spec, transport, applied in zip(specs, transports, results):
        if not applied.ok:
            out.append(None)
            continue
        if stopped:
            out.append(DeployResult(host=applied.host, ok=False, exit_code=Exit.FAILED,
                                    error=f"{applied.host}: not restarted (stopped after "
                                          f"{stopped} failed)"))
            continue
        host = inventory.resolve(spec)
        on_host(host.name)
        tree = applied.target or str(transport.target)
        try:
            roles, _ = affected_roles(host, transport, tree, series.upstream.git_prefix,
                                      series.upstream.name)
            if not roles:
                out.append(DeployResult(host=applied.host, ok=True,
                                        notes=["no running unit serves a changed role"]))
                continue
            result = deploy_units(host, transport, tree, roles=roles, timeout=timeout,
                                  lock_wait=lock_wait, on_event=on_event,
                                  git_prefix=series.upstream.git_prefix,
                                  package=series.upstream.name)
        except PatchsetError as exc:
            result = DeployResult(host=applied.host, ok=False,
                                  error=Scrub(inventory_secrets(host)).text(str(exc)),
                                  exit_code=exc.exit_code)
        out.append(result)
        if not result.ok:
            stopped = applied.host
    return out


