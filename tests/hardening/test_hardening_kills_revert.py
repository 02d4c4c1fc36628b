"""Issue 25, class 7, the revert half of test_hardening_kills.py's local kill matrix: a
file of its own so that the test runner (--dist loadfile) deals it to another worker than
the apply half (together they were the longest file of the suite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hardening.test_hardening_kills import GitKill, gitkill, kill_matrix, series  # noqa: F401

pytestmark = pytest.mark.long


def test_a_kill_at_every_git_child_of_revert_is_repaired_by_the_next_command(
        series, pinned_base, tmp_path: Path, gitkill: GitKill) -> None:  # noqa: F811
    kill_matrix("revert", series, pinned_base, tmp_path, gitkill)
