"""Which `namespace.name` facts exist: the vocabulary `requires` and the hazards may name.

The audit's fact table (auditor/facttable.py) resolves these names on a host; this module
is the part of it a manifest is checked against at load, so a typo such as
`gpu.compute_capability` is a `file:line: field` error instead of a condition that is
silently `unknown` on every host. Closed namespaces list their names; open ones (a
ServerArgs field, an env variable, a config.json key, a `systemctl show` property) are
checked for shape here, and `server.*` against the pin's ServerArgs by `patchset check`.
"""

from __future__ import annotations

from patchset.validate import Rule

GPU_FIELDS = ("compute_cap", "name", "driver_version", "uuid", "index", "count")
QUANT_FIELDS = ("quant_method", "quant_algo", "moe_quant_algo", "kv_cache_quant_algo")
ROLE_VALUES = ("prefill", "decode", "router", "null")

_SHAPES: dict[str, Rule] = {
    "server": Rule(r"[a-z_][a-z0-9_]{0,99}", "a ServerArgs field name"),
    "env": Rule(r"[A-Za-z_][A-Za-z0-9_]{0,127}", "an environment variable name"),
    "checkpoint": Rule(r"[A-Za-z_][A-Za-z0-9_]{0,99}", "a config.json key"),
    "unit": Rule(r"role|name|[A-Z][A-Za-z0-9]{0,99}", "role, name or a systemctl show "
                 "property (CamelCase)"),
    "patch": Rule(r"[a-z0-9][a-z0-9-]{0,62}", "a patch name"),
}
NAMESPACES = ("gpu",) + tuple(_SHAPES)


def problem(fact: str) -> str | None:
    """Why `fact` names nothing the audit can resolve, or None when it is well formed."""
    namespace, dot, name = fact.partition(".")
    if namespace not in NAMESPACES or not dot:
        return (f"{fact!r} must be <namespace>.<name> with namespace one of "
                f"{', '.join(NAMESPACES)}")
    if namespace == "gpu":
        if name not in GPU_FIELDS:
            return f"no such fact {fact!r} (gpu facts: {', '.join(GPU_FIELDS)})"
        return None
    rule = _SHAPES[namespace]
    if not rule.ok(name):
        return f"no such fact {fact!r}: {name!r} is not {rule.what}"
    return None


def value_problem(fact: str, values: tuple) -> str | None:
    """Values that can never match the fact (a role that does not exist, a GPU count that
    is not a number): a condition that is always false reads as 'inert' everywhere."""
    if fact == "unit.role":
        bad = [v for v in values if v not in ROLE_VALUES and v is not None]
        if bad:
            return f"{bad[0]!r} is not a role ({', '.join(ROLE_VALUES)})"
    if fact in ("gpu.count", "gpu.index"):
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            return f"{fact} is a whole number, got {bad[0]!r}"
    return None
