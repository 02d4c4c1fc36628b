"""Which functions does each patch change? Derived from the patch, never hand-listed.

Standard library only (part of the agent: it runs where the tree is). For every file a
patch touches, its pre-image (the base, or the file after the patches before it) and
post-image are compared line by line (difflib); the post-image is parsed with `ast`. A
changed line (added, or where lines were removed; blank and comment lines do not count)
belongs to the innermost function or method around it, nested ones included: that
function is a target, named by its `__qualname__` (`Class.method`,
`outer.<locals>.inner`), which is what the tracer matches a code object by. A change at
module level (or in a class body, outside any method) makes the module a target (it ran
when imported) plus every function that uses a name bound on a changed line. A function
compiled by Triton (`@triton.jit`, `autotune`, `heuristics`) is a `kernel` target: its
Python body never runs, so the tracer cannot see it; its launcher is a target too when the
patch changes it. A patch's manifest `trace:` entries add targets (or replace them).

The tracer (patchset/agent/lib/tracer.py) records which targets ran in each server process;
the audit compares that with what the patch's `requires` declare.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from typing import Any, Iterable

MODULE = "<module>"
MODULE_KIND = "module"
# decorators that compile a function (Triton): its Python body never executes
KERNEL_DECORATORS = ("jit", "autotune", "heuristics")


@dataclass(frozen=True)
class TraceTarget:
    """One function (or module) whose execution shows the patch's code ran."""

    patch: str
    module: str          # sglang.srt.models.deepseek_v4
    qualname: str        # DeepseekV4DecoderLayer.hc_pre.<locals>.hc_pre_torch_impl | <module>
    file: str            # git path of the file
    line: int            # first line of the def in the post-image (0: the module)
    why: str             # how it was derived
    kind: str = "function"   # function | module | kernel (a JIT kernel: compiled, its
                             # Python body never runs, so the tracer cannot see it)
    # what a call that returned shows (auditor/observed.py): new (the function is the
    # patch's own: only its code path calls it), unconditional (an upstream function
    # whose every changed line runs whenever it runs), conditional (an upstream function
    # whose changed lines may not run, or a dispatcher: it runs with the patch's
    # behaviour off too), declared (a manifest `trace:` entry: the author's evidence
    # point); modules and kernels: module, kernel
    evidence: str = "conditional"

    def to_json(self) -> dict[str, Any]:
        return {"patch": self.patch, "module": self.module, "qualname": self.qualname,
                "file": self.file, "line": self.line, "why": self.why, "kind": self.kind,
                "evidence": self.evidence}

    @property
    def traceable(self) -> bool:
        return self.kind != "kernel"


@dataclass(frozen=True)
class PostImage:
    """A touched file after a patch: its text, the post-image lines the patch changed,
    and the qualnames its pre-image already defined (None: no parseable pre-image)."""

    path: str
    text: str
    changed: frozenset[int]
    before: frozenset[str] | None = None


def for_patch(patch: str, files: Iterable[tuple[str, bytes | None, bytes | None]],
              git_prefix: str, declared: Iterable[dict[str, Any]] = (), mode: str = "add"
              ) -> list[TraceTarget]:
    """The targets of one patch from its files (path, before, after), then its manifest
    `trace:` entries ({module, qualname[, file]}); `mode` replace: only those."""
    derived: list[TraceTarget] = []
    for path, before, after in files:
        if path.endswith(".py") and after is not None:
            text = after.decode("utf-8", "replace")
            image = PostImage(path, text, frozenset(changed_lines(before, text)),
                              _defined(before))
            derived += _targets_in(patch, image, module_name(path, git_prefix))
    extra = [TraceTarget(patch, str(t["module"]), str(t["qualname"]), str(t.get("file") or ""),
                         0, "manifest trace:",
                         MODULE_KIND if t["qualname"] == MODULE else "function",
                         MODULE_KIND if t["qualname"] == MODULE else "declared")
             for t in declared]
    out = extra if mode == "replace" else derived + extra
    return list(dict.fromkeys(out))


def changed_lines(before: bytes | None, after: str) -> set[int]:
    """1-based lines of `after` that differ from `before`: inserted or replaced ones, and
    the line where lines were deleted."""
    old = (before or b"").decode("utf-8", "replace").splitlines()
    new = after.splitlines()
    out: set[int] = set()
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, _i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            out.update(range(j1 + 1, j2 + 1))
        elif tag == "delete":
            out.add(min(j1 + 1, max(len(new), 1)))
    return out


def module_name(path: str, git_prefix: str) -> str:
    """python/sglang/srt/x.py -> sglang.srt.x (a package's __init__ is the package)."""
    rel = path[len(git_prefix):] if path.startswith(git_prefix) else path
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# ---------------------------------------------------------------- the AST

@dataclass
class _Scope:
    qualname: str
    node: ast.AST
    first: int
    last: int
    is_function: bool
    kind: str = "function"


def _scopes(tree: ast.Module) -> list[_Scope]:
    """Every def and class with its __qualname__ and line span (decorators included)."""
    out: list[_Scope] = []

    def walk(node: ast.AST, prefix: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                is_function = not isinstance(child, ast.ClassDef)
                out.append(_Scope(name, child, first, child.end_lineno or child.lineno,
                                  is_function, "kernel" if _compiled(child) else "function"))
                walk(child, f"{name}.<locals>." if is_function else f"{name}.", is_function)
            else:
                walk(child, prefix, in_function)

    walk(tree, "", False)
    return out


def _targets_in(patch: str, image: PostImage, module: str) -> list[TraceTarget]:
    try:
        tree = ast.parse(image.text, image.path)
    except SyntaxError as exc:           # not Python 3 of this interpreter: the module only
        return [TraceTarget(patch, module, MODULE, image.path, 0, f"does not parse here "
                            f"({exc.msg}): the module only", MODULE_KIND)]
    scopes = _scopes(tree)
    functions: dict[str, tuple[_Scope, list[int]]] = {}
    module_lines: list[int] = []
    text = image.text.splitlines()
    for line in sorted(image.changed):
        code = text[line - 1].strip() if line <= len(text) else ""
        if not code or code.startswith("#"):
            continue                          # blank lines and comments run nothing
        inner = [s for s in scopes if s.is_function and s.first <= line <= s.last]
        if inner:
            best = max(inner, key=lambda s: s.first)
            functions.setdefault(best.qualname, (best, []))[1].append(line)
        else:
            module_lines.append(line)
    out = [TraceTarget(patch, module, q, image.path, s.first, f"body changed ({_span(ls)})",
                       s.kind, _strength(s, ls, image.before))
           for q, (s, ls) in functions.items()]
    if module_lines:
        out.append(TraceTarget(patch, module, MODULE, image.path, 0,
                               f"module-level change ({_span(module_lines)}): ran when imported",
                               MODULE_KIND, MODULE_KIND))
        out += _users(patch, image, module, tree, scopes, module_lines, set(functions))
    return out


def _users(patch: str, image: PostImage, module: str, tree: ast.Module,
           scopes: list[_Scope], lines: list[int], known: set[str]) -> list[TraceTarget]:
    """Functions that use a name bound on a changed module-level (or class-body) line."""
    names = _bound_on(tree, set(lines))
    out = []
    for scope in scopes:
        if not scope.is_function or scope.qualname in known:
            continue
        used = {n.id for n in ast.walk(scope.node) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(scope.node) if isinstance(n, ast.Attribute)}
        hit = sorted(names & used)
        if hit:
            out.append(TraceTarget(patch, module, scope.qualname, image.path, scope.first,
                                   f"uses {', '.join(hit)} (changed at module level)",
                                   scope.kind, "conditional"))
    return out


def _defined(before: bytes | None) -> frozenset[str] | None:
    """The qualnames of every def and class of the pre-image (None: none to parse)."""
    if before is None:
        return frozenset()
    try:
        tree = ast.parse(before.decode("utf-8", "replace"))
    except SyntaxError:
        return None
    return frozenset(s.qualname for s in _scopes(tree))


def _strength(scope: _Scope, lines: list[int], before: frozenset[str] | None) -> str:
    """What a returned call of this changed function shows: `new` when upstream had no
    such function, `unconditional` when every changed line is a statement of its body
    that runs on every call that returns (or its def line), else `conditional`."""
    if scope.kind == "kernel":
        return "kernel"
    if before is not None and scope.qualname not in before:
        return "new"
    return "unconditional" if _every_call_runs(scope.node, lines) else "conditional"


def _every_call_runs(func: ast.AST, lines: list[int]) -> bool:
    """Every changed line is in the def line (signature, decorators) or in a top-level
    statement of the body that is not a branch or loop and that no earlier top-level
    statement can return, raise or jump past."""
    body = getattr(func, "body", [])
    start = body[0].lineno if body else getattr(func, "lineno", 0)
    for line in lines:
        if line < start:
            continue                                   # def line, decorators: every call
        index = next((i for i, st in enumerate(body)
                      if st.lineno <= line <= (st.end_lineno or st.lineno)), None)
        if index is None or isinstance(body[index], BRANCHES) or _chooses(body[index]):
            return False
        if any(_exits(st) for st in body[:index]) or _exits(body[index], nested_only=True):
            return False
    return True


BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match, ast.With,
            ast.AsyncWith) if hasattr(ast, "Match") else (ast.If, ast.For, ast.AsyncFor,
                                                          ast.While, ast.Try, ast.With,
                                                          ast.AsyncWith)


def _chooses(stmt: ast.AST) -> bool:
    """An expression that picks one of two paths (`a if c else b`, `a and b`, `a or b`, a
    filtered comprehension): the changed part may be the one not taken."""
    return any(isinstance(n, (ast.IfExp, ast.BoolOp)) or
               (isinstance(n, ast.comprehension) and n.ifs) for n in ast.walk(stmt))


def _exits(stmt: ast.AST, nested_only: bool = False) -> bool:
    """Can this statement leave the function early (a return, raise or yield in it, not
    in a nested def)? `nested_only`: a lambda or comprehension does not count."""
    todo = [stmt] if not nested_only else list(ast.iter_child_nodes(stmt))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Return, ast.Raise, ast.Yield, ast.YieldFrom)) and \
                not (nested_only and node is stmt):
            return True
        todo.extend(ast.iter_child_nodes(node))
    return False


def _compiled(node: ast.AST) -> bool:
    """Decorated by triton.jit / autotune / heuristics (called or not)."""
    for deco in getattr(node, "decorator_list", []):
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = target.attr if isinstance(target, ast.Attribute) else \
            target.id if isinstance(target, ast.Name) else ""
        if name in KERNEL_DECORATORS:
            return True
    return False


def _bound_on(tree: ast.Module, lines: set[int]) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        span = range(getattr(node, "lineno", 0), (getattr(node, "end_lineno", 0) or 0) + 1)
        if not lines.intersection(span):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                node.lineno in lines:
            names.add(node.name)
    return names


def _span(lines: list[int]) -> str:
    return f"line {lines[0]}" if len(lines) == 1 else f"lines {lines[0]}-{lines[-1]}"
