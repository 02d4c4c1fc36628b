"""Issue 25, class 7, over SSH: the kill matrix of test_hardening_kills.py on a real
host. A file of its own so that the test runner deals it to a worker of its own (it is
the longest test of the suite: every git child of apply and revert, killed twice)."""

from __future__ import annotations

import json

import pytest

from tests.hostutil import TREE, clean_tree, cli, on_host
from tests.hardening.test_hardening_kills import KILLED, TOUCHED, WRAPPER, Tally
from tests.hosts.nspawn import TestHost

pytestmark = [pytest.mark.hosts, pytest.mark.long]

# ---------------------------------------------------------------- over SSH

HOST_CTL = "/run/gitkill"


def remote_exact(host: TestHost) -> dict:
    script = (f"cd {TREE} && G=/usr/bin/git && $G rev-parse HEAD && $G ls-files -s | "
              f"sha256sum && $G status --porcelain && sha256sum {' '.join(TOUCHED)} && "
              "find .git -name '*.lock' && ls .patchset | grep -vx recovery.log")
    return {"all": on_host(host, script)}


def test_a_kill_at_every_git_child_over_ssh_is_repaired(one_host: TestHost, remote_env,
                                                         capsys) -> None:
    """The same matrix over SSH on one host, apply and revert, the git child killed alone
    and with the engine (what a kill of the remote command's process group does): each
    kill is reported as a kill, status names the repair, and the next command makes the
    exact tree an uninterrupted command makes."""
    remote_env([one_host])
    clean_tree(one_host)
    on_host(one_host, f"rm -rf {HOST_CTL} && mkdir -p {HOST_CTL}")
    wrapper = WRAPPER.read_text()
    on_host(one_host, "cat > /usr/local/bin/git <<'GITKILL_EOF'\n" + wrapper
            + "GITKILL_EOF\nchmod 0755 /usr/local/bin/git")
    name = one_host.name
    ops = {"apply": (["apply", "--tier", "safe", name], ["apply", name]),
           "revert": (["apply", name], ["revert", "dsv4-b", "--with-dependents", "--host", name])}
    try:
        assert cli(capsys, "apply", "--tier", "safe", name)[0] == 0   # provisions the tree
        tally = Tally()
        for op, (start, run) in ops.items():
            assert cli(capsys, *start)[0] == 0
            arm(one_host, 0)
            code, _, err = cli(capsys, *run)
            assert code == 0, err
            total = len(on_host(one_host, f"cat {HOST_CTL}/calls").splitlines())
            disarm(one_host)
            intended = remote_exact(one_host)
            assert total >= 6
            for mode, call in [(m, c) for m in ("engine", "git") for c in range(1, total + 1)]:
                disarm(one_host)
                assert cli(capsys, *start)[0] == 0
                arm(one_host, call, mode)
                code, _, err = cli(capsys, *run)
                landed = on_host(one_host, f"cat {HOST_CTL}/landed 2>/dev/null || true").strip()
                disarm(one_host)
                assert landed, (op, mode, call, err)
                if code == 0:       # a git child the engine does without died
                    assert mode == "git" and remote_exact(one_host) == intended
                    tally.add(landed, True)
                    continue
                assert code == 4 and "python3" not in err, (op, mode, call, err)
                assert ("killed by a signal" if mode == "engine" else KILLED) in err, err
                code, out, _ = cli(capsys, "status", name, "--json")
                interrupted = json.loads(out)[0]["interrupted"]
                if interrupted and interrupted.get("git_locks"):
                    assert "clears the stale git lock(s)" in interrupted["next"]
                code, _, err = cli(capsys, *run)
                assert code == 0, (op, mode, call, landed, err)
                got = remote_exact(one_host)
                tally.add(landed, got == intended)
                assert got == intended, (op, mode, call, landed)
        print(f"\nover ssh: {tally.landed} kills landed, {tally.locks} holding a git lock "
              f"({sorted(tally.lock_calls)}), {tally.repaired}/{tally.landed} repaired")
        assert tally.repaired == tally.landed and tally.locks >= 8
    finally:
        on_host(one_host, f"rm -rf /usr/local/bin/git {HOST_CTL}")


def arm(host: TestHost, at: int, mode: str = "engine") -> None:
    on_host(host, f"cd {HOST_CTL} && rm -rf count calls landed held hooks && "
            f"echo {mode} > mode && echo {at} > at")


def disarm(host: TestHost) -> None:
    on_host(host, f"rm -f {HOST_CTL}/at")
