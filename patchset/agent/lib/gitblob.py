"""Git blobs and diffs, the same on a host and in the controller: a blob's id, one file's
diff in git's form, `git apply` outside any repository, and the one refusal type of a tree
operation (EngineError). The engine builds on these; the controller uses them to name and
diff files the way the engine does (adopt, guards), never the engine's internals."""

from __future__ import annotations

import difflib
import hashlib
import re
from pathlib import Path

from .gitenv import run_git
from .protocol import ended, killed

NULL_BLOB = "0" * 40


class EngineError(Exception):
    """An expected refusal; `kind` maps to the controller's error classes."""

    def __init__(self, message: str, kind: str = "target", details: str = "") -> None:
        super().__init__(message)
        self.kind, self.details = kind, details


def blob_id(data: bytes) -> str:
    """The git blob id of `data`: how files are named in patches and state."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git(cwd: Path, *args: str, data: bytes | None = None,
        env: dict[str, str] | None = None) -> str:
    """The engine's git: gitenv.run_git (the one runner and environment policy, tree
    mode) with a failure or a kill raised as EngineError naming the command."""
    proc = run_git(args, cwd, extra=env, input=data)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        why = ended(proc.returncode) if killed(proc.returncode) or not err else err[-1]
        raise EngineError(f"git {args[0]} failed in {cwd}: {why}",
                          details=proc.stderr.decode(errors="replace"))
    return proc.stdout.decode(errors="replace")


def git_apply(work: Path, patch: bytes, ceiling: Path, include: list[str] | None = None) -> None:
    """`git apply` of `patch` (-p1) to the files under `work`, outside any repository:
    GIT_CEILING_DIRECTORIES (`ceiling`, above `work`) keeps git from finding the target's
    own repository around it. `include`: only these paths of the patch (the rest is not
    read). EngineError carries git's reason in one line."""
    only = [f"--include={path}" for path in include or ()]
    try:
        git(work, "apply", "--whitespace=nowarn", "-p1", *only, "-", data=patch,
            env={"GIT_CEILING_DIRECTORIES": str(ceiling)})
    except EngineError as exc:        # git's reason, else how it ended (a kill)
        raise EngineError("; ".join(re.sub(r"^error: ", "", line.strip())
                                    for line in exc.details.splitlines() if line.strip())
                          or str(exc)) from None


def text_or_refuse(path: str, data: bytes) -> str:
    try:
        if b"\0" in data:
            raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL")
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise EngineError(f"cannot capture {path}: binary or not UTF-8 (patches are "
                          "text); restore it first", "usage") from None


def text_lines(path: str, data: bytes) -> list[str]:
    """The file's lines as git cuts them: at "\n" only, each keeping it, the last without
    one if the file does not end in one (str.splitlines also cuts at "\r", form feeds and
    the like, which made a diff that did not apply)."""
    text_or_refuse(path, data)
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return [line.decode("utf-8") for line in lines if line]


def file_diff(path: str, old: bytes | None, new: bytes | None, mode: str) -> str:
    """One file's diff in `git diff --full-index` form (git layout paths), from difflib."""
    a = text_lines(path, old or b"")
    b = text_lines(path, new or b"")
    pre = blob_id(old) if old is not None else NULL_BLOB
    post = blob_id(new) if new is not None else NULL_BLOB
    out = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        out += [f"new file mode {mode}\n", f"index {pre}..{post}\n"]
    elif new is None:
        out += [f"deleted file mode {mode}\n", f"index {pre}..{post}\n"]
    else:
        out.append(f"index {pre}..{post} {mode}\n")
    out.append(f"--- {'a/' + path if old is not None else '/dev/null'}\n")
    out.append(f"+++ {'b/' + path if new is not None else '/dev/null'}\n")
    for line in list(difflib.unified_diff(a, b, n=3, lineterm=""))[2:]:
        if line.startswith("@@"):
            out.append(line + "\n")
        else:
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)
