"""Facts, one small class per fact: the command that gets it + the parser of its output.

Grouped by area (gpu, systemd, procs, http, journal, checkpoint, tree); standard library only,
because the gatherer on the host runs the same classes. `base.get("gpu.GpuList")`.
"""

from . import checkpoint, gpu, http, journal, procs, systemd, trace, tree  # noqa: F401 - registration
from .base import FACTS, Command, Fact, FactValue, Provenance, Unavailable, get

__all__ = ["FACTS", "Command", "Fact", "FactValue", "Provenance", "Unavailable", "get"]
