"""The tests say how they run: a test that boots nspawn hosts (a fixture of
tests/hosts/fixtures.py's HOST_FIXTURES) is marked `hosts` and lives in tests/system, and
every test there is marked, so `make test-fast` (-m "not hosts") is exactly tests/unit and
tests/hardening; tests/hardening holds the hardening files; `long` (dealt out first) is said
of whole files. Read from a real collection of the whole suite, in a child pytest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosts.fixtures import HOST_FIXTURES

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
KINDS = ("unit", "hardening", "system")

# Writes, for each collected test, its file, its marks and the host fixtures it uses.
DUMP = """
import json, os
from tests.hosts.fixtures import HOST_FIXTURES

def pytest_collection_finish(session):
    rows = [{"file": str(item.path), "id": item.nodeid,
             "marks": sorted({m.name for m in item.iter_markers()}),
             "host_fixtures": sorted(HOST_FIXTURES & set(getattr(item, "fixturenames", ())))}
            for item in session.items]
    with open(os.environ["LAYOUT_DUMP"], "w") as out:
        json.dump(rows, out)
"""


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    where = tmp_path_factory.mktemp("layout")
    (where / "layout_dump.py").write_text(DUMP)
    out = where / "tests.json"
    env = {**os.environ, "LAYOUT_DUMP": str(out),
           "PYTHONPATH": os.pathsep.join([str(where), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-p", "layout_dump"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert len(rows) > 1000                        # the whole suite, not one folder
    return rows


def kind(row: dict) -> str:
    return Path(row["file"]).relative_to(TESTS).parts[0]


def test_every_test_file_is_in_the_folder_of_its_kind(collected) -> None:
    assert {kind(r) for r in collected} == set(KINDS)
    assert sorted(TESTS.glob("test_*.py")) == []
    for folder in KINDS:
        assert (TESTS / folder / "__init__.py").is_file()


def test_a_test_that_boots_hosts_is_marked_and_in_tests_system(collected) -> None:
    unmarked = [r["id"] for r in collected if r["host_fixtures"] and "hosts" not in r["marks"]]
    elsewhere = [r["id"] for r in collected if r["host_fixtures"] and kind(r) != "system"]
    assert unmarked == [] and elsewhere == []
    assert any(r["host_fixtures"] for r in collected)


def test_tests_system_is_exactly_the_hosts_tests(collected) -> None:
    """`-m "not hosts"` deselects all of tests/system and nothing else."""
    assert [r["id"] for r in collected if ("hosts" in r["marks"]) != (kind(r) == "system")] \
        == []


def test_tests_hardening_holds_the_hardening_files() -> None:
    """A hardening file that boots hosts is a system test (it keeps its name)."""
    hardening = {p.name for p in (TESTS / "hardening").glob("test_*.py")}
    named = {p.name for p in TESTS.glob("*/test_hardening_*.py") if p.parent.name != "system"}
    assert hardening == named and len(hardening) > 10
    assert list((TESTS / "unit").glob("test_hardening_*.py")) == []


def test_long_is_said_of_whole_files(collected) -> None:
    """`long` orders files (dealt out first): a file is long in all its tests or in none."""
    files: dict[str, set[bool]] = {}
    for r in collected:
        files.setdefault(r["file"], set()).add("long" in r["marks"])
    assert [f for f, said in files.items() if len(said) > 1] == []
    assert any(said == {True} for said in files.values())


def test_every_host_fixture_needs_host_base(collected) -> None:
    """host_base is the fixture that fails a test whose prerequisites (root,
    systemd-nspawn) are missing: every host fixture stands on it."""
    from tests.hosts import fixtures
    for name in HOST_FIXTURES:
        assert callable(getattr(fixtures, name)), name
    assert [r["id"] for r in collected if r["host_fixtures"]
            and "host_base" not in r["host_fixtures"]] == []
