"""Issue 25, class 6: `check` and the other commands validate a series in one place.

A series `check` refuses is refused by every command that reads it, with the same one
line and exit 2 (the bad-input contract of tests/hostile.py: nothing changed anywhere);
and every selection `check` passes is one that `plan` and `apply` then take.

The known disagreements this pins down: a patch that conflicts with a patch it needs
(`check` skipped it, `list`/`plan` refused the series as a selection error, `status`,
`revert` and `export` took it); a pin whose sha256 the cached wheel disagrees with (only
the commands that provision refused it); a `\\ No newline at end of file` marker where a
diff does not allow it (`git apply` joined two lines: `check` said FINDINGS, `apply`
failed on the host, `list`/`plan`/`export` passed it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import pytest
import yaml

from tests.hostile import World
from tests.hostutil import cli as run

ADDED = "+# patch chat-a\n"
MARKER = "\\ No newline at end of file\n"


def commands(quilt: Path) -> list[tuple[str, ...]]:
    """Every command that reads the series and can run here without a server: each must
    refuse a bad series before it touches a host, the cache or an output."""
    return [("list",), ("list", "--tier", "safe"), ("show", "chat-a"), ("check", "--offline"),
            ("plan",), ("plan", "--only", "chat-e"), ("plan", "localhost"),
            ("apply", "--dry-run", "--tier", "risky", "localhost"),
            ("apply", "--only", "chat-e", "localhost"), ("revert", "chat-a"), ("status",),
            ("provision", "--offline"), ("export", "--quilt", str(quilt)),
            ("capture", "localhost", "new-patch"), ("audit", "localhost"),
            ("trace", "localhost")]


def set_entry(name: str, **fields) -> Callable[[World], None]:
    def change(world: World) -> None:
        data = world.data()
        next(p for p in data["series"] if p["name"] == name).update(fields)
        world.manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    return change


def set_sha(world: World) -> None:
    data = world.data()
    sha = data["upstream"]["pypi"]["sha256"]
    data["upstream"]["pypi"]["sha256"] = sha[:-1] + ("0" if sha[-1] != "0" else "1")
    world.manifest.write_text(yaml.safe_dump(data, sort_keys=False))


def patch_text(old: str, new: str) -> Callable[[World], None]:
    def change(world: World) -> None:
        path = world.series / "patches" / "chat-a.patch"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))
    return change


CASES = [
    ("conflicts-own-dependency", set_entry("chat-e", conflicts=["chat-a"]),
     "series[4].conflicts[0]: 'chat-e' conflicts with 'chat-a', which it needs: no "
     "selection can take it"),
    ("dependencies-conflict", set_entry("dsv4-b", conflicts=["idx-c"]),
     "series[1].conflicts[0]: 'idx-d' needs both 'dsv4-b' and 'idx-c', which conflict: no "
     "selection can take it"),
    ("pin-sha256-not-the-cached-wheel", set_sha, re.compile(
        r"patches\.yaml:\d+: upstream\.pypi\.sha256: sha256 mismatch for \S+: the pin says "
        r"[0-9a-f]{64}, the cached file is [0-9a-f]{64}")),
    ("marker-mid-hunk", patch_text(ADDED, ADDED + MARKER),
     "diff.hunk: '\\\\ No newline at end of file' is not a `\\ No newline at end of file` "
     "marker after the last line of a side of the hunk of line"),
    ("marker-after-header", patch_text("@@\n", "@@\n" + MARKER), "diff.hunk: '\\\\ No newline"),
    ("marker-not-git-form", patch_text(ADDED, ADDED + "\\x\n"), "diff.hunk: '\\\\x' is not"),
    ("marker-twice-at-end", lambda w: _append_marker(w, 2),
     "diff.hunk:"),
    ("unknown-prefix-in-hunk", patch_text(ADDED, ADDED + "*star\n"),
     "diff.hunk: not a diff line: '*star'"),
]


def _append_marker(world: World, count: int) -> None:
    path = world.series / "patches" / "chat-a.patch"
    path.write_text(path.read_text() + MARKER * count)


@pytest.fixture()
def restore(world: World):
    """The world is shared by the module's cases: put the series back after each."""
    saved = {p: p.read_bytes() for p in [world.manifest, *sorted(
        (world.series / "patches").iterdir())]}
    yield world
    for path, data in saved.items():
        path.write_bytes(data)


@pytest.mark.parametrize(("case", "spoil", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_series_check_refuses_is_refused_by_every_command_alike(
        restore: World, tmp_path: Path, case, spoil, message) -> None:
    world = restore
    spoil(world)
    lines = {argv: world.refuse(argv, message) for argv in commands(tmp_path / "quilt")}
    assert len(set(lines.values())) == 1, lines
    assert not (tmp_path / "quilt").exists()


def test_a_marker_git_allows_still_loads(restore: World) -> None:
    """The markers `git diff` writes (after the last line of each side) stay valid."""
    world = restore
    path = world.series / "patches" / "chat-a.patch"
    text = path.read_text()
    hunk = text[text.index("@@ "):]
    last = hunk.rstrip("\n").split("\n")[-1]
    assert last.startswith(" ")
    path.write_text(text + MARKER)                  # after the last (context) line
    code, _, err = world.run("list")
    assert code == 0, err


# ---------------------------------------------------------------- check passes => apply

@pytest.fixture()
def conflicting(series_dir: Path, patchset_home: Path, monkeypatch) -> Path:
    """The test series with a conflict no patch's dependencies reach (idx-c vs chat-a)."""
    monkeypatch.chdir(series_dir)
    manifest = series_dir / "patches.yaml"
    data = yaml.safe_load(manifest.read_text())
    next(p for p in data["series"] if p["name"] == "idx-c")["conflicts"] = ["chat-a"]
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    return series_dir


def test_every_selection_check_passes_plans_and_applies(conflicting: Path, capsys) -> None:
    code, out, err = run(capsys, "check", "--offline", "--json", "--exhaustive")
    assert code == 0, err
    report = json.loads(out)
    selections = [tuple(s["names"]) for s in report["selections"]]
    assert all(s["ok"] for s in report["selections"])
    assert not any({"idx-c", "chat-a"} <= set(names) for names in selections)
    assert len([n for n in selections if n]) == 8   # 15 closed of 32, less 7 with both
    for names in filter(None, selections):
        only = ",".join(names)
        code, out, err = run(capsys, "plan", "--only", only, "--json")
        assert code == 0, (names, err)
        assert tuple(json.loads(out)["selected"]) == names
        code, out, err = run(capsys, "apply", "--only", only, "localhost", "--json")
        assert code == 0, (names, err)
        code, out, err = run(capsys, "status", "--json")
        assert code == 0, (names, err)
        assert tuple(p["name"] for p in json.loads(out)[0]["applied"]) == names, out


def test_a_selection_check_skips_is_one_plan_refuses(conflicting: Path, capsys) -> None:
    """What `check` leaves out (a conflict, a missing dependency) `plan` refuses or widens:
    the two ask the same question (selection.plan)."""
    from patchset.api import closed_selections
    from patchset.series.manifest import load_series
    series = load_series(conflicting / "patches.yaml")
    allowed = {tuple(p.name for p in s) for s in closed_selections(series, exhaustive=True)}
    code, _, err = run(capsys, "plan", "--only", "idx-c,chat-a")
    assert code == 2 and "idx-c conflicts with chat-a" in err
    assert ("chat-a", "idx-c") not in allowed
    code, out, err = run(capsys, "plan", "--only", "chat-e", "--json")
    assert code == 0 and json.loads(out)["selected"] == ["chat-a", "chat-e"]
    assert ("chat-e",) not in allowed and ("chat-a", "chat-e") in allowed


def test_a_series_check_passes_is_listed_whole(conflicting: Path, capsys) -> None:
    """`list` is a listing, not a selection: a conflict check passes does not stop it
    (it refused the series as a selection error), while `plan` refuses taking both."""
    code, out, err = run(capsys, "list", "--json")
    assert code == 0, err
    assert [p["name"] for p in json.loads(out)] == ["chat-a", "dsv4-b", "idx-c", "idx-d",
                                                    "chat-e"]
    code, out, err = run(capsys, "list", "--tier", "moderate", "--json")
    assert code == 0 and len(json.loads(out)) == 3, err
    code, _, err = run(capsys, "plan")
    assert code == 2 and "idx-c conflicts with chat-a; --exclude one of them" in err
