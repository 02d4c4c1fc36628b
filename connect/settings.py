"""What hosts.yaml may say about a host's units (`serving:`, `roles.ROLE:`): the settings
schema (every setting's rule and default), one role's settings as a typed record
(RoleSettings, the defaults filled in), and the value rules of systemd unit and env files.

It sits in the connection layer because the inventory loads with it: a bad value is a
`file:line: field` error before any host is contacted, whatever the command. The unit
deployer (deploy/units.py) renders from the RoleSettings of each role, checked again at
render time (gates and patch names come from the host).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from patchset import validate
from patchset.agent.lib.redact import is_secret_name

ROLES = ("prefill", "decode", "router")
SERVER_ROLES = ("prefill", "decode")
# Credentials of a server role go to a root-only file next to its env file that SGLang
# reads with `--config FILE.yaml` (server_args.py prepare_server_args ->
# ConfigArgumentMerger): the unit file and /proc/PID/cmdline never hold them. Keys are
# the flags without `--` (the merger turns `api-key: v` back into `--api-key v`).
CONFIG_SUFFIX = ".secrets.yaml"
SECRET_SETTINGS = {"api_key": "api-key", "admin_api_key": "admin-api-key"}
MAX_SECRET = 4096

MIN_TIMEOUT_START = 1800      # model load of a large checkpoint (and the default)
MIN_NOFILE = 65535            # SGLang's set_ulimit() raises the soft limit to this
DEFAULT_BOOTSTRAP_PORT = 8998
DEFAULT_TRANSFER_BACKEND = "mooncake"

# A value that is safe in a unit file without quoting (after % and $ escaping).
_UNIT_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\"'\\]")
_ENV_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")   # tab is allowed
_ENV_PLAIN = re.compile(r"[A-Za-z0-9_./:,=+@%-]*")          # used with fullmatch
_WORD_PLAIN = re.compile(r"[A-Za-z0-9_./:,=+@%-]+")

ENV_NAME = validate.ENV_NAME
PATCH_NAME = validate.PATCH_NAME
GPUS = validate.GPUS
BIND = validate.BIND
MODEL = validate.MODEL
TOKEN = validate.TOKEN
USER = validate.USER
URL = validate.HTTP_URL
ABS_PATH = validate.ABS_PATH

# Env variables deploy owns: set them with the role settings, never in `env`.
MANAGED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTHONPATH", "PATCHSET_PATCHES",
               "PATCHSET_TREE", "SPT_NOENV", "PATCHSET_TRACE", "PATCHSET_TRACE_DIR")
# Server flags deploy renders itself; extra_args may not repeat them.
MANAGED_FLAGS = {
    "prefill": ("--model-path", "--disaggregation-mode", "--host", "--port", "--tp-size",
                "--tp", "--disaggregation-transfer-backend", "--disaggregation-bootstrap-port",
                "--disaggregation-ib-device"),
    "router": ("--pd-disaggregation", "--prefill", "--decode", "--host", "--port"),
}
MANAGED_FLAGS["decode"] = MANAGED_FLAGS["prefill"]


class SettingError(ValueError):
    """A bad setting; `path` is the key path below the mapping that was checked."""

    def __init__(self, path: tuple, message: str) -> None:
        super().__init__(message)
        self.path = path


# ---------------------------------------------------------------- systemd escaping

def unit_value(value: str, what: str = "value") -> str:
    """A value for a unit-file setting: refused if unsafe, `%`/`$` escaped."""
    if not isinstance(value, str):
        raise SettingError((), f"{what} must be a string")
    bad = _UNIT_FORBIDDEN.search(value)
    if bad:
        raise SettingError((), f"{what} {value!r} contains {_describe(bad.group())}: unit "
                           "files take no quotes, backslashes, newlines or control characters")
    return value.replace("%", "%%").replace("$", "$$")


def exec_word(value: str, what: str = "argument") -> str:
    """One ExecStart= word: escaped, double-quoted when it holds whitespace."""
    if value == "" or value.strip() in (";", ""):
        raise SettingError((), f"{what} {value!r} is empty or a command separator")
    escaped = unit_value(value, what)
    return escaped if _WORD_PLAIN.fullmatch(value) else f'"{escaped}"'


def exec_line(argv: list[str]) -> str:
    return " ".join(exec_word(word) for word in argv)


def env_value(value: str, what: str = "value") -> str:
    """A value for systemd's EnvironmentFile= parser (quoted when not plain)."""
    if not isinstance(value, str):
        raise SettingError((), f"{what} must be a string")
    bad = _ENV_FORBIDDEN.search(value)
    if bad:
        raise SettingError((), f"{what} {value!r} contains {_describe(bad.group())}: env "
                           "values take no newlines or control characters")
    if _ENV_PLAIN.fullmatch(value):
        return value
    return '"' + re.sub(r'(["\\`$])', r"\\\1", value) + '"'


def _describe(char: str) -> str:
    names = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte", '"': "a quote",
             "'": "a quote", "\\": "a backslash"}
    return names.get(char, f"control character {char!r}")


# ---------------------------------------------------------------- the settings schema

def _pattern(rule: validate.Rule, what: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not rule.ok(value):
            raise SettingError((), f"{value!r} is not {what}")
        return value
    return check


def _integer(low: int, high: int | None = None, what: str = "",
             infinity: bool = False) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if infinity and value == "infinity":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (
                high is not None and value > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise SettingError((), f"{value!r} is not {what or 'an integer'} ({bound}"
                               f"{' or infinity' if infinity else ''})")
        return value
    return check


def _port(value: Any) -> int:
    return _integer(1, 65535, "a TCP port")(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise SettingError((), f"{value!r} is not true or false")
    return value


def _args(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise SettingError((), "must be a list of arguments, one item per word "
                           "(e.g. [--mem-fraction-static, \"0.85\"])")
    out = []
    secret_next = None                     # the flag whose value this item is
    for index, item in enumerate(value):
        if secret_next is not None:
            out.append(_secret_value(item, (index,), secret_next))
            secret_next = None
            continue
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise SettingError((index,), f"{item!r} must be a string")
        flag = secret_flag(str(item))
        if flag is not None:
            if not re.fullmatch(r"--[A-Za-z0-9][A-Za-z0-9_-]*", flag):
                raise SettingError((index,), f"{flag!r} is not a flag")
            if "=" in str(item):
                _secret_value(str(item).split("=", 1)[1], (index,), flag)
            else:
                secret_next = flag
            out.append(str(item))
            continue
        try:
            exec_word(str(item), "argument")
        except SettingError as exc:
            raise SettingError((index,), str(exc)) from None
        out.append(str(item))
    if secret_next is not None:
        raise SettingError((len(value) - 1,), f"{secret_next} needs a value")
    return out


def secret_flag(word: str) -> str | None:
    """The flag of `--api-key` / `--api-key=v` when its name is a credential's
    (patchset.redact.is_secret_name); None for any other word."""
    if not word.startswith("--"):
        return None
    flag = word.split("=", 1)[0]
    return flag if flag != "--config" and is_secret_name(flag) else None


def _secret_value(value: Any, path: tuple, what: str) -> str:
    """A credential (api_key, a secret flag's value): never echoed in a message."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SettingError(path, f"{what}: must be a string (quote it in YAML)")
    value = str(value)
    why = ("is empty" if not value else
           f"is longer than {MAX_SECRET} characters" if len(value) > MAX_SECRET else
           "contains a newline, tab or control character" if not value.isprintable() else
           "starts with '-' (SGLang's argument parser would take it for an option)"
           if value.startswith("-") else None)
    if why:
        raise SettingError(path, f"{what}: the value {why} (not shown: it is a credential)")
    return value


def _secret(value: Any) -> str:
    return _secret_value(value, (), "the value")


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise SettingError((), "must be a mapping NAME: value")
    out = {}
    for name, item in value.items():
        if not ENV_NAME.ok(name):
            raise SettingError((name,), f"{name!r} is not an environment variable name")
        if name in MANAGED_ENV:
            raise SettingError((name,), f"{name} is set by deploy (use gpus / tree / the "
                               "applied series instead)")
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise SettingError((name,), f"{item!r} must be a string (quote it in YAML)")
        try:
            env_value(str(item), name)
        except SettingError as exc:
            if is_secret_name(name):
                raise SettingError((name,), f"{name}: the value contains a newline or control "
                                   "character (not shown: it is a credential)") from None
            raise SettingError((name,), str(exc)) from None
        out[name] = str(item)
    return out


def _urls(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise SettingError((), "must be a non-empty list of URLs (or {url, bootstrap_port})")
    out = []
    for index, item in enumerate(value):
        entry = item if isinstance(item, dict) else {"url": item}
        unknown = set(entry) - {"url", "bootstrap_port"}
        if unknown:
            raise SettingError((index, min(unknown)), "unknown key (allowed: url, "
                               "bootstrap_port)")
        if not URL.ok(entry.get("url")):
            raise SettingError((index,), f"{entry.get('url')!r} is not an http(s)://host:port "
                               "URL")
        if "bootstrap_port" in entry:
            try:
                _port(entry["bootstrap_port"])
            except SettingError as exc:
                raise SettingError((index, "bootstrap_port"), str(exc)) from None
        out.append(dict(entry))
    return out


@dataclass(frozen=True)
class Setting:
    check: Callable[[Any], Any]
    roles: tuple[str, ...]        # where it may appear under roles.ROLE
    shared: bool                  # may appear under the host's `serving:`
    help: str                     # [a default that depends on more than this setting]
    default: Any = None           # when hosts.yaml does not set it; None: required, absent
    router_default: Any = None    # the router's, where it differs from `default`

    def default_for(self, role: str) -> Any:
        return self.router_default if role == "router" and self.router_default is not None \
            else self.default


S, A = SERVER_ROLES, ROLES
SCHEMA: dict[str, Setting] = {
    "gpus": Setting(_pattern(GPUS, "a GPU list like \"0,1,2,3\""), S, False,
                    "CUDA_VISIBLE_DEVICES (with CUDA_DEVICE_ORDER=PCI_BUS_ID)"),
    "port": Setting(_port, A, False, "--port (and the /health URL)"),
    "host": Setting(_pattern(BIND, "a bind address"), A, True, "--host",
                    default="127.0.0.1", router_default="0.0.0.0"),
    "tp": Setting(_integer(1, 4096, "a TP size"), S, True, "--tp-size [number of gpus]"),
    "bootstrap_port": Setting(_port, ("prefill",), False, "--disaggregation-bootstrap-port",
                              default=DEFAULT_BOOTSTRAP_PORT),
    "model_path": Setting(_pattern(MODEL, "a model path or hub id (no spaces or quotes)"),
                          S, True, "--model-path (required)"),
    "transfer_backend": Setting(_pattern(TOKEN, "a transfer backend name"), S, True,
                                "--disaggregation-transfer-backend",
                                default=DEFAULT_TRANSFER_BACKEND),
    "ib_device": Setting(_pattern(TOKEN, "an IB device name"), S, True,
                         "--disaggregation-ib-device"),
    "extra_args": Setting(_args, A, False, "more arguments, one list item per word",
                          default=()),
    "env": Setting(_env, A, True, "more environment (serving env, then role env)",
                   default={}),
    "user": Setting(_pattern(USER, "a user name"), A, True, "User= [root]"),
    "group": Setting(_pattern(USER, "a group name"), A, True, "Group="),
    "timeout_start_sec": Setting(_integer(MIN_TIMEOUT_START, None, "a timeout in seconds"),
                                 A, True, "TimeoutStartSec=", default=MIN_TIMEOUT_START),
    "timeout_stop_sec": Setting(_integer(1, None, "a timeout in seconds"), A, True,
                                "TimeoutStopSec=", default=120),
    "restart_sec": Setting(_integer(0, None, "seconds"), A, True, "RestartSec=", default=30),
    "limit_nofile": Setting(_integer(MIN_NOFILE, None, "a file limit", infinity=True), A,
                            True, "LimitNOFILE=", default=1048576),
    "limit_memlock": Setting(_integer(0, None, "a byte limit", infinity=True), A, True,
                             "LimitMEMLOCK= (RDMA registration)", default="infinity"),
    "health_timeout": Setting(_integer(1, None, "seconds"), A, True,
                              "how long deploy waits for /health [TimeoutStartSec]"),
    "pythonpath": Setting(_boolean, S, True, "PYTHONPATH= the tree, so the unit imports the "
                          "managed tree whatever the venv has installed", default=True),
    "trace": Setting(_boolean, S, True, "record in every server process which patched "
                     "functions ran (`patchset trace`, the audit's evidence)", default=True),
    "prefill": Setting(_urls, ("router",), False, "prefill URLs [this host's prefill]"),
    "decode": Setting(_urls, ("router",), False, "decode URLs [this host's decode]"),
    "api_key": Setting(_secret, S, True, f"--api-key, in the root-only ROLE{CONFIG_SUFFIX} "
                       "read with --config (never in the unit or the command line)"),
    "admin_api_key": Setting(_secret, S, True, f"--admin-api-key, in ROLE{CONFIG_SUFFIX} "
                             "like api_key"),
}


def check_settings(role: str | None, settings: Any) -> dict[str, Any]:
    """Validate `roles.ROLE` (role) or `serving` (role None); raise SettingError(path)."""
    if not isinstance(settings, dict):
        raise SettingError((), "must be a mapping of unit settings")
    out = {}
    for key, value in settings.items():
        spec = SCHEMA.get(key)
        if spec is None or not (role in spec.roles if role else spec.shared):
            names = [k for k, s in SCHEMA.items() if (role in s.roles if role else s.shared)]
            raise SettingError((key,), f"unknown key (allowed: {', '.join(names)})")
        try:
            out[key] = spec.check(value)
        except SettingError as exc:
            raise SettingError((key, *exc.path), str(exc)) from None
    if role == "router":
        for index, word in enumerate(out.get("extra_args", [])):
            if secret_flag(word):
                raise SettingError(("extra_args", index), f"{secret_flag(word)}: the router "
                                   "reads no --config file, and on its command line the "
                                   "credential is readable by every local user (ps, "
                                   "/proc/PID/cmdline)")
    return out


# ---------------------------------------------------------------- one role's settings

@dataclass(frozen=True)
class RoleSettings:
    """One role's unit settings: the host's `serving:` (what the role takes of it), then
    `roles.ROLE:` (the role's win, env merged), every default of SCHEMA filled in, and
    those that depend on another setting: tp (the number of gpus), health_timeout
    (timeout_start_sec). None: not set and without a default (a required setting deploy
    asks for; the router's worker URLs, which default to this host's own roles)."""

    role: str
    gpus: str | None
    port: int | None
    host: str
    tp: int | None
    bootstrap_port: int
    model_path: str | None
    transfer_backend: str
    ib_device: str | None
    extra_args: tuple[str, ...]
    env: dict[str, str]
    user: str | None
    group: str | None
    timeout_start_sec: int
    timeout_stop_sec: int
    restart_sec: int
    limit_nofile: int | str                 # or "infinity"
    limit_memlock: int | str
    health_timeout: int
    pythonpath: bool
    trace: bool
    prefill: list[dict] | None
    decode: list[dict] | None
    api_key: str | None
    admin_api_key: str | None

    @classmethod
    def of(cls, role: str, shared: dict[str, Any], own: dict[str, Any]) -> RoleSettings:
        """From `serving:` and `roles.ROLE:` as check_settings returns them."""
        given = {k: v for k, v in shared.items() if role in SCHEMA[k].roles}
        given.update(own)
        given["env"] = {**shared.get("env", {}), **own.get("env", {})}
        values = {key: given.get(key, spec.default_for(role)) for key, spec in SCHEMA.items()}
        values["extra_args"] = tuple(values["extra_args"])
        if values["tp"] is None and values["gpus"] is not None:
            values["tp"] = len(values["gpus"].split(","))
        if values["health_timeout"] is None:
            values["health_timeout"] = values["timeout_start_sec"]
        return cls(role=role, **values)

    def credentials(self) -> dict[str, str]:
        """The `--config` file's entries these settings give: flag name -> value."""
        return {flag: getattr(self, key) for key, flag in SECRET_SETTINGS.items()
                if getattr(self, key)}

