"""Hostile input files (issue: bounded reading of every input). Manifest, inventory and
patch files are read only if regular and up to a bound; YAML expansion, depth, integer
size, dates and tags are bounded. Every case: exit 2, one line, nothing changed.

FIFO cases run the CLI in a subprocess with a timeout: a reader that blocks would hang
the test run instead of failing it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile import World, snapshot
from patchset import inputfile, yamlsrc
from patchset.errors import ManifestError

ROOT = Path(__file__).resolve().parents[2]


def bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


YAML_CASES = [
    ("alias-bomb", bomb(), "expands to more than 100000 nodes"),
    ("alias-bomb-mapping", "a: &a {x: 1, y: 1, z: 1}\n" + "".join(
        f"b{i}: &b{i} {{p: *{'a' if i == 0 else f'b{i - 1}'}, q: *{'a' if i == 0 else f'b{i - 1}'}"
        f", r: *{'a' if i == 0 else f'b{i - 1}'}, s: *{'a' if i == 0 else f'b{i - 1}'}}}\n"
        for i in range(12)), "expands to more than"),
    ("deep-flow", "version: 1\nx: " + "[" * 200 + "]" * 200 + "\n", "nested deeper than 32"),
    ("deep-block", "version: 1\n" + "".join("  " * i + f"k{i}:\n" for i in range(40))
     + "  " * 40 + "v\n", "nested deeper than 32"),
    ("huge-int", "version: " + "9" * 5000 + "\n", "integer with 5000 digits"),
    ("huge-hex", "version: 0x" + "f" * 100 + "\n", "digits"),
    ("bad-date", "version: 1\nupstream: 2026-02-30\n", "is not a valid date"),
    ("bad-timestamp", "version: 1\nupstream: 2026-13-45 25:61:61\n", "is not a valid date"),
    ("python-tag", "version: !!python/object/apply:os.system ['touch /tmp/pwned']\n",
     "could not determine a constructor"),
    ("custom-tag", "version: !evil 1\n", "could not determine a constructor"),
    ("binary-tag", "version: !!binary 'not base64!'\n", "invalid YAML"),
    ("unhashable-key", "? [a, b]\n: 1\n", "invalid YAML"),
    ("mapping-key", "{a: 1}: 2\n", "invalid YAML"),
    ("duplicate-key", "version: 1\nversion: 1\n", "duplicate key"),
    ("two-documents", "version: 1\n---\nversion: 2\n", "invalid YAML"),
    ("tab-indent", "version: 1\nupstream:\n\tname: x\n", "invalid YAML"),
    ("unclosed-quote", 'version: "1\n', "invalid YAML"),
    ("scalar-document", "just a string\n", "must be a mapping"),
    ("empty-document", "", "must be a mapping"),
]


@pytest.mark.parametrize("case", YAML_CASES, ids=[c[0] for c in YAML_CASES])
@pytest.mark.parametrize("which", ["manifest", "inventory"])
def test_hostile_yaml_is_one_line(world: World, tmp_path: Path, case: tuple,
                                  which: str) -> None:
    _, text, fragment = case
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    argv = (("list", "--series", str(bad)) if which == "manifest"
            else ("status", "--inventory", str(bad), "gpu1"))
    line = world.refuse(argv, fragment)
    assert f"{bad}" in line


def test_the_yaml_loader_refuses_a_bomb_by_counting_not_by_building() -> None:
    """The bound is checked on parser events: a 9**10-node bomb is refused before a single
    object is constructed (the construct step is never reached)."""
    with pytest.raises(ManifestError, match="expands to more than"):
        yamlsrc.load(bomb(levels=10), "bomb.yaml")


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def cli(argv: list[str], cwd: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}   # this checkout
    return subprocess.run([sys.executable, "-m", "patchset.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def assert_one_line_2(proc: subprocess.CompletedProcess, fragment: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("patchset: error: "), proc.stderr
    assert fragment in lines[0] and "Traceback" not in proc.stderr


SPECIAL = [
    ("fifo", lambda d: fifo(d / "special"), "not a regular file (a FIFO)"),
    ("dev-zero", lambda d: Path("/dev/zero"), "not a regular file (a character device)"),
    ("dev-null", lambda d: Path("/dev/null"), "not a regular file (a character device)"),
    ("directory", lambda d: d, "not a regular file (a directory)"),
    ("symlink-to-zero", lambda d: _link(d / "link.yaml", "/dev/zero"),
     "not a regular file (a character device)"),
    ("dangling-symlink", lambda d: _link(d / "dangling.yaml", "/nonexistent/x"), "not found"),
    ("too-big", lambda d: _sparse(d / "big.yaml", inputfile.MANIFEST_LIMIT + 1),
     "larger than the 4 MiB"),
    ("nul-bytes", lambda d: _write(d / "nul.yaml", b"version: 1\x00\n"), "binary data"),
    ("latin1", lambda d: _write(d / "latin1.yaml", b"version: 1\nname: caf\xe9\n"),
     "not UTF-8 text"),
]


def _link(path: Path, target: str) -> Path:
    path.symlink_to(target)
    return path


def _sparse(path: Path, size: int) -> Path:
    with path.open("wb") as handle:
        handle.truncate(size)
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", SPECIAL, ids=[c[0] for c in SPECIAL])
@pytest.mark.parametrize("flag", ["--series", "--inventory"])
def test_special_files_are_refused_without_blocking(world: World, tmp_path: Path,
                                                    case: tuple, flag: str) -> None:
    _, make, fragment = case
    target = make(tmp_path)
    if flag == "--inventory" and fragment.startswith("larger"):
        fragment = "larger than the 1 MiB"
    before = world.state()
    argv = ["list", "--series", str(target)] if flag == "--series" else \
        ["status", "--inventory", str(target), "gpu1"]
    proc = cli(argv, world.series)
    assert_one_line_2(proc, fragment)
    assert world.state() == before


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "symlink-to-zero", "directory"])
def test_a_patch_file_that_is_not_a_regular_file_is_refused(world: World, kind: str) -> None:
    patch = world.series / "patches" / "chat-e.patch"
    original = patch.read_bytes()
    patch.unlink()
    if kind == "fifo":
        os.mkfifo(patch)
    elif kind == "directory":
        patch.mkdir()
    else:
        patch.symlink_to("/dev/zero")
    try:
        proc = cli(["list"], world.series)
        assert_one_line_2(proc, "not a regular file" if kind in ("fifo", "directory")
                          else "outside the series directory")
        assert "series[4].file" in proc.stderr
    finally:
        patch.rmdir() if patch.is_dir() and not patch.is_symlink() else patch.unlink()
        patch.write_bytes(original)


def test_a_patch_file_linking_outside_the_series_is_refused(world: World, tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("root:x:0:0:not for the terminal\n")
    patch = world.series / "patches" / "chat-e.patch"
    original = patch.read_bytes()
    patch.unlink()
    patch.symlink_to(outside)
    try:
        line = world.refuse(("list",), "outside the series directory")
        assert "not for the terminal" not in line and "series[4].file" in line
    finally:
        patch.unlink()
        patch.write_bytes(original)


def test_policy_data_is_checked_against_the_fact_table(tmp_path: Path) -> None:
    from patchset.auditor import policy
    data = Path(policy.__file__).parent / "data"
    for name in ("hazards.yaml", "tensors.yaml", "symptoms.yaml"):
        (tmp_path / name).write_bytes((data / name).read_bytes())
    hazards = (tmp_path / "hazards.yaml").read_text()
    assert "fact: checkpoint.moe_quant_algo" in hazards
    (tmp_path / "hazards.yaml").write_text(hazards.replace("fact: checkpoint.moe_quant_algo",
                                                           "fact: gpu.no_such_fact", 1))
    with pytest.raises(policy.AuditDataError, match=r"hazards\.yaml: hazards\[\d+\]\.when"
                                                    r"\[\d+\]\.fact: no such fact"):
        policy.load(str(tmp_path))
    assert policy.AuditDataError.exit_code == 2


@pytest.mark.parametrize("entry", ['{pattern: 3}', '{pattern: "*x", max: "9"}',
                                   '{pattern: "*x", max: 0}', '{pattern: "*x", mx: 9}', '"*x"'])
def test_a_tensor_pattern_that_is_not_a_glob_and_a_count_is_named(tmp_path: Path,
                                                                  entry: str) -> None:
    """tensors.yaml's patterns become the audit request's typed TensorPatterns on the
    controller: a bad entry is one line naming the file and the entry, never a host error."""
    from patchset.auditor import policy
    data = Path(policy.__file__).parent / "data"
    for name in ("hazards.yaml", "tensors.yaml", "symptoms.yaml"):
        (tmp_path / name).write_bytes((data / name).read_bytes())
    text = (tmp_path / "tensors.yaml").read_text()
    assert '  - {pattern: "*hc_attn_fn", max: 128}\n' in text
    (tmp_path / "tensors.yaml").write_text(text.replace(
        '  - {pattern: "*hc_attn_fn", max: 128}\n', f"  - {entry}\n", 1))
    with pytest.raises(policy.AuditDataError, match=r"tensors\.yaml: patterns\[0\]: expected"):
        policy.load(str(tmp_path))


def test_snapshot_sees_a_change(tmp_path: Path) -> None:
    """The nothing-changed assertions above are only as good as the snapshot."""
    (tmp_path / "f").write_text("a")
    before = snapshot(tmp_path)
    (tmp_path / "f").write_text("b")
    assert snapshot(tmp_path) != before
    os.chmod(tmp_path / "f", 0o600)
    again = snapshot(tmp_path)
    os.chmod(tmp_path / "f", 0o644)
    assert snapshot(tmp_path) != again
