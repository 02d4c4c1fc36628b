"""Plain dataclasses passed between stages: manifest -> selection -> engine -> state.

Nothing here does I/O; every stage takes and returns these, so each can be tested alone
and printed as JSON (`dataclasses.asdict`). Each class has a docstring: for one without,
@dataclass writes `__doc__` from `inspect.signature` at import, on every command's start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from patchset.pin.model import UpstreamPin

TIERS = ("safe", "moderate", "risky")
PATHS = ("prefill", "decode", "both")
UPSTREAM_STATUSES = (
    "pending",        # not sent upstream yet
    "submitted",      # sent, awaiting review
    "accepted",       # merged upstream after the pin; drop on rebase
    "backport",       # taken from a newer upstream
    "denied",         # upstream refused it
    "inappropriate",  # local by nature (deployment-specific)
    "inactive-upstream",
)
REQUIRE_OPS = ("eq", "ne", "in", "not_in")


@dataclass(frozen=True)
class Gate:
    """A patch's env gate: the patched code runs only where the environment variable
    `env` is `on`."""

    env: str
    on: str


@dataclass(frozen=True)
class Requirement:
    """A live condition under which a patch's code path runs (evaluated by the audit)."""

    fact: str                 # "<namespace>.<name>", e.g. "gpu.compute_cap"
    op: str                   # one of REQUIRE_OPS
    value: Any
    why: str = ""


@dataclass(frozen=True)
class FileChange:
    """One file a patch touches, with the git blob ids before and after it."""

    path: str                 # git path, e.g. python/sglang/srt/models/deepseek_v4.py
    pre: str | None           # 40-hex blob id; None when the patch creates the file
    post: str | None          # None when the patch deletes the file
    added: int = 0
    removed: int = 0


@dataclass(frozen=True)
class TraceSpec:
    """A manifest `trace:` entry: a function the tracer watches for this patch."""

    module: str               # sglang.srt.layers.x
    qualname: str             # Class.method | outer.<locals>.inner | <module>
    file: str = ""


@dataclass(frozen=True)
class Patch:
    """One `series:` entry of patches.yaml, with what its patch file records."""

    name: str
    file: str                 # path relative to the manifest's directory
    summary: str
    tier: str
    path: str
    gate: Gate | None
    requires: tuple[Requirement, ...]
    depends: tuple[str, ...]
    conflicts: tuple[str, ...]
    upstream_status: str
    evidence: dict[str, Any] = field(default_factory=dict)
    header: dict[str, str] = field(default_factory=dict)   # DEP-3 fields
    files: tuple[FileChange, ...] = ()
    sha256: str = ""          # of the patch file's bytes
    line: int = 0             # line of the entry in patches.yaml
    trace: tuple[TraceSpec, ...] = ()   # manifest `trace:` targets
    trace_mode: str = "add"             # add (to the derived ones) | replace
    wire: bool = False        # it changes a wire between roles (prefill/decode): a cohort
                              # mismatch of it is high severity (check cohort-parity)
    parity: str = "strict"    # strict | any: a cohort mismatch of it is declared compatible


@dataclass(frozen=True)
class Series:
    """A loaded patches.yaml: the pin and the patches, in series order."""

    manifest: str             # path of patches.yaml
    root: str                 # directory holding it
    upstream: UpstreamPin
    patches: tuple[Patch, ...]

    def by_name(self) -> dict[str, Patch]:
        return {p.name: p for p in self.patches}
