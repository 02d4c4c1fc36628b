"""Undeclared call-path guards against the live values of one server.

A patch whose gate is on and whose `requires` all hold is `active`, unless the code on its
call path tests a setting nothing declares (a guard, patchset/analysis/guards.py) and the server
runs with that setting at another value than the pin's default: then the declaration did
not look at what decides whether the patched code runs, and the state is `unknown`,
"undeclared guard NAME=value (file:line)". A guard whose live value is unknown or the
default changes nothing (the code path is the one the patch was written against), and so
does one with no default to compare with: a platform test, a ServerArgs field SGLang sets
itself at startup.

The live values come from the fact table (`env.X`: the scheduler processes' environ;
`server.X`: /server_info, the command line); nothing new is read on a host.

The guards come from the series: derived from the pinned base, kept in the cache by
`patchset check` / `show` (patchset.analysis.guards.stored), or derived here from the cached base
without the network on first use, once per process. Without the base (never provisioned
on this machine) there are no guards and states are as declared.
"""

from __future__ import annotations

from typing import Any

from patchset.analysis.guards import Guard, PatchGuards, covered_by, series_key, stored
from patchset.series.model import Patch, Series

from .facttable import Context, resolve
from .values import same, shown

_DERIVED: dict[str, dict[str, PatchGuards] | None] = {}
_SAME = object()                        # live() of a guard that changes nothing
TRUE = ("true", "1", "yes", "y")        # environ.py's EnvBool
FALSE = ("false", "0", "no", "n")


def use(series: Series, derived: dict[str, PatchGuards] | None) -> None:
    """Evaluate `series` with these guards (None: none) instead of looking them up."""
    _DERIVED[series_key(series)] = derived


def of_series(series: Series) -> dict[str, PatchGuards] | None:
    """The series' guards: given by `use`, else from the cache (derived offline from the
    cached base when needed); None when they cannot be had here."""
    key = series_key(series)
    if key not in _DERIVED:
        try:
            _DERIVED[key] = stored(series, offline=True)
        except Exception:                 # noqa: BLE001 - advisory: a derivation that fails
            _DERIVED[key] = None          # leaves the declared states, never the audit
    return _DERIVED[key]


def undeclared(series: Series, patch: Patch, ctx: Context) -> str | None:
    """Why an otherwise active patch is `unknown` in this server: every undeclared guard
    whose live value is not the pin's default; None when there is none."""
    derived = of_series(series)
    found = []
    for guard in derived[patch.name].guards if derived and patch.name in derived else ():
        if covered_by(guard, patch, series) is not None:
            continue
        value = live(guard, ctx)
        if value is not _SAME:
            found.append(f"undeclared guard {guard.name}={shown(value)} ({guard.where})")
    return "; ".join(dict.fromkeys(found)) or None


def live(guard: Guard, ctx: Context) -> Any:
    """The guard's live value when it is known and not the pin's default, else _SAME."""
    if guard.kind not in ("env", "server") or not guard.has_default:
        return _SAME
    value = resolve(guard.fact, ctx)
    if not value.known:
        return _SAME
    if guard.kind == "server":
        return _SAME if same(value.value, guard.default) else value.value
    if value.value is None:
        return _SAME                      # unset: the code reads its default
    default = None if guard.default is None else reads(guard.parse, str(guard.default), None)
    return _SAME if reads(guard.parse, str(value.value), default) == default else value.value


def reads(parse: str, text: str, fallback: Any) -> Any:
    """What SGLang makes of an env string: `fallback` (the default's reading) where it
    would warn and use the default (EnvBool, EnvInt on a bad value)."""
    if parse == "bool":
        low = text.lower()
        return True if low in TRUE else False if low in FALSE else fallback
    if parse == "sglang-bool":                   # utils.get_bool_env_var
        return text.lower() in ("true", "1")
    if parse in ("int", "float"):
        try:
            return int(text) if parse == "int" else float(text)
        except ValueError:
            return fallback
    return text
