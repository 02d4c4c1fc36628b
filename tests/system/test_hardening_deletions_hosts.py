"""Patches that delete or create files, over SSH on a real nspawn host's git tree: applied
and reverted exactly (the local trees and `check`'s refusals:
tests/hardening/test_hardening_deletions.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.hardening.test_hardening_deletions import (ALONE, CREATED, GONE, delete_and_create,
                                                      write_series)
from tests.hosts.nspawn import TestHost
from tests.hostutil import TREE, clean_tree, cli, on_host

pytestmark = pytest.mark.hosts


def test_deletion_and_creation_over_ssh(one_host: TestHost, remote_env, series_dir: Path,
                                        pinned_base, capsys) -> None:
    """The git tree on the host: after the revert HEAD is the pin, git sees no change (the
    deleted file's bytes and mode back, no file added) and the new directory is gone."""
    remote_env([one_host])
    clean_tree(one_host)
    write_series(pinned_base, series_dir, delete_and_create)
    code, out, err = cli(capsys, "apply", "--tier", "safe", one_host.name, "--json")
    assert code == 0, err
    shown = on_host(one_host, f"test ! -e {TREE}/{GONE} && test ! -e "
                              f"{TREE}/{os.path.dirname(ALONE)} && cat {TREE}/{CREATED}")
    assert shown == "ADDED = True\n"
    code, out, _ = cli(capsys, "status", one_host.name, "--json")
    [st] = json.loads(out)
    assert st["drift"] == [] and st["dirty"] == [] and st["applied"][0]["name"] == "files"

    code, out, err = cli(capsys, "revert", "files", "--host", one_host.name, "--json")
    assert code == 0, err
    after = on_host(one_host, f"cd {TREE} && test ! -e {os.path.dirname(CREATED)} && "
                              f"stat -c %a {ALONE} {GONE} && git rev-parse HEAD && "
                              "git status --porcelain --untracked-files=all")
    assert after == f"644\n644\n{st['base']['commit']}\n"
    code, out, _ = cli(capsys, "status", one_host.name, "--json")
    [st] = json.loads(out)
    assert st["drift"] == [] and st["dirty"] == [] and st["applied"] == []
