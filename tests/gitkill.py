#!/usr/bin/env python3
"""A `git` for the kill tests: first on PATH (locally, through the launcher the gitkill
fixture writes, which names the real git) or at /usr/local/bin/git (on a test host), it
runs the real git, except at call number N, where it SIGKILLs a running git child the way
a crash does: while that git holds its locks.

Standard library only (it runs on the nspawn hosts). Controlled by files in $GITKILL_DIR
(default /run/gitkill), so nothing reaches it through the agent's environment:
  at     N: the call to kill (absent or unreadable: every call is the real git)
  mode   "engine": kill the engine (this wrapper's parent) and the git child, as a kill
         of the whole process group does; "git": kill the git child only (the engine
         sees its git die)
  count  one byte appended per call (its size is the call number)
  calls  one line per call: the number and the git arguments
  landed written at the kill: the argv of the killed git and whether it held a lock

At call N the real git runs with its stdin held open and `core.hooksPath` pointing at a
reference-transaction hook that stops in the "prepared" state, so `update-index` (which
takes index.lock before it reads its stdin) and `update-ref` (HEAD.lock and the branch's
lock, taken before the hook runs) are killed holding their real locks.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

CTL = os.environ.get("GITKILL_DIR", "/run/gitkill")
HOOK = """#!/bin/sh
[ "$1" = prepared ] || exit 0
touch "$GITKILL_DIR/held"
exec sleep 30
"""


def real_git() -> str:
    """$GITKILL_REAL_GIT (set by the local launcher), else the first other git on PATH."""
    explicit = os.environ.get("GITKILL_REAL_GIT")
    if explicit:
        return explicit
    me = os.path.realpath(__file__)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder or ".", "git")
        if (os.path.isfile(candidate) and os.access(candidate, os.X_OK)
                and os.path.realpath(candidate) != me):
            return candidate
    return "/usr/bin/git"


def control(name: str) -> str | None:
    try:
        with open(os.path.join(CTL, name), encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def count_call() -> int:
    path = os.path.join(CTL, "count")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b".")
    finally:
        os.close(fd)
    number = os.stat(path).st_size
    with open(os.path.join(CTL, "calls"), "a", encoding="utf-8") as handle:
        handle.write(f"{number} {' '.join(sys.argv[1:4])}\n")
    return number


def locks_held() -> bool:
    git_dir = os.path.join(os.getcwd(), ".git")
    return bool(glob.glob(os.path.join(git_dir, "*.lock"))
                or glob.glob(os.path.join(git_dir, "refs", "**", "*.lock"), recursive=True)
                or os.path.exists(os.path.join(CTL, "held")))


def kill_at_work(git: str) -> None:
    hooks = os.path.join(CTL, "hooks")
    os.makedirs(hooks, exist_ok=True)
    with open(os.path.join(hooks, "reference-transaction"), "w", encoding="utf-8") as handle:
        handle.write(HOOK)
    os.chmod(os.path.join(hooks, "reference-transaction"), 0o755)
    env = dict(os.environ, GITKILL_DIR=CTL)
    child = subprocess.Popen([git, "-c", f"core.hooksPath={hooks}", *sys.argv[1:]],
                             stdin=subprocess.PIPE, env=env, start_new_session=True)
    deadline = time.monotonic() + 0.5
    while child.poll() is None and not locks_held() and time.monotonic() < deadline:
        time.sleep(0.01)
    held = locks_held()
    with open(os.path.join(CTL, "landed"), "w", encoding="utf-8") as handle:
        handle.write(f"{' '.join(sys.argv[1:4])}\t{'lock' if held else 'nolock'}\n")
    if control("mode") == "engine":
        os.kill(os.getppid(), signal.SIGKILL)
    try:
        os.killpg(child.pid, signal.SIGKILL)   # git and its hook
    except ProcessLookupError:
        pass                                   # it had finished
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    git = real_git()
    at = control("at")
    if at and at.isdigit() and count_call() == int(at):
        kill_at_work(git)
    os.execv(git, [git, *sys.argv[1:]])


if __name__ == "__main__":
    main()
