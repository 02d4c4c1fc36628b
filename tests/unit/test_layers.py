"""The rooms of the product and which may import which (ARCHITECTURE.md). Every import of
every product module is read with ast (function-level imports included) and checked
against the table ROOMS below: a module belongs to the room of its longest listed prefix,
and may import its own room and the rooms its row names, nothing else.

The layers above the queue keep the product card's folders at the top of the repository
(cli/, isolate/, deploy/, auditor/, connect/) and are linked into the one package
(patchset/cli -> ../cli, ...); patchset/ itself holds the core modules, the queue (api,
transport) and four rooms (series, pin, analysis, authoring) over the agent. The agent is
two rooms: the host program (patchset/agent/*.py) and its library (patchset/agent/lib/),
the only part of the agent the controller imports, apart from the program's one entry
point (patchset.agent.main), which runs it in process for a local tree.

The audit reads what the queue and deploy wrote and never sends a probe (the CLI passes
isolate's probes in as `patchset.auditor.api.HostProbes`); deploy never runs the audit.
The CLI's command modules share plumbing only through the cli's plumbing modules
(CLI_NOT_COMMANDS: cli/app.py, options.py, render.py), never one another. bench/ imports
no test module: it shares with the tests only the test-host harness packages (tests/hosts/: the
nspawn hosts and the audit host's setup, tests/standin/: the stand-in server), which import
no test module either."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import sysconfig
import tomllib
from pathlib import Path
from typing import Iterable

import patchset

ROOT = Path(__file__).resolve().parents[2]
CLI = "patchset.cli"
LIB = "patchset.agent.lib"
ENTRY = "patchset.agent.main"
# patchset/'s own modules that are no room of their own: the core (errors, progress, the
# input readers and value rules every room uses) and the queue (apply/revert/status over
# a transport).
CORE = ("patchset", "patchset.errors", "patchset.progress", "patchset.validate",
        "patchset.escaping", "patchset.inputfile", "patchset.yamlsrc")
QUEUE = ("patchset.api", "patchset.transport")
_BASE = ("core", LIB)
# room -> the rooms it may import (besides itself), bottom first.
ROOMS: dict[str, tuple[str, ...]] = {
    LIB: (),                                        # stdlib only: it ships to hosts
    "patchset.agent": (LIB, ENTRY),                 # the host program
    "core": (LIB,),
    "patchset.pin": _BASE,
    "patchset.series": (*_BASE, "patchset.pin"),
    "queue": (*_BASE, "patchset.pin", "patchset.series", ENTRY),
    "patchset.analysis": (*_BASE, "patchset.pin", "patchset.series"),
    "patchset.authoring": (*_BASE, "patchset.pin", "patchset.series", "queue",
                           "patchset.analysis"),
    "patchset.connect": (*_BASE, "patchset.pin", "patchset.series", "queue", ENTRY),
    "patchset.auditor": (*_BASE, "patchset.pin", "patchset.series", "queue",
                         "patchset.analysis"),
    "patchset.deploy": (*_BASE, "patchset.pin", "patchset.series", "queue",
                        "patchset.connect"),
    "patchset.isolate.measure": (*_BASE, "patchset.pin", "patchset.series", "queue",
                                 "patchset.connect", "patchset.auditor", "patchset.deploy"),
    "patchset.isolate.search": (*_BASE, "patchset.pin", "patchset.series", "queue",
                                "patchset.connect", "patchset.auditor", "patchset.deploy",
                                "patchset.isolate.measure"),
    "patchset.isolate.rollout": (*_BASE, "patchset.pin", "patchset.series", "queue",
                                 "patchset.connect", "patchset.auditor", "patchset.deploy",
                                 "patchset.isolate.measure", "patchset.isolate.search"),
    "patchset.isolate": (),                         # the package itself: a docstring
    CLI: ("*",),                                    # the commands use every room
}
# (importing module, imported module) pairs allowed across a rule, each with its reason.
# Empty: no exception is needed today; add one only with the why next to it.
ALLOWED: dict[tuple[str, str], str] = {}
# The test-host harness bench may use: nspawn hosts, the stand-in server (stdlib only).
HARNESS = ("tests.hosts", "tests.standin")
# cli modules that are not commands, each with why: the command modules may import these
# (and nothing of one another).
CLI_NOT_COMMANDS = {
    CLI: "the package registers the commands (it imports each one so typer knows it)",
    f"{CLI}.__main__": "runs the package (`python -m patchset.cli`)",
    f"{CLI}.app": "the app, the plumbing commands share (series, hosts, results) and the "
                  "one error handler",
    f"{CLI}.options": "the options more than one command takes, each declared once",
    f"{CLI}.render": "what commands print with: the terminal, messages, JSON, progress views",
}
# The folders a product module lives in: patchset/ and the layers linked into it.
FOLDERS = {"patchset": "patchset", **{f"patchset.{layer}": layer for layer in patchset.LAYERS}}


def room(module: str) -> str:
    """The room `module` belongs to (ROOMS' keys, "core" and "queue" for patchset/'s own
    modules); the agent's entry point is its own name, so a rule can allow it alone."""
    if module in CORE:
        return "core"
    if module in QUEUE:
        return "queue"
    if module == ENTRY:
        return ENTRY
    fits = [r for r in ROOMS if module == r or module.startswith(r + ".")]
    return max(fits, key=len) if fits else module


def modules() -> dict[str, Path]:
    """Every product module by its installed name: patchset/ walked without following its
    links, then each linked layer folder."""
    out = {}
    for prefix, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([*prefix.split("."), *parts])] = path
    return out


MODULES = modules()


def imports(name: str, path: Path, every_name: bool = False, runtime: bool = False,
            known: Iterable[str] | None = None) -> set[str]:
    """Absolute names of the modules `name` imports (`from X import Y`: X, and X.Y when Y
    is a module of `known`, the product modules by default, or always with `every_name`).
    `runtime`: only what runs, so not the body of an `if TYPE_CHECKING:` (annotations)."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    known = MODULES if known is None else set(known)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skipped = {id(n) for n in _typing_only(tree)} if runtime else set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
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
                       if every_name or f"{module}.{alias.name}" in known)
    return out


def _typing_only(tree: ast.Module) -> list[ast.AST]:
    """Every node inside an `if TYPE_CHECKING:` (never executed: not an import that runs)."""
    return [inner for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body for inner in ast.walk(stmt)]


def import_graph(modules: dict[str, Path], typing: bool = False) -> dict[str, set[str]]:
    """Who imports whom at run time among `modules`, function-level imports included (a
    loop hidden inside a function is still a loop); with `typing`, the imports only a type
    checker reads (`if TYPE_CHECKING:`) too. A module's own enclosing packages are left
    out: Python imports them first anyway, so `from . import x` is no arrow back."""
    graph = {}
    for name, path in modules.items():
        found = imports(name, path, runtime=not typing, known=modules)
        graph[name] = {m for m in found if m in modules and m != name
                       and not name.startswith(m + ".")}
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops of `graph`: its strongly connected components of more than one
    module (Tarjan), each sorted, so a failure names every module of the loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def allowed(importer: str, imported: str) -> bool:
    """May `importer` import `imported`? Its own room, the rooms of its row, and always a
    package that encloses it (Python imports those first anyway)."""
    mine, theirs = room(importer), room(imported)
    if mine == theirs or within(importer, imported) or imported == "patchset":
        return True
    if mine == ENTRY:
        return theirs in ("patchset.agent", LIB)
    rule = ROOMS.get(mine, ())
    return "*" in rule or theirs in rule


def violations() -> list[str]:
    found = []
    for name, path in MODULES.items():
        for imported in sorted(imports(name, path)):
            if (name, imported) in ALLOWED or not within(imported, "patchset"):
                continue
            if within(name, CLI):
                if (name not in CLI_NOT_COMMANDS and within(imported, CLI)
                        and imported not in CLI_NOT_COMMANDS):
                    found.append(f"{name} imports the command module {imported} (share "
                                 "helpers through the cli's plumbing, CLI_NOT_COMMANDS, "
                                 "or a library)")
                continue
            if not allowed(name, imported):
                found.append(f"{name} imports {imported}: room {room(name)} must not "
                             f"import room {room(imported)}")
    return found


def test_the_scan_sees_every_room() -> None:
    for name in ROOMS:
        assert name == "core" or any(room(m) == name for m in MODULES), name
    assert {room(m) for m in MODULES} <= set(ROOMS) | {ENTRY, "queue"}
    assert imports("patchset.cli.queue", MODULES["patchset.cli.queue"]) >= {
        "patchset.cli.app", "patchset.api"}                   # relative, lazy ones too
    assert "patchset.isolate.measure.probe" in imports("patchset.cli.audit", MODULES["patchset.cli.audit"])


# Command modules not named for one command: a group, named for what its commands share.
CLI_GROUPS = {"queue": "the patch queue: list, show, check, plan, apply, revert, status, "
                       "provision, version",
              "series": "a series moved in and out, or started: export, import, init"}


def test_each_command_module_is_named_for_its_commands() -> None:
    """Every command is registered by a command module (never a plumbing one), and a
    module is named for its command (cli/deploy.py holds `deploy`) or is a CLI_GROUPS
    group; a command's name is no other module's name."""
    import patchset.cli  # noqa: F401 - registers every command
    from patchset.cli.app import app
    by_module: dict[str, list[str]] = {}
    for info in app.registered_commands:
        name = info.name or info.callback.__name__
        by_module.setdefault(info.callback.__module__, []).append(name)
    commands = {c for names in by_module.values() for c in names}
    assert set(by_module) == {m for m in MODULES if within(m, CLI)} - set(CLI_NOT_COMMANDS)
    for module, names in by_module.items():
        short = module.rsplit(".", 1)[1]
        assert short in names or short in CLI_GROUPS, (module, names)
        assert not (short in CLI_GROUPS and short in commands), module


def test_dependencies_point_one_way() -> None:
    assert violations() == []


def test_no_import_loops() -> None:
    """No module imports (at the top or inside a function) one that imports it back,
    directly or round a longer loop: a shared piece lives in a lower module instead."""
    assert loops(import_graph(MODULES)) == []


def test_no_import_loops_through_type_checking() -> None:
    """Nor round an `if TYPE_CHECKING:` import: a loop that only annotations close is still
    modules that each need the other. The shared records live in the lower module (the
    audit's model holds the waiver records a Finding carries; waivers, which read the
    checks' registry, import the model, never the other way round)."""
    assert loops(import_graph(MODULES, typing=True)) == []


def test_the_loop_finder_finds_a_loop_hidden_in_a_function(tmp_path: Path) -> None:
    """A planted package: a imports b at the top, b imports c, c imports a inside a
    function (the hiding place); d imports a and is no part of the loop; e imports a
    only for type checking. Without the function-level import there is no loop."""
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .b import thing\n")
    (pkg / "b.py").write_text("import planted.c\nthing = 1\n")
    (pkg / "c.py").write_text("def late():\n    from . import a\n    return a\n")
    (pkg / "d.py").write_text("from planted.a import thing\n")
    (pkg / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from . import a\nfrom . import d\n")
    planted = {"planted": pkg / "__init__.py",
               **{f"planted.{m}": pkg / f"{m}.py" for m in "abcde"}}
    graph = import_graph(planted)
    assert graph["planted.c"] == {"planted.a"} and graph["planted.e"] == {"planted.d"}
    assert loops(graph) == [["planted.a", "planted.b", "planted.c"]]
    (pkg / "c.py").write_text("def late():\n    return None\n")
    assert loops(import_graph(planted)) == []
    assert loops({"x": {"x"}, "y": {"z"}, "z": {"y"}}) == [["y", "z"]]
    (pkg / "a.py").write_text("from .e import thing\n")       # e -> a only for typing
    (pkg / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from . import a\nthing = 1\n")
    assert loops(import_graph(planted)) == []
    assert loops(import_graph(planted, typing=True)) == [["planted.a", "planted.e"]]


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
    tests |= {p.stem for p in (ROOT / "tests").glob("*/test_*.py")}
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


def _packages() -> set[str]:
    """Every package of the product, walked from patchset/ through its links."""
    out = set()
    for folder, dirs, files in os.walk(ROOT / "patchset", followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if "__init__.py" in files:
            out.add(".".join(Path(folder).relative_to(ROOT).parts))
    return out


def test_the_folders_are_the_rooms() -> None:
    """What `ls` shows is the house: the top-level folders holding a package are patchset/
    and the layers (or the tests, benchmarks and dev tools); each layer is linked into
    patchset/ by a relative link, nothing else is linked there, and pyproject installs
    every package as it is found (no package-dir mapping, no search-path change)."""
    found = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and not p.is_symlink()}
    assert found - {"tests", "bench", "dev"} == {"patchset", *patchset.LAYERS}
    links = {p.name: os.readlink(p) for p in (ROOT / "patchset").iterdir() if p.is_symlink()}
    assert links == {layer: f"../{layer}" for layer in patchset.LAYERS}
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]
    assert "package-dir" not in setuptools
    data_only = set(setuptools["packages"]) - _packages()      # folders of data, no code
    assert _packages() <= set(setuptools["packages"])
    assert data_only == set(setuptools["package-data"])
    for package in data_only:
        folder = ROOT / package.replace(".", "/")
        assert folder.is_dir() and not list(folder.rglob("*.py")), package
    assert list(patchset.__path__) == [str(ROOT / "patchset")]
    assert "__path__" not in (ROOT / "patchset" / "__init__.py").read_text("utf-8")


def test_no_room_is_a_third_of_the_product() -> None:
    """patchset/'s rooms (and each layer) stay a size a reader can hold: none holds a
    third of the product's lines."""
    lines: dict[str, int] = {}
    for name, path in MODULES.items():
        parts = name.split(".") + [""]
        key = ".".join(parts[:3]) if parts[1] == "agent" else ".".join(parts[:2])
        lines[key] = lines.get(key, 0) + len(path.read_text("utf-8").splitlines())
    total = sum(lines.values())
    assert total > 20_000 and max(lines.values()) < total / 3, sorted(lines.items())


def test_the_installed_wheel_claims_no_name_but_patchset() -> None:
    """pip installs one top-level package (RECORD, top_level.txt), holding exactly this
    tree's modules (`make test` installs the tree before the suite runs)."""
    site = sysconfig.get_paths()["purelib"]      # not a checkout's patchset.egg-info
    dist, = importlib.metadata.distributions(name="patchset", path=[site])
    files = [f for f in dist.files or () if f.suffix == ".py" and f.parts[0] != ".."]
    assert {f.parts[0] for f in files} == {"patchset"}
    assert (dist.read_text("top_level.txt") or "").split() == ["patchset"]
    installed = {".".join(f.with_suffix("").parts).removesuffix(".__init__") for f in files}
    assert installed == set(MODULES), "the installed patchset is not this tree: run make test"


def unresolved_imports(modules: dict[str, Path]) -> list[str]:
    """Every `from X import name` of the product (in a function too, where nothing runs it
    until that code path does) whose module or name does not exist: a rename that missed
    a function-level import is found here, not by the one request that reaches it."""
    import importlib
    missing = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if not target.startswith("patchset"):
                continue                      # third-party: pip's business, not ours
            module = importlib.import_module(target)
            for alias in node.names:
                if alias.name != "*" and not hasattr(module, alias.name) and \
                        f"{target}.{alias.name}" not in modules:
                    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    missing.append(f"{shown}:{node.lineno}: "
                                   f"{target} has no {alias.name}")
    return missing


def test_every_import_of_the_product_resolves() -> None:
    assert unresolved_imports(MODULES) == []


def test_an_import_that_does_not_resolve_is_found(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("def later():\n    from patchset.errors import NoSuchError\n")
    assert unresolved_imports({"patchset.planted": planted}) == [
        f"{planted}:2: "
        "patchset.errors has no NoSuchError"]
