"""Facts, one small class per fact: the command that gets it + the parser of its output.

Grouped by area (gpu, systemd, procs, http, journal, checkpoint, tree); standard library only,
because the gatherer on the host runs the same classes. `facts.get("gpu.GpuList")`.
"""

from . import checkpoint, gpu, http, journal, procs, systemd, trace, tree  # noqa: F401 - registration
from .base import FACTS, Command, Fact, FactValue, Provenance, Unavailable


def get(name: str) -> Fact:
    """A fact by its name (`gpu.GpuList`), for the data-driven tests and the docs. Here, not
    in base.py: the package has imported every fact module (which registers it), and base
    imports none of them (no import loop)."""
    return FACTS[name]()


__all__ = ["FACTS", "Command", "Fact", "FactValue", "Provenance", "Unavailable", "get"]
