"""The shipped DeepSeek-V4 sm_120 series: metadata complete, deterministic, and every
selection the tier and dependency rules allow applies on the real pin with zero fuzz."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from patchset import api
from patchset.series.manifest import load_series
from patchset.series.selection import Selection, plan

ROOT = Path(__file__).resolve().parents[2]
NAMES = {"mma-splitk-decode", "triton-dsa-indexer", "indexer-bf16-gemm", "mhc-bf16",
         "default-thinking-reasoning"}


@pytest.fixture(scope="module")
def series():
    return load_series(ROOT / "patches.yaml")


def test_series_has_the_patches_with_their_gates(series) -> None:
    patches = series.by_name()
    assert NAMES <= set(patches)
    assert patches["mma-splitk-decode"].gate.env == "MMA_FLASHMLA"
    assert patches["triton-dsa-indexer"].gate.env == "TRITON_INDEXER"
    for name in ("indexer-bf16-gemm", "mhc-bf16", "default-thinking-reasoning"):
        assert patches[name].gate is None
    assert patches["mhc-bf16"].tier == "risky"
    for patch in series.patches:
        assert {"Description", "Author", "Last-Update", "Forwarded"} <= set(patch.header)
        assert patch.requires, f"{patch.name} declares no runtime conditions"
        assert patch.evidence.get("command"), f"{patch.name} has no evidence command"


def test_every_allowed_selection_applies_on_the_pin(series, pinned_base) -> None:
    def read(path: str) -> bytes | None:
        proc = subprocess.run(["git", "cat-file", "blob", f"{pinned_base.commit}:{path}"],
                              cwd=pinned_base.repo, capture_output=True)
        return proc.stdout if proc.returncode == 0 else None

    report = api.check(series, read, pinned_base.commit, exhaustive=True)
    assert all(p.ok for p in report.preimages), [p for p in report.preimages if not p.ok]
    failed = [(s.names, s.error) for s in report.selections if not s.ok]
    assert failed == []
    every_tier = {plan(series, Selection(tier=t)).names for t in ("safe", "moderate", "risky")}
    assert every_tier <= {s.names for s in report.selections}
    assert len(report.selections) == 48     # dependency-closed subsets of the six patches


def test_regenerating_the_patches_changes_no_byte() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "dev" / "regen_patches.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
