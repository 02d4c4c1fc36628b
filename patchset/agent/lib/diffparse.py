"""The one parser of git diffs: files, their header lines, hunks and hunk lines.

Standard library only, in the agent package, because the agent runs on hosts with nothing
else (patchset/transport.py ships this folder) and the controller's patch-file reader
(patchset/series/patchfile.py) uses the same code: one idea of where a hunk ends. It reads the
structure only; what a caller accepts (modes, renames, blob ids, paths) is the caller's
rule. A line is a `str`; bytes that are not UTF-8 go through as surrogate escapes
(`decode("utf-8", "surrogateescape")`), so nothing is lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HUNK_HEADER = re.compile(r"@@ -([0-9]{1,9})(?:,([0-9]{1,9}))? "
                         r"\+([0-9]{1,9})(?:,([0-9]{1,9}))? @@(.*)", re.S)
DEV_NULL = "/dev/null"


class DiffError(ValueError):
    """Text that is not a git diff; `line` is 1-based within the text parsed."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line, self.message = line, message


@dataclass(frozen=True)
class Hunk:
    """One `@@ -a,b +c,d @@` hunk: its header's numbers and its lines as (sign, text),
    sign one of " ", "-", "+" or "\\" (a `\\ No newline at end of file` marker, whose
    text is the rest of the marker line). An empty line in a diff, which git reads as an
    empty context line, is ("", ""): a caller that takes only what git writes (the exact
    applier) can tell it from " "."""

    old_start: int
    old_count: int
    new_start: int
    new_count: int
    header: str
    lines: tuple[tuple[str, str], ...]

    @property
    def added(self) -> int:
        return sum(sign == "+" for sign, _ in self.lines)

    @property
    def removed(self) -> int:
        return sum(sign == "-" for sign, _ in self.lines)


@dataclass(frozen=True)
class FileDiff:
    """One `diff --git` section: its header lines (the `diff --git` line and the extended
    ones before `---`), the `---`/`+++` names (None when the section has none, as a
    binary or mode-only one) and its hunks."""

    header: tuple[str, ...]
    source: str | None
    target: str | None
    hunks: tuple[Hunk, ...]
    line: int                   # 1-based line of its `diff --git` within the text parsed

    @property
    def is_added_file(self) -> bool:
        return self.source == DEV_NULL

    @property
    def is_removed_file(self) -> bool:
        return self.target == DEV_NULL

    @property
    def path(self) -> str:
        """The file's path without git's a/ b/ prefix (the side that is not /dev/null)."""
        name = self.source if self.is_removed_file else self.target
        if name is None:                       # no ---/+++: the diff --git line's b/ name
            name = self.header[0].split(" ")[-1]
        return name[2:] if name[:2] in ("a/", "b/") else name

    @property
    def added(self) -> int:
        return sum(h.added for h in self.hunks)

    @property
    def removed(self) -> int:
        return sum(h.removed for h in self.hunks)


def parse(text: str) -> tuple[FileDiff, ...]:
    """Every file section of `text`, which starts at its first `diff --git` line (a final
    newline ends the last line). DiffError names the first line that is no part of a
    git diff, or a hunk shorter or longer than its header counts."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    files, at = [], 0
    while at < len(lines):
        section, at = _section(lines, at)
        files.append(section)
    return tuple(files)


def _section(lines: list[str], at: int) -> tuple[FileDiff, int]:
    if not lines[at].startswith("diff --git "):
        raise DiffError(at + 1, f"expected `diff --git`, found {lines[at][:60]!r}")
    start, at = at, at + 1
    while at < len(lines) and not lines[at].startswith(("diff --git ", "--- ", "@@")):
        at += 1
    header = tuple(lines[start:at])
    source = target = None
    if at < len(lines) and lines[at].startswith("--- "):
        if at + 1 >= len(lines) or not lines[at + 1].startswith("+++ "):
            raise DiffError(at + 2, "a `---` line without its `+++` line")
        source, target = _name(lines[at]), _name(lines[at + 1])
        at += 2
    hunks = []
    while at < len(lines) and lines[at].startswith("@@"):
        if source is None:
            raise DiffError(at + 1, "a hunk before the `---`/`+++` lines")
        hunk, at = _hunk(lines, at)
        hunks.append(hunk)
    if at < len(lines) and not lines[at].startswith("diff --git "):
        raise DiffError(at + 1, f"not a diff line: {lines[at][:60]!r}")
    return FileDiff(header, source, target, tuple(hunks), start + 1), at


def _name(line: str) -> str:
    """The file name of a `---`/`+++` line (git ends it at a tab when it adds a date)."""
    return line[4:].split("\t")[0]


def _hunk(lines: list[str], at: int) -> tuple[Hunk, int]:
    """One hunk: its header's counts say how many lines it has; a `\\` marker may follow
    any of them (which side it closes is the caller's rule)."""
    match = HUNK_HEADER.fullmatch(lines[at])
    if not match:
        raise DiffError(at + 1, f"malformed hunk header {lines[at][:60]!r}")
    old_count, new_count = (1 if n is None else int(n) for n in (match[2], match[4]))
    old_left, new_left, body, header = old_count, new_count, [], lines[at]
    at += 1
    while old_left > 0 or new_left > 0:
        if at >= len(lines):
            raise DiffError(at, f"the hunk {header[:40]!r} ends before the lines it counts")
        sign, text = lines[at][:1], lines[at][1:]
        if sign == "\\":
            body.append((sign, text))
        elif sign in (" ", "", "-", "+"):
            old_left -= sign != "+"
            new_left -= sign != "-"
            if old_left < 0 or new_left < 0:
                raise DiffError(at + 1, f"more lines than the hunk header {header[:40]!r} "
                                "counts")
            body.append((sign, text))
        else:
            raise DiffError(at + 1, f"not a hunk line: {lines[at][:60]!r}")
        at += 1
    if at < len(lines) and lines[at].startswith("\\"):
        body.append(("\\", lines[at][1:]))
        at += 1
    return Hunk(int(match[1]), old_count, int(match[3]), new_count, header, tuple(body)), at
