"""The library API the CLI is a thin layer over; tests call these functions directly.

Data flows one way: Series -> Plan -> engine request -> engine result -> HostResult.
Transports are passed in (patchset/ never imports deploy/).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from . import __version__
from patchset.agent.lib import wire
from patchset.agent.lib.wire import (ApplyRequest, ApplyResult, BisectMarkResult, Failure,
                                     RevertRequest)
from .errors import (BisectPending, Exit, Unreachable, LockedError, PatchsetError,
                     TargetError, UsageError)
from patchset.series.model import Patch, Series
from patchset.series.selection import Plan, Selection, list_patches, plan  # noqa: F401 (list_patches: API)

from patchset.agent.lib.records import (BaseSource, FileChange, GitSource, PatchSpec,
                                        Recovered, StatusRecord, TraceSpec, UnitStatus)

if TYPE_CHECKING:
    # Imported where used: `list`, `show` and `plan` do not load the transport's tarfile.
    from .transport import Transport


# ---------------------------------------------------------------- requests

def base_files(series: Series) -> dict[str, str | None]:
    """Pre-image of every file the series touches: the first patch's `index` pre blob."""
    out: dict[str, str | None] = {}
    for patch in series.patches:
        for change in patch.files:
            out.setdefault(change.path, change.pre)
    return out


def patch_spec(patch: Patch) -> PatchSpec:
    """The manifest's patch as apply and revert send it to the engine."""
    return PatchSpec(name=patch.name, sha256=patch.sha256, file=patch.file,
                     summary=patch.summary, depends=list(patch.depends), tier=patch.tier,
                     path=patch.path,
                     gate={"env": patch.gate.env, "on": patch.gate.on} if patch.gate else None,
                     files=[FileChange(path=c.path, pre=c.pre, post=c.post)
                            for c in patch.files],
                     trace=[TraceSpec(module=t.module, qualname=t.qualname, file=t.file)
                            for t in patch.trace], trace_mode=patch.trace_mode)


def make_request(series: Series, op: str, patches: Iterable[Patch] = (),
                 **extra: Any) -> tuple[wire.Request, dict[str, Path]]:
    """The engine request of `op` (wire.REQUESTS) plus the files to ship with it (bundle
    name -> local path). apply and revert carry the series (patches, base files, pin)."""
    chosen = list(patches)
    pin = series.upstream
    kind = wire.REQUESTS[op]
    fields: dict[str, Any] = {"git_prefix": pin.git_prefix, "package": pin.name,
                              "tool_version": __version__}
    if issubclass(kind, wire.TreeChangeRequest):
        fields.update(base_files=base_files(series),
                      upstream={"name": pin.name, "version": pin.version},
                      patches=[patch_spec(p) for p in chosen])
    files = {p.file: Path(series.root) / p.file for p in chosen}
    return kind(**fields, **extra), files


# ---------------------------------------------------------------- per-host results

@dataclass
class HostResult:
    """The outcome of `apply` or `revert` on one host (one line, or a JSON object)."""

    host: str
    ok: bool
    changed: bool = False
    target: str | None = None
    before: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    head: str | None = None
    recovered: Recovered | None = None
    dry_run: bool = False
    reverted: list[str] = field(default_factory=list)
    provisioned: str | None = None
    bisect: dict | None = None     # the unfinished bisect that refused this change
    error: str | None = None
    details: str = ""
    exit_code: int = Exit.OK


BaseProvider = Callable[[], "tuple[str, Path]"]   # -> (base commit, bundle file)


def _run_on(transport: Transport, request: ApplyRequest | RevertRequest, files: dict[str, Path],
            base_provider: BaseProvider | None = None) -> HostResult:
    from .transport import raise_for
    try:
        raw = transport.call(request, files)
        if isinstance(raw, Failure) and raw.kind == "need_base" and base_provider \
                and isinstance(request, ApplyRequest):
            commit, bundle = base_provider()
            request = replace(request, base=replace(request.base, commit=commit))
            raw = transport.call(request, {**files, "base.bundle": bundle})
        result = raise_for(transport.host, raw)
    except (Unreachable, TargetError, UsageError) as exc:
        return HostResult(host=transport.host, ok=False, error=str(exc),
                          details=exc.details, exit_code=exc.exit_code,
                          bisect=exc.record if isinstance(exc, BisectPending) else None)
    assert isinstance(result, ApplyResult)          # apply's and revert's result
    return HostResult(host=transport.host, ok=True, changed=result.changed,
                      target=result.target, before=result.before, after=result.after,
                      head=result.head, recovered=result.recovered, dry_run=result.dry_run,
                      reverted=getattr(result, "reverted", []), provisioned=result.provisioned)


DEFAULT_FORKS = 16       # hosts worked on at once (`--forks`, as Ansible's)
MAX_FORKS = 256


def check_forks(forks: int) -> int:
    """`--forks N`: a whole number of hosts at once, 1..MAX_FORKS (bad input otherwise)."""
    if isinstance(forks, bool) or not isinstance(forks, int) or not 1 <= forks <= MAX_FORKS:
        raise UsageError(f"--forks {forks!r}: a number of hosts at once, 1 to {MAX_FORKS}")
    return forks


def on_hosts(transports: list[Transport], work: Callable[[Transport], Any],
             forks: int = DEFAULT_FORKS) -> list[Any]:
    """Run `work` on at most `forks` hosts at once (a fleet of hundreds must not open
    hundreds of SSH connections together); results in the order of `transports`."""
    check_forks(forks)
    if len(transports) <= 1 or forks == 1:
        return [work(t) for t in transports]
    from concurrent.futures import ThreadPoolExecutor    # only a fleet needs threads
    with ThreadPoolExecutor(max_workers=min(forks, len(transports))) as pool:
        return list(pool.map(work, transports))


def apply(series: Series, selected: Plan, transports: list[Transport], dry_run: bool = False,
          lock_wait: float = 0.0, base_provider: BaseProvider | None = None,
          bisect: str | None = None, forks: int = DEFAULT_FORKS) -> list[HostResult]:
    """Make each host run exactly the planned selection (declarative, idempotent), on at
    most `forks` hosts at once. `bisect`: the id of the bisect this change is a step of
    (others are refused)."""
    pin = series.upstream
    git_pin = GitSource(url=pin.git.url, ref=pin.git.ref) if pin.git else None
    request, files = make_request(series, "apply", selected.patches, dry_run=dry_run,
                                  lock_wait=lock_wait, base=BaseSource(git=git_pin),
                                  bisect=bisect)
    assert isinstance(request, ApplyRequest)        # wire.REQUESTS["apply"]
    return on_hosts(transports, lambda t: _run_on(
        t, replace(request, provision=t.provisions), files, base_provider), forks)


def revert(series: Series, names: list[str], transport: Transport, with_dependents: bool = False,
           lock_wait: float = 0.0) -> HostResult:
    """Take `names` out; the engine rebuilds the rest from the copies kept on the target."""
    known = series.by_name()
    for name in names:
        if name not in known:
            raise UsageError(f"no patch named {name!r} in {series.manifest} (see `patchset list`)")
    request, files = make_request(series, "revert", names=names, with_dependents=with_dependents,
                                  lock_wait=lock_wait)
    assert isinstance(request, wire.RevertRequest)  # wire.REQUESTS["revert"]
    return _run_on(transport, request, files)


def bisect_mark(series: Series, transport: Transport, bisect_id: str,
                record: dict | None, lock_wait: float = 30.0) -> dict | None:
    """Write (record) or drop (None) the host's bisect record; raises BisectPending when
    another bisect's record is there."""
    from .transport import raise_for
    request, _ = make_request(series, "bisect-mark", record=record, bisect=bisect_id,
                              lock_wait=lock_wait)
    result = raise_for(transport.host, transport.call(request))
    assert isinstance(result, BisectMarkResult)
    return result.bisect


@dataclass
class HostStatus:
    """`status` of one host: the agent's record of its tree, or why it could not be had."""

    host: str
    record: StatusRecord | None = None
    pinned_base: str = ""
    error: str | None = None
    exit_code: int = Exit.OK

    def has_findings(self) -> bool:
        return self.record is not None and self.record.has_findings()

    def stale_units(self) -> list[UnitStatus]:
        return self.record.stale_units() if self.record else []

    def to_json(self) -> dict:
        """The `status --json` object: the record's fields, host and pinned_base."""
        if self.record is None:
            return {"host": self.host, "error": self.error, "exit_code": self.exit_code}
        return {**self.record.to_json(), "host": self.host, "pinned_base": self.pinned_base}


def status(series: Series, transport: Transport) -> HostStatus:
    from .transport import raise_for
    request, files = make_request(series, "status")
    record = raise_for(transport.host, transport.call(request, files))
    assert isinstance(record, StatusRecord), record     # the wire decoded the op's result
    return HostStatus(host=transport.host, record=record,
                      pinned_base=_pinned_summary(series, record))


def status_or_error(series: Series, transport: Transport) -> HostStatus:
    """Status of one host, or a record of why it could not be had (for fleets)."""
    try:
        return status(series, transport)
    except (Unreachable, TargetError, UsageError) as exc:
        return HostStatus(host=transport.host, error=str(exc), exit_code=exc.exit_code)


def _pinned_summary(series: Series, record: StatusRecord) -> str:
    pin = f"{series.upstream.name} {series.upstream.version}"
    if not record.managed:
        return f"not managed yet (apply checks it is {pin})"
    return f"{pin} (verified at first apply)"


# ---------------------------------------------------------------- show

@dataclass(frozen=True)
class PatchView:
    """`show` of one patch: its entry, its file, and the diff part of that file."""

    patch: Patch
    text: str            # the whole patch file
    diff: str            # from the first `diff --git`


def show(series: Series, name: str) -> PatchView:
    patch = series.by_name().get(name)
    if patch is None:
        raise UsageError(f"no patch named {name!r} in {series.manifest} (see `patchset list`)")
    text = (Path(series.root) / patch.file).read_text(encoding="utf-8")
    start = text.find("diff --git ")
    return PatchView(patch=patch, text=text, diff=text[start:])


# ---------------------------------------------------------------- check

@dataclass(frozen=True)
class PreImage:
    """`check`: a file's pre-image blob as the series records it and as the pin has it."""

    path: str
    recorded: str | None
    found: str | None

    @property
    def ok(self) -> bool:
        return self.recorded == self.found


@dataclass(frozen=True)
class SelectionCheck:
    """`check`: whether one allowed selection applies to the pin, else why not."""

    names: tuple[str, ...]
    ok: bool
    error: str | None = None


@dataclass(frozen=True)
class CheckReport:
    """The result of `check`: every pre-image and every selection checked."""

    manifest: str
    base: str
    preimages: tuple[PreImage, ...]
    selections: tuple[SelectionCheck, ...]

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.preimages) and all(s.ok for s in self.selections)


def closed_selections(series: Series, exhaustive: bool = False) -> list[tuple[Patch, ...]]:
    """Selections the rules allow: whole series, tiers, paths, each patch with its deps;
    with `exhaustive`, every dependency-closed conflict-free subset (small series only)."""
    subsets: Iterable[set[str]]
    if exhaustive:
        names = [p.name for p in series.patches]
        subsets = (set(c) for r in range(len(names) + 1) for c in itertools.combinations(names, r))
    else:
        subsets = _representative(series)
    out, seen = [], set()
    for subset in subsets:
        if _allowed(series, subset):
            chosen = tuple(p for p in series.patches if p.name in subset)
            key = tuple(p.name for p in chosen)
            if key not in seen:
                seen.add(key)
                out.append(chosen)
    return out


def _representative(series: Series) -> Iterable[set[str]]:
    yield {p.name for p in series.patches}
    for tier, path in itertools.product(("safe", "moderate", "risky", None),
                                        ("prefill", "decode", "both", None)):
        try:
            yield set(plan(series, Selection(tier=tier, path=path)).names)
        except PatchsetError:
            continue
    for patch in series.patches:
        try:
            yield set(plan(series, Selection(only=(patch.name,))).names)
        except PatchsetError:
            continue


def _allowed(series: Series, subset: set[str]) -> bool:
    """Whether `apply --only SUBSET` takes exactly `subset`: asked of `plan` itself, so a
    selection `check` passes is one `plan` and `apply` accept (one rule, not two)."""
    if not subset:
        return True
    try:
        return set(plan(series, Selection(only=tuple(sorted(subset)))).names) == subset
    except PatchsetError:
        return False


def check(series: Series, read_base_blob, base_label: str, exhaustive: bool = False,
          progress=None) -> CheckReport:
    """Verify recorded pre-images against the pin, then apply every selection on a scratch
    copy of the touched base files with the real engine (zero fuzz, post-images checked).

    `read_base_blob(path) -> bytes | None` reads a git-layout path from the pinned base.
    The engine is imported here, not at the top: only `check` runs it in this process
    (`list`, `plan`, `show` never do, and the engine's imports are a quarter of `list`).
    """
    from patchset.agent.lib.gitblob import blob_id
    base = base_files(series)
    contents = {path: read_base_blob(path) for path in base}
    pre = tuple(PreImage(path, blob, blob_id(contents[path]) if contents[path] is not None
                         else None) for path, blob in sorted(base.items()))
    selections = closed_selections(series, exhaustive)
    results = []
    for chosen in selections:
        results.append(_check_one(series, chosen, contents))
        if progress:
            progress(1)
    return CheckReport(series.manifest, base_label, pre, tuple(results))


def _check_one(series: Series, chosen: tuple[Patch, ...],
               contents: dict[str, bytes | None]) -> SelectionCheck:
    import tempfile

    from patchset.agent.lib.protocol import Events
    from patchset.agent.main import serve
    names = tuple(p.name for p in chosen)
    with tempfile.TemporaryDirectory(prefix="patchset-check-") as tmp:
        root = Path(tmp)
        (root / series.upstream.git_prefix / series.upstream.name).mkdir(parents=True)
        for path, data in contents.items():
            if data is not None:
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_bytes(data)
        request, _ = make_request(series, "apply", chosen, target=str(root))
        result = serve(request, Path(series.root), Events(sink=lambda event: None))
    if not isinstance(result, Failure):
        return SelectionCheck(names, True)
    return SelectionCheck(names, False, result.message)
