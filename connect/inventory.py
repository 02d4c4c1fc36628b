"""hosts.yaml (or an Ansible inventory, connect/ansible.py): the fleet, and how a HOST
argument resolves to one host.

Every value here can end up on a remote command line or in a unit file, so each is
checked against a strict pattern at load time (spaces, quotes, `;`, `$()`, newlines are
refused with file:line: field), and is still quoted with shlex wherever it is used.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchset import inputfile, validate, yamlsrc
from patchset.errors import ManifestError, UsageError
from patchset.yamlsrc import Located

from . import ansible
from .settings import SettingError, check_settings

NAME = validate.HOST_NAME
ADDRESS = validate.ADDRESS
USER = validate.USER
ABS_PATH = validate.ABS_PATH
REMOTE_PATH = validate.REMOTE_PATH
HOST_KEYS = {"address": False, "user": False, "port": False, "tree": False, "python": False,
             "identity_file": False, "proxy_jump": False, "roles": False, "serving": False,
             "cohort": False}
COHORT_KEYS = {"compatible": False}
ROLE_NAMES = ("prefill", "decode", "router")
SPEC = re.compile(r"(?:(?P<user>[^@]+)@)?(?P<host>\[[^\]]+\]|[^:@]+)(?::(?P<port>[0-9]{1,5}))?")


@dataclass(frozen=True)
class Host:
    """One host as the transports need it."""

    name: str                      # what the user typed or the inventory key
    address: str                   # what to connect to (may be an ~/.ssh/config alias)
    user: str | None = None
    port: int | None = None
    tree: str | None = None        # the SGLang tree patchset manages there
    python: str = "python3"        # the interpreter that serves SGLang there
    identity_file: str | None = None
    proxy_jump: str | None = None
    roles: dict[str, Any] = field(default_factory=dict)
    serving: dict[str, Any] = field(default_factory=dict)   # unit settings for every role
    cohort: str | None = None      # the servers that serve together (check cohort-parity)

    @property
    def local(self) -> bool:
        return self.address in ("localhost", "local") and self.name in ("localhost", "local")

    def ssh_argv(self) -> list[str]:
        """The ssh command line that reaches this host (port, ProxyJump, user@address),
        before the remote command: how a suggested command is run on it by hand."""
        argv = ["ssh"]
        if self.port:
            argv += ["-p", str(self.port)]
        if self.proxy_jump:
            argv += ["-J", self.proxy_jump]
        argv.append(f"{self.user}@{self.address}" if self.user else self.address)
        return argv


@dataclass(frozen=True)
class Cohort:
    """Servers that serve together (a prefill/decode pair, the hosts of one model group):
    the audit's cohort-parity check wants them to run the same patches. `compatible`
    names patches whose mismatch inside this cohort is declared harmless; `line` is where
    it is declared (an unknown patch name is reported there, once the series is known)."""

    name: str
    hosts: tuple[str, ...]
    compatible: tuple[str, ...] = ()
    line: int | None = None


@dataclass(frozen=True)
class Inventory:
    """A loaded hosts.yaml: its hosts by name and the default host."""

    path: str | None
    hosts: dict[str, Host]
    default: str | None
    cohorts: dict[str, Cohort] = field(default_factory=dict)

    def resolve(self, spec: str) -> Host:
        """An inventory name, `user@host[:port]`, or `localhost`."""
        if spec in self.hosts:
            return self.hosts[spec]
        return parse_spec(spec)


def parse_spec(spec: str) -> Host:
    if spec in ("localhost", "local"):
        return Host(name="localhost", address="localhost")
    match = SPEC.fullmatch(spec)
    if not match or validate.control_char(spec):
        raise UsageError(f"host {spec!r}: expected an inventory name, user@host[:port] or "
                         "localhost")
    user, host, port = match.group("user"), match.group("host"), match.group("port")
    if user is not None and not USER.ok(user):
        raise UsageError(f"host {spec!r}: user {user!r} is not a valid user name")
    if not ADDRESS.ok(host):
        raise UsageError(f"host {spec!r}: {host!r} is not a valid host name or address")
    if port is not None and not 0 < int(port) < 65536:
        raise UsageError(f"host {spec!r}: port {port} is out of range")
    return Host(name=spec, address=host.strip("[]"), user=user,
                port=int(port) if port else None)


def default_path() -> Path:
    return Path(os.environ.get("PATCHSET_INVENTORY", "hosts.yaml"))


def load(path: str | Path | None = None) -> Inventory:
    """Load the inventory; a missing default file is an empty inventory."""
    file = Path(path) if path else default_path()
    if not file.exists() and not file.is_symlink():
        if path:
            raise ManifestError(str(file), None, "(file)", "not found")
        return Inventory(None, {}, None)
    text = inputfile.read_text(file, inputfile.INVENTORY_LIMIT, "inventory")
    if ansible.is_ansible(text, str(file)):
        doc = ansible.load(text, str(file))        # then the very same checks
    else:
        doc = yamlsrc.load(text, str(file))
    data = _mapping(doc, (), doc.data, {"version": False, "default": False, "hosts": True,
                                        "cohorts": False})
    doc.version(1, 1, "unsupported inventory version (this patchset reads 1)")
    hosts_raw = _mapping(doc, ("hosts",), data["hosts"], None)
    hosts = {name: _host(doc, name, value) for name, value in hosts_raw.items()}
    default = data.get("default")
    if default is not None and default not in hosts and default != "localhost":
        raise doc.error(("default",), f"{default!r} is not a host in this inventory")
    return Inventory(str(file), hosts, default, _cohorts(doc, data.get("cohorts"), hosts))


def _cohorts(doc: Located, value: Any, hosts: dict[str, Host]) -> dict[str, Cohort]:
    """Each host's `cohort`, with the `cohorts:` declarations (`compatible: [patch]`); a
    declared cohort no host names is a mistake (a typo would silently check nothing)."""
    declared = _mapping(doc, ("cohorts",), value if value is not None else {}, None)
    members: dict[str, list[str]] = {}
    for host in hosts.values():
        if host.cohort:
            members.setdefault(host.cohort, []).append(host.name)
    out: dict[str, Cohort] = {}
    for name in sorted(set(members) | set(declared)):
        where = ("cohorts", name)
        if name in declared and name not in members:
            raise doc.error(where, f"no host names cohort {name!r} (hosts.<name>.cohort)")
        spec = _mapping(doc, where, declared.get(name) or {}, COHORT_KEYS)
        compatible = spec.get("compatible") or []
        if not isinstance(compatible, list) or not all(
                isinstance(c, str) and validate.PATCH_NAME.ok(c) for c in compatible):
            raise doc.error(where + ("compatible",), "must be a list of patch names")
        out[name] = Cohort(name, tuple(members[name]), tuple(compatible),
                           doc.line(where + ("compatible",)) if compatible else None)
    return out


def _mapping(doc: Located, where: tuple, value: Any, allowed: dict | None) -> dict:
    if not isinstance(value, dict):
        raise doc.error(where, "must be a mapping")
    for key in value:
        if allowed is not None and key not in allowed:
            raise doc.error(where + (key,), f"unknown key (allowed: {', '.join(allowed)})")
    for key, required in (allowed or {}).items():
        if required and key not in value:
            raise doc.error(where, f"missing required key {key!r}")
    return value


def _checked(doc: Located, where: tuple, value: Any, pattern: validate.Rule,
             what: str) -> str:
    if not pattern.ok(value):
        raise doc.error(where, f"{value!r} is not {what} (no spaces, quotes, ;, $, "
                        "backticks or newlines)")
    return value


def _host(doc: Located, name: Any, value: Any) -> Host:
    where = ("hosts", name)
    if not NAME.ok(name):
        raise doc.error(where, f"host name {name!r} is not {NAME.what} (letters, digits, "
                        "_ . -; at most 63)")
    h = _mapping(doc, where, value or {}, HOST_KEYS)
    port = h.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 0 < port < 65536):
        raise doc.error(where + ("port",), f"{port!r} is not a TCP port")
    return Host(
        name=name,
        address=_checked(doc, where + ("address",), h.get("address", name), ADDRESS,
                         "a host name or address"),
        user=_opt(doc, where + ("user",), h.get("user"), USER, "a user name"),
        port=port,
        tree=_opt(doc, where + ("tree",), h.get("tree"), ABS_PATH, "an absolute path"),
        python=_opt(doc, where + ("python",), h.get("python"), ABS_PATH,
                    "an absolute path") or "python3",
        identity_file=_opt(doc, where + ("identity_file",), h.get("identity_file"),
                           validate.KEY_FILE, "a key file path"),
        proxy_jump=_opt(doc, where + ("proxy_jump",), h.get("proxy_jump"),
                        validate.PROXY_JUMP, "a ProxyJump spec"),
        roles=_roles(doc, where + ("roles",), h.get("roles")),
        serving=_serving(doc, where + ("serving",), h.get("serving")),
        cohort=_opt(doc, where + ("cohort",), h.get("cohort"), NAME, "a cohort name"),
    )


def _opt(doc: Located, where: tuple, value: Any, pattern: validate.Rule,
         what: str) -> str | None:
    return None if value is None else _checked(doc, where, value, pattern, what)


def _roles(doc: Located, where: tuple, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    roles = _mapping(doc, where, value, {r: False for r in ROLE_NAMES})
    for role, settings in roles.items():
        if settings is not None and not isinstance(settings, dict):
            raise doc.error(where + (role,), "must be a mapping of unit settings")
        for key, item in (settings or {}).items():
            if isinstance(item, str) and (char := validate.control_char(item)):
                raise doc.error(where + (role, key), f"must not contain {validate.describe(char)}")
        _unit_settings(doc, where + (role,), role, settings or {})
    return {r: dict(s or {}) for r, s in roles.items()}


def _serving(doc: Located, where: tuple, value: Any) -> dict[str, Any]:
    """Unit settings shared by every role (model_path, transfer_backend, env, limits...)."""
    if value is None:
        return {}
    _unit_settings(doc, where, None, value)
    return dict(value)


def _unit_settings(doc: Located, where: tuple, role: str | None, settings: Any) -> None:
    """The unit settings schema (connect/settings.py): every value that can reach a unit
    file."""
    try:
        check_settings(role, settings)
    except SettingError as exc:
        raise doc.error(where + exc.path, str(exc)) from None
