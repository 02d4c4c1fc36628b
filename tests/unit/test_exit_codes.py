"""One exit-code table: `patchset.errors.Exit` and its MEANINGS, and no literal codes."""

from __future__ import annotations

import ast
import json
import patchset
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from patchset import transport as wire
from patchset.api import HostResult
from patchset.errors import MEANINGS, Exit

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("patchset", *patchset.LAYERS)
# The agent, shipped to hosts with only the standard library (patchset/transport.py
# `bundle`): patchset.errors does not go with it, so its process exit status (always 0:
# the result is the JSON line) stays a literal.
HOST_SHIPPED = {name.replace(wire.AGENT_NAME, "patchset/agent", 1) for name in wire.agent_files()}
# What each code's meaning must say.
WORDS = {Exit.OK: "done", Exit.FINDINGS: "findings", Exit.BAD_INPUT: "bad input",
         Exit.UNREACHABLE: "unreachable", Exit.FAILED: "refused", Exit.INTERNAL: "internal",
         Exit.INCONCLUSIVE: "inconclusive", Exit.INTERRUPTED: "interrupted"}


def test_every_code_has_its_one_meaning() -> None:
    """MEANINGS is the one table (docs/reference/exit-codes.md is generated from it)."""
    assert set(MEANINGS) == set(Exit) == set(WORDS)
    for code, word in WORDS.items():
        assert word in MEANINGS[code].lower(), (code, MEANINGS[code])


@pytest.mark.parametrize("codes, expected", [
    ([], Exit.OK), ([0, 0], Exit.OK), ([0, 1, 4], Exit.FAILED), ([1, 3, 4], Exit.UNREACHABLE),
    ([2, 1], Exit.BAD_INPUT), ([130, 3], Exit.UNREACHABLE), ([0, 70, 4], Exit.INTERNAL),
    (iter([1, 1]), Exit.FINDINGS), ({0, 130}, Exit.INTERRUPTED),
])
def test_combine(codes, expected) -> None:
    got = Exit.combine(codes)
    assert got == expected and type(got) is Exit


def test_combine_passes_an_unknown_code_through() -> None:
    assert Exit.combine([1, 5]) == 5


def test_codes_are_plain_ints_in_json() -> None:
    result = HostResult(host="h", ok=False, exit_code=Exit.UNREACHABLE)
    assert json.loads(json.dumps(asdict(result)))["exit_code"] == 3
    assert json.dumps({"exit_code": Exit.FAILED}) == '{"exit_code": 4}'
    assert f"exit {Exit.INTERRUPTED}" == "exit 130" and str(Exit.OK) == "0"


def product_modules() -> list[Path]:
    return [p for top in PRODUCT for p in sorted((ROOT / top).rglob("*.py"))
            if str(p.relative_to(ROOT)) not in HOST_SHIPPED]


def _int(node: ast.AST | None) -> bool:
    if isinstance(node, ast.IfExp):
        return _int(node.body) or _int(node.orelse)
    return (isinstance(node, ast.Constant) and isinstance(node.value, int)
            and not isinstance(node.value, bool))


def literal_codes(rel: str, text: str) -> list[str]:
    """Exit codes written as numbers: typer.Exit(N), sys.exit(N), exit_code = N,
    exit_code=N, {"exit_code": N}, and `return N` in CLI modules, `main` and `exit_code`."""
    tree = ast.parse(text, rel)
    cli = rel.startswith("cli/")
    found = []

    def hit(node: ast.AST, what: str) -> None:
        found.append(f"{rel}:{node.lineno}: {what}")

    def walk(node: ast.AST, function: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", "")
            if name in ("Exit", "exit") and node.args and _int(node.args[0]):
                hit(node, f"{name}(<literal>)")
            for kw in node.keywords:
                if kw.arg == "exit_code" and _int(kw.value):
                    hit(node, "exit_code=<literal>")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {getattr(t, "id", None) or getattr(t, "attr", None) for t in targets}
            if names & {"exit_code", "code"} and _int(node.value):
                hit(node, "exit_code = <literal>")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "exit_code" and _int(value):
                    hit(node, '"exit_code": <literal>')
        elif isinstance(node, ast.Return) and _int(node.value) and (
                cli or function in ("main", "exit_code")):
            hit(node, "return <literal>")
        for child in ast.iter_child_nodes(node):
            walk(child, function)

    walk(tree, None)
    return found


def test_no_literal_exit_codes_in_product_modules() -> None:
    modules = product_modules()
    assert any(str(p).endswith("cli/app.py") for p in modules)
    assert not any(str(p).endswith("patchset/agent/engine.py") for p in modules)
    found = [line for path in modules
             for line in literal_codes(str(path.relative_to(ROOT)), path.read_text("utf-8"))]
    assert found == []


def test_the_scan_sees_literals() -> None:
    text = ("import sys, typer\n\ndef f(r):\n    r.exit_code = 4\n"
            "    if r: raise typer.Exit(3)\n    return 0 if r else 1\n\n"
            "def main():\n    g(exit_code=2, x={'exit_code': 70})\n    sys.exit(130)\n")
    assert len(literal_codes("cli/x.py", text)) == 6
    assert len(literal_codes("patchset/x.py", text)) == 5     # `return` counts in CLI modules
    assert literal_codes("cli/x.py", "raise typer.Exit(Exit.FAILED)\n") == []


def test_host_shipped_modules_do_not_import_errors() -> None:
    """They cannot use Exit: patchset/errors.py is not shipped with them."""
    assert "patchset/errors.py" not in HOST_SHIPPED
    for rel in HOST_SHIPPED:
        text = (ROOT / rel).read_text(encoding="utf-8")
        assert not re.search(r"^\s*(from|import)\s+(patchset\.errors|\.errors|\.\.errors)\b",
                             text, re.M), rel


def test_one_unreachable_error() -> None:
    """No answer is one error, patchset.errors.Unreachable (exit 3), whether SSH, a probed
    server, the audit's HTTP read or the package index gave none: no product module
    defines another exception class named like it (a subclass says more, as
    connect/ssh.py's HostKeyRefused does, and keeps the code)."""
    from patchset.errors import PatchsetError, Unreachable
    assert issubclass(Unreachable, PatchsetError) and Unreachable.exit_code is Exit.UNREACHABLE
    found = []
    for path in product_modules():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef) and "unreachable" in node.name.lower() and \
                    not str(path).endswith("patchset/errors.py"):
                found.append(f"{path.relative_to(ROOT)}: class {node.name}")
    assert found == []
    from patchset.connect.ssh import HostKeyRefused
    assert issubclass(HostKeyRefused, Unreachable)
