"""Plain dataclasses passed between stages: manifest -> selection -> engine -> state.

Nothing here does I/O; every stage takes and returns these, so each can be tested alone
and printed as JSON (`dataclasses.asdict`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
class GitPin:
    url: str
    ref: str


@dataclass(frozen=True)
class PypiPin:
    requirement: str       # e.g. "sglang==0.5.14"
    file: str              # exact wheel file name
    sha256: str
    python_version: str    # for `pip download --python-version`
    platform: str          # for `pip download --platform`


@dataclass(frozen=True)
class UpstreamPin:
    name: str
    version: str
    git: GitPin | None
    pypi: PypiPin | None
    git_prefix: str = "python/"   # where the wheel's top level sits in the git tree


@dataclass(frozen=True)
class Gate:
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


@dataclass(frozen=True)
class Series:
    manifest: str             # path of patches.yaml
    root: str                 # directory holding it
    upstream: UpstreamPin
    patches: tuple[Patch, ...]

    def by_name(self) -> dict[str, Patch]:
        return {p.name: p for p in self.patches}
