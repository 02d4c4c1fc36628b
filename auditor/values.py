"""How the audit compares and shows a fact's value: one rule for the checks, the states'
conditions and the reading of what a server runs."""

from __future__ import annotations

from typing import Any


def same(a: Any, b: Any) -> bool:
    """Loose equality of a declared value and a gathered one: `True` and "true", 256 and
    "256" are the same setting; None equals only None."""
    if a is None or b is None:
        return a is None and b is None
    if a == b:
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return str(a).lower() == str(b).lower()
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return "unset" if value is None else str(value)
