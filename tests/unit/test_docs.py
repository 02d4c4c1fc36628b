"""The docs: generated reference pages match the code, links resolve, the README stays a
front door (the site itself is built with `mkdocs build --strict` by `make test`)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def docsgen():
    spec = importlib.util.spec_from_file_location("docsgen", ROOT / "dev" / "docsgen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = docsgen()


@pytest.mark.parametrize("page", sorted(GEN.PAGES))
def test_a_generated_page_is_what_the_code_renders(page: str) -> None:
    committed = (ROOT / "docs" / "reference" / page).read_text()
    assert committed == GEN.PAGES[page](), f"docs/reference/{page}: run python dev/docsgen.py"


def test_the_generated_pages_list_every_command_check_and_code() -> None:
    from patchset.auditor.checks import CHECKS
    from patchset.cli.app import command_tree
    from patchset.errors import Exit
    cli = (ROOT / "docs/reference/cli.md").read_text()
    assert all(f"## `patchset {name}`" in cli for name in command_tree().commands)
    checks = (ROOT / "docs/reference/checks.md").read_text()
    assert all(f"| `{m.ID}` |" in checks for m in CHECKS)
    codes = (ROOT / "docs/reference/exit-codes.md").read_text()
    assert all(f"| {int(c)} | `{c.name}` |" in codes for c in Exit)


def test_the_check_mode_names_a_stale_page(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(GEN, "REFERENCE", tmp_path)
    for name, render in GEN.PAGES.items():
        (tmp_path / name).write_text(render())
    assert GEN.stale() == []
    (tmp_path / "checks.md").write_text("hand edited\n")
    assert GEN.stale() == ["checks.md"]


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [m.group(1) for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
            if "://" not in m.group(1)]


def test_every_relative_link_of_the_readme_and_the_docs_resolves() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [f"{p.relative_to(ROOT)}: {target}" for p in pages for target in links(p)
              if not (p.parent / target).exists()]
    assert broken == []
    assert len(links(ROOT / "README.md")) >= 10


def test_the_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for step in ("make run", "make test", "hosts.yaml", "apply --tier safe gpu1",
                 "deploy gpu1", "audit gpu1 --symptom context-loss"):
        assert step in text, step


def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    proc = subprocess.run([str(mkdocs), "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()
