"""Parse one patch file: a DEP-3 style header, then a git diff with full blob ids.

The full `index <pre>..<post>` lines are what make apply verifiable: they record the exact
pre-image each file must have (so zero fuzz is guaranteed, not hoped for) and the
post-image it must end up with (so "applied" never means "changed nothing").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from patchset import validate
from patchset.agent.lib import diffparse
from patchset.errors import ManifestError
from patchset.series.model import FileChange

HEADER_KEYS = (
    "Description", "Subject", "Author", "From", "Origin", "Bug", "Forwarded",
    "Applied-Upstream", "Reviewed-by", "Last-Update", "Upstream-Status", "Patchset-Name",
)
REQUIRED_HEADER = ("Author", "Forwarded", "Last-Update", "Patchset-Name")
HEADER_LINE = re.compile(r"([A-Za-z][A-Za-z0-9-]*):[ \t]*(.*)")        # fullmatch
DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
INDEX_LINE = re.compile(r"index ([0-9a-f]+)\.\.([0-9a-f]+)(?: ([0-7]{6}))?")
SAFE_PATH = re.compile(r"[A-Za-z0-9_.+@/-]+")
HUNK = re.compile(r"@@ -[0-9]{1,9}(?:,([0-9]{1,9}))? \+[0-9]{1,9}(?:,([0-9]{1,9}))? @@")
ZERO = "0" * 40
FILE_HEADER_LINES = ("diff --git ", "index ", "--- ", "+++ ", "new file mode ",
                     "deleted file mode ", "old mode ", "new mode ", "similarity index ",
                     "dissimilarity index ", "rename from ", "rename to ", "copy from ",
                     "copy to ", "Binary files ", "GIT binary patch")


@dataclass(frozen=True)
class ParsedPatch:
    """One patch file, parsed: its DEP-3 header and the files its diff changes."""

    header: dict[str, str]
    files: tuple[FileChange, ...]
    diff_offset: int          # 0-based line where the diff starts


def parse(text: str, file: str, git_prefix: str) -> ParsedPatch:
    """Validate and parse; every error names `file:line: field`."""
    lines = text.split("\n")
    start = _diff_start(lines, file)
    header = parse_header(lines[:start], file)
    check_raw_diff(lines, start, file)
    files = parse_diff("\n".join(lines[start:]), file, start, git_prefix)
    return ParsedPatch(header=header, files=files, diff_offset=start)


def changes(text: str, file: str, git_prefix: str = "") -> tuple[FileChange, ...]:
    """The files a patch changes, its header (description, trailers) skipped unchecked."""
    lines = text.split("\n")
    start = _diff_start(lines, file)
    return parse_diff("\n".join(lines[start:]), file, start, git_prefix)


def _diff_start(lines: list[str], file: str) -> int:
    for number, line in enumerate(lines):
        if line.startswith("diff --git "):
            return number
    raise ManifestError(file, None, "diff", "no `diff --git` section: not a git patch "
                        "(generate it with `git diff --full-index`)")


def parse_header(lines: list[str], file: str) -> dict[str, str]:
    header: dict[str, str] = {}
    key = None
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.strip() == "---":
            key = None
            continue
        if line[0] in " \t" and key:
            header[key] += "\n" + line.strip()
            continue
        bad = validate.control_char(line, allow_tab=True)
        if bad:
            raise ManifestError(file, number, "header", f"contains {validate.describe(bad)}")
        match = HEADER_LINE.fullmatch(line)
        if not match:
            raise ManifestError(file, number, "header", f"not a `Key: value` line: {line[:60]!r}")
        key, value = match.groups()
        if key not in HEADER_KEYS:
            raise ManifestError(file, number, f"header.{key}",
                                f"unknown header field (allowed: {', '.join(HEADER_KEYS)})")
        if key in header:
            raise ManifestError(file, number, f"header.{key}", "duplicate header field")
        header[key] = value.strip()
    _check_header(header, file)
    return header


def _check_header(header: dict[str, str], file: str) -> None:
    if not (header.get("Description") or header.get("Subject")):
        raise ManifestError(file, 1, "header.Description", "missing (DEP-3 needs Description)")
    for key in REQUIRED_HEADER:
        if not header.get(key):
            raise ManifestError(file, 1, f"header.{key}", "missing required header field")
    if not DATE.fullmatch(header["Last-Update"]):
        raise ManifestError(file, 1, "header.Last-Update",
                            f"{header['Last-Update']!r} is not a YYYY-MM-DD date")


def check_raw_diff(lines: list[str], start: int, file: str) -> None:
    """Things the diff parser (agent/lib/diffparse.py) reads but we refuse: binary, renames, short blob ids,
    unsafe paths, hunks whose header counts disagree with their lines, and anything after a
    hunk that is not a new file section (shown by `show`, ignored by `git apply`: what is
    reviewed must be exactly what is applied)."""
    end = len(lines) - 1 if lines and lines[-1] == "" else len(lines)   # text ends in \n
    hunk = _Hunk()
    for number in range(start, end):
        line = lines[number]
        if hunk.open:
            hunk.take(line, number + 1, file)
            continue
        if line.startswith("@@"):
            hunk = _Hunk.start(line, number + 1, file)
            continue
        if line.startswith("diff --git "):
            hunk = _Hunk()
        elif hunk.seen:
            if line.startswith("\\") and hunk.ended == number:
                hunk.take_marker(line, number + 1, file)
                continue
            raise ManifestError(file, number + 1, "diff.hunk",
                                f"{_quote(line)} follows the hunk of line {hunk.line}, which "
                                f"its header ({hunk.header}) already closed: only a new "
                                "`diff --git` section may follow")
        _check_file_header(line, number + 1, file)
    if hunk.open:
        raise hunk.short(file)


class _Hunk:
    """Lines still owed to the hunk being read, from its `@@ -a,b +c,d @@` header."""

    def __init__(self, old: int = 0, new: int = 0, line: int = 0, header: str = "") -> None:
        self.old, self.new, self.line, self.header = old, new, line, header
        self.seen = line > 0          # a hunk of this file section has been read
        self.ended = 0                # 0-based index of the line after the hunk's last
        self.marker_ok = False        # a `\\ No newline` marker may follow the last line

    @classmethod
    def start(cls, text: str, number: int, file: str) -> "_Hunk":
        match = HUNK.match(text)
        if not match:
            raise ManifestError(file, number, "diff.hunk", f"malformed hunk header "
                                f"{_quote(text)}")
        old, new = (1 if n is None else int(n) for n in (match.group(1), match.group(2)))
        if old == new == 0:
            raise ManifestError(file, number, "diff.hunk", "hunk header counts no lines")
        hunk = cls(old, new, number, match.group(0))
        hunk.ended = number
        return hunk

    @property
    def open(self) -> bool:
        return self.old > 0 or self.new > 0

    def take(self, line: str, number: int, file: str) -> None:
        kind = line[:1]
        if kind in (" ", ""):            # git reads an empty line as empty context
            self.old, self.new = self.old - 1, self.new - 1
        elif kind == "-":
            self.old -= 1
        elif kind == "+":
            self.new -= 1
        elif kind == "\\":
            self.take_marker(line, number, file)
            return
        else:
            raise self.short(file, number, line)
        if self.old < 0 or self.new < 0:
            side = "removed/context" if self.old < 0 else "added/context"
            raise ManifestError(file, number, "diff.hunk", f"the hunk of line {self.line} "
                                f"has more {side} lines than its header ({self.header}) "
                                "counts")
        self.ended = number
        # The marker says the line before it is its file's last: only the last line of a
        # side may carry it (git would otherwise join two lines, and apply a patch other
        # than the one `show` displays).
        self.marker_ok = {" ": self.old == self.new == 0, "": self.old == self.new == 0,
                          "-": self.old == 0, "+": self.new == 0}[kind]

    def take_marker(self, line: str, number: int, file: str) -> None:
        """A `\\ No newline at end of file` line: once, after the last line of a side, in
        git's form (`\\ ` and at least 12 characters, whatever the locale's words)."""
        if not self.marker_ok or not line.startswith("\\ ") or len(line) < 12:
            raise ManifestError(file, number, "diff.hunk", f"{_quote(line)} is not a "
                                "`\\ No newline at end of file` marker after the last line "
                                f"of a side of the hunk of line {self.line}")
        self.marker_ok = False

    def short(self, file: str, number: int | None = None, line: str = "") -> ManifestError:
        owed = (f"{self.old} old and {self.new} new line(s) fewer than its header "
                f"({self.header}) counts")
        if number:
            return ManifestError(file, number, "diff.hunk", f"not a diff line: {_quote(line)} "
                                 f"(the hunk of line {self.line} has {owed})")
        return ManifestError(file, self.line, "diff.hunk", f"the hunk of line {self.line} "
                             f"ends at the end of the file with {owed}")


def _check_file_header(line: str, number: int, file: str) -> None:
    if line and not line.startswith(FILE_HEADER_LINES):
        raise ManifestError(file, number, "diff", f"not a diff line: {_quote(line)}")
    if line.startswith(("diff --git ", "--- ", "+++ ")) and _unsafe_header_path(line):
        raise ManifestError(file, number, "diff.path", f"{_quote(line)} points outside the "
                            "tree")
    if line.startswith(("GIT binary patch", "Binary files ")):
        raise ManifestError(file, number, "diff", "binary diffs are not supported")
    if line.startswith(("rename from ", "copy from ", "similarity index ")):
        raise ManifestError(file, number, "diff",
                            "renames/copies are not supported (use `git diff --no-renames`)")
    if line.startswith("index "):
        match = INDEX_LINE.fullmatch(line)
        if not match or len(match.group(1)) != 40 or len(match.group(2)) != 40:
            raise ManifestError(file, number, "diff.index",
                                "blob ids must be full 40-hex (use `git diff --full-index`)")
        _check_mode(match.group(3), number, file)
    for prefix in ("new file mode ", "deleted file mode ", "old mode ", "new mode "):
        if line.startswith(prefix):
            _check_mode(line[len(prefix):], number, file)
    _check_mode_change(line, number, file)
    if line.startswith("diff --git "):
        words = line.split(" ")[2:]
        if len(words) == 2 and words[0][2:] != words[1][2:]:
            raise ManifestError(file, number, "diff.path", f"{_quote(line)}: the a/ and b/ "
                                "paths must name the same file (renames are not supported)")


def _check_mode(mode: str | None, number: int, file: str) -> None:
    """Only regular files: a 120000 (symlink) or 160000 (submodule) entry would make
    `git apply` plant a link anywhere in the served tree."""
    if mode is not None and mode not in ("100644", "100755"):
        raise ManifestError(file, number, "diff.mode", f"file mode {mode!r} is not "
                            "supported (only regular files: 100644, 100755)")


def _check_mode_change(line: str, number: int, file: str) -> None:
    """A file's mode is kept, never set: the switch writes each file with the mode it has
    (a new one 0644), and a plain tree records no modes to restore. So a mode change, or
    an executable file created or deleted, could not apply and revert exactly: refused
    here, where every command that reads the series sees it. Deleting or creating a
    regular 100644 file is supported (the engine removes and restores it exactly)."""
    if line.startswith(("old mode ", "new mode ")):
        raise ManifestError(file, number, "diff.mode", "mode changes are not supported "
                            "(a patch changes content only; drop the old/new mode lines)")
    if line in ("new file mode 100755", "deleted file mode 100755"):
        raise ManifestError(file, number, "diff.mode", f"{_quote(line)}: creating or "
                            "deleting an executable file is not supported (its mode could "
                            "not be restored exactly)")


def _quote(line: str) -> str:
    return repr(line if len(line) <= 60 else line[:57] + "...")


def _unsafe_header_path(line: str) -> bool:
    words = line.split(" ")[2:] if line.startswith("diff --git ") else [line[4:].split("\t")[0]]
    for word in words:
        if word == "/dev/null":
            continue
        if word.startswith("/") or ".." in word.split("/") or "\\" in word:
            return True
    return False


def parse_diff(text: str, file: str, offset: int, git_prefix: str) -> tuple[FileChange, ...]:
    try:
        patch = diffparse.parse(text)
    except diffparse.DiffError as exc:
        raise ManifestError(file, offset + exc.line, "diff", f"malformed diff: "
                            f"{exc.message}") from None
    changes = []
    seen: set[str] = set()
    for patched in patch:
        path = _checked_path(patched, file, offset, git_prefix)
        if path in seen:
            raise ManifestError(file, None, "diff", f"{path} appears twice in one patch")
        seen.add(path)
        changes.append(_file_change(patched, path, file))
    if not changes:
        raise ManifestError(file, None, "diff", "the diff changes no file")
    return tuple(changes)


def _checked_path(patched: diffparse.FileDiff, file: str, offset: int, git_prefix: str) -> str:
    names = {n for n in (patched.source, patched.target) if n and n != "/dev/null"}
    for raw in names:
        name = raw[2:] if raw[:2] in ("a/", "b/") else raw
        if name.startswith("/") or ".." in name.split("/") or "\\" in name or not name:
            raise ManifestError(file, None, "diff.path", f"{raw!r} points outside the tree")
        if not SAFE_PATH.fullmatch(name):
            raise ManifestError(file, None, "diff.path", f"{name!r} has characters patchset "
                                "does not handle (allowed: letters, digits, _ . + @ - /)")
        if not name.startswith(git_prefix):
            raise ManifestError(file, None, "diff.path",
                                f"{name!r} is outside the upstream package prefix {git_prefix!r}")
    return patched.path


def _file_change(patched: diffparse.FileDiff, path: str, file: str) -> FileChange:
    pre, post = _blob_ids(patched, file)
    if patched.is_added_file:
        pre = None
    if patched.is_removed_file:
        post = None
    return FileChange(path=path, pre=pre, post=post,
                      added=patched.added, removed=patched.removed)


def _blob_ids(patched: diffparse.FileDiff, file: str) -> tuple[str | None, str | None]:
    for line in patched.header:
        match = INDEX_LINE.fullmatch(line)
        if match:
            pre, post = match.group(1), match.group(2)
            return (None if pre == ZERO else pre), (None if post == ZERO else post)
    raise ManifestError(file, None, "diff.index",
                        f"{patched.path}: no `index` line (use `git diff --full-index`)")
