"""`patchset capture` over SSH: a hand edit on a real nspawn host's managed tree becomes a
patch, the host unchanged (local trees: tests/unit/test_capture.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchset.series.manifest import load_series
from tests.hostutil import TREE, clean_tree, cli, on_host
from tests.seriesfactory import CHAT, DSV4
from tests.unit.test_capture import AUTHOR

pytestmark = pytest.mark.hosts


def test_capture_over_ssh(one_host, remote_env, series_dir: Path, capsys) -> None:
    remote_env([one_host])
    clean_tree(one_host)
    code, _, err = cli(capsys, "apply", "--only", "chat-a,chat-e", one_host.name)
    assert code == 0, err
    look = (f"sha1sum {TREE}/{DSV4} {TREE}/{CHAT} {TREE}/.patchset/state.json && "
            f"git -C {TREE} rev-parse HEAD && git -C {TREE} status --porcelain")
    on_host(one_host, f"sed -i '1a # remote hand edit' {TREE}/{CHAT}")
    before = on_host(one_host, look)
    code, out, err = cli(capsys, "capture", one_host.name, "chat-remote", "--author", AUTHOR,
                         "--offline", "--json")
    assert code == 0, err
    assert json.loads(out)["depends"] == ["chat-a", "chat-e"]
    assert on_host(one_host, look) == before
    patch = load_series(series_dir / "patches.yaml").by_name()["chat-remote"]
    assert "+# remote hand edit\n" in (series_dir / patch.file).read_text()
    assert patch.files[0].post == on_host(
        one_host, f"git -C {TREE} hash-object {TREE}/{CHAT}").strip()
    code, out, err = cli(capsys, "check", "--offline")
    assert code == 0, out + err
