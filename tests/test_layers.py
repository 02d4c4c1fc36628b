"""Dependencies point one way (DESIGN.md): every import of every product module, read with
ast (function-level imports included), against the layering

    isolate/ (probe, bisect)                          uses all three below
    deploy/ (units, inventory, transports)            uses patchset/ only
    auditor/ (facts, states, checks, rank, report)    uses patchset/ only (read-only)
    patchset/ (queue, selection, engine, interop, rebase)

with patchset/cli/ on top, tying them together. The audit reads what the queue and deploy
wrote and never sends a probe (the CLI passes isolate's probes in as
`auditor.api.HostProbes`); deploy never runs the audit.
The CLI's command modules share plumbing only through patchset/cli/app.py. bench/ imports
no test module: what it shares with the tests is bench/hostsetup.py, which tests import; it
boots hosts with the test-host harness packages (tests/hosts/, tests/standin/), which
import no test module either."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("patchset", "deploy", "auditor", "isolate")
CLI = "patchset.cli"

# What each layer must not import (a module name, or a package and everything under it).
FORBIDDEN = {
    "patchset": ("deploy", "auditor", "isolate"),     # except patchset.cli (below)
    "deploy": ("auditor", "isolate"),
    "auditor": ("deploy", "isolate"),
    "isolate": (),
}
# (importing module, imported module) pairs allowed across a rule, each with its reason.
# Empty: no exception is needed today; add one only with the why next to it.
ALLOWED: dict[tuple[str, str], str] = {}
# The test-host harness bench may use: nspawn hosts, the stand-in server (stdlib only).
HARNESS = ("tests.hosts", "tests.standin")
# patchset/cli modules that are not commands: the package registers the commands (it
# imports each one so typer knows it), __main__ runs it, app is the shared plumbing.
CLI_NOT_COMMANDS = {f"{CLI}", f"{CLI}.__main__", f"{CLI}.app"}


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = modules()


def imports(name: str, path: Path, every_name: bool = False) -> set[str]:
    """Absolute names of the modules `name` imports (`from X import Y`: X, and X.Y when Y
    is a product submodule, or always with `every_name`)."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names
                       if every_name or f"{module}.{alias.name}" in MODULES)
    return out


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer(name: str) -> str:
    return name.split(".")[0]


def violations() -> list[str]:
    found = []
    for name, path in MODULES.items():
        for imported in sorted(imports(name, path)):
            if (name, imported) in ALLOWED:
                continue
            if within(name, CLI):
                if (name not in CLI_NOT_COMMANDS and within(imported, CLI)
                        and imported not in (CLI, f"{CLI}.app")):
                    found.append(f"{name} imports the command module {imported} (share "
                                 "helpers through patchset/cli/app.py or a library)")
                continue
            for other in FORBIDDEN[layer(name)]:
                if within(imported, other):
                    found.append(f"{name} imports {imported}: {layer(name)}/ must not "
                                 f"import {other}/")
    return found


def test_the_scan_sees_every_layer() -> None:
    for package in PACKAGES:
        assert any(layer(name) == package for name in MODULES), package
    assert imports("patchset.cli.queue", MODULES["patchset.cli.queue"]) >= {
        "patchset.cli.app", "patchset.api"}                   # relative, lazy ones too
    assert "isolate.probe" in imports("patchset.cli.audit", MODULES["patchset.cli.audit"])


def test_dependencies_point_one_way() -> None:
    assert violations() == []


def test_every_exception_says_why_and_is_still_needed() -> None:
    for (importer, imported), why in ALLOWED.items():
        assert why.strip(), (importer, imported)
        assert imported in imports(importer, MODULES[importer]), \
            f"stale exception: {importer} no longer imports {imported}"


def test_the_agent_imports_only_the_standard_library_and_itself() -> None:
    """patchset/agent/ is what runs on hosts, as the package `patchset_agent`: an absolute
    import of patchset (or any product package) would break there, a third-party one too."""
    agent = "patchset.agent"
    stdlib = set(__import__("sys").stdlib_module_names) | {"__future__"}
    found = [f"{name} imports {imported}" for name, path in MODULES.items()
             if within(name, agent) for imported in imports(name, path)
             if not within(imported, agent) and imported.split(".")[0] not in stdlib]
    assert any(within(n, agent) for n in MODULES) and found == []
    relative = [name for name, path in MODULES.items() if within(name, agent)
                and any(isinstance(node, ast.ImportFrom) and node.level == 0
                        and (node.module or "").startswith("patchset")
                        for node in ast.walk(ast.parse(path.read_text("utf-8"))))]
    assert relative == []


def test_bench_imports_no_test_module() -> None:
    """bench/ runs with ROOT and bench/ on sys.path (never tests/): a test module would be
    `tests.NAME` (or a bare NAME, if tests/ were on the path)."""
    tests = {p.stem if p.suffix else p.name for p in (ROOT / "tests").iterdir()
             if p.suffix == ".py" or (p.is_dir() and not p.name.startswith((".", "__")))}
    found = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        name = "bench." + ".".join(path.relative_to(ROOT / "bench").with_suffix("").parts)
        for imported in sorted(imports(name, path, every_name=True)):
            if any(within(imported, h) for h in HARNESS) or imported == "tests":
                continue
            if within(imported, "tests") or imported.split(".")[0] in tests:
                found.append(f"{path.relative_to(ROOT)} imports {imported}")
    for harness in HARNESS:                           # the harness stays free of tests too
        for path in sorted((ROOT / harness.replace(".", "/")).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for imported in imports(name, path, every_name=True):
                if (within(imported, "tests") and imported != "tests"
                        and not any(within(imported, h) for h in HARNESS)):
                    found.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert "hostutil" in tests and "test_audit_hosts" in tests
    assert found == []
