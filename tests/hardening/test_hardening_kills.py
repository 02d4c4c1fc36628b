"""Issue 25, class 7: a kill can leave a tree that no command repairs.

A SIGKILL at every git child of apply and of revert (tests/gitkill.py, a `git` first on
PATH that kills at call N while that git holds its real locks), locally (the engine's
git child alone, or the engine with it) and over SSH: the next command repairs the tree
to the exact intended one (HEAD, index, files, state), `status` says before it what that
command will do, and the kill is reported as a kill.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from patchset.connect.local import LocalTransport
from patchset import api
from patchset import transport as wire
from patchset.agent import engine
from patchset.errors import TargetError
from patchset.series.manifest import load_series
from patchset.series.selection import Selection, plan
from patchset.pin.upstream import materialize
from tests.seriesfactory import CHAT, DSV4, INDEXER

pytestmark = pytest.mark.long

WRAPPER = Path(__file__).resolve().parents[1] / "gitkill.py"
TOUCHED = (CHAT, DSV4, INDEXER)
KILLED = "was killed by SIGKILL"


class GitKill:
    """tests/gitkill.py's control files, in a local directory."""

    def __init__(self, ctl: Path) -> None:
        self.ctl = ctl
        ctl.mkdir(parents=True, exist_ok=True)

    def arm(self, at: int, mode: str = "engine") -> None:
        """Kill at call `at` (0: count the calls, kill none)."""
        shutil.rmtree(self.ctl / "hooks", ignore_errors=True)
        for name in ("count", "calls", "landed", "held"):
            (self.ctl / name).unlink(missing_ok=True)
        (self.ctl / "mode").write_text(mode)
        (self.ctl / "at").write_text(str(at))

    def disarm(self) -> None:
        (self.ctl / "at").unlink(missing_ok=True)

    def calls(self) -> list[str]:
        path = self.ctl / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def landed(self) -> str | None:
        path = self.ctl / "landed"
        return path.read_text().strip() if path.exists() else None


@dataclass
class Tally:
    """Kills that landed, those that left a git lock, and trees repaired exactly."""
    landed: int = 0
    locks: int = 0
    repaired: int = 0
    lock_calls: set[str] = field(default_factory=set)    # the git commands killed locked

    def add(self, landed: str, repaired: bool) -> None:
        self.landed += 1
        self.repaired += repaired
        if landed.endswith("\tlock"):
            self.locks += 1
            self.lock_calls.add(landed.split()[0])


# ---------------------------------------------------------------- the exact tree

def git_out(tree: Path, *args: str) -> str:
    return subprocess.run(["/usr/bin/git", *args], cwd=tree, capture_output=True, text=True,
                          check=True).stdout


def exact(tree: Path) -> dict:
    """Everything the intended tree is: HEAD, the whole index, the series' files, the
    state's selection; and nothing a kill leaves (no git lock, journal, staging)."""
    state = json.loads((tree / ".patchset" / "state.json").read_text())
    return {"head": git_out(tree, "rev-parse", "HEAD").strip(),
            "index": git_out(tree, "ls-files", "-s"),
            "status": git_out(tree, "status", "--porcelain"),
            "files": {p: (tree / p).read_bytes() for p in TOUCHED if (tree / p).exists()},
            "applied": [a["name"] for a in state["applied"]],
            "locks": sorted(str(p.relative_to(tree)) for p in (tree / ".git").rglob("*.lock")),
            "journal": (tree / ".patchset" / "journal.json").exists(),
            "txn": (tree / ".patchset" / "txn").exists()}


# ---------------------------------------------------------------- locally

@pytest.fixture()
def series(series_dir: Path):
    return load_series(series_dir / "patches.yaml")


@pytest.fixture()
def gitkill(tmp_path: Path, monkeypatch) -> GitKill:
    """tests/gitkill.py first on PATH for the engine's child process, through a launcher
    that names the real git and runs the wrapper with this interpreter without site
    (`-S`). Why: through `#!/usr/bin/env python3` a pyenv shim ran first, 95 ms of each
    git call's 100 (35 ms now), and every op of the matrix makes ~20 git calls."""
    real = shutil.which("git")
    assert real, "git is not on PATH"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    launcher = bindir / "git"
    launcher.write_text(f"#!/bin/sh\nGITKILL_REAL_GIT={shlex.quote(real)} exec "
                        f"{shlex.quote(sys.executable)} -S {shlex.quote(str(WRAPPER))} "
                        '"$@"\n')
    launcher.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GITKILL_DIR", str(tmp_path / "ctl"))
    return GitKill(tmp_path / "ctl")


def local_ops(series) -> dict[str, tuple[Callable, Callable]]:
    """op -> (bring the tree to its start, the op itself), each returning a HostResult."""
    def apply(tier: str | None) -> Callable:
        chosen = plan(series, Selection(tier=tier) if tier else Selection())
        return lambda t: api.apply(series, chosen, [t])[0]
    revert = lambda t: api.revert(series, ["dsv4-b"], t, with_dependents=True)  # noqa: E731
    return {"apply": (apply("safe"), apply(None)), "revert": (apply(None), revert)}


def test_a_kill_at_every_git_child_of_apply_is_repaired_by_the_next_command(
        series, pinned_base, tmp_path: Path, gitkill: GitKill) -> None:
    """The matrix for apply (revert's is test_hardening_kills_revert.py: a file of its
    own, so the test runner deals each half to a worker of its own)."""
    kill_matrix("apply", series, pinned_base, tmp_path, gitkill)


def kill_matrix(op: str, series, pinned_base, tmp_path: Path, gitkill: GitKill) -> None:
    """Every git child of the op, killed alone ("git") and with the engine ("engine"):
    each leaves what it leaves, and the same op run again repairs the tree to exactly the
    tree an uninterrupted op gives. Without the engine's stale-lock recovery, every kill
    that lands while git holds index.lock or HEAD.lock leaves a tree no command repairs."""
    start, run = local_ops(series)[op]
    tree = materialize(pinned_base, tmp_path / "tree", layout="git")
    transport = LocalTransport(tree, in_process=False)   # the engine in its own process
    assert start(transport).ok
    gitkill.arm(0)                                       # count the op's git children
    assert run(transport).ok
    intended, total = exact(tree), len(gitkill.calls())
    assert total >= 6 and intended["locks"] == [] and not intended["journal"]
    tally = Tally()
    for mode in ("engine", "git"):
        for call in range(1, total + 1):
            gitkill.disarm()
            assert start(transport).ok
            gitkill.arm(call, mode)
            killed = run(transport)
            landed = gitkill.landed()
            gitkill.disarm()
            assert landed, (mode, call, gitkill.calls())
            if killed.ok:           # a git child the engine does without (rev-parse's
                assert mode == "git" and exact(tree) == intended    # first ask) died
                tally.add(landed, True)
                continue
            assert KILLED in killed.error and "python3" not in killed.error, killed.error
            st = api.status(series, transport).record
            if st.interrupted:      # status names what the next command really does
                assert st.interrupted.next.startswith("the next apply or revert ")
                if st.interrupted.git_locks:
                    assert "clears the stale git lock(s)" in st.interrupted.next
            again = run(transport)
            assert again.ok, (mode, call, landed, again.error)
            got = exact(tree)
            tally.add(landed, got == intended)
            assert got == intended, (mode, call, landed)
            assert not api.status(series, transport).record.interrupted
    print(f"\n{op}: {tally.landed} kills landed at {total} git children x 2 modes, "
          f"{tally.locks} holding a git lock ({sorted(tally.lock_calls)}), "
          f"{tally.repaired}/{tally.landed} repaired exactly")
    assert tally.landed == 2 * total and tally.repaired == tally.landed
    assert {"update-index", "update-ref"} <= tally.lock_calls


def test_status_says_what_the_next_command_does_and_it_does_it(
        series, pinned_base, tmp_path: Path, gitkill: GitKill) -> None:
    """A git lock left by a killed update-index: status names it and says the next apply
    or revert clears it; the apply does, logs it in its result and the recovery log."""
    start, run = local_ops(series)["apply"]
    tree = materialize(pinned_base, tmp_path / "tree", layout="git")
    transport = LocalTransport(tree, in_process=False)
    assert start(transport).ok
    gitkill.arm(0)
    assert run(transport).ok
    index_call = next(int(c.split()[0]) for c in gitkill.calls() if " update-index " in c)
    gitkill.disarm()
    assert start(transport).ok
    gitkill.arm(index_call, "git")
    killed = run(transport)
    gitkill.disarm()
    assert "update-index failed" in killed.error and KILLED in killed.error
    assert (tree / ".git" / "index.lock").exists()
    st = api.status(series, transport).record
    assert st.interrupted.git_locks == ".git/index.lock"
    assert st.interrupted.next == ("the next apply or revert clears the stale git lock(s) "
                                      ".git/index.lock (no git process is working in the "
                                      "tree) and finishes it")
    again = run(transport)
    assert again.ok and again.recovered and again.recovered.finished
    assert again.recovered.stale_git_locks == [str(tree / ".git" / "index.lock")]
    log = [json.loads(line) for line in
           (tree / ".patchset" / "recovery.log").read_text().splitlines()]
    assert log[-1]["stale_git_locks"] == again.recovered.stale_git_locks
    assert not (tree / ".git" / "index.lock").exists()


def test_a_lock_of_a_live_git_is_never_cleared(series, pinned_base, tmp_path: Path,
                                               monkeypatch) -> None:
    """A git process at work in the tree holds index.lock: not stale. status says the next
    command waits for it; apply waits, then refuses as `locked` and leaves it alone."""
    start, run = local_ops(series)["apply"]
    tree = materialize(pinned_base, tmp_path / "tree", layout="git")
    transport = LocalTransport(tree)
    assert start(transport).ok
    monkeypatch.setattr(engine, "GIT_WAIT", 0.3)
    live = subprocess.Popen(["git", "update-index", "-z", "--index-info"], cwd=tree,
                            stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not (tree / ".git" / "index.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (tree / ".git" / "index.lock").exists()
        st = api.status(series, transport).record
        assert f"git (pid {live.pid})" in st.interrupted.next
        assert st.interrupted.next.startswith("the next apply or revert waits up to")
        result = run(transport)
        assert not result.ok and f"git (pid {live.pid}) is working in" in result.error
        assert (tree / ".git" / "index.lock").exists()
    finally:
        live.communicate(b"")
    assert not (tree / ".git" / "index.lock").exists()
    assert run(transport).ok


@pytest.mark.parametrize("exited, shell, killed", [
    (-9, False, "was killed by SIGKILL"), (137, True, "was killed by SIGKILL (exit 137)"),
    (-1, True, "ended without an exit status (killed by a signal"),
    (None, True, "ended without an exit status (killed by a signal"),
    (-15, False, "was killed by SIGTERM")])
def test_an_agent_killed_by_a_signal_is_reported_killed(exited, shell, killed) -> None:
    sink = wire.LineSink(None)
    with pytest.raises(TargetError) as caught:
        sink.outcome("h", exited, "", "apply", shell=shell)
    message = str(caught.value)
    assert f"the engine {killed}" in message and "python3" not in message
    assert "patchset status" in message


@pytest.mark.parametrize("exited, shell", [(127, True), (1, False),
                                           (129, False)])     # git's usage error: no SIGHUP
def test_an_agent_that_did_not_start_still_asks_for_python3(exited, shell) -> None:
    with pytest.raises(TargetError) as caught:
        wire.LineSink(None).outcome("h", exited, "python3: not found", "apply", shell=shell)
    assert f"exited {exited}" in str(caught.value) and "python3 >= 3.8" in str(caught.value)
