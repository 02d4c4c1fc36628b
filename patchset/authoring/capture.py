"""`patchset capture`: hand edits on a host's managed tree become a new patch in the series.

The host is only read (the engine's `capture` op returns a full-index diff of the edits
against what the state says should be there). Here the diff is applied on a scratch clone
of the pin with the whole series applied, its result checked blob for blob against the
host's files, re-diffed, and written through interop's validated writer: one line and
exit 2 on any problem, and nothing written.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from patchset import api, validate
from patchset.authoring import interop
from patchset.errors import UsageError
from patchset.series.model import Series
from patchset.agent.lib import wire
from patchset.transport import Transport, raise_for

NAME = validate.PATCH_NAME       # the manifest's own name rule: shell-safe


@dataclass(frozen=True)
class CaptureMeta:
    name: str
    tier: str = "risky"
    path: str = "both"
    summary: str | None = None
    author: str | None = None


@dataclass(frozen=True)
class CaptureResult:
    name: str
    file: str
    host: str
    target: str
    files: list[str]
    depends: list[str]
    manifest: str
    applied_on_host: list[str] = field(default_factory=list)


def capture(series: Series, transport: Transport, meta: CaptureMeta, progress=None,
            offline: bool = False, lock_wait: float = 0.0) -> CaptureResult:
    """Read the host's edits, verify them on the pin + series, write patch and entry."""
    check_meta(series, meta)
    request, files = api.make_request(series, "capture", lock_wait=lock_wait)
    found = raise_for(transport.host, transport.call(request, files))
    assert isinstance(found, wire.CaptureResult)
    changed = found.files
    _check_pre_images(series, transport.host, changed)
    depends = _depends(series, found.applied, set(changed))
    built = _build(series, meta, found, depends, transport.host, progress, offline)
    written = interop.write_entries(series, [built])
    return CaptureResult(name=meta.name, file=built.entry.file, host=transport.host,
                         target=found.target, files=sorted(changed), depends=depends,
                         manifest=written.manifest, applied_on_host=found.applied)


def check_meta(series: Series, meta: CaptureMeta) -> None:
    """Refuse bad flags before any host is contacted."""
    interop.ImportMeta(tier=meta.tier, path=meta.path, author=meta.author)
    if not NAME.ok(meta.name):
        raise UsageError(f"capture: name {meta.name!r}: use 1-63 of a-z, 0-9 and - "
                         "(starting with a letter or digit)")
    if meta.name in series.by_name():
        raise UsageError(f"capture: {meta.name!r} is already in {series.manifest}; pick a "
                         "new name")
    if (Path(series.root) / "patches" / f"{meta.name}.patch").exists():
        raise UsageError(f"capture: patches/{meta.name}.patch already exists; pick a new name")
    if not meta.author:
        raise UsageError("capture: pass --author 'Name <email>' (the patch's DEP-3 Author)")
    if meta.summary is not None and (not meta.summary.strip() or "\n" in meta.summary):
        raise UsageError("capture: --summary must be one non-empty line")


def _final_blobs(series: Series) -> dict[str, str | None]:
    """Each file's content after the whole series: what a new last patch must start from."""
    out = dict(api.base_files(series))
    for patch in series.patches:
        for change in patch.files:
            out[change.path] = change.post
    return out


def _check_pre_images(series: Series, host: str, changed: dict[str, dict]) -> None:
    """A patch appended to the series applies on the series' final files, so the host's
    expected content must be exactly that (else the edits sit on another selection)."""
    final = _final_blobs(series)
    for path, blobs in sorted(changed.items()):
        if blobs["pre"] != final.get(path, blobs["pre"]):
            raise UsageError(f"{host}: {path}: the edits sit on a different selection than "
                             "the whole series (patches that change this file are missing "
                             "or extra on the host); apply the whole series there first")


def _depends(series: Series, applied: list[str], paths: set[str]) -> list[str]:
    """The host's applied patches that change a captured file, in series order."""
    on_host = set(applied)
    return [p.name for p in series.patches
            if p.name in on_host and any(c.path in paths for c in p.files)]


def _build(series: Series, meta: CaptureMeta, found: wire.CaptureResult, depends: list[str], host: str,
           progress, offline: bool) -> interop._Built:
    """Apply on the pin + series, check every post blob against the host, re-diff."""
    from patchset.pin.upstream import materialize, provision
    source = f"{host}:{found.target}"
    summary = meta.summary or f"hand edits captured from {host}"
    base = provision(series.upstream, progress=progress, offline=offline)
    with tempfile.TemporaryDirectory(prefix="patchset-capture-") as tmp:
        work = materialize(base, Path(tmp) / "tree", layout="git", progress=progress)
        for patch in series.patches:
            text = (Path(series.root) / patch.file).read_text(encoding="utf-8")
            interop.apply_diff(work, text, 1, str(Path(series.root) / patch.file), patch.name)
        before = interop.git_out(work, "rev-parse", "HEAD", what="scratch tree").strip()
        interop.apply_diff(work, found.diff, 1, source, meta.name)
        _check_posts(work, found.files, source)
        body = interop.git_out(work, *interop.DIFF_ARGS, before, "HEAD", what="scratch tree")
    item = interop.Incoming(source=source, name_hint=meta.name, raw_header=None, diff=body,
                            header={"Description": summary, "Author": meta.author or ""})
    text = interop.render_header(item, meta.name, interop.ImportMeta(
        tier=meta.tier, path=meta.path, author=meta.author))
    interop.parse_built(text + body, item, series.upstream.git_prefix)
    entry = interop.Imported(name=meta.name, file=f"patches/{meta.name}.patch", source=source,
                             depends=depends, rediffed=True)
    return interop._Built(entry, text + body, summary[:200], meta.tier, meta.path)


def _check_posts(work: Path, files: dict[str, dict], source: str) -> None:
    """The patch must reproduce the host's files byte for byte (blob ids say so)."""
    for path, blobs in sorted(files.items()):
        disk = work / path
        got = interop.git_out(work, "hash-object", "--", path, what="scratch tree").strip() \
            if disk.is_file() else None
        if got != blobs["post"]:
            raise UsageError(f"{source}: {path}: applying the captured diff on the pin gives "
                             f"blob {str(got)[:12]}, the host has {str(blobs['post'])[:12]}")
