"""The deploy runner: installs and restarts the SGLang units, on the host they run on.

Standard library only, part of the agent (patchset/agent/): it reuses the engine's
Target, lock and unit facts, and reads a unit's state with the one systemctl reader
(runner.unit_show). The controller ships the agent and the request with the rendered
unit and env files in one tar and reads JSON lines back: progress events
(`{"event": ...}`) while it works, then one `{"result": ...}`. The whole transaction,
rollback included, happens here, so a dropped SSH connection cannot leave it half done
(SIGHUP is ignored and a closed stdout only stops the events).

Ops:
  facts   read-only: the tree and its state, the installed files, the units' state
  deploy  under the deploy lock and the tree's lock: check the state is still the one the
          files were rendered from; `systemd-analyze verify` the new units (any output is a
          failure); install what changed; daemon-reload; enable; restart in order the roles
          that changed, are not running, or are stale; wait for each /health. If a unit
          fails: put every previous file back, daemon-reload, bring the restarted roles
          back to how they were, and report the unit's last journal lines.

A server role's credentials are in ENV_DIR/ROLE.secrets.yaml (SGLang's `--config`): it and
the env file are written 0600 root:root, atomically; one found with another mode or owner
is rewritten. The transaction record holds the previous files, so it is 0600 too.
Everything the runner reports (journal lines, errors) is redacted here first, with the
secrets the controller names in the request (redact.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

from .lib import bounded, redact, safewrite, tracer, wire
from . import engine
from .lib.protocol import Events
from .lib.records import TreeState, UnitStatus
from .runner import unit_show


SECRET_MODE = 0o600
UNIT_PROPS = ("ActiveState", "SubState", "MainPID", "NRestarts", "Result", "ExecMainStatus",
              "ExecMainCode", "UnitFileState", "LoadState")

EngineError = engine.EngineError
DEPLOY_LOCK = "/run/lock/patchset-deploy.lock"
RECORD_DIR = "/var/lib/patchset/deploy"
JOURNAL_LINES = 30
POLL_S = 1.0          # /health poll interval
POLL_FAST_S = 0.2     # ... during the first FAST_FOR_S seconds (a quick restart)
FAST_FOR_S = 5.0
SYSTEMCTL_TIMEOUT = 120


# ---------------------------------------------------------------- small helpers

def run(args: list[str], timeout: float = SYSTEMCTL_TIMEOUT) -> subprocess.CompletedProcess:
    env = dict(os.environ, LC_ALL="C.UTF-8", SYSTEMD_PAGER="", SYSTEMD_COLORS="0")
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", f"{args[0]} timed out after "
                                           f"{timeout:.0f}s")
    except OSError as exc:
        return subprocess.CompletedProcess(args, 127, "", str(exc))


UNIT_LIMIT = 4 * bounded.MIB      # a unit, env or server config file: kilobytes


def read_text(path: str) -> str | None:
    """A unit, env or config file the deployer compares or keeps (None: absent), through
    the bounded reader: a FIFO or device planted there must not hang a deploy."""
    try:
        return bounded.read_text(path, UNIT_LIMIT, "unit file")
    except bounded.Missing:
        return None
    except bounded.InputError as exc:
        raise EngineError(str(exc)) from None


def write_file(path: str, text: str, mode: int) -> None:
    """Whole, with `mode`, owned by root when we are; never through or over a link or
    anything but a regular file (safewrite)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    safewrite.write_file(path, text.encode("utf-8"), mode, owner_root=True)


def insecure(spec: dict) -> list[dict]:
    """The role's secret-bearing files (env, --config) that exist with another mode than
    0600 or another owner than root."""
    out = []
    for path in (spec.get("env_path"), spec.get("config_path")):
        try:
            st = os.lstat(path) if path else None
        except FileNotFoundError:
            st = None
        if st is not None and (st.st_mode & 0o7777 != SECRET_MODE or st.st_uid != 0):
            out.append({"path": path, "mode": f"{st.st_mode & 0o7777:04o}", "uid": st.st_uid})
    return out


def remove_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def sha256(data: bytes | None) -> str:
    return hashlib.sha256(data or b"").hexdigest()


def journal(unit: str, lines: int = JOURNAL_LINES) -> list[str]:
    proc = run(["journalctl", "--no-pager", "--quiet", "-o", "short-iso", "-n", str(lines),
                "-u", unit])
    return proc.stdout.splitlines()[-lines:]


def systemctl(*args: str) -> None:
    proc = run(["systemctl", *args])
    if proc.returncode != 0:
        raise EngineError(f"systemctl {' '.join(args)} failed: "
                          f"{(proc.stderr or proc.stdout).strip() or proc.returncode}")


def probe(url: str, timeout: float) -> tuple[bool, str]:
    """GET url without any proxy, within `timeout` for the whole exchange: (healthy,
    what was seen)."""
    import http.client

    from .lib import httpdeadline
    try:
        status, _ = httpdeadline.get(url, {}, timeout, 4096)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return False, httpdeadline.reason(exc)
    return status == 200, f"HTTP {status}"


@contextlib.contextmanager
def flock(path: str, wait: float, what: str) -> Iterator[None]:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        if not engine.acquire_flock(handle, wait):
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise EngineError(f"{what} is running ({holder}); wait for it or pass "
                              "--lock-wait SECONDS", "locked")
        handle.seek(0)
        handle.truncate()
        handle.write(f"patchset deploy, pid {os.getpid()}, since {engine.now()}\n")
        handle.flush()
        yield


# ---------------------------------------------------------------- the tree

def open_tree(request: wire.FactsRequest | wire.DeployRequest) -> "engine.Target | None":
    path = Path(os.path.expanduser(request.tree))
    if not path.exists():
        return None
    return engine.Target(str(path), request.git_prefix, request.package)


def state_bytes(target: "engine.Target | None") -> bytes | None:
    if target is None:
        return None
    try:
        return bounded.read_bytes(target.state_file, engine.STATE_LIMIT, "state record")
    except bounded.Missing:
        return None
    except bounded.InputError as exc:
        raise EngineError(str(exc)) from None


def units_by_name(target: "engine.Target | None",
                  state: "TreeState | None") -> dict[str, UnitStatus]:
    if target is None:
        return {}
    return {u.unit: u for u in engine.unit_facts(target, state)}


def show(unit: str) -> dict[str, Any]:
    """The unit's state through the one systemctl reader (runner.unit_show), only the
    properties a deploy decides by: never Environment= or ExecStart= (an older unit may
    hold a key there) in what the runner returns."""
    props = unit_show(unit)
    return {k: props[k] for k in UNIT_PROPS if k in props}


# ---------------------------------------------------------------- facts

def op_facts(request: wire.FactsRequest, events: Events) -> wire.FactsResult:
    target = open_tree(request)
    state = target.state() if target else None
    facts = units_by_name(target, state)
    roles = {}
    for role, spec in request.roles.items():
        unit = spec["unit"]
        roles[role] = {
            "unit_text": read_text(spec["unit_path"]), "env_text": read_text(spec["env_path"]),
            "config_text": read_text(spec["config_path"]) if spec.get("config_path") else None,
            "insecure": insecure(spec),
            "systemd": show(unit) if systemd_running() else {},
            "stale": bool(unit in facts and facts[unit].stale),
            "facts": asdict(facts[unit]) if unit in facts else None,
        }
    return wire.FactsResult(
        root=os.geteuid() == 0, systemd=systemd_running(),
        tree=None if target is None else {
            "root": str(target.root), "layout": target.layout, "managed": state is not None,
            "state_sha256": sha256(state_bytes(target)),
            "applied": [a.to_json() for a in state.applied] if state else [],
            "updated": state.updated if state else None,
            **_trace_targets(target, state),
            "bisect": engine.read_json(target.bisect_file),
        },
        roles=roles,
        interrupted=({k: v for k, v in txn.items() if k in ("pid", "since")}
                     if (txn := engine.read_json(txn_file())) else None),
    )


def _trace_targets(target: "engine.Target", state: "TreeState | None") -> dict:
    """{"trace": what the tracer is to watch for each applied patch (engine.trace_targets),
    "trace_error": why not, when it cannot be had (the tracer then watches only the
    markers of served work; deploy says so)}."""
    try:
        return {"trace": engine.trace_targets(target, state), "trace_error": None}
    except (EngineError, OSError) as exc:
        return {"trace": {}, "trace_error": f"{exc} {getattr(exc, 'details', '')}".strip()}


def install_tracer() -> None:
    """tracer.HOME/{sitecustomize.py, patchset_tracer.py} from this agent, 0644 root: what
    a unit with PATCHSET_TRACE puts first on its PYTHONPATH. Rewritten only if changed."""
    here = Path(__file__).resolve().parent
    _root_only_dirs(tracer.HOME)
    for name, source in (("sitecustomize.py", here / "sitecustomize.py"),
                         ("patchset_tracer.py", here / "lib" / "tracer.py")):
        text = source.read_text(encoding="utf-8")
        dest = os.path.join(tracer.HOME, name)
        st = os.lstat(dest) if os.path.lexists(dest) else None
        if st is None or read_text(dest) != text or st.st_uid != 0 or st.st_mode & 0o7022 or \
                not os.path.isfile(dest) or os.path.islink(dest):
            write_file(dest, text, 0o644)


def _root_only_dirs(path: str, top: str = "/var/lib") -> None:
    """The tracer's directory goes first on a root server's PYTHONPATH: it and its parents
    below `top` must be root's and writable by root alone, never a link (a directory
    someone else could write would be code run as root). Created 0755 or put right; a link
    is refused."""
    chain, current = [], Path(path)
    while current != Path(top) and current != current.parent:
        chain.append(current)
        current = current.parent
    if current != Path(top):
        raise EngineError(f"{path} is not below {top}", "usage")
    for d in chain:
        if d.is_symlink():
            raise EngineError(f"{d} is a symbolic link: refusing to install the tracer "
                              "there (it would run as root in every server)", "target")
    os.makedirs(path, 0o755, exist_ok=True)
    for d in chain:
        st = os.lstat(d)
        if st.st_uid != 0 or st.st_mode & 0o022:
            os.chown(d, 0, 0)
            os.chmod(d, 0o755)


def systemd_running() -> bool:
    return Path("/run/systemd/system").is_dir()


# ---------------------------------------------------------------- deploy

class Failure(Exception):
    def __init__(self, role: str, unit: str, reason: str) -> None:
        super().__init__(reason)
        self.role, self.unit, self.reason = role, unit, reason


def op_deploy(request: wire.DeployRequest, events: Events) -> wire.DeployResult:
    if os.geteuid() != 0:
        raise EngineError("deploy needs root on the host (it writes /etc/systemd/system and "
                          "runs systemctl): connect as root or allow passwordless sudo",
                          "need_root")
    if not systemd_running():
        raise EngineError("systemd is not running on this host (no /run/systemd/system)",
                          "usage")
    wait = request.lock_wait
    with flock(DEPLOY_LOCK, wait, "another patchset deploy"):
        recovered = recover(events)
        target = open_tree(request)
        if target is None:
            raise EngineError(f"no SGLang tree at {request.tree}: run `patchset apply` "
                              "first", "usage")
        lock = target.lock(wait, "deploy") if target.meta.exists() else contextlib.nullcontext()
        with lock:
            return dataclasses.replace(_deploy_locked(request, target, events),
                                       recovered=recovered)


def _deploy_locked(request: wire.DeployRequest, target: "engine.Target",
                   events: Events) -> wire.DeployResult:
    if sha256(state_bytes(target)) != request.state_sha256:
        raise EngineError(f"the tree at {target.root} changed since the units were rendered "
                          "(an apply or revert ran in between); run deploy again", "changed")
    engine.refuse_during_bisect(target, request)
    roles = request.roles                    # in restart order
    old = {r: files_of(s) for r, s in roles.items()}
    changed = [r for r, s in roles.items() if old[r] != new_files(s) or insecure(s)]
    verify(roles, events)
    before = {r: show(s["unit"]) for r, s in roles.items()}
    restart = restart_reasons(roles, changed, before, units_by_name(target, target.state()))
    actions: dict[str, list[str]] = {r: [] for r in roles}
    install_tracer()
    begin(roles, old, before)
    try:
        install(roles, changed, old, actions, events)
        for role, spec in roles.items():
            if role in restart:
                events("restart", role=role, unit=spec["unit"], reason=restart[role])
                actions[role].append("restarted")
                try:
                    systemctl("restart", "--", spec["unit"])
                except EngineError as exc:
                    raise Failure(role, spec["unit"], str(exc)) from None
                wait_healthy(role, spec, events, "deploy")
    except (Failure, EngineError, OSError) as exc:
        failure = exc if isinstance(exc, Failure) else Failure("", "", str(exc))
        red = redactor(request)
        lines = [red.text(line) for line in journal(failure.unit)] if failure.unit else []
        status = show(failure.unit) if failure.unit else {}
        touched = [r for r in roles if actions[r]]
        restarted = [r for r in roles if "restarted" in actions[r]]
        rollback = roll_back(roles, old, touched, restarted, before, events)
        finish()
        return wire.DeployResult(**red.value(dict(
            deployed=False, changed=bool(touched),
            failed={"role": failure.role, "unit": failure.unit, "reason": failure.reason,
                    "journal": lines, "result": status.get("Result"),
                    "exit_status": status.get("ExecMainStatus")},
            rollback=rollback, actions=actions, restart_reasons=restart)))
    finish()
    record(request, actions)
    return wire.DeployResult(deployed=True, changed=any(actions.values()), actions=actions,
                             restart_reasons=restart, failed=None, rollback=None)


def files_of(spec: dict) -> tuple:
    """(unit, env, --config) text installed now (None: absent)."""
    config = spec.get("config_path")
    return (read_text(spec["unit_path"]), read_text(spec["env_path"]),
            read_text(config) if config else None)


def new_files(spec: dict) -> tuple:
    return (spec["unit_text"], spec["env_text"], spec.get("config_text"))


def redactor(request: wire.Request) -> Any:
    return redact.Redactor(known=getattr(request, "redact", ()))


def restart_reasons(roles: dict, changed: list[str], before: dict,
                    facts: dict[str, UnitStatus]) -> dict[str, str]:
    """Which roles to restart, and why: new files (unless the controller found the change
    has no effect on the process, e.g. comments only), not running, or stale."""
    out = {}
    for role, spec in roles.items():
        if role in changed and spec.get("effective", True):
            out[role] = "unit or env file changed"
        elif before[role].get("ActiveState") != "active":
            out[role] = "not running"
        elif spec["unit"] in facts and facts[spec["unit"]].stale:
            out[role] = "stale: started before the tree changed"
    return out


def install(roles: dict, changed: list[str], old: dict, actions: dict, events: Events) -> None:
    """Write the changed files (credentials and env first, 0600), daemon-reload, enable."""
    for role in changed:                       # only what differs: an unchanged unit file
        spec = roles[role]                     # keeps its mtime (no daemon-reload pending)
        bad = {x["path"] for x in insecure(spec)}
        config = spec.get("config_path")
        if config and (old[role][2] != spec.get("config_text") or config in bad):
            if spec.get("config_text") is None:
                remove_file(config)
            else:
                write_file(config, spec["config_text"], SECRET_MODE)
        if old[role][1] != spec["env_text"] or spec["env_path"] in bad:
            write_file(spec["env_path"], spec["env_text"], SECRET_MODE)
        if old[role][0] != spec["unit_text"]:
            write_file(spec["unit_path"], spec["unit_text"], 0o644)
        actions[role].append("installed")
    if any(old[r][0] != roles[r]["unit_text"] for r in changed):
        systemctl("daemon-reload")
        events("step", message="daemon-reload")
    for role, spec in roles.items():
        if show(spec["unit"]).get("UnitFileState") != "enabled":
            systemctl("enable", "--quiet", "--", spec["unit"])
            actions[role].append("enabled")


# The transaction record: what to put back if this runner dies half way (SIGKILL, OOM,
# reboot). The next deploy finds it and rolls back before anything else.

def txn_file() -> Path:
    return Path(RECORD_DIR) / "txn.json"


def begin(roles: dict, old: dict, before: dict) -> None:
    """The record holds the previous env and --config files: root only (0700 / 0600)."""
    Path(RECORD_DIR).mkdir(parents=True, exist_ok=True)
    os.chmod(RECORD_DIR, 0o700)
    keep = ("unit", "unit_path", "env_path", "config_path", "health_url", "health_timeout")
    record = {"pid": os.getpid(), "since": engine.now(), "roles": {
        r: {**{k: s.get(k) for k in keep}, "old_unit": old[r][0], "old_env": old[r][1],
            "old_config": old[r][2],
            "before": {k: before[r].get(k) for k in ("ActiveState", "UnitFileState")}}
        for r, s in roles.items()}}
    write_file(str(txn_file()), json.dumps(record, indent=2, sort_keys=True) + "\n",
               SECRET_MODE)


def finish() -> None:
    remove_file(str(txn_file()))


def recover(events: Events) -> list[dict] | None:
    """Roll back a deploy whose runner died: restore its files, restore its units."""
    txn = engine.read_json(txn_file())
    if not txn:
        return None
    roles = txn["roles"]
    old = {r: (x["old_unit"], x["old_env"], x.get("old_config")) for r, x in roles.items()}
    touched = [r for r, x in roles.items()
               if files_of(x) != old[r]
               or show(x["unit"]).get("ActiveState") != x["before"].get("ActiveState")]
    events("step", message=f"rolling back an interrupted deploy (pid {txn.get('pid')}, "
                           f"since {txn.get('since')})")
    out = roll_back(roles, old, touched, touched, {r: x["before"] for r, x in roles.items()},
                    events)
    finish()
    return out


def verify(roles: dict, events: Events) -> None:
    """systemd-analyze verify the new units; it exits 0 on warnings, so any output fails."""
    stage = Path(tempfile.mkdtemp(prefix="patchset-verify-", dir="/run"))
    try:
        paths = []
        for spec in roles.values():
            path = stage / spec["unit"]
            path.write_text(spec["unit_text"], encoding="utf-8")
            paths.append(str(path))
        args = ["systemd-analyze", "verify", "--man=no", "--recursive-errors=no", *paths]
        proc = run(args)
        if "recursive-errors" in proc.stderr and proc.returncode != 0:
            proc = run([a for a in args if not a.startswith("--recursive-errors")])
        output = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0 or output:
            text = output.replace(str(stage) + "/", "") or f"exit status {proc.returncode}"
            raise EngineError(f"systemd-analyze verify refused the units (nothing was "
                              f"installed): {text.splitlines()[0]}", "verify", details=text)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    events("step", message=f"systemd-analyze verify: {len(roles)} unit(s) clean")

def wait_healthy(role: str, spec: dict, events: Events, phase: str) -> float:
    """Poll /health until 200; fail fast when the unit stops or restarts; then timeout.
    (MainPID is an int: runner.unit_show parses it.)"""
    unit, url, timeout = spec["unit"], spec["health_url"], float(spec["health_timeout"])
    start = time.monotonic()
    first = show(unit)
    pid0, restarts0 = first.get("MainPID"), int(first.get("NRestarts") or 0)
    seen = "not polled yet"
    events("wait", role=role, unit=unit, phase=phase, url=url, elapsed=0.0, timeout=timeout,
           detail="starting")
    while True:
        elapsed = time.monotonic() - start
        ok, seen = probe(url, max(0.5, min(5.0, timeout - elapsed)))
        elapsed = time.monotonic() - start
        if ok:
            events("healthy", role=role, unit=unit, phase=phase, elapsed=round(elapsed, 2),
                   timeout=timeout)
            return elapsed
        st = show(unit)
        state = st.get("ActiveState")
        if (state in ("failed", "inactive", "deactivating") or st.get("SubState") == "auto-restart"
                or int(st.get("NRestarts") or 0) > restarts0
                or (st.get("MainPID") not in (pid0, 0) and pid0 != 0)):
            code = st.get("ExecMainStatus")
            raise Failure(role, unit, f"{unit} stopped while starting ({state}/"
                          f"{st.get('SubState')}, result {st.get('Result')}, exit status "
                          f"{code}) after {elapsed:.0f}s")
        if elapsed >= timeout:
            raise Failure(role, unit, f"{unit} did not report healthy at {url} within "
                          f"{timeout:.0f}s (last: {seen})")
        events("wait", role=role, unit=unit, phase=phase, url=url, elapsed=round(elapsed, 2),
               timeout=timeout, detail=seen)
        pause = POLL_FAST_S if elapsed < FAST_FOR_S else POLL_S
        time.sleep(min(pause, max(0.0, timeout - elapsed)))

def roll_back(roles: dict, old: dict, touched: list[str], restarted: list[str],
              before: dict, events: Events) -> list[dict]:
    """Put the previous files of the `touched` roles back; a new unit is disabled and
    stopped; of the `restarted` ones, a stopped unit is stopped again and a running one
    restarted with its previous files and waited for; enabling is undone."""
    out = []
    for role in touched:                       # new units go before their files do
        if old[role][0] is None:
            run(["systemctl", "disable", "--now", "--quiet", "--", roles[role]["unit"]])
            run(["systemctl", "reset-failed", "--", roles[role]["unit"]])
    for role in touched:
        spec = roles[role]
        for path, text, mode in ((spec["unit_path"], old[role][0], 0o644),
                                 (spec["env_path"], old[role][1], SECRET_MODE),
                                 (spec.get("config_path"), old[role][2], SECRET_MODE)):
            if not path:
                continue
            if text is None:
                remove_file(path)
            elif read_text(path) != text:
                write_file(path, text, mode)
    if touched:
        run(["systemctl", "daemon-reload"])
        events("step", message="rollback: previous unit files restored, daemon-reload")
    for role in touched:
        spec, was = roles[role], before[role]
        unit = spec["unit"]
        entry = {"role": role, "unit": unit, "healthy": None}
        if old[role][0] is None:
            entry["action"] = "removed (it was new)"
        elif role not in restarted:
            entry["action"] = "previous files restored (it was not restarted)"
        elif was.get("ActiveState") != "active":
            run(["systemctl", "stop", "--", unit])
            entry["action"] = f"stopped (it was {was.get('ActiveState')})"
        else:
            events("restart", role=role, unit=unit, reason="rollback")
            proc = run(["systemctl", "restart", "--", unit])
            entry["action"] = "restarted with the previous files"
            if proc.returncode != 0:
                entry.update(healthy=False, error=(proc.stderr or proc.stdout).strip())
            else:
                try:
                    wait_healthy(role, previous_spec(spec, old[role][0]), events, "rollback")
                    entry["healthy"] = True
                except Failure as exc:
                    entry.update(healthy=False, error=exc.reason)
        if old[role][0] is not None and was.get("UnitFileState") != "enabled":
            run(["systemctl", "disable", "--quiet", "--", unit])
        out.append(entry)
    return out


def previous_spec(spec: dict, unit_text: str | None) -> dict:
    """Health URL of the previous unit (it may have had another port)."""
    for line in (unit_text or "").splitlines():
        if line.startswith("X-Patchset-Health="):
            return dict(spec, health_url=line.split("=", 1)[1].strip())
    return spec


def record(request: wire.DeployRequest, actions: dict) -> None:
    with contextlib.suppress(OSError):
        Path(RECORD_DIR).mkdir(parents=True, exist_ok=True)
        write_file(str(Path(RECORD_DIR) / "last.json"), json.dumps(
            {"time": engine.now(), "tree": request.tree, "actions": actions,
             "tool_version": request.tool_version}, indent=2, sort_keys=True) + "\n",
            0o644)


# ---------------------------------------------------------------- entry points

def serve(request: wire.Request, bundle: str | Path = ".",
          events: Events | None = None) -> wire.Result | wire.Failure:
    """The unit ops' frame (wire.OPS names the op's function): a refusal is a Failure,
    redacted of the request's secrets."""
    try:
        function = wire.op_function(sys.modules[__name__], request)
        return function(request, events or Events())
    except (EngineError, wire.WireError) as exc:
        red = redactor(request)
        return wire.Failure(exc.kind, red.text(str(exc)),
                            red.text(getattr(exc, "details", "") or ""))
