"""The systemd units of one host: resolving each role's unit from its settings, and
rendering the unit, env and credentials files.

Three roles, one unit and one env file each:

    sglang-prefill.service  /etc/sglang/prefill.env   python -m sglang.launch_server ...
    sglang-decode.service   /etc/sglang/decode.env      --disaggregation-mode prefill|decode
    sglang-router.service   /etc/sglang/router.env    python -m sglang_router.launch_router

Settings come from hosts.yaml (`serving:` for the whole host, `roles.ROLE:` per role,
the role wins) as connect/settings.py's RoleSettings, which holds the schema, every
default and the systemd escaping; the patch gates come from the state on the host (passed
in as data). Every value that reaches a unit or env file is checked twice: at inventory
load (so a bad value is a `file:line: field` error before any host is contacted) and
again here at render time (gates and patch names come from the host). Unit-file values
refuse newlines, control characters, quotes and backslashes, and get `%` and `$` escaped
for systemd; env-file values may hold anything but newlines and control characters and
are quoted for systemd's EnvironmentFile= parser.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from patchset import validate
from patchset.errors import PatchsetError, UsageError

from patchset.agent.lib import staleness, tracer
from patchset.agent.lib.facts.systemd import parse_env_file
from patchset.connect.inventory import Host
from patchset.connect.settings import (ABS_PATH, CONFIG_SUFFIX, ENV_NAME, MANAGED_ENV,
                                      MANAGED_FLAGS, PATCH_NAME, SCHEMA, SECRET_SETTINGS,
                                      SERVER_ROLES, RoleSettings, SettingError,
                                      check_settings, env_value, exec_line, secret_flag,
                                      unit_value)

UNIT_DIR = "/etc/systemd/system"
ENV_DIR = "/etc/sglang"
TEMPLATE_DIRS = (Path(__file__).resolve().parent.parent / "systemd",   # a checkout
                 Path(sys.prefix) / "share" / "patchset" / "systemd")     # an install

# The tracer (patchset/agent/lib/tracer.py): installed by the deploy runner in TRACE_HOME
# (sitecustomize.py + patchset_tracer.py, first on the unit's PYTHONPATH); each role's
# records go to its root-only RuntimeDirectory, which systemd removes when the unit stops.
TRACE_HOME = tracer.HOME
TRACE_RUN = tracer.RUN_DIR
# The server's forward entry (0.5.14's ModelRunner.forward, in the scheduler processes):
# the tracer counts its calls per forward mode, the only work that can show a patched
# kernel did not run (request handling in the main process never does).
FORWARD_ENTRIES = ("sglang.srt.model_executor.model_runner:ModelRunner.forward",)
FORWARD = tracer.FORWARD
TRACE_MODULE = validate.MODULE_NAME
TRACE_QUALNAME = validate.QUALNAME

# ---------------------------------------------------------------- resolved per-role config

@dataclass(frozen=True)
class RoleUnit:
    """Everything one role's unit and env file are rendered from."""

    role: str
    unit: str                       # sglang-ROLE.service
    unit_path: str
    env_path: str
    argv: list[str]
    env: dict[str, str]             # env file contents, in order
    gates: dict[str, str]           # the subset of env that are patch gates
    gate_sources: dict[str, list[str]]
    overridden_gates: dict[str, tuple[str, str]]   # name -> (gate value, inventory value)
    health_url: str
    health_timeout: float           # seconds: the settings' int, or deploy --health-timeout
    settings: RoleSettings
    tree: str | None                # None for the router (it does not import the tree)
    patches: str                    # PATCHSET_PATCHES: the applied patches this role runs
    notes: list[str] = field(default_factory=list)
    config: dict[str, str] = field(default_factory=dict)   # credentials: `--config` file
    config_path: str | None = None  # ENV_DIR/ROLE.secrets.yaml (server roles)
    trace: bool = False             # the tracer runs in this role's processes


def unit_name(role: str) -> str:
    return f"sglang-{role}.service"


def config_path(role: str) -> str | None:
    """Where a server role's credentials go (root only, 0600); None for the router."""
    return f"{ENV_DIR}/{role}{CONFIG_SUFFIX}" if role in SERVER_ROLES else None


def role_settings(host: Host, role: str) -> RoleSettings:
    """serving (shared) + roles.ROLE, validated again; env merged, the role's wins, the
    schema's defaults filled in."""
    where = f"{host.name}: hosts.{host.name}"
    try:
        shared = check_settings(None, host.serving or {})
    except SettingError as exc:
        raise UsageError(f"{where}.serving.{'.'.join(map(str, exc.path))}: {exc}") from None
    if role not in host.roles:
        raise UsageError(f"{host.name}: no role {role!r} in hosts.yaml (hosts.{host.name}.roles "
                         f"has: {', '.join(host.roles) or 'none'})")
    try:
        own = check_settings(role, host.roles[role] or {})
    except SettingError as exc:
        raise UsageError(f"{where}.roles.{role}.{'.'.join(map(str, exc.path))}: {exc}") from None
    return RoleSettings.of(role, shared, own)


def _require(host: Host, role: str, value: Any, key: str) -> Any:
    """`value`, the setting `key` of `role`, which deploy cannot do without."""
    if value is None:
        shared = f" or hosts.{host.name}.serving" if SCHEMA[key].shared else ""
        raise UsageError(f"{host.name}: hosts.{host.name}.roles.{role}.{key} is required to "
                         f"deploy (set it there{shared})")
    return value


def _connect_host(bind: str) -> str:
    return "127.0.0.1" if bind in ("0.0.0.0", "::", "127.0.0.1", "localhost") else bind


def role_applied(applied: list[dict], role: str) -> list[dict]:
    """The applied patches whose code runs in `role`, in order (the one rule:
    patchset/agent/lib/staleness.py)."""
    return staleness.role_applied(applied, role)


def trace_value(applied: list[dict], traces: dict) -> str:
    """PATCHSET_TRACE: `NAME:SHA12=MODULE:QUALNAME,...` for every applied patch (its
    targets as the host derived them: patchset/agent/lib/tracetargets.py, each prefixed by
    what a returned call of it shows (tracer.FLAGS: `!` a compiled kernel, never
    watchable; `+` the patch's own function; `=` an upstream function whose changed lines
    run on every call; `?` one whose changed lines may not), then `~forward=` the server's
    forward entry. Every role watches every
    applied patch, so a path tag is checked against what ran. Every name is checked again
    here: the targets come from the host."""
    words = []
    for a in applied:
        word = f"{a.get('name')}:{str(a.get('sha256') or '')[:12]}"
        targets = list(traces.get(word) or [])
        for t in targets:
            if not (TRACE_MODULE.ok(str(t.get("module"))) and
                    TRACE_QUALNAME.ok(str(t.get("qualname")))):
                raise UsageError(f"the host reports a trace target {t.get('module')!r}:"
                                 f"{t.get('qualname')!r} for {word}: not a module and "
                                 "qualified name (is the tree damaged?)")
        if targets:
            words.append(word + "=" + ",".join(
                f"{tracer.evidence_flag(t)}{t['module']}:{t['qualname']}" for t in targets))
    return " ".join(words + [f"{FORWARD}=" + ",".join(FORWARD_ENTRIES)])


def patches_value(applied: list[dict], role: str) -> str:
    """PATCHSET_PATCHES: `name:sha12 ...` of the patches this role runs (stale detection)."""
    words = []
    for a in role_applied(applied, role):
        name, sha = str(a.get("name")), str(a.get("sha256") or "")
        if not PATCH_NAME.ok(name) or not validate.SHORT_SHA.ok(sha):
            raise UsageError(f"the host's state lists a patch {name!r} with sha256 {sha!r}: "
                             "not a valid patch record (is the state damaged?)")
        words.append(f"{name}:{sha[:12]}")
    return " ".join(words)


def role_gates(applied: list[dict], role: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Gate env of the applied patches that run in `role`; conflicting gates refused."""
    gates: dict[str, str] = {}
    sources: dict[str, list[str]] = {}
    for a in role_applied(applied, role):
        gate = a.get("gate")
        if not gate:
            continue
        name, on = gate.get("env"), gate.get("on")
        if not ENV_NAME.ok(name) or name in MANAGED_ENV:
            raise UsageError(f"patch {a.get('name')}: gate variable {name!r} is not usable")
        if not validate.GATE_VALUE.ok(on):
            raise UsageError(f"patch {a.get('name')}: gate value {validate.printable(repr(on))} "
                             f"is not {validate.GATE_VALUE.what}")
        if name in gates and gates[name] != str(on):
            raise UsageError(f"patches {', '.join(sources[name])} and {a.get('name')} gate on "
                             f"{name} with different values ({gates[name]!r}, {str(on)!r})")
        gates[name] = str(on)
        sources.setdefault(name, []).append(str(a.get("name")))
    return gates, sources


def import_root(tree: str, layout: str | None, git_prefix: str = "python/") -> str:
    """The directory that holds `sglang/` in the tree (what PYTHONPATH must name)."""
    if layout == "wheel":
        return tree
    return tree.rstrip("/") + "/" + git_prefix.strip("/")


def resolve(host: Host, roles: list[str], tree: str, state: dict | None,
            layout: str | None, git_prefix: str = "python/") -> dict[str, RoleUnit]:
    """The units of `roles` on `host`, from the inventory and the host's state."""
    applied = (state or {}).get("applied", [])
    python = host.python or "python3"
    if not ABS_PATH.ok(python):
        raise UsageError(f"{host.name}: hosts.{host.name}.python must be an absolute path to "
                         f"deploy units (got {python!r})")
    out = {}
    for role in roles:
        settings = role_settings(host, role)
        if role == "router":
            out[role] = _router(host, settings, python)
        else:
            out[role] = _server(host, role, settings, python, tree, applied, layout, git_prefix,
                                (state or {}).get("trace") or {})
    return out


def _server(host: Host, role: str, settings: RoleSettings, python: str, tree: str,
            applied: list, layout: str | None, git_prefix: str, traces: dict) -> RoleUnit:
    model = _require(host, role, settings.model_path, "model_path")
    gpus = _require(host, role, settings.gpus, "gpus")
    port = _require(host, role, settings.port, "port")
    bind = settings.host
    argv = [python, "-m", "sglang.launch_server", "--model-path", model,
            "--disaggregation-mode", role, "--host", bind, "--port", str(port),
            "--tp-size", str(settings.tp), "--disaggregation-transfer-backend",
            settings.transfer_backend]
    if role == "prefill":
        argv += ["--disaggregation-bootstrap-port", str(settings.bootstrap_port)]
    if settings.ib_device:
        argv += ["--disaggregation-ib-device", settings.ib_device]
    extra, config = _credentials(host, role, settings, _extra(host, role, settings))
    argv += extra
    if config:
        argv += ["--config", config_path(role)]
    gates, sources = role_gates(applied, role)
    own = settings.env
    overridden = {k: (v, own[k]) for k, v in gates.items() if k in own and own[k] != v}
    # SPT_NOENV=1: setproctitle must not overwrite the scheduler children's environ, which
    # is where the audit reads the gates those children really run with.
    env = {"CUDA_VISIBLE_DEVICES": gpus, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "SPT_NOENV": "1"}
    paths = ([TRACE_HOME] if settings.trace else []) + \
        ([import_root(tree, layout, git_prefix)] if settings.pythonpath else [])
    if paths:
        env["PYTHONPATH"] = ":".join(paths)
    env.update({"PATCHSET_TREE": tree, "PATCHSET_PATCHES": patches_value(applied, role)})
    if settings.trace:
        env.update({"PATCHSET_TRACE": trace_value(applied, traces),
                    "PATCHSET_TRACE_DIR": f"{TRACE_RUN}/{role}"})
    env.update({k: v for k, v in gates.items() if k not in own})
    env.update(own)
    notes = [f"gate {k} of {', '.join(sources[k])} is set to {inv!r} by hosts.yaml (the patch "
             f"is applied but gated {'off' if inv != on else 'on'})"
             for k, (on, inv) in overridden.items()]
    return RoleUnit(role=role, unit=unit_name(role), unit_path=f"{UNIT_DIR}/{unit_name(role)}",
                    env_path=f"{ENV_DIR}/{role}.env", argv=argv, env=env,
                    gates={k: env[k] for k in gates}, gate_sources=sources,
                    overridden_gates=overridden,
                    health_url=f"http://{_url_host(_connect_host(bind))}:{port}/health",
                    health_timeout=settings.health_timeout, settings=settings, tree=tree,
                    patches=env["PATCHSET_PATCHES"], notes=notes, config=config,
                    config_path=config_path(role) if config else None,
                    trace="PATCHSET_TRACE" in env)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _extra(host: Host, role: str, settings: RoleSettings) -> list[str]:
    extra = settings.extra_args
    for word in extra:
        flag = word.split("=", 1)[0]
        if flag in MANAGED_FLAGS[role] or (flag == "--config" and role in SERVER_ROLES):
            raise UsageError(f"{host.name}: hosts.{host.name}.roles.{role}.extra_args: "
                             f"{flag} is rendered by deploy; set it with the "
                             "role's own setting instead")
    return list(extra)


def _credentials(host: Host, role: str, settings: RoleSettings,
                 extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """(extra_args without credentials, the `--config` file's entries): api_key,
    admin_api_key and every secret flag of extra_args (`--api-key V`, `--x-password=V`)."""
    config = settings.credentials()
    given = {cli: f"{key} (hosts.{host.name})" for key, cli in SECRET_SETTINGS.items()
             if cli in config}
    kept, index = [], 0
    while index < len(extra):
        word, flag = extra[index], secret_flag(extra[index])
        if flag is None:
            kept.append(word)
            index += 1
            continue
        if "=" in word:
            value, index = word.split("=", 1)[1], index + 1
        elif index + 1 < len(extra):
            value, index = extra[index + 1], index + 2
        else:
            raise UsageError(f"{host.name}: hosts.{host.name}.roles.{role}.extra_args: {flag} "
                             "needs a value")
        key = flag[2:]
        if key in config:
            raise UsageError(f"{host.name}: hosts.{host.name}.roles.{role}: {flag} is given "
                             f"twice ({given[key]} and extra_args)")
        config[key], given[key] = value, "extra_args"
    return kept, config


def _router(host: Host, settings: RoleSettings, python: str) -> RoleUnit:
    port = _require(host, "router", settings.port, "port")
    bind = settings.host
    prefill = settings.prefill or _local_worker(host, "prefill")
    decode = settings.decode or _local_worker(host, "decode")
    argv = [python, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    for entry in prefill:
        argv += ["--prefill", entry["url"]]
        if entry.get("bootstrap_port"):
            argv.append(str(entry["bootstrap_port"]))
    for entry in decode:
        argv += ["--decode", entry["url"]]
    argv += ["--host", bind, "--port", str(port)] + _extra(host, "router", settings)
    return RoleUnit(role="router", unit=unit_name("router"),
                    unit_path=f"{UNIT_DIR}/{unit_name('router')}",
                    env_path=f"{ENV_DIR}/router.env", argv=argv, env=dict(settings.env),
                    gates={}, gate_sources={}, overridden_gates={},
                    health_url=f"http://{_url_host(_connect_host(bind))}:{port}/health",
                    health_timeout=settings.health_timeout, settings=settings, tree=None,
                    patches="")


def _local_worker(host: Host, role: str) -> list[dict]:
    if role not in host.roles:
        raise UsageError(f"{host.name}: hosts.{host.name}.roles.router.{role} is required to "
                         f"deploy (this host has no {role} role to default to)")
    settings = role_settings(host, role)
    port = _require(host, role, settings.port, "port")
    entry: dict[str, Any] = {"url": f"http://{_url_host(_connect_host(settings.host))}:{port}"}
    if role == "prefill":
        entry["bootstrap_port"] = settings.bootstrap_port
    return [entry]


# ---------------------------------------------------------------- rendering

@dataclass(frozen=True)
class Rendered:
    role: str
    unit: str
    unit_path: str
    unit_text: str
    env_path: str
    env_text: str
    config_path: str | None = None  # the credentials file (`--config`), when there are any
    config_text: str | None = None


def template_dir() -> Path:
    """$PATCHSET_UNIT_TEMPLATES, else systemd/ of this checkout, else the installed copy."""
    candidates = ([Path(os.environ["PATCHSET_UNIT_TEMPLATES"])]
                  if os.environ.get("PATCHSET_UNIT_TEMPLATES") else list(TEMPLATE_DIRS))
    for candidate in candidates:
        if (candidate / "_unit.service.j2").is_file():
            return candidate
    raise PatchsetError(f"the unit templates are not installed (looked in "
                        f"{', '.join(map(str, candidates))}); set PATCHSET_UNIT_TEMPLATES to "
                        "the systemd/ directory of a patchset checkout")


def _environment(directory: Path | None = None):
    import jinja2
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory or template_dir())),
        undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True)
    env.filters["execline"] = _filter(exec_line)
    env.filters["unitvalue"] = _filter(lambda v: unit_value(str(v)))
    env.filters["envvalue"] = _filter(lambda v: env_value(str(v)))
    return env


def _filter(func: Callable[[Any], str]) -> Callable[[Any], str]:
    def wrapped(value: Any) -> str:
        try:
            return func(value)
        except SettingError as exc:
            raise UsageError(f"cannot render a unit: {exc}") from None
    return wrapped


def render(host: Host, units: dict[str, RoleUnit],
           template_dir: Path | None = None) -> dict[str, Rendered]:
    """Unit and env file text of each role, from the templates in systemd/. Nothing about
    where or how the inventory was given reaches the text (a path in a comment made the
    same inventory as `hosts.yaml` and `/abs/hosts.yaml` render different units)."""
    env = _environment(template_dir)
    out = {}
    for role, u in units.items():
        s = u.settings
        context = {
            "host": host.name, "role": role, "unit": u.unit,
            "argv": u.argv, "env": u.env, "gates": u.gates, "gate_sources": u.gate_sources,
            "env_path": u.env_path, "tree": u.tree, "user": s.user, "group": s.group,
            "timeout_start_sec": s.timeout_start_sec, "timeout_stop_sec": s.timeout_stop_sec,
            "restart_sec": s.restart_sec, "limit_nofile": s.limit_nofile,
            "limit_memlock": s.limit_memlock,
            "health_url": u.health_url, "trace": u.trace,
        }
        unit_text = env.get_template(f"sglang-{role}.service.j2").render(context)
        env_text = env.get_template(f"sglang-{role}.env.j2").render(context)
        config = config_text(u, host.name) if u.config else None
        _check_rendered(u, unit_text, env_text, config)
        out[role] = Rendered(role, u.unit, u.unit_path, unit_text, u.env_path, env_text,
                             u.config_path if config is not None else None, config)
    return out


def config_text(u: RoleUnit, host: str) -> str:
    """The `--config` YAML of a role: one `flag-name: "value"` line per credential (JSON
    string syntax, which YAML's double-quoted scalars read the same)."""
    lines = [f"# {u.config_path}: credentials of {u.unit} on {host}, root only (0600).",
             "# Rendered by `patchset deploy` from the inventory; do not edit here. SGLang reads",
             "# it with --config, so the values stay out of the unit file and the command line."]
    lines += [f"{key}: {json.dumps(value, ensure_ascii=False)}" for key, value in u.config.items()]
    return "\n".join(lines) + "\n"


def _check_rendered(u: RoleUnit, unit_text: str, env_text: str,
                    config: str | None = None) -> None:
    """Belt and braces: the env file must parse back to exactly the intended env, the
    credentials file to the intended entries, and no credential flag is left in ExecStart.
    Messages name variables, never values (they may be credentials)."""
    parsed = parse_env_file(env_text)
    if parsed != u.env:
        names = sorted({k for k, _ in set(parsed.items()) ^ set(u.env.items())})
        raise UsageError(f"{u.unit}: the rendered env file does not round-trip (template "
                         f"bug?): {', '.join(names[:3])}")
    leaked = [w.split("=", 1)[0] for w in u.argv if secret_flag(w)]
    if leaked:
        raise UsageError(f"{u.unit}: {', '.join(leaked)} would be on the command line")
    if config is not None:
        import yaml
        back = yaml.safe_load(config)
        if back != u.config:
            raise UsageError(f"{u.unit}: the rendered {u.config_path} does not round-trip: "
                             f"{', '.join(sorted(set(back or {}) ^ set(u.config))) or 'a value'}")
