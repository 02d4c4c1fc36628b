"""Every manifest/patch validation error: one line naming file, line and field; exit 2."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import pytest
import yaml

from patchset.cli import main
from patchset.errors import ManifestError
from patchset.series.manifest import load_series


def mutate_yaml(series_dir: Path, change: Callable[[dict], None]) -> Path:
    manifest = series_dir / "patches.yaml"
    data = yaml.safe_load(manifest.read_text())
    change(data)
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    return manifest


def entry(index: int, **values) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        data["series"][index].update(values)
    return change


def line_of(manifest: Path, needle: str, occurrence: int = 0) -> int:
    hits = [n for n, text in enumerate(manifest.read_text().split("\n"), 1) if needle in text]
    return hits[occurrence]


YAML_CASES = [
    # (id, mutation, field, message fragment, line needle)
    ("unknown-top-key", lambda d: d.update(extra=1), "extra", "unknown key", "extra:"),
    ("bad-version", lambda d: d.update(version=7), "version", "unsupported manifest version",
     "version: 7"),
    ("bool-version", lambda d: d.update(version=True), "version",
     "unsupported manifest version True", "version: true"),
    ("float-version", lambda d: d.update(version=1.0), "version",
     "unsupported manifest version 1.0", "version: 1.0"),
    ("unknown-patch-key", entry(1, colour="red"), "series[1].colour", "unknown key", "colour:"),
    ("bad-tier", entry(0, tier="yolo"), "series[0].tier", "'yolo' is not one of", "tier: yolo"),
    ("bad-path", entry(0, path="sideways"), "series[0].path", "not one of", "path: sideways"),
    ("bad-status", entry(0, upstream_status="merged"), "series[0].upstream_status",
     "not one of", "upstream_status: merged"),
    ("unsafe-name", entry(0, name="x; rm -rf /"), "series[0].name", "is not a patch name",
     "name: x; rm"),
    ("upper-name", entry(0, name="Chat"), "series[0].name", "is not a patch name", "name: Chat"),
    ("dup-name", entry(1, name="chat-a"), "series[1].name", "duplicate patch name",
     "name: chat-a", 1),
    ("missing-file", entry(0, file="patches/nope.patch"), "series[0].file", "does not exist",
     "file: patches/nope.patch"),
    ("dotdot-file", entry(0, file="patches/../x.patch"), "series[0].file",
     "inside the series directory", "file: patches/../x.patch"),
    ("abs-file", entry(0, file="/etc/passwd"), "series[0].file", "inside the series directory",
     "file: /etc/passwd"),
    ("unknown-depend", entry(4, depends=["ghost"]), "series[4].depends[0]",
     "unknown patch 'ghost'", "- ghost"),
    ("self-depend", entry(4, depends=["chat-e"]), "series[4].depends[0]", "cannot name itself",
     "- chat-e"),
    ("later-depend", entry(0, depends=["chat-e"]), "series[0].depends", "dependency cycle",
     "depends:"),
    ("forward-depend", entry(1, depends=["idx-c"]), "series[1].depends[0]", "comes later",
     "- idx-c"),
    ("unknown-conflict", entry(0, conflicts=["ghost"]), "series[0].conflicts[0]",
     "unknown patch", "- ghost"),
    ("gate-not-string", entry(2, gate={"env": "TRITON_INDEXER", "on": 1}), "series[2].gate.on",
     "quoted string", "'on': 1"),
    ("gate-bad-env", entry(2, gate={"env": "A B", "on": "1"}), "series[2].gate.env",
     "is not an environment variable name", "env: A B"),
    ("gate-extra", entry(2, gate={"env": "X", "on": "1", "off": "0"}), "series[2].gate.off",
     "unknown key", "'off':"),
    ("requires-namespace", entry(0, requires=[{"fact": "cpu.arch", "op": "eq", "value": "x"}]),
     "series[0].requires[0].fact", "namespace", "fact: cpu.arch"),
    ("requires-op", entry(0, requires=[{"fact": "gpu.compute_cap", "op": "gt", "value": "x"}]),
     "series[0].requires[0].op", "not one of", "op: gt"),
    ("requires-in-scalar", entry(0, requires=[{"fact": "gpu.compute_cap", "op": "in", "value": "x"}]),
     "series[0].requires[0].value", "needs a list", "value: x"),
    ("requires-patch", entry(0, requires=[{"fact": "patch.ghost", "op": "eq", "value": "x"}]),
     "series[0].requires[0].fact", "unknown patch", "fact: patch.ghost"),
    ("missing-tier", lambda d: d["series"][0].pop("tier"), "series[0]", "missing required key",
     "- name: chat-a"),
    ("bad-sha", lambda d: d["upstream"]["pypi"].update(sha256="abc"), "upstream.pypi.sha256",
     "is not a 64-hex sha256", "sha256: abc"),
    ("no-source", lambda d: (d["upstream"].pop("git"), d["upstream"].pop("pypi")), "upstream",
     "needs `git` or `pypi`", "upstream:"),
    ("series-not-list", lambda d: d.update(series={"a": 1}), "series", "must be a list",
     "series:"),
]


@pytest.mark.parametrize("case", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_manifest_errors_name_file_line_field(series_dir: Path, case: tuple) -> None:
    _, change, field, fragment, needle, *occ = case
    manifest = mutate_yaml(series_dir, change)
    with pytest.raises(ManifestError) as info:
        load_series(manifest)
    err = info.value
    assert err.field == field
    assert fragment in str(err)
    assert err.line == line_of(manifest, needle, *occ)
    assert str(err).startswith(f"{manifest}:{err.line}: {field}: ")
    assert "\n" not in str(err)


def test_duplicate_yaml_key_and_syntax_error(series_dir: Path) -> None:
    manifest = series_dir / "patches.yaml"
    text = manifest.read_text()
    manifest.write_text(text.replace("  tier: safe\n", "  tier: safe\n  tier: risky\n", 1))
    with pytest.raises(ManifestError, match=r"series\[0\]\.tier: duplicate key"):
        load_series(manifest)
    manifest.write_text("series: [\n")
    with pytest.raises(ManifestError, match="invalid YAML"):
        load_series(manifest)


def rewrite_patch(series_dir: Path, name: str, change: Callable[[str], str]) -> Path:
    path = series_dir / "patches" / f"{name}.patch"
    path.write_text(change(path.read_text()))
    return path


PATCH_CASES = [
    ("dotdot-path", lambda t: t.replace("a/python/sglang/srt/entrypoints",
                                        "a/python/../../etc", 1), "diff.path", "outside the tree"),
    ("abs-path", lambda t: t.replace("+++ b/python/", "+++ /etc/", 1), "diff.path",
     "outside the tree"),
    ("outside-prefix", lambda t: t.replace(" b/python/", " b/docs/", 1).replace(
        " a/python/", " a/docs/", 1).replace("--- a/python/", "--- a/docs/").replace(
        "+++ b/python/", "+++ b/docs/"), "diff.path", "outside the upstream package prefix"),
    ("odd-chars", lambda t: t.replace("openai/serving_chat.py", "openai/serving chat.py"),
     "diff.path", "has characters patchset does not handle"),
    ("binary", lambda t: t + "diff --git a/python/x.bin b/python/x.bin\nindex "
     + "1" * 40 + ".." + "2" * 40 + "\nBinary files a/python/x.bin and b/python/x.bin differ\n",
     "diff", "binary diffs are not supported"),
    ("short-index", lambda t: re.sub(r"index ([0-9a-f]{40})\.\.([0-9a-f]{40})",
                                     lambda m: f"index {m.group(1)[:7]}..{m.group(2)[:7]}", t),
     "diff.index", "full 40-hex"),
    ("bad-hunk-header", lambda t: t.replace("@@ -", "@@ -x", 1), "diff.hunk",
     "malformed hunk header"),
    ("truncated-hunk", lambda t: t.rsplit("\n", 3)[0] + "\n", "diff.hunk", "fewer than its header"),
    ("stray-line", lambda t: t.replace("\n+#", "\nstray\n+#", 1), "diff.hunk",
     "not a diff line"),
    ("no-diff", lambda t: t.split("diff --git")[0], "diff", "no `diff --git`"),
    ("header-unknown", lambda t: "Colour: red\n" + t, "header.Colour", "unknown header field"),
    ("header-date", lambda t: t.replace("Last-Update: 2026-11-29", "Last-Update: yesterday"),
     "header.Last-Update", "not a YYYY-MM-DD date"),
    ("header-missing-author", lambda t: re.sub(r"Author: .*\n", "", t), "header.Author",
     "missing required"),
    ("header-name-mismatch", lambda t: t.replace("Patchset-Name: chat-a", "Patchset-Name: x"),
     "header.Patchset-Name", "does not match the series name"),
    ("rename", lambda t: t.replace("index ", "similarity index 90%\nrename from a\nindex ", 1),
     "diff", "renames/copies are not supported"),
]


@pytest.mark.parametrize("case", PATCH_CASES, ids=[c[0] for c in PATCH_CASES])
def test_patch_file_errors(series_dir: Path, case: tuple) -> None:
    _, change, field, fragment = case
    path = rewrite_patch(series_dir, "chat-a", change)
    with pytest.raises(ManifestError) as info:
        load_series(series_dir / "patches.yaml")
    assert info.value.field == field, str(info.value)
    assert fragment in str(info.value)
    assert str(info.value).startswith(str(path))


def test_binary_patch_file_rejected(series_dir: Path) -> None:
    (series_dir / "patches" / "chat-a.patch").write_bytes(b"\x00\x01binary")
    with pytest.raises(ManifestError, match=r"series\[0\]\.file: .* binary data"):
        load_series(series_dir / "patches.yaml")


def test_cli_reports_one_line_and_exit_2(series_dir: Path, capsys, monkeypatch) -> None:
    mutate_yaml(series_dir, entry(0, tier="yolo"))
    monkeypatch.chdir(series_dir)
    assert main(["list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert re.match(r"patchset: error: patches\.yaml:\d+: series\[0\]\.tier: 'yolo' is not one "
                    r"of safe, moderate, risky$", err[0])


def test_valid_series_loads_with_hashes(series_dir: Path) -> None:
    series = load_series(series_dir / "patches.yaml")
    assert [p.name for p in series.patches] == ["chat-a", "dsv4-b", "idx-c", "idx-d", "chat-e"]
    idx_d = series.by_name()["idx-d"]
    assert idx_d.depends == ("idx-c", "dsv4-b")
    assert {c.path for c in idx_d.files} == {
        "python/sglang/srt/layers/attention/dsv4/indexer.py",
        "python/sglang/srt/models/deepseek_v4.py"}
    assert all(len(c.pre) == 40 and len(c.post) == 40 for c in idx_d.files)
    assert series.by_name()["idx-c"].gate.env == "TRITON_INDEXER"


def test_gate_written_as_plain_yaml_on_key(series_dir: Path) -> None:
    """`on:` unquoted is boolean true in YAML 1.1; the gate must still read as `on`."""
    manifest = series_dir / "patches.yaml"
    text = manifest.read_text()
    manifest.write_text(text.replace("  gate:\n    env: TRITON_INDEXER\n    'on': '1'",
                                     "  gate: {env: TRITON_INDEXER, on: \"1\"}"))
    assert "on: \"1\"" in manifest.read_text()
    assert load_series(manifest).by_name()["idx-c"].gate.on == "1"
