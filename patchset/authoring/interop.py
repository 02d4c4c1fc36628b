"""Export the series as a quilt series; import quilt series and git ranges into it.

Import never trusts what it reads: every incoming patch is applied, in order, on a scratch
clone of the pin with the existing series already applied, and what lands in patches/ is
a `git diff --full-index --no-renames` of that result (or the incoming diff itself when its
full index lines already say exactly that, so an export/import round trip is byte-exact).
Everything is built and validated aside first; a bad patch is one `file: field: message`
error (exit 2) and nothing is written.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from patchset import inputfile
from patchset.series import patchfile
from patchset.agent.lib import safewrite
from patchset.agent.lib.gitenv import LOCAL, run_git
from patchset.errors import ManifestError, UsageError
from patchset.series.model import PATHS, TIERS, Series

DIFF_ARGS = ("diff", "--full-index", "--no-color", "--no-renames", "-U3")
NAME_MAX = 63
QUILT_OPTION = re.compile(r"-p([0-9])")          # fullmatch
# `git format-patch` mail lines that are not description: mbox From, Date, diffstat, ---
MBOX_NOISE = re.compile(r"^(From [0-9a-f]{40} |Date: |---\s*$| \S.* \| +\d+ |"
                        r" \d+ files? changed)")


# ---------------------------------------------------------------- data between stages

@dataclass(frozen=True)
class ExportResult:
    directory: str
    series_file: str
    patches: list[str]


@dataclass(frozen=True)
class Incoming:
    """One patch as read from the source, before it is checked against the pin."""

    source: str                   # "file" or "repo commit", for error messages
    name_hint: str                # file stem or commit subject
    header: dict[str, str]        # DEP-3 fields found (may be incomplete)
    raw_header: str | None        # the header text, when it is already valid DEP-3
    diff: str                     # the diff text as read
    strip: int = 1                # -pN
    gate: dict | None = None      # a proposed env gate {env, on} (adopt), else none


@dataclass(frozen=True)
class ImportMeta:
    tier: str = "risky"
    path: str = "both"
    author: str | None = None     # fallback when the source names none

    def __post_init__(self) -> None:
        """Bad flags are refused before any source is read."""
        _check_meta(self)


@dataclass(frozen=True)
class ImportSource:
    """Where incoming patches come from: a quilt directory, or a git range."""

    quilt: Path | None = None
    git: Path | None = None
    rev_range: str | None = None
    split: bool = False

    def __post_init__(self) -> None:
        if (self.quilt is None) == (self.git is None):
            raise UsageError("import: give exactly one of --quilt DIR or --git REPO BASE..HEAD")
        if self.git is not None and not self.rev_range:
            raise UsageError("import --git REPO needs a range BASE..HEAD")
        if self.quilt is not None and (self.rev_range or self.split):
            raise UsageError("import --quilt takes no range and no --split")

    def read(self) -> list[Incoming]:
        if self.quilt is not None:
            return read_quilt(self.quilt)
        assert self.git is not None         # __post_init__: exactly one of the two
        return read_git(self.git, self.rev_range or "", self.split)


@dataclass(frozen=True)
class Imported:
    name: str
    file: str
    source: str
    depends: list[str]
    rediffed: bool                # True when the body was regenerated from the applied tree


@dataclass(frozen=True)
class ImportResult:
    manifest: str
    patches: list[Imported] = field(default_factory=list)


# ---------------------------------------------------------------- export

def export_quilt(series: Series, dest: Path, force: bool = False) -> ExportResult:
    """Write `series` + one file per patch (DEP-3 header and diff, as stored), in order."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"--quilt {dest}: not a directory")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise UsageError(f"--quilt {dest}: directory is not empty (pass --force to write "
                         "over it)")
    names = [f"{patch.name}.patch" for patch in series.patches]
    for name in [*names, "series"]:         # a link or a directory there: nothing written
        safewrite.check_beneath(dest / name, dest)
    dest.mkdir(parents=True, exist_ok=True)
    for patch, name in zip(series.patches, names):
        data = (Path(series.root) / patch.file).read_bytes()
        safewrite.write_file(dest / name, data, root=dest)
    series_file = dest / "series"
    _write_atomic(series_file, "".join(f"{n}\n" for n in names), dest)
    return ExportResult(directory=str(dest), series_file=str(series_file), patches=names)


# ---------------------------------------------------------------- reading sources

def read_quilt(directory: Path) -> list[Incoming]:
    """The patches a quilt `series` file lists, in order (comments and blanks skipped)."""
    directory = Path(directory)
    series_file = directory / "series"
    if not series_file.is_file():
        raise ManifestError(str(series_file), None, "(file)", "not found: not a quilt "
                            "patches directory")
    out = []
    text = inputfile.read_text(series_file, inputfile.DATA_LIMIT, "quilt series file")
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        out.append(_quilt_entry(directory, series_file, number, words))
    if not out:
        raise ManifestError(str(series_file), None, "series", "lists no patches")
    return out


def _quilt_entry(directory: Path, series_file: Path, number: int,
                 words: list[str]) -> Incoming:
    name, options = words[0], words[1:]
    strip = 1
    for option in options:
        match = QUILT_OPTION.fullmatch(option)
        if not match:
            raise ManifestError(str(series_file), number, "series",
                                f"option {option!r} is not supported (only -pN)")
        strip = int(match.group(1))
    file = directory / name
    if ".." in Path(name).parts or name.startswith("/") or not file.is_file():
        raise ManifestError(str(series_file), number, "series", f"{name!r}: no such patch file")
    text = _read_text(file)
    header_text, diff = _split(text)
    header, raw = _read_header(header_text, str(file))
    stem = re.sub(r"\.(patch|diff)$", "", Path(name).name)
    return Incoming(source=str(file), name_hint=stem, header=header, raw_header=raw,
                    diff=diff, strip=strip)


def read_git(repo: Path, rev_range: str, split: bool) -> list[Incoming]:
    """One patch per commit of BASE..HEAD (oldest first), or one per file with `split`."""
    if ".." not in rev_range or rev_range.startswith("-"):
        raise UsageError(f"{rev_range!r}: expected a range BASE..HEAD")
    # Never an option: a leading '-' is refused above, and --end-of-options (git 2.24+)
    # makes git read whatever follows as a revision.
    commits = git_out(repo, "rev-list", "--reverse", "--parents", "--end-of-options",
                       rev_range, what=f"--git {repo} {rev_range}").split("\n")
    out: list[Incoming] = []
    for line in filter(None, commits):
        ids = line.split()
        if len(ids) != 2:
            raise UsageError(f"--git {repo}: commit {ids[0][:12]} is a merge or a root "
                             "commit; import a linear range")
        out.extend(_commit(repo, ids[0], split))
    if not out:
        raise UsageError(f"--git {repo} {rev_range}: no commits in the range")
    return out


def _commit(repo: Path, commit: str, split: bool) -> list[Incoming]:
    fmt = git_out(repo, "show", "-s", "--format=%an <%ae>%n%as%n%B", commit, what=commit)
    author, day, message = (fmt.split("\n", 2) + ["", ""])[:3]
    subject, _, body = message.strip().partition("\n")
    header = {"Description": _description(subject, body), "Author": author,
              "Last-Update": day, "Forwarded": "no"}
    source = f"{repo} commit {commit[:12]}"
    if not split:
        diff = git_out(repo, *DIFF_ARGS, f"{commit}^", commit, what=source)
        return [Incoming(source=source, name_hint=subject, header=header, raw_header=None,
                         diff=diff)]
    files = git_out(repo, "diff", "--name-only", "--no-renames", f"{commit}^", commit,
                     what=source).split()
    return [Incoming(source=f"{source} {path}", name_hint=f"{subject}-{Path(path).stem}",
                     header=header, raw_header=None,
                     diff=git_out(repo, *DIFF_ARGS, f"{commit}^", commit, "--", path,
                                   what=source))
            for path in files]


def _description(subject: str, body: str) -> str:
    """DEP-3 continuation lines: blank lines become ` .` so the header stays one block."""
    lines = [subject.strip() or "imported commit"]
    for line in body.strip("\n").split("\n") if body.strip() else []:
        text = line.rstrip()
        lines.append("." if not text.strip() or text.strip() == "---" else text)
    return "\n".join(lines)


# ---------------------------------------------------------------- headers

def _split(text: str) -> tuple[str, str]:
    """Header text and diff text: the diff starts at the first git or unified header."""
    lines = text.split("\n")
    for number, line in enumerate(lines):
        if line.startswith(("diff --git ", "--- ", "Index: ")):
            return "\n".join(lines[:number]), "\n".join(lines[number:])
    return text, ""


def _read_header(text: str, file: str) -> tuple[dict[str, str], str | None]:
    """DEP-3 fields if the header is valid DEP-3 (kept verbatim then); else free text
    becomes the Description, as quilt headers often are."""
    if text.strip():
        try:
            header = patchfile.parse_header(text.rstrip("\n").split("\n"), file)
            return header, text.rstrip("\n") + "\n\n"
        except ManifestError:
            pass
    free = [line.strip() for line in text.split("\n")
            if line.strip() and not MBOX_NOISE.match(line)]
    if not free:
        return {}, None
    fields: dict[str, str] = {}
    rest = []
    for line in free:
        key, sep, value = line.partition(":")
        if sep and key in ("Author", "From") and value.strip():
            fields.setdefault("Author", value.strip())
        elif sep and key == "Subject" and value.strip():
            fields["Subject"] = re.sub(r"^\[PATCH[^\]]*\]\s*", "", value.strip())
        else:
            rest.append(line)
    lines = ([fields.pop("Subject")] if "Subject" in fields else []) + rest
    fields["Description"] = "\n".join(lines or ["imported patch"])
    return fields, None


def render_header(item: Incoming, name: str, meta: ImportMeta) -> str:
    """The project's DEP-3 header: the incoming one verbatim when already complete."""
    if item.raw_header and item.header.get("Patchset-Name") == name:
        return item.raw_header
    h = dict(item.header)
    h.pop("Patchset-Name", None)
    description = h.pop("Description", None) or h.pop("Subject", None) or name
    author = h.pop("Author", None) or h.pop("From", None) or meta.author
    if not author:
        raise ManifestError(item.source, None, "header.Author",
                            "the patch names no author; pass --author 'Name <email>'")
    first, *more = description.split("\n")
    lines = [f"Description: {first}"] + [f" {m}" for m in more]
    lines.append(f"Author: {author}")
    h.setdefault("Forwarded", "no")
    h.setdefault("Last-Update", date.today().isoformat())
    for key in patchfile.HEADER_KEYS:
        if key in h and key not in ("Subject", "From"):
            value = h[key].replace("\n", "\n ")
            lines.append(f"{key}: {value}")
    lines.append(f"Patchset-Name: {name}")
    return "\n".join(lines) + "\n\n"


# ---------------------------------------------------------------- names

def slug(text: str) -> str:
    """A patch name safe in any shell and valid in patches.yaml ([a-z0-9][a-z0-9-]*)."""
    text = re.sub(r"^\d{4}-", "", text.strip())          # git format-patch numbering
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:NAME_MAX].strip("-")
    return name or "patch"


def unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    for n in range(2, 1000):
        candidate = f"{name[:NAME_MAX - len(str(n)) - 1].rstrip('-')}-{n}"
        if candidate not in taken:
            return candidate
    raise UsageError(f"cannot make a unique name from {name!r}")


# ---------------------------------------------------------------- import

def import_from(series: Series, source: ImportSource, meta: ImportMeta, progress=None,
                offline: bool = False) -> ImportResult:
    """Read the source, then `import_patches`: the one call behind `patchset import`."""
    return import_patches(series, source.read(), meta, progress=progress, offline=offline)


def import_patches(series: Series, items: list[Incoming], meta: ImportMeta,
                   progress=None, offline: bool = False) -> ImportResult:
    """Check every incoming patch on the pin (+ the series), then write them all or none."""
    return write_entries(series, build_patches(series, items, meta, progress, offline))


def build_patches(series: Series, items: list[Incoming], meta: ImportMeta,
                  progress=None, offline: bool = False) -> list[_Built]:
    """Every incoming patch checked on the pin (+ the series) and rendered; nothing is
    written (write_entries writes them)."""
    from patchset.pin.upstream import materialize, provision
    if not items:
        raise UsageError("nothing to import")
    base = provision(series.upstream, progress=progress, offline=offline)
    with tempfile.TemporaryDirectory(prefix="patchset-import-") as tmp:
        work = materialize(base, Path(tmp) / "tree", layout="git", progress=progress)
        for patch in series.patches:
            apply_diff(work, (Path(series.root) / patch.file).read_text(encoding="utf-8"), 1,
                   str(Path(series.root) / patch.file), patch.name)
        return _build_all(series, items, meta, work)


def _check_meta(meta: ImportMeta) -> None:
    if meta.tier not in TIERS:
        raise UsageError(f"--tier {meta.tier!r}: expected one of {', '.join(TIERS)}")
    if meta.path not in PATHS:
        raise UsageError(f"--path {meta.path!r}: expected one of {', '.join(PATHS)}")


@dataclass(frozen=True)
class _Built:
    entry: Imported
    text: str
    summary: str
    tier: str
    path: str
    gate: dict | None = None


def _build_all(series: Series, items: list[Incoming], meta: ImportMeta,
               work: Path) -> list[_Built]:
    taken = {p.name for p in series.patches}
    touched = _touched_by(series.patches)
    built: list[_Built] = []
    for item in items:
        name = unique(slug(item.name_hint), taken)
        taken.add(name)
        before = git_out(work, "rev-parse", "HEAD", what="scratch tree").strip()
        if not item.diff.strip():
            raise ManifestError(item.source, None, "diff", "no diff in this patch")
        apply_diff(work, item.diff, item.strip, item.source, name)
        body, rediffed = _body(work, before, item)
        text = render_header(item, name, meta) + body
        parsed = parse_built(text, item, series.upstream.git_prefix)
        depends = _in_series_order([touched[c.path] for c in parsed.files
                                    if c.path in touched], series, built)
        for change in parsed.files:
            touched[change.path] = name
        summary = parsed.header.get("Description", parsed.header.get("Subject", name))
        built.append(_Built(Imported(name=name, file=f"patches/{name}.patch",
                                     source=item.source, depends=depends, rediffed=rediffed),
                            text, summary.split("\n")[0][:200], meta.tier, meta.path,
                            item.gate))
    return built


def parse_built(text: str, item: Incoming, git_prefix: str) -> patchfile.ParsedPatch:
    """The project's own validation, with the error naming the incoming file or commit."""
    try:
        return patchfile.parse(text, item.source, git_prefix)
    except ManifestError as exc:
        message = str(exc).split(": ", 2)[-1]
        raise ManifestError(item.source, None, exc.field, message) from None


def _touched_by(patches) -> dict[str, str]:
    """file path -> the last patch of the series that changes it (its exact pre-image
    for the next patch: that patch depends on it)."""
    out: dict[str, str] = {}
    for patch in patches:
        for change in patch.files:
            out[change.path] = patch.name
    return out


def _in_series_order(names: list[str], series: Series, built: list[_Built]) -> list[str]:
    order = [p.name for p in series.patches] + [b.entry.name for b in built]
    return sorted(set(names), key=order.index)


def apply_diff(work: Path, diff: str, strip: int, source: str, name: str) -> None:
    """Apply without fuzz and commit, so the next patch sees exactly this result."""
    proc = run_git(["apply", "--index", f"-p{strip}", "--whitespace=nowarn", "-"], work,
                   mode=LOCAL, extra=IDENTITY, input=diff.encode())
    if proc.returncode != 0:
        reason = (proc.stderr.decode(errors="replace").strip().split("\n") or [""])[0]
        raise ManifestError(source, None, "diff", "does not apply on the pinned base with the "
                            f"series before it: {reason}")
    git_out(work, "commit", "-q", "--allow-empty", "-m", name, what="scratch tree")


def _body(work: Path, before: str, item: Incoming) -> tuple[str, bool]:
    """The incoming diff verbatim when its full index lines match what applying it did;
    else the diff regenerated from the scratch tree (pre/post blob ids of the pin)."""
    fresh = git_out(work, *DIFF_ARGS, before, "HEAD", what="scratch tree")
    if not fresh.strip():
        raise ManifestError(item.source, None, "diff", "changes nothing on the pinned base")
    if item.strip == 1 and _same_changes(item.diff, fresh):
        return (item.diff if item.diff.endswith("\n") else item.diff + "\n"), False
    return fresh, True


def _same_changes(diff: str, fresh: str) -> bool:
    try:
        old = patchfile.parse_diff(diff, "incoming", 0, "")
        new = patchfile.parse_diff(fresh, "fresh", 0, "")
        patchfile.check_raw_diff(diff.split("\n"), 0, "incoming")
    except ManifestError:
        return False
    key = lambda c: (c.path, c.pre, c.post)
    return sorted(map(key, old)) == sorted(map(key, new))


# ---------------------------------------------------------------- writing

def write_entries(series: Series, built: list[_Built], replace: bool = False) -> ImportResult:
    """Validate the new manifest with the new files in a copy, then move them in: each
    patch file, then the manifest (the one file that makes them the series). `replace`:
    the built entries become the whole series (adopt --force): the old series' files may
    be written over; any other existing file only where it already holds this patch (a
    killed write's), never a file of someone else's."""
    from patchset.series.manifest import load_series
    root = Path(series.root)
    manifest = Path(series.manifest)
    text = manifest.read_text(encoding="utf-8")
    new_manifest = _replace_series(text, built) if replace else _append_entries(text, built)
    ours = {p.file for p in series.patches} if replace else set()
    for b in built:
        path = root / b.entry.file
        if path.exists() and b.entry.file not in ours and not (
                path.is_file() and same_patch(path.read_bytes(), b.text.encode("utf-8"))):
            raise ManifestError(str(path), None, "file", "already exists; "
                                "remove it or rename the incoming patch")
    with tempfile.TemporaryDirectory(prefix="patchset-import-check-") as tmp:
        check = Path(tmp)
        shutil.copytree(root / "patches", check / "patches") if (root / "patches").is_dir() \
            else (check / "patches").mkdir()
        for b in built:
            (check / b.entry.file).write_text(b.text, encoding="utf-8")
        (check / manifest.name).write_text(new_manifest, encoding="utf-8")
        load_series(check / manifest.name)
    for path in [*(root / b.entry.file for b in built), manifest]:
        safewrite.check_beneath(path, root)
    for b in built:
        _write_atomic(root / b.entry.file, b.text, root)
    _write_atomic(manifest, new_manifest, root)
    return ImportResult(manifest=str(manifest), patches=[b.entry for b in built])


def same_patch(a: bytes, b: bytes) -> bool:
    """The same patch file but for the day it was written (its Last-Update line)."""
    strip = lambda data: re.sub(rb"(?m)^Last-Update: [^\n]*\n", b"", data, count=1)
    return strip(a) == strip(b)


def holds(series: Series, built: list[_Built]) -> bool:
    """The series is exactly these built entries already (names, files, bytes but for the
    day): what a write that was killed after its manifest left."""
    if [(p.name, p.file) for p in series.patches] != [(b.entry.name, b.entry.file)
                                                       for b in built]:
        return False
    root = Path(series.root)
    return all(same_patch((root / b.entry.file).read_bytes(), b.text.encode("utf-8"))
               for b in built)


def _replace_series(text: str, built: list[_Built]) -> str:
    """The manifest with its top-level `series` (however its key is written: quoted, flow
    or block) replaced by the built entries, everything else kept as it is. The key is
    found by the YAML parser, never by a pattern on the text."""
    import yaml
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise ManifestError("patches.yaml", None, "series", f"not YAML: {exc}") from None
    found = None
    if isinstance(root, yaml.MappingNode):
        found = next(((k, v) for k, v in root.value
                      if isinstance(k, yaml.ScalarNode) and k.value == "series"), None)
    if found is None:
        raise ManifestError("patches.yaml", None, "series", "no top-level `series` key")
    key, value = found
    lines = text.split("\n")
    first = key.start_mark.line
    end = value.end_mark.line if value.end_mark.column == 0 else value.end_mark.line + 1
    end = max(end, first + 1)
    while end > first + 1 and (not lines[end - 1].strip()
                               or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    entries = _entries(built)
    if entries:
        block = yaml.safe_dump(entries, sort_keys=False, default_flow_style=None, width=1000)
        new = ["series:"] + ["  " + line if line else line
                             for line in block.rstrip("\n").split("\n")]
    else:
        new = ["series: []"]
    return "\n".join(lines[:first] + new + lines[end:]).rstrip("\n") + "\n"


def _entries(built: list[_Built]) -> list[dict]:
    return [{"name": b.entry.name, "file": b.entry.file, "summary": b.summary,
             "tier": b.tier, "path": b.path, "gate": b.gate, "requires": [],
             "depends": b.entry.depends, "conflicts": [], "upstream_status": "pending"}
            for b in built]


def _append_entries(text: str, built: list[_Built]) -> str:
    """Add entries at the end of the `series:` list, keeping comments and layout."""
    import yaml
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if re.match(r"^series:", line)), None)
    if start is None:
        raise ManifestError("patches.yaml", None, "series", "no top-level `series:` key")
    end = next((i for i in range(start + 1, len(lines))
                if re.match(r"^[A-Za-z]", lines[i])), len(lines))
    item = next((re.match(r"^(\s*)- ", lines[i]) for i in range(start + 1, end)
                 if re.match(r"^\s*- ", lines[i])), None)
    indent = item.group(1) if item else "  "    # match the list's own indentation
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    if re.fullmatch(r"series:\s*\[\s*\]\s*(#.*)?", lines[start]):
        lines[start] = "series:"
    entries = _entries(built)
    block = yaml.safe_dump(entries, sort_keys=False, default_flow_style=None, width=1000)
    indented = [indent + line if line else line for line in block.rstrip("\n").split("\n")]
    out = lines[:end] + indented + lines[end:]
    return "\n".join(out).rstrip("\n") + "\n"


# ---------------------------------------------------------------- small helpers

def _read_text(file: Path) -> str:
    return inputfile.read_text(file, inputfile.PATCH_LIMIT, "patch file")


def _write_atomic(path: Path, text: str, root: Path) -> None:
    """Whole, inside `root`, never through a link planted there (safewrite)."""
    safewrite.write_file(path, text.encode("utf-8"), root=root)


# Who the scratch trees' commits are by (gitenv's LOCAL mode: no user or system config,
# so diffs do not depend on whoever runs the import).
IDENTITY = {"GIT_AUTHOR_NAME": "patchset", "GIT_AUTHOR_EMAIL": "patchset@localhost",
            "GIT_COMMITTER_NAME": "patchset", "GIT_COMMITTER_EMAIL": "patchset@localhost"}


def git_out(cwd: Path, *args: str, what: str) -> str:
    return git_bytes(cwd, *args, what=what).decode("utf-8", errors="replace")


def git_bytes(cwd: Path, *args: str, what: str, stdin: bytes | None = None) -> bytes:
    """git's exact stdout (file contents must round-trip byte for byte)."""
    proc = run_git(args, cwd, mode=LOCAL, extra=IDENTITY, input=stdin)
    if proc.returncode != 0:
        reason = (proc.stderr.decode(errors="replace").strip().split("\n") or [""])[0]
        raise UsageError(f"{what}: git {args[0]} failed: {reason}")
    return proc.stdout
