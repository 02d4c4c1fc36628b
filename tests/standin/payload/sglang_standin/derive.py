"""Read the pinned SGLang source with `ast` and derive what the stand-in serves.

Nothing here imports the real ``sglang`` package (it pulls in torch).  Instead
the source files of the tree that the host's ``sglang`` resolves to are parsed
and evaluated just far enough:

* ``ServerArgs`` (``srt/server_args.py``): every dataclass field in order with
  its default, and an ``argparse`` parser built the way SGLang 0.5.14 builds
  it: ``ArgumentParser(prog=...)`` as in ``prepare_server_args``, then
  ``add_cli_args`` replayed statement by statement.  Its
  ``add_cli_args_from_dataclass(parser, ServerArgs)`` call runs the *real*
  function from ``srt/arg_groups/arg_utils.py`` (a stdlib-only module) on a
  dataclass rebuilt from the field annotations (``A[T, Arg(...)]`` evaluated to
  real typing objects and real ``Arg`` instances) and defaults; its explicit
  ``parser.add_argument(...)`` calls run with their arguments evaluated from
  source (deprecated-flag actions are the real classes of
  ``argparse_actions.py``).  So option strings, dest, type, nargs, choices,
  defaults, required flags and error messages are SGLang's own.
* ``--config FILE.yaml``: the step ``prepare_server_args`` takes before parsing
  (``if "--config" in argv: argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)``)
  runs the tree's own ``ConfigArgumentMerger`` (``srt/server_args_config_parser.py``,
  executed for real) on the derived parser, with ``yaml`` bound to PyYAML when the venv
  has it, else to ``yaml_subset`` (``safe_load`` for flat mappings of scalars; anything
  else is refused, never guessed).
* Names those expressions use are resolved through the imports of the module
  they appear in: module constants are evaluated from their assignments; a
  module whose own imports are all standard library (``argparse_actions.py``,
  ``cuda_graph_config.py``, ``auth.py``, ``kv_canary/consts.py``) is loaded for
  real from the tree; a function from a heavy module (``human_readable_int``
  in ``srt/utils/common.py``, ``_compute_parallelism_ranks`` in
  ``engine.py``) is compiled on its own from its source, with the standard
  library names it needs.
* Response shapes: field names and defaults of the pydantic models in
  ``srt/entrypoints/openai/protocol.py``, the keys ``/server_info`` and
  ``/model_info`` build in ``srt/entrypoints/http_server.py``, the scheduler's
  init info and internal state keys (``srt/managers/scheduler.py``), the
  environment edits of ``_set_envs_and_config`` and the process-title rule of
  ``configure_scheduler_process``; ``_handle_missing_default_values`` and
  ``describe_kv_events_publisher`` are compiled from their source and run on
  the parsed values (``get_device()`` -> "cuda"; ``KVEventsConfig`` parsed
  with the defaults of its pydantic model).

Whatever cannot be derived raises :class:`DerivationError` (strict: a new
SGLang pin that changes these shapes must fail loudly, not be guessed).
Standard library only: this runs on the test hosts.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import dataclasses
import enum
import functools
import importlib
import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from typing import Any, Callable

__all__ = ["DerivationError", "SourceTree", "ServerArgsSpec", "derive_server_args", "locate_tree"]


class DerivationError(RuntimeError):
    """The pinned source does not have the shape this stand-in understands."""


class _Unresolved(Exception):
    """An expression could not be evaluated (internal; callers decide)."""


MISSING = dataclasses.MISSING
_STDLIB = set(sys.stdlib_module_names) | {"__future__"}

# Builtins an evaluated expression may name or call.
_SAFE_BUILTINS = {
    n: getattr(builtins, n)
    for n in (
        "str", "int", "float", "bool", "list", "dict", "tuple", "set", "frozenset", "len",
        "sorted", "min", "max", "range", "type", "repr", "getattr", "isinstance", "any", "all",
        "ValueError", "TypeError", "KeyError", "Exception", "object", "print", "round", "abs",
        "enumerate", "zip", "reversed", "map", "filter", "sum", "hasattr", "setattr", "iter", "next",
    )
}
_SAFE_METHOD_TYPES = (str, bytes, list, tuple, dict, set, frozenset, int, float, enum.Enum, range)


def locate_tree() -> Path:
    """The ``sglang`` package directory the running interpreter resolves (never imported).

    Uses the path-based finder directly, so the stand-in's own import hook
    (which only stands in for ``sglang`` inside a launch_server process) is
    bypassed and the answer is the tree on disk.
    """
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("sglang")
    if spec is None or not spec.origin or not spec.origin.endswith("__init__.py"):
        raise DerivationError("no `sglang` package on sys.path (is the tree's .pth installed?)")
    return Path(spec.origin).parent


# ---------------------------------------------------------------------------
# Source tree and module scopes
# ---------------------------------------------------------------------------


class SourceTree:
    """The SGLang source tree, read-only: ``root`` is the ``sglang`` package dir."""

    def __init__(self, pkg_dir: Path | str) -> None:
        self.pkg_dir = Path(pkg_dir)
        self.top = self.pkg_dir.parent
        if not (self.pkg_dir / "srt" / "server_args.py").is_file():
            raise DerivationError(f"{self.pkg_dir}: not an SGLang package (no srt/server_args.py)")
        self._scopes: dict[str, ModuleScope] = {}

    def file_for(self, modname: str) -> Path | None:
        parts = modname.split(".")
        base = self.top.joinpath(*parts)
        if (base / "__init__.py").is_file():
            return base / "__init__.py"
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py")
        return None

    def scope(self, modname: str) -> "ModuleScope":
        if modname not in self._scopes:
            path = self.file_for(modname)
            if path is None:
                raise _Unresolved(f"module {modname} not in tree")
            self._scopes[modname] = ModuleScope(self, modname, path)
        return self._scopes[modname]

    def source(self, modname: str) -> str:
        return self.scope(modname).path.read_text()


class ModuleScope:
    """Top-level names of one module, resolved lazily from its AST."""

    def __init__(self, tree: SourceTree, modname: str, path: Path) -> None:
        self.tree = tree
        self.modname = modname
        self.path = path
        self.module = ast.parse(path.read_text(), filename=str(path))
        self.is_package = path.name == "__init__.py"
        self.defs: dict[str, tuple] = {}
        self.stdlib_imports: dict[str, Any] = {}
        self._all_stdlib = True
        for stmt in self.module.body:
            self._collect(stmt)
        self._values: dict[str, Any] = {}
        self._resolving: set[str] = set()
        self._real: types.ModuleType | None = None

    # -- collection -------------------------------------------------------

    def _collect(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                root = alias.name.split(".")[0]
                if root not in _STDLIB:
                    self._all_stdlib = False
                if alias.asname:
                    self.defs[alias.asname] = ("module", alias.name)
                else:
                    self.defs[root] = ("module", root)
        elif isinstance(stmt, ast.ImportFrom):
            mod = self._absolute(stmt)
            if mod.split(".")[0] not in _STDLIB:
                self._all_stdlib = False
            for alias in stmt.names:
                self.defs[alias.asname or alias.name] = ("from", mod, alias.name)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    self.defs[target.id] = ("assign", stmt.value)
        elif isinstance(stmt, ast.AnnAssign):
            if isinstance(stmt.target, ast.Name) and stmt.value is not None:
                self.defs[stmt.target.id] = ("assign", stmt.value)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.defs[stmt.name] = ("func", stmt)
        elif isinstance(stmt, ast.ClassDef):
            self.defs[stmt.name] = ("class", stmt)
        elif isinstance(stmt, ast.Try):
            for sub in stmt.body:
                self._collect(sub)
        elif isinstance(stmt, ast.If):
            # Conditional module code (platform / env gated additions such as
            # SAMPLING_BACKEND_CHOICES.add("token_oracle")) is not evaluated:
            # the unconditional definition is what a default host sees.  Imports
            # inside still count for the stdlib-only test.
            for sub in ast.walk(stmt):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in sub.names] if isinstance(sub, ast.Import) else [self._absolute(sub)]
                    if any(n.split(".")[0] not in _STDLIB for n in names):
                        self._all_stdlib = False

    def _absolute(self, stmt: ast.ImportFrom) -> str:
        if not stmt.level:
            return stmt.module or ""
        parts = self.modname.split(".")
        if not self.is_package:
            parts = parts[:-1]
        if stmt.level > 1:
            parts = parts[: len(parts) - (stmt.level - 1)]
        return ".".join(parts + ([stmt.module] if stmt.module else []))

    # -- real loading (stdlib-only modules) --------------------------------

    @property
    def stdlib_only(self) -> bool:
        return self._all_stdlib

    def real(self) -> types.ModuleType:
        """Execute this module for real (only when all its imports are stdlib)."""
        if self._real is None:
            if not self._all_stdlib:
                raise _Unresolved(f"{self.modname} imports non-stdlib modules")
            name = "_sglang_standin_src." + self.modname
            spec = importlib.util.spec_from_file_location(name, self.path)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
            self._real = mod
        return self._real

    # -- lookup ----------------------------------------------------------------

    def lookup(self, name: str) -> Any:
        if name in self._values:
            return self._values[name]
        if name not in self.defs:
            sub = f"{self.modname}.{name}"
            if self.is_package and self.tree.file_for(sub) is not None:
                return self.tree.scope(sub)
            raise _Unresolved(f"{self.modname}.{name} is not defined at module level")
        if name in self._resolving:
            raise _Unresolved(f"cyclic definition of {self.modname}.{name}")
        self._resolving.add(name)
        try:
            value = self._resolve(name)
        finally:
            self._resolving.discard(name)
        self._values[name] = value
        return value

    def _resolve(self, name: str) -> Any:
        kind, *rest = self.defs[name]
        if kind == "module":
            return _import_module(self.tree, rest[0])
        if kind == "from":
            mod, attr = rest
            if mod.split(".")[0] in _STDLIB:
                return getattr(importlib.import_module(mod), attr)
            if mod.split(".")[0] != "sglang":
                raise _Unresolved(f"{mod}.{attr}: third-party import")
            if self.tree.file_for(f"{mod}.{attr}") is not None:
                return self.tree.scope(f"{mod}.{attr}")
            return self.tree.scope(mod).lookup(attr)
        if self._all_stdlib and kind in ("func", "class"):
            return getattr(self.real(), name)
        if kind == "assign":
            return Evaluator(self).eval(rest[0])
        if kind == "func":
            return FunctionRef(self, rest[0])
        if kind == "class":
            return ClassRef(self, rest[0])
        raise _Unresolved(name)

    def function(self, name: str) -> Callable:
        """A real callable for the top-level function *name* (see FunctionRef)."""
        value = self.lookup(name)
        if isinstance(value, FunctionRef):
            return value.materialize()
        if callable(value):
            return value
        raise DerivationError(f"{self.modname}.{name} is not a function")

    def funcdef(self, name: str) -> ast.FunctionDef:
        kind, *rest = self.defs.get(name, (None,))
        if kind != "func":
            raise DerivationError(f"{self.modname}: no function {name}")
        return rest[0]

    def classdef(self, name: str) -> ast.ClassDef:
        kind, *rest = self.defs.get(name, (None,))
        if kind != "class":
            raise DerivationError(f"{self.modname}: no class {name}")
        return rest[0]


def _import_module(tree: SourceTree, dotted: str) -> Any:
    if dotted.split(".")[0] in _STDLIB:
        return importlib.import_module(dotted)
    if dotted.split(".")[0] == "sglang":
        return tree.scope(dotted)
    raise _Unresolved(f"{dotted}: third-party module")


class _Opaque:
    """A value that exists in the source but cannot be evaluated here."""

    def __init__(self, src: str) -> None:
        self.src = src

    def __repr__(self) -> str:
        return f"<opaque {self.src}>"


class FunctionRef:
    """A function defined in a (possibly heavy) module, compiled on its own on demand."""

    _shims = {"orjson": json}  # orjson.loads/dumps -> json (JSONDecodeError is json's)

    def __init__(self, scope: ModuleScope, node: ast.FunctionDef, owner: "ClassRef | None" = None) -> None:
        self.scope = scope
        self.node = node
        self.owner = owner
        self._fn: Callable | None = None

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return ast.get_docstring(self.node)

    def materialize(self, extra_globals: dict[str, Any] | None = None, drop_imports: bool = False) -> Callable:
        """Compile this function alone.  *extra_globals* override names;
        *drop_imports* removes its function-level (lazy) imports, whose names
        must then come from *extra_globals*."""
        if self._fn is not None and not extra_globals and not drop_imports:
            return self._fn
        body = [s for s in self.node.body if not (drop_imports and isinstance(s, (ast.Import, ast.ImportFrom)))]
        node = ast.FunctionDef(
            name=self.node.name, args=self.node.args, body=body, decorator_list=[],
            returns=None, type_comment=None,
        )
        module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
        namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": f"_standin.{self.scope.modname}"}
        extra = dict(extra_globals or {})
        for name in _free_names(self.node):
            if name in extra:
                namespace[name] = extra[name]
            elif name in self._shims:
                namespace[name] = self._shims[name]
            elif hasattr(builtins, name):
                continue
            else:
                try:
                    value = self.scope.lookup(name)
                except _Unresolved:
                    continue  # only fails if that code path runs
                if isinstance(value, FunctionRef):
                    value = value.materialize()
                if isinstance(value, (ModuleScope, ClassRef, _Opaque)):
                    continue
                namespace[name] = value
        exec(compile(module, str(self.scope.path), "exec"), namespace)
        fn = namespace[self.node.name]
        if not extra_globals and not drop_imports:
            self._fn = fn
        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.materialize()(*args, **kwargs)


def _free_names(node: ast.AST) -> set[str]:
    loaded = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    glob = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Global):
            glob.update(n.names)
    return loaded | glob


class ClassRef:
    """A class from the source: attribute access evaluates its body's assignments."""

    def __init__(self, scope: ModuleScope, node: ast.ClassDef) -> None:
        self.scope = scope
        self.node = node
        self._attrs: dict[str, Any] = {}
        self._enum: type[enum.Enum] | None = None

    def _body_defs(self) -> dict[str, ast.AST]:
        out: dict[str, ast.AST] = {}
        for stmt in self.node.body:
            if isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = stmt.value
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                out[stmt.target.id] = stmt.value
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[stmt.name] = stmt
        return out

    def attr(self, name: str) -> Any:
        if name in self._attrs:
            return self._attrs[name]
        defs = self._body_defs()
        if name not in defs:
            if self.is_enum:
                return getattr(self.as_enum(), name)
            raise _Unresolved(f"{self.node.name}.{name}")
        node = defs[name]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            value: Any = FunctionRef(self.scope, node, owner=self)
        else:
            if _is_call_to(node, "field", "dataclasses.field", "Field"):
                value = _field_call_default(Evaluator(self.scope), node)
                if value is MISSING:
                    raise _Unresolved(f"{self.node.name}.{name} has no class-level default")
            else:
                value = Evaluator(self.scope, class_ns=self).eval(node)
        self._attrs[name] = value
        return value

    @property
    def is_enum(self) -> bool:
        names = {ast.unparse(b) for b in self.node.bases}
        return bool(names & {"Enum", "IntEnum", "StrEnum", "enum.Enum", "enum.IntEnum", "IntFlag", "Flag"})

    def as_enum(self) -> type[enum.Enum]:
        if self._enum is None:
            bases = {ast.unparse(b) for b in self.node.bases}
            members = [
                (k, Evaluator(self.scope, class_ns=self).eval(v))
                for k, v in self._body_defs().items()
                if not isinstance(v, (ast.FunctionDef, ast.AsyncFunctionDef)) and not k.startswith("_")
            ]
            base = enum.IntEnum if "IntEnum" in bases else enum.Enum
            if "str" in bases:
                self._enum = enum.Enum(self.node.name, members, type=str)  # type: ignore[call-overload]
            else:
                self._enum = base(self.node.name, members)  # type: ignore[call-overload]
        return self._enum

    def __iter__(self):
        if not self.is_enum:
            raise _Unresolved(f"iterating class {self.node.name}")
        return iter(self.as_enum())


def _is_call_to(node: ast.AST, *names: str) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) in names


def _field_call_default(ev: "Evaluator", call: ast.Call) -> Any:
    """Default of ``dataclasses.field(...)`` / pydantic ``Field(...)``, or MISSING."""
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    if "default" in kw:
        return ev.eval(kw["default"])
    if call.args and ast.unparse(call.func) == "Field":  # Field(default, ...)
        return ev.eval(call.args[0])
    if "default_factory" in kw:
        factory = kw["default_factory"]
        if isinstance(factory, ast.Lambda):
            return ev.eval(factory.body)
        fn = ev.eval(factory)
        if fn in (list, dict, set, tuple):
            return fn()
        raise _Unresolved(f"default_factory {ast.unparse(factory)}")
    return MISSING


# ---------------------------------------------------------------------------
# Expression evaluator
# ---------------------------------------------------------------------------


_BINOPS = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a ** b, ast.BitOr: lambda a, b: a | b, ast.BitAnd: lambda a, b: a & b,
    ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b,
}
_CMPOPS = {
    ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
}


class Evaluator:
    """Evaluates constant-ish expressions of a module (no imports of sglang, no side effects)."""

    def __init__(
        self,
        scope: ModuleScope,
        locals_: dict[str, Any] | None = None,
        class_ns: ClassRef | None = None,
        lenient_kwargs: tuple[str, ...] = (),
    ) -> None:
        self.scope = scope
        self.locals = locals_ if locals_ is not None else {}
        self.class_ns = class_ns
        self.lenient_kwargs = lenient_kwargs  # keyword args that fall back to "" (help texts)

    def try_eval(self, node: ast.AST, fallback: Any = None) -> Any:
        try:
            return self.eval(node)
        except (_Unresolved, Exception):
            return fallback

    def eval(self, node: ast.AST) -> Any:
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise _Unresolved(f"cannot evaluate {type(node).__name__}: {ast.unparse(node)[:80]}")
        return method(node)

    def _Constant(self, n: ast.Constant) -> Any:
        return n.value

    def _List(self, n: ast.List) -> list:
        return self._elts(n.elts)

    def _Tuple(self, n: ast.Tuple) -> tuple:
        return tuple(self._elts(n.elts))

    def _Set(self, n: ast.Set) -> set:
        return set(self._elts(n.elts))

    def _elts(self, elts: list[ast.expr]) -> list:
        out: list = []
        for e in elts:
            if isinstance(e, ast.Starred):
                out.extend(self.eval(e.value))
            else:
                out.append(self.eval(e))
        return out

    def _Dict(self, n: ast.Dict) -> dict:
        out: dict = {}
        for k, v in zip(n.keys, n.values):
            if k is None:
                out.update(self.eval(v))
                continue
            try:
                value = self.eval(v)
            except _Unresolved:
                value = _Opaque(ast.unparse(v))
            out[self.eval(k)] = value
        return out

    def _Name(self, n: ast.Name) -> Any:
        if n.id in self.locals:
            return self.locals[n.id]
        if self.class_ns is not None:
            try:
                return self.class_ns.attr(n.id)
            except _Unresolved:
                pass
        if n.id in self.scope.defs:
            return self.scope.lookup(n.id)
        if n.id in _SAFE_BUILTINS:
            return _SAFE_BUILTINS[n.id]
        raise _Unresolved(f"name {n.id}")

    def _Attribute(self, n: ast.Attribute) -> Any:
        base = self.eval(n.value)
        return _get_attr(base, n.attr)

    def _Call(self, n: ast.Call) -> Any:
        fn = self.eval(n.func)
        if isinstance(fn, FunctionRef):
            raise _Unresolved(f"calling {ast.unparse(n.func)}")
        if isinstance(fn, (ClassRef, ModuleScope, _Opaque)):
            raise _Unresolved(f"calling {ast.unparse(n.func)}")
        if not _callable_allowed(fn):
            raise _Unresolved(f"call to {ast.unparse(n.func)} not allowed")
        args = [_real(a) for a in self._elts(n.args)]
        kwargs = {}
        for k in n.keywords:
            if k.arg is None:
                kwargs.update(self.eval(k.value))
            elif k.arg in self.lenient_kwargs:
                kwargs[k.arg] = self.try_eval(k.value, "")
            else:
                kwargs[k.arg] = _real(self.eval(k.value))
        return fn(*args, **kwargs)

    def _BinOp(self, n: ast.BinOp) -> Any:
        op = _BINOPS.get(type(n.op))
        if op is None:
            raise _Unresolved(ast.unparse(n))
        return op(self.eval(n.left), self.eval(n.right))

    def _UnaryOp(self, n: ast.UnaryOp) -> Any:
        v = self.eval(n.operand)
        if isinstance(n.op, ast.USub):
            return -v
        if isinstance(n.op, ast.UAdd):
            return +v
        if isinstance(n.op, ast.Not):
            return not v
        if isinstance(n.op, ast.Invert):
            return ~v
        raise _Unresolved(ast.unparse(n))

    def _BoolOp(self, n: ast.BoolOp) -> Any:
        if isinstance(n.op, ast.And):
            v: Any = True
            for e in n.values:
                v = self.eval(e)
                if not v:
                    return v
            return v
        v = False
        for e in n.values:
            v = self.eval(e)
            if v:
                return v
        return v

    def _Compare(self, n: ast.Compare) -> bool:
        left = self.eval(n.left)
        for op, comp in zip(n.ops, n.comparators):
            right = self.eval(comp)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True

    def _IfExp(self, n: ast.IfExp) -> Any:
        return self.eval(n.body) if self.eval(n.test) else self.eval(n.orelse)

    def _Subscript(self, n: ast.Subscript) -> Any:
        base = self.eval(n.value)
        return base[self.eval(n.slice)]

    def _Slice(self, n: ast.Slice) -> slice:
        f = lambda x: None if x is None else self.eval(x)  # noqa: E731
        return slice(f(n.lower), f(n.upper), f(n.step))

    def _JoinedStr(self, n: ast.JoinedStr) -> str:
        out = []
        for part in n.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            else:
                out.append(self._FormattedValue(part))
        return "".join(out)

    def _FormattedValue(self, n: ast.FormattedValue) -> str:
        v = self.eval(n.value)
        if n.conversion == ord("r"):
            v = repr(v)
        elif n.conversion == ord("s"):
            v = str(v)
        elif n.conversion == ord("a"):
            v = ascii(v)
        spec = self._JoinedStr(n.format_spec) if n.format_spec is not None else ""
        return format(v, spec)

    def _comprehension(self, n: ast.ListComp | ast.SetComp | ast.GeneratorExp) -> list:
        if len(n.generators) != 1 or not isinstance(n.generators[0].target, ast.Name):
            raise _Unresolved(ast.unparse(n))
        gen = n.generators[0]
        out = []
        for item in self.eval(gen.iter):
            inner = Evaluator(self.scope, {**self.locals, gen.target.id: item}, self.class_ns)
            if all(inner.eval(c) for c in gen.ifs):
                out.append(inner.eval(n.elt))
        return out

    def _ListComp(self, n: ast.ListComp) -> list:
        return self._comprehension(n)

    def _SetComp(self, n: ast.SetComp) -> set:
        return set(self._comprehension(n))

    def _GeneratorExp(self, n: ast.GeneratorExp) -> list:
        return self._comprehension(n)

    def _Lambda(self, n: ast.Lambda) -> Callable:
        if n.args.args or n.args.vararg or n.args.kwarg:
            raise _Unresolved("lambda with arguments")
        return lambda: self.eval(n.body)


def _real(value: Any) -> Any:
    """Source-level functions become real callables when passed to real code."""
    if isinstance(value, FunctionRef):
        return value.materialize()
    if isinstance(value, (ClassRef, ModuleScope, _Opaque)):
        raise _Unresolved(f"{value!r} passed to real code")
    return value


def _get_attr(base: Any, attr: str) -> Any:
    if isinstance(base, ModuleScope):
        return base.lookup(attr)
    if isinstance(base, ClassRef):
        return base.attr(attr)
    if isinstance(base, FunctionRef):
        if attr == "__doc__":
            return base.__doc__
        raise _Unresolved(f"attribute {attr} of a function")
    if isinstance(base, _Opaque):
        raise _Unresolved(f"attribute {attr} of {base.src}")
    if isinstance(base, types.ModuleType):
        if base.__name__.split(".")[0] in _STDLIB or base.__name__.startswith("_sglang_standin_src."):
            return getattr(base, attr)
        raise _Unresolved(f"attribute of module {base.__name__}")
    if attr.startswith("__") and attr not in ("__doc__", "__name__"):
        raise _Unresolved(f"dunder {attr}")
    return getattr(base, attr)


def _callable_allowed(fn: Any) -> bool:
    if any(fn is b for b in _SAFE_BUILTINS.values()):
        return True
    owner = getattr(fn, "__self__", None)
    if owner is not None and isinstance(owner, _SAFE_METHOD_TYPES):
        return True
    if isinstance(owner, type) and issubclass(owner, enum.Enum):
        return True
    mod = getattr(fn, "__module__", None) or ""
    if mod.split(".")[0] in _STDLIB or mod.startswith("_sglang_standin_src."):
        return True
    if isinstance(fn, type) and issubclass(fn, enum.Enum):
        return True
    return False


# ---------------------------------------------------------------------------
# ServerArgs: fields, defaults, the argparse parser
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class FieldSpec:
    name: str
    default: Any  # MISSING when the field has none
    annotation: str  # the annotation's source
    cli: bool = False  # some option string stores into it


@dataclasses.dataclass
class ServerArgsSpec:
    """What the pinned ``server_args.py`` says about the server's arguments."""

    fields: dict[str, FieldSpec]
    parser: argparse.ArgumentParser
    prog: str
    options: list[dict]  # one record per add_argument, for reports/tests
    missing_defaults: Callable[[dict], None]
    # prepare_server_args' config step: (flag, merge(parser, argv) -> argv); None if absent
    config_step: tuple[str, Callable[[argparse.ArgumentParser, list[str]], list[str]]] | None = None

    def defaults(self) -> dict[str, Any]:
        """``{field: default}`` in declaration order (MISSING for a required field)."""
        import copy

        return {n: f.default if f.default is MISSING else copy.deepcopy(f.default) for n, f in self.fields.items()}

    def parse(self, argv: list[str]) -> dict[str, Any]:
        """Parse like ``prepare_server_args`` + ``ServerArgs.from_cli_args``.

        Exits with status 2 and argparse's message on bad input (argparse does).
        Returns field values in declaration order, before ``__post_init__``.
        """
        return self.from_namespace(self.parser.parse_args(self.merged(argv)))

    def merged(self, argv: list[str]) -> list[str]:
        """argv after ``prepare_server_args``' ``--config`` step (the file's options
        first, then the command line's: CLI > config > defaults, as upstream)."""
        argv = list(argv)
        if self.config_step is not None and self.config_step[0] in argv:
            return self.config_step[1](self.parser, argv)
        return argv

    def from_namespace(self, ns: argparse.Namespace) -> dict[str, Any]:
        """``ServerArgs.from_cli_args``: fields on the namespace, dataclass defaults otherwise."""
        values = self.defaults()
        for name in values:
            if hasattr(ns, name):
                values[name] = getattr(ns, name)
        missing = [n for n, v in values.items() if v is MISSING]
        if missing:
            raise DerivationError(f"fields without value: {missing}")
        return values


class _AnnotationEvaluator(Evaluator):
    """Evaluates a field annotation to real typing objects.

    ``A``/``Arg`` come from the real ``arg_utils`` module, typing names from
    ``typing``; a class defined in a heavy module (``LoRARef``) becomes an
    empty placeholder class of the same name: ``arg_utils`` only looks at the
    annotation's shape (Optional / Literal / List / bool / scalar), never
    inside such a class.
    """

    _placeholders: dict[int, type] = {}

    def _as_type(self, value: Any) -> Any:
        if isinstance(value, ClassRef):
            key = id(value.node)
            if key not in self._placeholders:
                self._placeholders[key] = type(value.node.name, (), {"__module__": value.scope.modname})
            return self._placeholders[key]
        return value

    def _Name(self, n: ast.Name) -> Any:
        return self._as_type(super()._Name(n))

    def _Attribute(self, n: ast.Attribute) -> Any:
        return self._as_type(super()._Attribute(n))

    def _Subscript(self, n: ast.Subscript) -> Any:
        base = self.eval(n.value)
        if isinstance(n.slice, ast.Tuple):
            index: Any = tuple(self.eval(e) for e in n.slice.elts)
        else:
            index = self.eval(n.slice)
        return base[index]


def _class_fields(ev: Evaluator, cls: ast.ClassDef) -> tuple[dict[str, FieldSpec], dict[str, ast.AnnAssign]]:
    fields: dict[str, FieldSpec] = {}
    nodes: dict[str, ast.AnnAssign] = {}
    for stmt in cls.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        ann_src = ast.unparse(stmt.annotation)
        if ann_src.startswith(("ClassVar", "typing.ClassVar")):
            continue
        name = stmt.target.id
        if stmt.value is None:
            default: Any = MISSING
        elif _is_call_to(stmt.value, "field", "dataclasses.field", "Field"):
            try:
                default = _field_call_default(ev, stmt.value)
            except _Unresolved as exc:
                raise DerivationError(f"{cls.name}.{name}: default: {exc}") from None
        else:
            try:
                default = ev.eval(stmt.value)
            except _Unresolved as exc:
                raise DerivationError(f"{cls.name}.{name}: default: {exc}") from None
        fields[name] = FieldSpec(name, default, ann_src)
        nodes[name] = stmt
    return fields, nodes


def _real_dataclass(scope: ModuleScope, cls: ast.ClassDef, fields: dict[str, FieldSpec],
                    nodes: dict[str, ast.AnnAssign]) -> type:
    """A real dataclass with ServerArgs' field names, annotations (with ``Arg``
    metadata) and defaults, in declaration order: what ``add_cli_args_from_dataclass``
    reads through ``dataclasses.fields`` and ``get_type_hints``."""
    ann_ev = _AnnotationEvaluator(scope)
    spec = []
    for name, f in fields.items():
        try:
            ann = ann_ev.eval(nodes[name].annotation)
        except (_Unresolved, TypeError) as exc:
            raise DerivationError(f"{cls.name}.{name}: annotation {f.annotation[:60]}: {exc}") from None
        if f.default is MISSING:
            spec.append((name, ann))
        elif isinstance(f.default, (list, dict, set)):
            value = f.default
            spec.append((name, ann, dataclasses.field(default_factory=lambda v=value: type(v)(v))))
        else:
            spec.append((name, ann, dataclasses.field(default=f.default)))
    return dataclasses.make_dataclass(cls.name, spec, kw_only=True)


def derive_server_args(tree: SourceTree) -> ServerArgsSpec:
    """Fields, defaults and the CLI parser of the tree's ``ServerArgs``.

    The parser is built by replaying ``ServerArgs.add_cli_args`` on a real
    ``argparse.ArgumentParser(prog=...)`` (prog as in ``prepare_server_args``):
    its ``add_cli_args_from_dataclass(parser, ServerArgs)`` call runs the real
    function from the tree's ``arg_groups/arg_utils.py`` (a stdlib-only module)
    on a real dataclass rebuilt from the field annotations and defaults; its
    ``parser.add_argument(...)`` calls run with their arguments evaluated from
    source (custom actions are the real classes from ``argparse_actions.py``).
    """
    scope = tree.scope("sglang.srt.server_args")
    cls = scope.classdef("ServerArgs")
    ev = Evaluator(scope)
    fields, nodes = _class_fields(ev, cls)
    dc = _real_dataclass(scope, cls, fields, nodes)

    prog = _parser_prog(scope)
    parser = argparse.ArgumentParser(prog=prog)

    add_cli = None
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "add_cli_args":
            add_cli = stmt
    if add_cli is None:
        raise DerivationError("ServerArgs.add_cli_args not found")
    locals_: dict[str, Any] = {add_cli.args.args[0].arg: parser, cls.name: dc}
    local_ev = Evaluator(scope, locals_, lenient_kwargs=("help",))
    for stmt in add_cli.body:
        try:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # docstring
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                locals_[stmt.targets[0].id] = local_ev.eval(stmt.value)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                local_ev.eval(stmt.value)
            else:
                raise _Unresolved("statement kind not understood")
        except (_Unresolved, argparse.ArgumentError) as exc:
            raise DerivationError(f"add_cli_args: {ast.unparse(stmt).splitlines()[0][:100]}: {exc}") from None

    options = []
    for action in parser._actions:
        if action.dest in fields:
            fields[action.dest].cli = True
        if action.option_strings and action.dest != "help":
            options.append({
                "names": list(action.option_strings), "dest": action.dest, "action": type(action).__name__,
                "nargs": action.nargs, "type": getattr(action.type, "__name__", action.type),
                "choices": list(action.choices) if action.choices is not None else None,
                "default": action.default, "required": action.required,
            })
    return ServerArgsSpec(
        fields=fields, parser=parser, prog=prog, options=options,
        missing_defaults=_missing_defaults_hook(scope, cls), config_step=config_step(tree),
    )


def config_step(tree: SourceTree) -> tuple[str, Callable[[argparse.ArgumentParser, list[str]], list[str]]] | None:
    """``prepare_server_args``' ``if FLAG in argv:`` block that imports and runs
    ``ConfigArgumentMerger``: (FLAG, merge).  ``merge(parser, argv)`` is
    ``ConfigArgumentMerger(parser).merge_config_with_args(argv)`` with the tree's class,
    its module executed for real (``yaml``: PyYAML if importable, else yaml_subset;
    every other import must be standard library)."""
    scope = tree.scope("sglang.srt.server_args")
    fn = scope.funcdef("prepare_server_args")
    found = None
    for node in ast.walk(fn):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Constant) and len(node.test.ops) == 1
                and isinstance(node.test.ops[0], ast.In)):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and any(a.name == "ConfigArgumentMerger" for a in sub.names):
                found = (node.test.left.value, sub.module, node)
    if found is None:
        return None
    flag, modname, block = found
    calls = {ast.unparse(c.func).rsplit(".", 1)[-1] for c in ast.walk(block) if isinstance(c, ast.Call)}
    if not {"ConfigArgumentMerger", "merge_config_with_args"} <= calls:
        raise DerivationError(f"prepare_server_args: the {flag} block does not merge with "
                              "ConfigArgumentMerger(parser).merge_config_with_args(argv)")
    path = tree.file_for(modname or "")
    if path is None:
        raise DerivationError(f"{modname}: not in the tree")
    module = ast.parse(path.read_text(), filename=str(path))
    body: list[ast.stmt] = []
    for stmt in module.body:
        if isinstance(stmt, ast.Import) and [a.name for a in stmt.names] == ["yaml"]:
            continue                                  # bound below
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else [stmt.module or ""]
            if stmt.__class__ is ast.ImportFrom and stmt.level or any(n.split(".")[0] not in _STDLIB for n in names):
                raise DerivationError(f"{modname}: imports {ast.unparse(stmt)} (only yaml and the "
                                      "standard library are understood)")
        body.append(stmt)
    try:
        yaml_module: Any = importlib.import_module("yaml")
    except ImportError:
        from . import yaml_subset as yaml_module
    namespace: dict[str, Any] = {"__name__": f"_sglang_standin_src.{modname}", "__builtins__": builtins,
                                 "__file__": str(path), "yaml": yaml_module}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    merger = namespace.get("ConfigArgumentMerger")
    if not isinstance(merger, type) or not hasattr(merger, "merge_config_with_args"):
        raise DerivationError(f"{modname}: no ConfigArgumentMerger.merge_config_with_args")
    return flag, lambda parser, argv: merger(parser).merge_config_with_args(argv)


def _parser_prog(scope: ModuleScope) -> str:
    """``prog=`` of the ArgumentParser that ``prepare_server_args`` builds."""
    fn = scope.funcdef("prepare_server_args")
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("argparse.ArgumentParser", "ArgumentParser"):
            for k in node.keywords:
                if k.arg == "prog":
                    return Evaluator(scope).eval(k.value)
            return os.path.basename(sys.argv[0])
    raise DerivationError("prepare_server_args builds no ArgumentParser")


class _EnvsShim:
    """Stands in for ``sglang.srt.environ.envs`` inside extracted methods: ``envs.X.get()``."""

    class _Var:
        def __init__(self, name: str) -> None:
            self.name = name

        def get(self) -> Any:
            raw = os.environ.get(self.name)
            if raw is None:
                return None
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "y", "on"):
                return True
            if low in ("0", "false", "no", "n", "off", ""):
                return False
            return raw

    def __getattr__(self, name: str) -> Any:
        return self._Var(name)


def _missing_defaults_hook(scope: ModuleScope, cls: ast.ClassDef) -> Callable[[dict], None]:
    """``ServerArgs._handle_missing_default_values`` compiled from source.

    It runs on a plain namespace holding the field values; ``get_device()``
    answers "cuda" (the stand-in pretends to be a CUDA host) and ``envs.X.get()``
    reads the environment.  Other post-init hooks need the model and GPUs and
    are not run (see server.py).
    """
    node = None
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "_handle_missing_default_values":
            node = stmt
    if node is None:
        return lambda values: None
    import random

    fn = FunctionRef(scope, node).materialize(
        extra_globals={"get_device": lambda *a, **k: "cuda", "envs": _EnvsShim(), "random": random}
    )

    def apply(values: dict) -> None:
        ns = _ValuesNamespace(**values)
        fn(ns)
        values.update({k: v for k, v in vars(ns).items() if k in values})

    return apply


class _ValuesNamespace(types.SimpleNamespace):
    def __getattr__(self, name: str) -> Any:  # method calls on self -> no-op (e.g. modelscope paths)
        if name.startswith("_handle"):
            return lambda *a, **k: None
        raise AttributeError(name)


# ---------------------------------------------------------------------------
# Shapes of responses and runtime behaviour
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class ModelShape:
    """A pydantic response model: field order, defaults, fields dropped when None."""

    name: str
    fields: dict[str, Any]  # name -> default (MISSING: required; callable: factory)
    drop_if_none: set[str]

    def build(self, **values: Any) -> dict:
        unknown = set(values) - set(self.fields)
        if unknown:
            raise DerivationError(f"{self.name}: no fields {sorted(unknown)}")
        out = {}
        for name, default in self.fields.items():
            if name in values:
                v = values[name]
            elif default is MISSING:
                raise DerivationError(f"{self.name}.{name} is required")
            else:
                v = default() if callable(default) else json.loads(json.dumps(default))
            if v is None and name in self.drop_if_none:
                continue
            out[name] = v
        return out


def pydantic_shape(tree: SourceTree, modname: str, clsname: str) -> ModelShape:
    scope = tree.scope(modname)
    cls = scope.classdef(clsname)
    ev = Evaluator(scope)
    fields: dict[str, Any] = {}
    for stmt in cls.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        name = stmt.target.id
        if stmt.value is None:
            fields[name] = MISSING
        elif _is_call_to(stmt.value, "Field"):
            kw = {k.arg: k.value for k in stmt.value.keywords if k.arg}
            if "default_factory" in kw and isinstance(kw["default_factory"], ast.Lambda):
                fields[name] = ev.eval(kw["default_factory"])
            elif "default_factory" in kw:
                fields[name] = ev.eval(kw["default_factory"])
            else:
                d = _field_call_default(ev, stmt.value)
                fields[name] = d
        else:
            fields[name] = ev.try_eval(stmt.value, None)
    drop: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and any("model_serializer" in ast.unparse(d) for d in stmt.decorator_list):
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(".pop") and node.args:
                    key = node.args[0]
                    if isinstance(key, ast.Constant):
                        drop.add(key.value)
    return ModelShape(clsname, fields, drop)


def dict_keys_returned(fn: ast.FunctionDef) -> list[tuple[str | None, str]]:
    """Keys of the dict a function returns/builds: [(key or None for **spread, value source)]."""
    for node in ast.walk(fn):
        target = None
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
            target = node.value
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and len(node.value.keys) > 1:
            target = node.value
        if target is not None:
            out = []
            for k, v in zip(target.keys, target.values):
                out.append((k.value if isinstance(k, ast.Constant) else None, ast.unparse(v)))
            return out
    raise DerivationError(f"{fn.name}: builds no dict")


def find_funcdef(module: ast.Module, name: str, within: str | None = None) -> ast.FunctionDef:
    for node in ast.walk(module):
        if within is not None and isinstance(node, ast.ClassDef) and node.name == within:
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name == name:
                    return sub  # type: ignore[return-value]
        elif within is None and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node  # type: ignore[return-value]
    raise DerivationError(f"no function {within + '.' if within else ''}{name}")


def first_log_message(tree: SourceTree, modname: str, fn_name: str, level: str) -> str | None:
    """The first ``logger.<level>(...)`` message in a function, as a string."""
    scope = tree.scope(modname)
    fn = find_funcdef(scope.module, fn_name)
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == f"logger.{level}" and node.args:
            return Evaluator(scope).try_eval(node.args[0])
    return None


def launch_server_warning(tree: SourceTree) -> tuple[str, str, int] | None:
    """(message, file, line) of the UserWarning ``python -m sglang.launch_server`` prints."""
    scope = tree.scope("sglang.launch_server")
    for node in ast.walk(scope.module):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "warnings.warn" and node.args:
            message = Evaluator(scope).try_eval(node.args[0])
            if isinstance(message, str):
                return message, str(scope.path), node.lineno
    return None


def version(tree: SourceTree) -> str:
    for mod in ("sglang._version", "sglang.version"):
        try:
            return str(tree.scope(mod).lookup("__version__"))
        except (_Unresolved, DerivationError):
            continue
    raise DerivationError("no __version__ in the tree")


def env_setup(tree: SourceTree) -> tuple[Callable[[Any], None], list[str]]:
    """``_set_envs_and_config`` (engine.py), keeping only what touches the process.

    Each top-level statement of the function runs if every name it uses is
    available here: ``os``, ``time``, ``random``, ``server_args`` and the two
    helpers it calls, ``set_prometheus_multiproc_dir`` and ``set_ulimit``
    (both compiled from ``srt/utils/common.py``).  Package version checks,
    signal handlers and ``mp.set_start_method`` are skipped (their first lines are
    returned, for the log).
    """
    import logging
    import random
    import resource
    import tempfile
    import time

    engine = tree.scope("sglang.srt.entrypoints.engine")
    common = tree.scope("sglang.srt.utils.common")
    fn = engine.funcdef("_set_envs_and_config")
    log = logging.getLogger("sglang.srt.utils.common")
    helpers = {
        name: FunctionRef(common, common.funcdef(name)).materialize(
            extra_globals={"logger": log, "os": os, "tempfile": tempfile, "resource": resource}
        )
        for name in ("set_prometheus_multiproc_dir", "set_ulimit")
    }
    arg = fn.args.args[0].arg
    available = {"os", "time", "random", arg, "str", "int", "bool", *helpers}
    keep: list[ast.stmt] = []
    skipped: list[str] = []
    for stmt in fn.body:
        names = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        if names <= available:
            keep.append(stmt)
        else:
            skipped.append(ast.unparse(stmt).splitlines()[0])
    body = keep or [ast.Pass()]
    node = ast.FunctionDef(name="_standin_env", args=fn.args, body=body, decorator_list=[], returns=None,
                           type_comment=None)
    module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    ns: dict[str, Any] = {"os": os, "time": time, "random": random, **helpers}
    exec(compile(module, str(engine.path), "exec"), ns)
    return ns["_standin_env"], skipped


def scheduler_title(tree: SourceTree) -> Callable[..., str]:
    """The process title rule of ``configure_scheduler_process`` (scheduler.py).

    The statements before its ``setproctitle.setproctitle(...)`` call that
    compute ``prefix`` run as written; the title is the call's argument.
    Returns ``title(server_args, **ranks)``.
    """
    scope = tree.scope("sglang.srt.managers.scheduler")
    fn = scope.funcdef("configure_scheduler_process")
    body: list[ast.stmt] = []
    title_expr = None
    for stmt in fn.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            if ast.unparse(stmt.value.func) == "setproctitle.setproctitle":
                title_expr = stmt.value.args[0]
                break
            continue  # kill_itself_when_parent_died() etc.
        body.append(stmt)
    if title_expr is None:
        raise DerivationError("configure_scheduler_process sets no process title")
    body.append(ast.Return(value=title_expr))
    node = ast.FunctionDef(name="_title", args=fn.args, body=body, decorator_list=[], returns=None,
                           type_comment=None)
    module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    ns: dict[str, Any] = {"os": os}
    exec(compile(module, str(scope.path), "exec"), ns)
    return ns["_title"]


def simple_title(tree: SourceTree, modname: str, fn_name: str) -> str:
    """A constant ``setproctitle.setproctitle("...")`` in a function."""
    scope = tree.scope(modname)
    fn = find_funcdef(scope.module, fn_name)
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "setproctitle.setproctitle":
            value = Evaluator(scope).try_eval(node.args[0])
            if isinstance(value, str):
                return value
    raise DerivationError(f"{fn_name} sets no constant title")


def engine_function(tree: SourceTree, name: str) -> Callable:
    return tree.scope("sglang.srt.entrypoints.engine").function(name)


@functools.lru_cache(maxsize=None)
def load(pkg_dir: str) -> "Derived":
    return Derived(SourceTree(pkg_dir))


class Derived:
    """Everything the stand-in takes from one tree, computed once."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self.server_args = derive_server_args(tree)
        self.version = version(tree)
        protocol = "sglang.srt.entrypoints.openai.protocol"
        self.shapes = {
            name: pydantic_shape(tree, protocol, name)
            for name in ("ModelCard", "ModelList", "ChatMessage", "ChatCompletionResponseChoice",
                         "ChatCompletionResponse", "UsageInfo", "DeltaMessage",
                         "ChatCompletionResponseStreamChoice", "ChatCompletionStreamResponse", "ErrorResponse")
        }
        self.kv_events_config = pydantic_shape(tree, "sglang.srt.disaggregation.kv_events", "KVEventsConfig")
        http = tree.scope("sglang.srt.entrypoints.http_server").module
        self.server_info_keys = dict_keys_returned(find_funcdef(http, "server_info"))
        self.model_info_keys = dict_keys_returned(find_funcdef(http, "model_info"))
        sched = tree.scope("sglang.srt.managers.scheduler").module
        self.scheduler_init_keys = dict_keys_returned(find_funcdef(sched, "get_init_info", within="Scheduler"))
        self.internal_state_extra = _subscript_assignments(
            find_funcdef(sched, "get_internal_state", within="Scheduler"))
        self.auth = tree.scope("sglang.srt.utils.auth").real()
        self.launch_warning = launch_server_warning(tree)
        http_mod = "sglang.srt.entrypoints.http_server"
        self.deprecated_server_info = first_log_message(tree, http_mod, "get_server_info", "warning")
        self.deprecated_model_info = first_log_message(tree, http_mod, "get_model_info", "warning")
        self.ready_message = _ready_message(tree)
        self.set_envs, self.env_skipped = env_setup(tree)
        self.scheduler_title = scheduler_title(tree)
        self.detokenizer_title = simple_title(
            tree, "sglang.srt.managers.detokenizer_manager", "run_detokenizer_process")
        self.dp_controller_title = simple_title(
            tree, "sglang.srt.managers.data_parallel_controller", "run_data_parallel_controller_process"
        )
        self.calculate_rank_ranges = engine_function(tree, "_calculate_rank_ranges")
        self.compute_parallelism_ranks = engine_function(tree, "_compute_parallelism_ranks")
        self.describe_kv_events = _kv_events_describer(tree, self.kv_events_config)


def _kv_events_describer(tree: SourceTree, config_shape: ModelShape) -> Callable[[dict], Any]:
    """``ServerArgs.describe_kv_events_publisher`` compiled from source.

    Its lazy ``from ...kv_events import KVEventsConfig`` is replaced by a shim
    whose ``from_cli`` parses the JSON like ``model_validate_json`` (fields and
    defaults from the tree's pydantic ``KVEventsConfig``; unknown keys ignored).
    """
    scope = tree.scope("sglang.srt.server_args")
    node = find_funcdef(scope.module, "describe_kv_events_publisher", within="ServerArgs")

    class KVEventsConfig:
        @classmethod
        def from_cli(cls, raw: str) -> Any:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("KVEventsConfig must be a JSON object")
            base = config_shape.build()
            base.update({k: v for k, v in data.items() if k in base})
            return types.SimpleNamespace(**base)

    fn = FunctionRef(scope, node).materialize(extra_globals={"KVEventsConfig": KVEventsConfig}, drop_imports=True)
    return lambda values: fn(types.SimpleNamespace(**values))


def _subscript_assignments(fn: ast.FunctionDef) -> list[tuple[str, Any]]:
    """Unconditional ``ret["k"] = v`` statements: [(k, keys of v if a dict literal else None)]."""
    out = []
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript):
            key = stmt.targets[0].slice
            if isinstance(key, ast.Constant):
                sub = None
                if isinstance(stmt.value, ast.Dict):
                    sub = [k.value for k in stmt.value.keys if isinstance(k, ast.Constant)]
                out.append((key.value, sub))
    return out


def _ready_message(tree: SourceTree) -> str | None:
    scope = tree.scope("sglang.srt.entrypoints.http_server")
    for node in ast.walk(scope.module):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "logger.info" and node.args:
            v = node.args[0]
            if isinstance(v, ast.Constant) and isinstance(v.value, str) and "ready to roll" in v.value:
                return v.value
    return None
