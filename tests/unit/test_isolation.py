"""Tests never read or write the user's real ~/.cache/patchset, ~/.local/share/patchset
or ~/.ssh (conftest points HOME/XDG into a session directory and audits file access)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import conftest


def test_home_cache_and_state_point_into_the_session_directory() -> None:
    from patchset.pin.paths import data_home
    from patchset.pin.upstream import cache_root
    session = str(conftest.SESSION_HOME)
    assert os.environ["HOME"] == session and Path.home() == conftest.SESSION_HOME
    assert str(data_home()).startswith(session)
    assert not str(cache_root()).startswith(conftest.PROTECTED)
    for var in ("XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME"):
        assert os.environ[var].startswith(session)


def test_subprocesses_inherit_the_session_home() -> None:
    out = subprocess.run([sys.executable, "-c", "from pathlib import Path; print(Path.home())"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(conftest.SESSION_HOME)


def test_the_audit_hook_sees_an_access_to_the_real_home() -> None:
    """The hook is what makes the session fail; prove it fires (on a name that cannot
    exist, so nothing is read: the open fails, the attempt is still recorded)."""
    probe = os.path.join(conftest.PROTECTED[2], "no-such-dir", ".patchset-isolation-probe")
    before = len(conftest.TOUCHED)
    try:
        open(probe, encoding="utf-8")
    except OSError:
        pass
    assert conftest.TOUCHED[before:] == [f"open {probe}"]
