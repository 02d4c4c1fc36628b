"""The typed records that cross between the agent and the controller, defined once.

Standard library only (the agent ships it). JSON exists only at the edges: `from_json`
where a record is read (a state file on the host, an agent result on the controller) and
`to_json` where it is written; everything in between uses attributes.

The tree's state (.patchset/state.json) is versioned. STATE_FORMAT 2 records `updated`
with milliseconds (format 1 had whole seconds, so a process started in the same second as
an apply could not be ordered against it); `TreeState.from_json` reads every format up to
STATE_FORMAT and refuses a newer one, naming the file. A state is rewritten in the current
format by the next apply or revert.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional

from .message import Message, Result

STATE_FORMAT = 2
READABLE_FORMATS = (1, 2)


class StateError(ValueError):
    """A state file this agent cannot read (another format, damaged)."""


def now_stamp() -> str:
    """The state's `updated` stamp: UTC, milliseconds (`2026-12-01T14:00:00.123Z`)."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


# ---------------------------------------------------------------- the series as sent

@dataclass
class FileChange(Message):
    """One file a patch changes: its git-layout path and its blob before and after
    (None: absent)."""

    path: str
    pre: Optional[str]
    post: Optional[str]


@dataclass
class TraceSpec(Message):
    """A function the manifest's `trace:` names for a patch (beside the derived targets)."""

    module: str
    qualname: str
    file: Optional[str] = None


@dataclass
class PatchSpec(Message):
    """One patch as apply and revert send it: the manifest's entry, and `file`, the patch
    file's name beside the request (the bundle, or the tree's own copies for a revert)."""

    name: str
    sha256: str
    file: str
    summary: str = ""
    depends: List[str] = field(default_factory=list)
    tier: Optional[str] = None
    path: str = "both"                            # prefill | decode | both
    gate: Optional[Dict[str, str]] = None         # {"env": NAME, "on": VALUE}
    files: List[FileChange] = field(default_factory=list)
    trace: List[TraceSpec] = field(default_factory=list)
    trace_mode: str = "add"                       # add (to the derived targets) | replace


@dataclass
class GitSource(Message):
    """The pin's git remote and ref, as the manifest names them."""

    url: str
    ref: str


@dataclass
class BaseSource(Message):
    """Where a host without a tree gets the pinned base: the pin's git remote, else the
    commit of the git bundle the controller ships beside the request (base.bundle)."""

    git: Optional[GitSource] = None
    commit: Optional[str] = None


# ---------------------------------------------------------------- the tree's state

@dataclass
class AppliedPatch:
    """One applied patch as the state records it."""

    name: str
    sha256: str
    summary: str = ""
    depends: list[str] = field(default_factory=list)
    gate: dict[str, str] | None = None  # {"env": NAME, "on": VALUE}
    path: str = "both"                  # prefill | decode | both
    tier: str | None = None
    files: list[dict[str, Any]] = field(default_factory=list)
    commit: str | None = None           # git trees: the commit of this patch
    trace: list[dict[str, Any]] = field(default_factory=list)   # manifest `trace:` entries
    trace_mode: str = "add"             # add (to the derived targets) | replace

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AppliedPatch:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_spec(cls, spec: PatchSpec, commit: str | None = None) -> AppliedPatch:
        """The state's record of `spec` once applied."""
        return cls(name=spec.name, sha256=spec.sha256, summary=spec.summary,
                   depends=list(spec.depends), gate=spec.gate, path=spec.path, tier=spec.tier,
                   files=[asdict(f) for f in spec.files], commit=commit,
                   trace=[asdict(t) for t in spec.trace], trace_mode=spec.trace_mode)

    def spec(self) -> PatchSpec:
        """This patch as a revert or a rebuild re-applies it, from the tree's own copy
        (.patchset/patches/SHA256.patch)."""
        return PatchSpec(name=self.name, sha256=self.sha256, file=f"{self.sha256}.patch",
                         summary=self.summary, depends=list(self.depends or ()),
                         tier=self.tier, path=self.path, gate=self.gate,
                         files=[FileChange(path=f["path"], pre=f.get("pre"), post=f.get("post"))
                                for f in self.files],
                         trace=[TraceSpec(module=t["module"], qualname=t["qualname"],
                                          file=t.get("file")) for t in self.trace],
                         trace_mode=self.trace_mode)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TreeState:
    """.patchset/state.json: what patchset applied to the tree, and what each file is."""

    updated: str
    kind: str                           # git | plain
    layout: str                         # git | wheel
    upstream: dict[str, Any] | None
    base: dict[str, Any]                # {"commit": ..., "files": {path: blob}}
    applied: list[AppliedPatch]
    files: dict[str, str | None]        # path -> blob id now
    head: str | None = None
    tool_version: str = "?"
    format: int = STATE_FORMAT

    @classmethod
    def from_json(cls, data: Any, where: str = "state.json") -> TreeState:
        """Any readable format -> the current record; StateError names the file."""
        if not isinstance(data, dict):
            raise StateError(f"{where} is not a JSON object")
        version = data.get("format")
        if version not in READABLE_FORMATS:
            raise StateError(f"{where} has state format {version}; this patchset reads "
                             f"{', '.join(map(str, READABLE_FORMATS))}: upgrade patchset")
        try:
            return cls(updated=str(data.get("updated") or ""), kind=data.get("kind", "plain"),
                       layout=data.get("layout", "wheel"), upstream=data.get("upstream"),
                       base=dict(data.get("base") or {"commit": None, "files": {}}),
                       applied=[AppliedPatch.from_json(a) for a in data["applied"]],
                       files=dict(data.get("files") or {}), head=data.get("head"),
                       tool_version=data.get("tool_version", "?"), format=version)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"{where} is damaged (format {version}: "
                             f"{type(exc).__name__}: {exc})") from None

    def to_json(self) -> dict[str, Any]:
        """Always written in the current format."""
        return {"format": STATE_FORMAT, "tool_version": self.tool_version,
                "updated": self.updated, "kind": self.kind, "layout": self.layout,
                "upstream": self.upstream, "base": self.base,
                "applied": [a.to_json() for a in self.applied], "head": self.head,
                "files": self.files}

    def names(self) -> list[str]:
        return [a.name for a in self.applied]


# ---------------------------------------------------------------- the audit's reads

@dataclass
class TensorPattern(Message):
    """Checkpoint tensors the audit reads the headers of (auditor/data/tensors.yaml): the
    names matching `pattern` (fnmatch), at most `max` of them per pattern."""

    pattern: str
    max: int = 1000


# ---------------------------------------------------------------- progress

@dataclass
class Event(Message):
    """One progress line of a running op (a deploy's steps, restarts and health waits):
    a JSON line on the agent's stdout, the same record in process. Which fields a kind
    fills: step (message), restart (role, unit, reason), wait (role, unit, phase, url,
    elapsed, timeout, detail), healthy (role, unit, phase, elapsed, timeout)."""

    event: str
    message: Optional[str] = None
    role: Optional[str] = None
    unit: Optional[str] = None
    reason: Optional[str] = None
    phase: Optional[str] = None                 # deploy | rollback
    url: Optional[str] = None
    elapsed: Optional[float] = None
    timeout: Optional[float] = None
    detail: Optional[str] = None


# ---------------------------------------------------------------- a repair

@dataclass
class Recovered(Message):
    """What an operation repaired first: the transaction a kill interrupted (finished:
    the journal's op and id, the patches it took out) and the stale git locks cleared.
    The result's `recovered` and the line of .patchset/recovery.log."""

    op: Optional[str] = None
    id: Optional[str] = None
    finished: bool = False
    removed: List[str] = field(default_factory=list)
    stale_git_locks: List[str] = field(default_factory=list)


# ---------------------------------------------------------------- status
# The status op's result (StatusRecord) and the records it holds: each a Message, so the
# wire checks them down to their leaves, and the controller reads attributes, never keys.
# Annotations are typing's (the agent's wire reads them on Python 3.8).

@dataclass
class UnitStatus(Message):
    """A systemd unit that serves the tree, and whether it runs the tree as it is now."""

    unit: str
    role: str
    path: str
    active: Optional[str] = None
    sub: Optional[str] = None
    main_pid: int = 0
    started: Optional[str] = None
    tree_changed: Optional[str] = None
    running_patches: Optional[str] = None
    patches: str = ""
    stale: bool = False
    stale_reason: str = ""
    need_daemon_reload: bool = False
    enabled: Optional[str] = None
    imports: Optional[str] = None          # the sglang its process imports (find_spec, as run)
    managed: Optional[bool] = None         # ... is it this tree? (None: not known)


@dataclass
class Interpreter(Message):
    """Which tree the server's interpreter imports (find_spec)."""

    python: str
    imports: Optional[str] = None
    managed: Optional[bool] = None
    expected: Optional[str] = None
    error: Optional[str] = None


@dataclass
class StatusPatch(Message):
    """One applied patch as status shows it (the state's AppliedPatch, less its files)."""

    name: str
    sha256: str
    commit: Optional[str] = None
    gate: Optional[Dict[str, str]] = None       # {"env": NAME, "on": VALUE}
    path: str = "both"
    tier: Optional[str] = None


@dataclass
class Drift(Message):
    """A file the state names whose content is not what the state recorded."""

    path: str
    expected: Optional[str]                     # the blob the state recorded (None: absent)
    found: Optional[str]                        # the blob there now (None: absent)


@dataclass
class Interrupted(Message):
    """A transaction a kill left (the journal's), or stale git locks alone, and which
    command finishes it."""

    op: str
    id: str
    files: int
    git_locks: Optional[str]
    next: str


@dataclass
class StatusRecord(Result):
    """The engine's `status` of one tree: state, drift, hand edits, interrupted work,
    the units serving it and the interpreter. Read-only on the host; the status op's
    result as it crosses the wire, and the record the controller renders."""

    target: str = ""
    kind: str = ""
    layout: str = ""
    managed: bool = False
    head: Optional[str] = None
    state_version: Optional[int] = None
    tool_version: Optional[str] = None
    updated: Optional[str] = None
    upstream: Optional[Dict[str, str]] = None           # {"name", "version"}
    base: Optional[Dict[str, Any]] = None               # the state's {"commit", "files"}
    applied: List[StatusPatch] = field(default_factory=list)
    drift: List[Drift] = field(default_factory=list)
    dirty: List[str] = field(default_factory=list)
    foreign_commits: List[str] = field(default_factory=list)
    interrupted: Optional[Interrupted] = None
    locked_by: Optional[str] = None
    bisect: Optional[Dict[str, Any]] = None             # the bisect record (isolate's)
    interpreter: Optional[Interpreter] = None
    units: List[UnitStatus] = field(default_factory=list)

    def has_findings(self) -> bool:
        """Drift, hand edits, foreign commits, interrupted work, a bisect holding the host,
        or an interpreter (the inventory's, or a unit's running process) that does not
        import this tree."""
        return (self.interpreter is not None and self.interpreter.managed is False) or \
            any(u.managed is False for u in self.units) or bool(
                self.drift or self.dirty or self.foreign_commits or self.interrupted
                or self.bisect)

    def stale_units(self) -> List[UnitStatus]:
        return [u for u in self.units if u.stale]
