#!/usr/bin/env python3
"""Regenerate patches/*.patch: a DEP-3 header from the series metadata, then the diff body.

The header is a pure function of patches.yaml (summary, upstream_status) and
patches/headers.yaml (author, last_update, forwarded, origin, description); the body is
the stored diff (everything from the first `diff --git` line), or, with --from-git, the
diff of the commit named after the patch in a scratch repository built on the pin:

    git diff --full-index --no-color --no-renames -U3 <commit>^ <commit>

Nothing depends on the clock or the environment, so a second run changes no byte;
--check reports (exit 1) instead of writing when any file would change.

To edit the series: --init-git REPO --wheel WHEEL builds that scratch repository (the
wheel's sglang/ under python/, one commit per patch, named after it); edit and amend the
commits (git rebase -i), then regenerate with --from-git REPO.

usage: python dev/regen_patches.py [--from-git REPO] [--check] [--series FILE] [--headers FILE]
       python dev/regen_patches.py --init-git REPO --wheel sglang-0.5.14-...whl
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DIFF_ARGS = ("diff", "--full-index", "--no-color", "--no-renames", "-U3")
HEADER_FIELDS = ("author", "last_update", "forwarded", "description")


def header(entry: dict, meta: dict) -> str:
    missing = [k for k in HEADER_FIELDS if not meta.get(k)]
    if missing:
        raise SystemExit(f"{entry['name']}: headers.{entry['name']} lacks {', '.join(missing)}")
    lines = [f"Description: {entry['summary'].strip()}"]
    lines += [" " + line.rstrip() for line in meta["description"].strip().splitlines()]
    lines.append(f"Author: {meta['author']}")
    if meta.get("origin"):
        lines.append(f"Origin: {meta['origin']}")
    lines.append(f"Forwarded: {meta['forwarded']}")
    lines.append(f"Last-Update: {meta['last_update']}")
    lines.append(f"Upstream-Status: {entry['upstream_status']}")
    lines.append(f"Patchset-Name: {entry['name']}")
    for line in lines:
        if line != line.rstrip() or "\t" in line or "\r" in line:
            raise SystemExit(f"{entry['name']}: whitespace in header line {line!r}")
    return "\n".join(lines) + "\n\n"


def stored_body(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    start = text.find("diff --git ")
    if start != 0 and (start < 0 or text[start - 1] != "\n"):
        raise SystemExit(f"{path}: no `diff --git` line")
    return text[start:]


def git_body(repo: Path, name: str) -> str:
    """Diff of the first-parent commit of REPO whose subject is `name` (exactly one)."""
    log = subprocess.run(["git", "log", "--first-parent", "--format=%H %s"], cwd=repo,
                         check=True, capture_output=True, text=True).stdout
    commits = [c for c, _, s in (line.partition(" ") for line in log.splitlines()) if s == name]
    if len(commits) != 1:
        raise SystemExit(f"{repo}: {len(commits)} commits named {name!r}, need exactly one")
    return subprocess.run(["git", *DIFF_ARGS, f"{commits[0]}^", commits[0]], cwd=repo,
                          check=True, capture_output=True, text=True).stdout


def init_git(repo: Path, wheel: Path, entries: list[dict]) -> None:
    """The pin as a git tree (tag `pin`), then one commit per patch in series order."""
    repo.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.filename.startswith("sglang/") and not info.is_dir():
                dest = repo / "python" / info.filename
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(zf.read(info))
                dest.chmod((info.external_attr >> 16) & 0o777 or 0o644)
    git = lambda *a: subprocess.run(["git", "-c", "user.name=patchset", "-c",
                                     "user.email=patchset@localhost", *a], cwd=repo, check=True)
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "upstream pin")
    git("tag", "pin")
    for entry in entries:
        git("apply", "--whitespace=nowarn", str(ROOT / entry["file"]))
        git("commit", "-qam", entry["name"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=Path, default=ROOT / "patches.yaml")
    ap.add_argument("--headers", type=Path, default=ROOT / "patches" / "headers.yaml")
    ap.add_argument("--from-git", type=Path, metavar="REPO",
                    help="take diff bodies from the commits of REPO named after the patches")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 on a change")
    ap.add_argument("--init-git", type=Path, metavar="REPO", help="build the scratch repo")
    ap.add_argument("--wheel", type=Path, help="the pinned wheel, for --init-git")
    args = ap.parse_args()
    doc = yaml.safe_load(args.series.read_text(encoding="utf-8"))
    if args.init_git:
        if not args.wheel:
            ap.error("--init-git needs --wheel")
        init_git(args.init_git, args.wheel, doc["series"])
        return 0
    metas = yaml.safe_load(args.headers.read_text(encoding="utf-8"))["headers"]
    changed = []
    for entry in doc["series"]:
        path = ROOT / entry["file"]
        body = git_body(args.from_git, entry["name"]) if args.from_git else stored_body(path)
        if not body.endswith("\n") or "\r" in body:
            raise SystemExit(f"{entry['name']}: the diff must use LF and end with a newline")
        text = header(entry, metas.get(entry["name"]) or {}) + body
        old = path.read_bytes() if path.exists() else None
        if old != text.encode("utf-8"):
            changed.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_bytes(text.encode("utf-8"))
    for name in changed:
        print(("would change " if args.check else "wrote ") + name)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
