"""Build small real series against the real SGLang 0.5.14 files, for tests.

Each patch is a real `git diff --full-index` of an edit to a real upstream file, made in a
scratch clone of the pinned base, exactly as a user would author one.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from patchset.pin.upstream import BaseTree, materialize

DSV4 = "python/sglang/srt/models/deepseek_v4.py"
CHAT = "python/sglang/srt/entrypoints/openai/serving_chat.py"
INDEXER = "python/sglang/srt/layers/attention/dsv4/indexer.py"

Edit = Callable[[str], str]


def append_line(text: str, line: str) -> Edit:
    """An edit that inserts `line` after the first line containing `text`."""
    def edit(source: str) -> str:
        lines = source.split("\n")
        for i, current in enumerate(lines):
            if text in current:
                indent = current[: len(current) - len(current.lstrip())]
                return "\n".join(lines[: i + 1] + [indent + line] + lines[i + 1:])
        raise AssertionError(f"{text!r} not found")
    return edit


@dataclass
class PatchDef:
    name: str
    edits: dict[str, Edit]
    tier: str = "safe"
    path: str = "both"
    gate: dict | None = None
    depends: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    requires: list[dict] = field(default_factory=list)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def header(name: str) -> str:
    return (f"Description: test patch {name}\n Edits real 0.5.14 files.\n"
            f"Author: Test Author <test@example.invalid>\nForwarded: not-needed\n"
            f"Last-Update: 2026-11-29\nPatchset-Name: {name}\n\n")


def build_series(base: BaseTree, root: Path, patches: list[PatchDef],
                 pin: dict | None = None) -> Path:
    """Write root/patches.yaml + root/patches/*.patch; returns the manifest path."""
    work = root / "authoring"
    materialize(base, work, layout="git")
    (root / "patches").mkdir(parents=True, exist_ok=True)
    entries = []
    for p in patches:
        for path, edit in p.edits.items():
            file = work / path
            file.write_text(edit(file.read_text()))
        diff = git(work, "diff", "--full-index", "--no-color", "--no-renames")
        (root / "patches" / f"{p.name}.patch").write_text(header(p.name) + diff)
        git(work, "commit", "-qam", p.name)
        entries.append({"name": p.name, "file": f"patches/{p.name}.patch",
                        "summary": f"test {p.name}", "tier": p.tier, "path": p.path,
                        "gate": p.gate, "requires": p.requires, "depends": p.depends,
                        "conflicts": p.conflicts, "upstream_status": "pending"})
    manifest = root / "patches.yaml"
    manifest.write_text(yaml.safe_dump({"version": 1, "upstream": pin or PIN_YAML,
                                        "series": entries}, sort_keys=False))
    return manifest


PIN_YAML = {
    "name": "sglang", "version": "0.5.14",
    "git": {"url": "https://github.com/sgl-project/sglang.git", "ref": "v0.5.14"},
    "pypi": {"requirement": "sglang==0.5.14",
             "file": "sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl",
             "sha256": "4fe16056b45c8aca00f5f90ceb174dc3a62a3f5dccf159c791370795cd00fc99",
             "python_version": "3.11", "platform": "manylinux_2_34_x86_64"},
    "layout": {"git_prefix": "python/"},
}


def default_patches() -> list[PatchDef]:
    """Five patches over three real files; two touch the same file; one depends."""
    return [
        PatchDef("chat-a", {CHAT: append_line("import ", "# patch chat-a")}, tier="safe"),
        PatchDef("dsv4-b", {DSV4: append_line("import ", "# patch dsv4-b")}, tier="moderate",
                 path="prefill"),
        PatchDef("idx-c", {INDEXER: append_line("import ", "# patch idx-c")}, tier="moderate",
                 path="decode", gate={"env": "TRITON_INDEXER", "on": "1"}),
        PatchDef("idx-d", {INDEXER: append_line("# patch idx-c", "# patch idx-d"),
                           DSV4: append_line("# patch dsv4-b", "# patch idx-d")},
                 tier="risky", path="decode", depends=["idx-c", "dsv4-b"]),
        PatchDef("chat-e", {CHAT: append_line("# patch chat-a", "# patch chat-e")},
                 tier="risky", depends=["chat-a"]),
    ]
