"""Conditions on the call path to a patched function, read from the pinned source with
`ast` (SGLang is never imported, nothing runs).

A patched function runs only when every test between the server's forward entry and it
lets the call through. Those tests often read a live setting: an environment variable, a
server argument, the platform. This module finds them, a few hops up from the functions a
patch changes, so that `requires` can be compared with what the code really checks
(patchset/analysis/guards.py turns them into guards; the audit reads their live values).

Callers are found by name, not by types (Python has none to go on): a function using `f`
or `obj.f` where `f` is the name, an import of it or an alias. A method's class counts as
on the path too (its instances exist only where the class is instantiated), and so does a
function's registration (`@register_attention_backend("dsv4")` runs it only when a server
argument whose choices hold "dsv4" says so). A name defined more than AMBIGUOUS times in
the tree (`apply`, `forward`) is not followed through `obj.name`: the note says so.

In each function on the path, the tests that dominate the call (an `if`/`elif`/ternary
around it, the operands of `and`/`or` before it, an early `return`/`raise` before it) are
read for settings, following a tested name DEPTH levels to what it was computed from (a
module constant, a local, `self.x` set elsewhere in the module, a property, a getter of a
module global) and a tested parameter to the argument its callers pass.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_HOPS = 3          # callers followed upward from the patched functions
AMBIGUOUS = 3         # a name defined more often is not followed through `obj.name`
DEPTH = 3             # how far a tested name is followed to what it was computed from
SCOPE = ("srt/", "jit_kernel/")      # what the server runs, under the package directory
PLATFORM = re.compile(r"is_(cuda|hip|npu|xpu|cpu|musa|mps|hpu|cuda_alike)")
ARCH = re.compile(r"is_sm\d+\w*|is_blackwell\w*|is_hopper\w*|get_device_capability")
ENV_CALLS = ("os.environ.get", "environ.get", "os.getenv", "getenv")
ENV_GETTERS = {"get_bool_env_var": ("sglang-bool", "false"), "get_int_env_var": ("int", 0)}
SERVER_GETTERS = ("get_global_server_args",)
SERVER_DICTS = ("global_server_args_dict",)
REGISTER = re.compile(r"register_(\w+)")
ENV_SET = re.compile(r"\benvs\.([A-Z_][A-Z0-9_]*)\.set\(")
SERVER_ASSIGN = re.compile(r"\bserver_args\.([a-z_][a-z0-9_]*)\s*(?:=(?!=)|\+=)")
TEST_WIDTH = 120


@dataclass(frozen=True)
class Read:
    """One live setting a test reads, with what the code sees when it is not set."""

    fact: str             # env.NAME | server.FIELD | gpu.compute_cap | platform.hip
    kind: str             # env | server | platform
    parse: str = "raw"    # how a live value reads: raw | bool | sglang-bool | int | float |
                          # str (env); startup: a server field SGLang sets itself (no default)
    default: Any = None   # the env default / the ServerArgs field default
    has_default: bool = True   # False: no default to compare with (platform, a computed one)
    via: str = ""         # the names followed to it: "_sm120_default_backend (x.py:199)"


@dataclass(frozen=True)
class Condition:
    """A test that decides whether the path goes on, where it sits, and what it reads."""

    file: str             # git path
    line: int
    function: str         # qualname of the function it sits in
    hops: int             # 0: in a patched function; n: n callers up
    test: str             # as written (one line, shortened)
    needs: bool           # the path goes on while the test is true (False: while false)
    reads: tuple[Read, ...]


@dataclass(frozen=True)
class Target:
    """A patched function (or class) to start from, with its changed lines."""

    file: str
    qualname: str
    changed: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Defaults:
    """What the pin says a setting is when nobody sets it (srt/environ.py, server_args.py)."""

    envs: dict[str, tuple[str, Any, bool]] = field(default_factory=dict)  # (parse, default, known)
    server: dict[str, tuple[Any, bool]] = field(default_factory=dict)    # (default, known)
    choices: dict[str, frozenset[str]] = field(default_factory=dict)     # field -> its choices
    rewritten: frozenset[str] = frozenset()     # fields SGLang itself sets at startup
    envs_set: frozenset[str] = frozenset()      # envs.X the startup code .set()s itself


# ---------------------------------------------------------------- the tree

class Module:
    """One parsed file: parents, scopes, and the names a test may be followed through."""

    def __init__(self, path: str, name: str, tree: ast.Module) -> None:
        self.path, self.name, self.tree = path, name, tree
        self.parents: dict[ast.AST, ast.AST] = {}
        self.qualnames: dict[ast.AST, str] = {}
        self.defs: dict[str, ast.AST] = {}
        self.refs: dict[str, list[ast.AST]] = {}
        self.constants: dict[str, list[ast.expr]] = {}
        self.attributes: dict[str, list[ast.expr]] = {}
        self.properties: dict[str, list[ast.AST]] = {}
        self.imports: list[ast.ImportFrom] = []
        self._index(tree, "", None)

    def _index(self, node: ast.AST, prefix: str, scope: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            self.parents[child] = node
            inner, sub = scope, prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = prefix + child.name
                self.qualnames[child] = qual
                self.defs[qual] = child
                inner = child
                sub = qual + (".<locals>." if not isinstance(child, ast.ClassDef) else ".")
                if any(_name(d) == "property" for d in getattr(child, "decorator_list", [])):
                    self.properties.setdefault(child.name, []).append(child)
            elif scope is None and isinstance(child, ast.Assign):
                for target in child.targets:
                    if isinstance(target, ast.Name):
                        self.constants.setdefault(target.id, []).append(child.value)
            if isinstance(child, ast.Assign):
                for target in child.targets:
                    if isinstance(target, ast.Attribute) and _name(target.value) == "self":
                        self.attributes.setdefault(target.attr, []).append(child.value)
            if isinstance(child, ast.ImportFrom):
                self.imports.append(child)
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
                self.refs.setdefault(child.id, []).append(child)
            elif isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Load):
                self.refs.setdefault(child.attr, []).append(child)
            if _annotation(node, child):
                continue                      # a type annotation runs nothing
            self._index(child, sub, inner)

    def enclosing(self, node: ast.AST) -> ast.AST | None:
        """The innermost function around `node` (None at module or class level)."""
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
            if isinstance(node, ast.ClassDef):
                return None
        return None

    def bound_names(self, name: str, module: str, same_file: bool) -> set[str]:
        """The local names under which the module-level `module.name` is used here."""
        out = {name} if same_file else set()
        here = self.name.split(".")
        for node in self.imports:
            base = here[: len(here) - node.level] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            if source != module and not module.startswith(source + "."):
                continue
            out |= {a.asname or a.name for a in node.names if a.name == name}
        return out


class SourceTree:
    """The pinned package's Python files (git path -> text), each parsed once, on demand.
    `overlay` gives the same tree with some files replaced (a patch's post-images); it
    shares the parsed modules and the name scans of every file it did not replace."""

    def __init__(self, root: str, files: dict[str, str], base: SourceTree | None = None,
                 changed: frozenset[str] = frozenset()) -> None:
        self.root = root                    # "python/sglang/"
        self.files = files
        self._base, self._changed = base, changed
        self._parsed: dict[tuple[str, int], Module | None] = base._parsed if base else {}
        self._mentions: dict[str, tuple[str, ...]] = {}
        self._counts: dict[str, int] = {}
        self._found: dict[str, tuple[Module, ast.AST] | None] = {}

    def overlay(self, changes: dict[str, str | None]) -> SourceTree:
        base = self._base or self
        files = dict(self.files)
        for path, text in changes.items():
            if text is None:
                files.pop(path, None)
            elif in_scope(self.root, path):
                files[path] = text
        return SourceTree(self.root, files, base, self._changed | frozenset(changes))

    def module(self, path: str) -> Module | None:
        text = self.files.get(path)
        if text is None:
            return None
        key = (path, hash(text))
        if key not in self._parsed:
            try:
                tree = ast.parse(text, path)
            except (SyntaxError, ValueError):
                tree = None
            self._parsed[key] = Module(path, module_name(self.root, path), tree) \
                if tree is not None else None
        return self._parsed[key]

    def mentioning(self, name: str) -> tuple[str, ...]:
        """Files whose text holds `name` (a substring scan, before any parse)."""
        if name not in self._mentions:
            if self._base is None:
                found = tuple(p for p, t in self.files.items() if name in t)
            else:
                found = tuple(p for p in self._base.mentioning(name) if p not in self._changed) \
                    + tuple(p for p in sorted(self._changed) if name in self.files.get(p, ""))
            self._mentions[name] = found
        return self._mentions[name]

    def definitions(self, name: str) -> int:
        """How many `def name` / `class name` the tree has, counted up to AMBIGUOUS + 1
        (more is "too many to follow by name" whatever the number)."""
        if name not in self._counts:
            pattern = re.compile(rf"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+"
                                 rf"{re.escape(name)}\b", re.M)
            count = 0
            for path in self.mentioning(name):
                text = self.files[path]
                if f"def {name}" not in text and f"class {name}" not in text:
                    continue
                count += sum(1 for _ in pattern.finditer(text))
                if count > AMBIGUOUS:
                    break
            self._counts[name] = count
        return self._counts[name]

    def find_def(self, name: str) -> tuple[Module, ast.AST] | None:
        """The one module-level function `name` of the tree (None: none, or several)."""
        if name not in self._found:
            self._found[name] = None
            if self.definitions(name) == 1:
                for path in self.mentioning(name):
                    if not re.search(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(name)}\b",
                                     self.files[path], re.M):
                        continue
                    mod = self.module(path)
                    node = mod.defs.get(name) if mod else None
                    if mod is not None and node is not None and \
                            not isinstance(node, ast.ClassDef):
                        self._found[name] = (mod, node)
        return self._found[name]


def in_scope(root: str, path: str) -> bool:
    return path.startswith(root) and path.endswith(".py") and \
        path[len(root):].startswith(SCOPE)


def module_name(root: str, path: str) -> str:
    """python/sglang/srt/x.py -> sglang.srt.x (root "python/sglang/")."""
    package = root.rstrip("/").rsplit("/", 1)[-1]
    parts = [package] + path[len(root):-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# ---------------------------------------------------------------- the pin's defaults

def read_defaults(tree: SourceTree) -> Defaults:
    """Each `envs.X`'s type and default (the Envs class of srt/environ.py) and each
    ServerArgs field's default and choices (srt/server_args.py), by ast; and which fields
    SGLang sets itself at startup (`self.X = ...` in ServerArgs, `server_args.X = ...`
    anywhere): their dataclass default is not what a server runs with when unset."""
    envs: dict[str, tuple[str, Any, bool]] = {}
    env_mod = tree.module(tree.root + "srt/environ.py")
    cls = env_mod.defs.get("Envs") if env_mod else None
    for stmt in getattr(cls, "body", []):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and \
                isinstance(stmt.targets[0], ast.Name):
            kind = _name(stmt.value.func) or ""
            parse = next((p for w, p in (("Bool", "bool"), ("Int", "int"), ("Float", "float"),
                                         ("Str", "str")) if w in kind), "raw")
            value, known = _literal(stmt.value.args[0]) if stmt.value.args else (None, True)
            envs[stmt.targets[0].id] = (parse, value, known)
    server: dict[str, tuple[Any, bool]] = {}
    choices: dict[str, frozenset[str]] = {}
    args_mod = tree.module(tree.root + "srt/server_args.py")
    cls = args_mod.defs.get("ServerArgs") if args_mod else None
    for stmt in getattr(cls, "body", []):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            server[stmt.target.id] = _literal(stmt.value) if stmt.value else (None, False)
            assert args_mod is not None         # cls, and so a body, came from it
            found = _choices(stmt.annotation, args_mod)
            if found:
                choices[stmt.target.id] = found
    return Defaults(envs, server, choices, _rewritten(tree, cls) & frozenset(server),
                    _envs_set(tree) & frozenset(envs))


def _envs_set(tree: SourceTree) -> frozenset[str]:
    """`envs.X.set(...)` in the server's startup code (server_args.py, arg_groups/): e.g.
    the sm_120 hook turns SGLANG_OPT_USE_TILELANG_MHC_PRE off whatever the environment
    said (server_args.py:3796), so the pin's default is not what such a server runs with:
    the platform decides it, not the variable."""
    startup = (tree.root + "srt/server_args.py", tree.root + "srt/arg_groups/")
    return frozenset(name for path, text in tree.files.items() if path.startswith(startup)
                     for name in ENV_SET.findall(text))


def _rewritten(tree: SourceTree, cls: ast.AST | None) -> frozenset[str]:
    out = {t.attr for n in ast.walk(cls) if isinstance(n, (ast.Assign, ast.AugAssign))
           for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
           if isinstance(t, ast.Attribute) and _name(t.value) == "self"} if cls else set()
    for text in tree.files.values():
        if "server_args." in text:
            out.update(SERVER_ASSIGN.findall(text))
    return frozenset(out)


def _choices(annotation: ast.AST, mod: Module) -> frozenset[str]:
    for node in ast.walk(annotation):
        if isinstance(node, ast.keyword) and node.arg == "choices":
            value = node.value
            if isinstance(value, ast.Name) and value.id in mod.constants:
                value = mod.constants[value.id][0]
            found, known = _literal(value)
            if known and isinstance(found, (list, tuple)):
                return frozenset(v for v in found if isinstance(v, str))
    return frozenset()


# ---------------------------------------------------------------- the walk

@dataclass
class _Site:
    """Where a function on the path is used: the reference and the function around it."""

    mod: Module
    ref: ast.AST
    function: ast.AST


@dataclass
class _Pending:
    """A test on a parameter: the callers' arguments say what it reads."""

    at: Condition
    param: str


class Walk:
    """One walk up from a patch's targets. `run` returns the conditions and notes (what
    was not followed, and why)."""

    def __init__(self, tree: SourceTree, defaults: Defaults) -> None:
        self.tree, self.defaults = tree, defaults
        self.conditions: dict[tuple, Condition] = {}
        self.notes: list[str] = []
        self.calls: dict[tuple[str, str], list[_Site]] = {}
        self.pending: dict[tuple[str, str], list[_Pending]] = {}
        self._tested: dict[tuple[int, int], tuple[list[Read], set[str]]] = {}
        self._locals: dict[int, dict[str, list[ast.expr]]] = {}

    def run(self, targets: list[Target]) -> tuple[list[Condition], list[str]]:
        seen: dict[tuple[str, str], int] = {}
        queue: deque[tuple[str, str]] = deque()
        for t in targets:
            mod = self.tree.module(t.file)
            if mod is None or t.qualname not in mod.defs:
                continue
            seen[(t.file, t.qualname)] = 0
            queue.append((t.file, t.qualname))
            self._in_target(mod, mod.defs[t.qualname], t.changed)
        while queue:
            node = queue.popleft()
            hop = seen[node]
            mod = self.tree.module(node[0])
            assert mod is not None
            definition = mod.defs[node[1]]
            self._registration(mod, definition, hop)
            owner = node[1].rpartition(".")[0]
            if isinstance(mod.defs.get(owner), ast.ClassDef) and (node[0], owner) not in seen:
                seen[(node[0], owner)] = hop           # its instances carry the method
                queue.append((node[0], owner))
            if hop >= MAX_HOPS:
                continue
            for site in self._sites(mod, node[1], definition):
                caller = (site.mod.path, site.mod.qualnames[site.function])
                if isinstance(definition, ast.ClassDef) and _bases(site, definition.name):
                    hops = hop                         # a subclass: same instances
                else:
                    hops = seen.get(caller, hop + 1)
                    self.calls.setdefault(node, []).append(site)
                    self._at_site(site, site.ref, hops)
                if caller not in seen:
                    seen[caller] = hops
                    queue.append(caller)
        self._resolve_parameters()
        found = sorted(self.conditions.values(), key=lambda c: (c.hops, c.file, c.line))
        return found, list(dict.fromkeys(self.notes))

    # -------------------------------------------------- where a function is used

    def _sites(self, mod: Module, qualname: str, definition: ast.AST) -> Iterator[_Site]:
        name = qualname.rpartition(".")[2]
        if ".<locals>." in qualname:
            outer = mod.defs.get(qualname.rpartition(".<locals>.")[0])
            for ref in mod.refs.get(name, []):
                if isinstance(ref, ast.Name) and _inside(mod, ref, outer):
                    function = mod.enclosing(ref)
                    if function is not None:
                        yield _Site(mod, ref, function)
            return
        is_class = isinstance(definition, ast.ClassDef)
        method = "." in qualname
        by_attribute = self.tree.definitions(name) <= AMBIGUOUS
        if not by_attribute:
            self.notes.append(f"{name}: more than {AMBIGUOUS} definitions in the tree, "
                              f"callers through `obj.{name}` not followed")
            if method:
                return                        # a method is only ever used as obj.name
        word = re.compile(rf"\b{re.escape(name)}\b")
        for path in self.tree.mentioning(name):
            text = self.tree.files[path]
            if not word.search(text) or (not by_attribute and path != mod.path
                                         and "import" not in text):
                continue                      # only inside a longer name: nothing to parse
            other = self.tree.module(path)
            if other is None:
                continue
            bound = set() if method else other.bound_names(name, mod.name, path == mod.path)
            for local in bound | {name}:
                for ref in other.refs.get(local, []):
                    if isinstance(ref, ast.Name) and (method or ref.id not in bound):
                        continue
                    if isinstance(ref, ast.Attribute) and (not by_attribute or ref.attr != name):
                        continue
                    if is_class and not (_instantiates(other, ref) or _is_base(other, ref)):
                        continue
                    function = other.enclosing(ref) if not _is_base(other, ref) else \
                        other.parents[ref]
                    if function is not None:
                        yield _Site(other, ref, function)

    # -------------------------------------------------- the tests on the way

    def _in_target(self, mod: Module, definition: ast.AST, changed: frozenset[int]) -> None:
        """Tests inside a patched function that dominate its changed lines: those of each
        statement on a changed line, and of each branch of a ternary or `and`/`or` there."""
        for node in ast.walk(definition):
            if node is definition or getattr(node, "lineno", None) not in changed:
                continue
            branch = isinstance(mod.parents.get(node), (ast.IfExp, ast.BoolOp))
            if (isinstance(node, ast.stmt) or branch) and mod.enclosing(node) is definition:
                self._at_site(_Site(mod, node, definition), node, 0)

    def _at_site(self, site: _Site, node: ast.AST, hops: int) -> None:
        qualname = site.mod.qualnames[site.function]
        for test, needs in dominating(site.mod, node, site.function):
            key = (id(test), id(site.function))
            if key not in self._tested:
                params: set[str] = set()
                self._tested[key] = (self._reads(test, site.mod, site.function, DEPTH, params),
                                     params)
            reads, params = self._tested[key]
            if not reads and not params:
                continue
            cond = Condition(site.mod.path, test.lineno, qualname, hops, _text(test), needs,
                             tuple(dict.fromkeys(reads)))
            if reads:
                self._add(cond)
            for param in params:
                self.pending.setdefault((site.mod.path, qualname), []).append(
                    _Pending(cond, param))

    def _registration(self, mod: Module, definition: ast.AST, hop: int) -> None:
        """`@register_X("key")`: the function runs when a server argument X (or *_X) whose
        choices hold "key" is set to it."""
        for deco in getattr(definition, "decorator_list", []):
            name = _name(deco.func) if isinstance(deco, ast.Call) else None
            match = REGISTER.fullmatch(name or "")
            if not match or not deco.args or not isinstance(deco.args[0], ast.Constant):
                continue
            key, suffix = deco.args[0].value, match.group(1)
            reads = tuple(self._server(f, f"registered as {key!r}") for f in sorted(
                self.defaults.choices) if (f == suffix or f.endswith("_" + suffix))
                and key in self.defaults.choices[f])
            if reads:
                self._add(Condition(mod.path, deco.lineno, mod.qualnames[definition], hop,
                                    _text(deco), True, reads))

    def _add(self, cond: Condition) -> None:
        key = (cond.file, cond.line, cond.function, cond.test)
        old = self.conditions.get(key)
        if old is None or cond.hops < old.hops:
            self.conditions[key] = cond
        elif old is not None:
            self.conditions[key] = Condition(old.file, old.line, old.function, old.hops,
                                             old.test, old.needs,
                                             tuple(dict.fromkeys(old.reads + cond.reads)))

    def _resolve_parameters(self) -> None:
        """A tested parameter reads what its callers pass (one level up)."""
        for node, items in self.pending.items():
            mod = self.tree.module(node[0])
            definition = mod.defs[node[1]] if mod else None
            for site in self.calls.get(node, []):
                for item in items:
                    arg = _argument(site, definition, item.param)
                    if arg is None:
                        continue
                    reads = self._reads(arg, site.mod, site.function, DEPTH - 1)
                    line = getattr(arg, "lineno", 0)
                    via = f"{item.param}={_text(arg)} ({_short(site.mod.path)}:{line})"
                    reads = [_via(r, via) for r in reads]
                    if reads:
                        c = item.at
                        self._add(Condition(c.file, c.line, c.function, c.hops, c.test,
                                            c.needs, tuple(dict.fromkeys(reads))))

    # -------------------------------------------------- what a test reads

    def _reads(self, expr: ast.AST, mod: Module, function: ast.AST | None, depth: int,
               params: set[str] | None = None) -> list[Read]:
        """The settings `expr` reads; a parameter of `function` it tests goes to `params`
        (when given: only for the function the test sits in)."""
        reads: list[Read] = []
        todo = [expr]
        while todo:
            node = todo.pop()
            direct = self._direct(node)
            if direct is not None:
                reads.append(direct)
                continue
            if depth > 0:
                found = self._follow(node, mod, function, depth, params)
                if found is not None:
                    reads += found
                    continue
            todo.extend(ast.iter_child_nodes(node))
        return reads

    def _direct(self, node: ast.AST) -> Read | None:
        """An env, server or platform read written out in the test itself."""
        if isinstance(node, ast.Call):
            callee = _dotted(node.func) or ""
            last = callee.rpartition(".")[2]
            key = _const_arg(node, 0)
            if callee in ENV_CALLS and key:
                value, known = _arg_literal(node, 1, "default", None)
                return Read(f"env.{key}", "env", "raw", value, known)
            if last in ENV_GETTERS and key:
                parse, fallback = ENV_GETTERS[last]
                value, known = _arg_literal(node, 1, "default", fallback)
                return Read(f"env.{key}", "env", parse, value, known)
            if platform := PLATFORM.fullmatch(last):
                return Read(f"platform.{platform.group(1)}", "platform", "raw", None, False)
            if ARCH.fullmatch(last):
                return Read("gpu.compute_cap", "platform", "raw", None, False)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and \
                isinstance(node.slice.value, str):
            base = _dotted(node.value)
            if base in ("os.environ", "environ"):
                return Read(f"env.{node.slice.value}", "env", "raw", None, True)
            if base in SERVER_DICTS and node.slice.value in self.defaults.server:
                return self._server(node.slice.value)
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and \
                isinstance(node.left.value, str) and len(node.ops) == 1 and \
                isinstance(node.ops[0], (ast.In, ast.NotIn)) and \
                _dotted(node.comparators[0]) in ("os.environ", "environ"):
            return Read(f"env.{node.left.value}", "env", "raw", None, True)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            if _name(node.value) == "envs" and node.attr in self.defaults.envs:
                parse, value, known = self.defaults.envs[node.attr]
                if node.attr in self.defaults.envs_set:
                    return Read(f"env.{node.attr}", "env", "startup", value, False)
                return Read(f"env.{node.attr}", "env", parse, value, known)
            if _server_args(node.value) and node.attr in self.defaults.server:
                return self._server(node.attr)
        return None

    def _server(self, name: str, via: str = "") -> Read:
        """A ServerArgs field; one SGLang sets at startup reads `startup`: no default."""
        value, known = self.defaults.server.get(name, (None, False))
        if name in self.defaults.rewritten:
            return Read(f"server.{name}", "server", "startup", value, False, via)
        return Read(f"server.{name}", "server", "raw", value, known, via)

    def _follow(self, node: ast.AST, mod: Module, function: ast.AST | None, depth: int,
                params: set[str] | None) -> list[Read] | None:
        """A name to what it was computed from (None: not a name this follows)."""
        sources: list[tuple[ast.AST, Module, ast.AST | None, set[str] | None]] = []
        label = ""
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            label = node.id
            if function is not None and node.id in _params(function):
                if params is not None:
                    params.add(node.id)
                return []
            local = self._assigned(function, node.id) if function is not None else []
            if local:
                sources = [(v, mod, function, params) for v in local]
            elif node.id in mod.constants:
                sources = [(v, mod, None, None) for v in mod.constants[node.id]]
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            label = f"self.{node.attr}"
            if node.attr in mod.properties:
                sources = [(r.value, mod, p, None) for p in mod.properties[node.attr]
                           for r in ast.walk(p) if isinstance(r, ast.Return) and r.value]
            elif node.attr in mod.attributes:
                sources = [(v, mod, mod.enclosing(v), None) for v in mod.attributes[node.attr]]
        elif isinstance(node, ast.Call) and not node.args and not node.keywords:
            sources = self._getter(node)
            label = f"{_dotted(node.func)}()"
        if not sources:
            return None
        out: list[Read] = []
        for value, where, scope, tested in sources:
            reads = self._reads(value, where, scope, depth - 1, tested)
            via = f"{label} ({_short(where.path)}:{getattr(value, 'lineno', 0)})"
            out += [_via(r, via) for r in reads]
        return out

    def _assigned(self, function: ast.AST, name: str) -> list[ast.expr]:
        """What `function` assigns to the local `name` (indexed once per function)."""
        if id(function) not in self._locals:
            table: dict[str, list[ast.expr]] = {}
            for n in ast.walk(function):
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        if isinstance(t, ast.Name):
                            table.setdefault(t.id, []).append(n.value)
            self._locals[id(function)] = table
        return self._locals[id(function)].get(name, [])

    def _getter(self, call: ast.Call
                ) -> list[tuple[ast.AST, Module, ast.AST | None, set[str] | None]]:
        """`get_x()` returning a module global: what its module assigns to that global
        (a getter by name: `get_` and no arguments, defined once in the tree)."""
        name = (_dotted(call.func) or "").rpartition(".")[2]
        found = self.tree.find_def(name) if name.startswith("get_") else None
        if found is None:
            return []
        mod, definition = found
        returned = {r.value.id for r in ast.walk(definition)
                    if isinstance(r, ast.Return) and isinstance(r.value, ast.Name)}
        out: list[tuple[ast.AST, Module, ast.AST | None, set[str] | None]] = []
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id in returned for t in node.targets):
                scope = mod.enclosing(node)
                if scope is not None and scope is not definition:
                    out.append((node.value, mod, scope, None))
        return out


# ---------------------------------------------------------------- dominance

def dominating(mod: Module, node: ast.AST, function: ast.AST) -> list[tuple[ast.expr, bool]]:
    """The tests that must hold (True) or fail (False) for `node` to run in `function`:
    enclosing if/elif/while/ternary tests, earlier `and`/`or` operands, and the tests of
    earlier `if`s in the same blocks whose branch always leaves (return, raise, ...)."""
    out: list[tuple[ast.expr, bool]] = []
    child = node
    while child is not function and child in mod.parents:
        parent = mod.parents[child]
        if isinstance(parent, (ast.If, ast.While, ast.IfExp)):
            if _holds(child, parent.body):
                out.append((parent.test, True))
            elif _holds(child, parent.orelse):
                out.append((parent.test, False))
        elif isinstance(parent, ast.BoolOp):
            position = next(i for i, v in enumerate(parent.values) if v is child)
            out += [(v, isinstance(parent.op, ast.And)) for v in parent.values[:position]]
        if isinstance(child, ast.stmt):
            out += _early_exits(parent, child)
        child = parent
    return out


def _holds(child: ast.AST, block: Any) -> bool:
    return child is block or (isinstance(block, list) and any(child is s for s in block))


def _early_exits(parent: ast.AST, child: ast.stmt) -> list[tuple[ast.expr, bool]]:
    out = []
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if not isinstance(block, list) or not any(child is s for s in block):
            continue
        for prev in block[:next(i for i, s in enumerate(block) if s is child)]:
            if isinstance(prev, ast.If):
                if _leaves(prev.body) and not _leaves(prev.orelse):
                    out.append((prev.test, False))
                elif _leaves(prev.orelse) and not _leaves(prev.body):
                    out.append((prev.test, True))
    return out


def _leaves(block: list[ast.stmt]) -> bool:
    """The block always ends in return, raise, continue or break."""
    if not block:
        return False
    last = block[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    return isinstance(last, ast.If) and _leaves(last.body) and _leaves(last.orelse)


# ---------------------------------------------------------------- small helpers

def _annotation(parent: ast.AST, child: ast.AST) -> bool:
    return (isinstance(parent, ast.arg) and child is parent.annotation) or \
        (isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and child is parent.returns) \
        or (isinstance(parent, ast.AnnAssign) and child is parent.annotation)


def _name(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


def _server_args(node: ast.AST) -> bool:
    """`server_args`, `x.server_args`, `get_global_server_args()`."""
    if isinstance(node, ast.Call):
        return _name(node.func) in SERVER_GETTERS
    return _name(node) == "server_args"


def _const_arg(call: ast.Call, index: int) -> str | None:
    arg = call.args[index] if len(call.args) > index else None
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def _arg_literal(call: ast.Call, index: int, keyword: str, fallback: Any) -> tuple[Any, bool]:
    node = call.args[index] if len(call.args) > index else next(
        (k.value for k in call.keywords if k.arg == keyword), None)
    return _literal(node) if node is not None else (fallback, True)


def _literal(node: ast.AST) -> tuple[Any, bool]:
    """(value, True) for a literal, (None, False) for anything computed."""
    try:
        return ast.literal_eval(node), True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, False


def _params(function: ast.AST) -> set[str]:
    assert isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))   # Module.enclosing
    args = function.args
    return {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs} - {"self", "cls"}


def _argument(site: _Site, definition: ast.AST | None, param: str) -> ast.AST | None:
    """The expression `site`'s call passes for `param` (None: not a call, not passed)."""
    call = site.mod.parents.get(site.ref)
    if not isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
            not isinstance(call, ast.Call) or call.func is not site.ref:
        return None
    for keyword in call.keywords:
        if keyword.arg == param:
            return keyword.value
    names = [a.arg for a in definition.args.posonlyargs + definition.args.args]
    if names and names[0] in ("self", "cls") and isinstance(site.ref, ast.Attribute):
        names = names[1:]
    if param in names and names.index(param) < len(call.args):
        arg = call.args[names.index(param)]
        return None if isinstance(arg, ast.Starred) else arg
    return None


def _instantiates(mod: Module, ref: ast.AST) -> bool:
    parent = mod.parents.get(ref)
    return isinstance(parent, ast.Call) and parent.func is ref


def _is_base(mod: Module, ref: ast.AST) -> bool:
    parent = mod.parents.get(ref)
    return isinstance(parent, ast.ClassDef) and any(ref is b for b in parent.bases)


def _bases(site: _Site, name: str) -> bool:
    return isinstance(site.function, ast.ClassDef) and any(
        _name(b) == name for b in site.function.bases)


def _inside(mod: Module, node: ast.AST, outer: ast.AST | None) -> bool:
    while node in mod.parents:
        node = mod.parents[node]
        if node is outer:
            return True
    return False


def _via(read: Read, via: str) -> Read:
    chain = f"{via} <- {read.via}" if read.via else via
    return Read(read.fact, read.kind, read.parse, read.default, read.has_default, chain)


def _text(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= TEST_WIDTH else text[:TEST_WIDTH - 3] + "..."


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]
