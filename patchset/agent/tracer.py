"""patchset's tracer: which patched functions ran, in this very server process.

Standard library only, one file: `patchset deploy` installs it on the host with a
`sitecustomize.py` that calls `install()` in every Python process the unit starts, the
spawned `sglang::scheduler_*` children included (they inherit the environment). Inert
unless PATCHSET_TRACE (what to watch) and PATCHSET_TRACE_DIR (where to write) are set.

PATCHSET_TRACE is space-separated words `NAME:SHA12=MODULE:QUALNAME,MODULE:QUALNAME...`
(the targets patchset/agent/tracetargets.py derived from each applied patch; `~work`
names patchset's own markers of served work). A target module is instrumented right after
it is imported (a meta-path finder wraps its loader; nothing else is touched):

* Python >= 3.12: `sys.monitoring` PY_START events set on the target code objects only
  (found by `co_qualname`, nested functions included); the callback records the first
  call and returns DISABLE, so a target costs nothing after its first call.
* Python < 3.12 (the pinned 0.5.14 wheel is cp311): the function or method is replaced on
  its module or class by a wrapper that records the first call and puts the original back;
  references taken before that (a dispatch table built at import) keep calling the wrapper,
  one extra frame and a flag test per call. A nested function (`f.<locals>.g`) cannot be
  wrapped: its outermost enclosing function is watched instead (`via` says so).
* `<module>`: recorded when the module has been imported.

Records: one JSON file per process, PATCHSET_TRACE_DIR/PID.json (the unit's root-only
RuntimeDirectory, removed by systemd when the unit stops), written atomically (temp file +
rename) at start and at each target's first call only: no I/O on the hot path after that.
A record holds pid, title (`sglang::scheduler_TP0`, never argv values or the environment),
role, the patches it loaded, first-call times, and why tracing is unavailable, if it is.
Any exception inside the tracer is swallowed and recorded; the server never sees it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from typing import Any

FORMAT = 1
HOME = "/var/lib/patchset/trace"      # where deploy installs this file + sitecustomize.py
RUN_DIR = "/run/patchset-trace"       # RUN_DIR/ROLE: a unit's RuntimeDirectory (records)
TRACE_VAR = "PATCHSET_TRACE"
DIR_VAR = "PATCHSET_TRACE_DIR"
PATCHES_VAR = "PATCHSET_PATCHES"
MODULE = "<module>"
WORK = "~work"
MAX_TARGETS = 512
MAX_TEXT = 200
TOOL_NAME = "patchset-trace"

_tracer: "_Tracer | None" = None


def install(environ: Any = None) -> None:
    """Start tracing in this process (once); never raises."""
    global _tracer
    env = os.environ if environ is None else environ
    if _tracer is not None or not env.get(TRACE_VAR) or not env.get(DIR_VAR):
        return
    try:
        _tracer = _Tracer(parse(env[TRACE_VAR]), env[DIR_VAR], env.get(PATCHES_VAR))
        _tracer.start()
    except BaseException as exc:  # noqa: BLE001 - the server must start whatever happens
        _last_resort(env.get(DIR_VAR), f"{type(exc).__name__}: {exc}")


def parse(spec: str) -> dict[tuple[str, str], list[str]]:
    """PATCHSET_TRACE -> (module, qualname) -> the patches (`name:sha12`) it shows ran."""
    out: dict[tuple[str, str], list[str]] = {}
    for word in spec.split()[:MAX_TARGETS]:
        patch, sep, targets = word.partition("=")
        if not sep:
            continue
        for target in targets.split(","):
            module, sep, qualname = target.partition(":")
            if sep and module and qualname:
                out.setdefault((module, qualname), []).append(patch)
    return out


class _Tracer:
    def __init__(self, targets: dict[tuple[str, str], list[str]], directory: str,
                 started_with: str | None) -> None:
        self.targets = targets
        self.dir = directory
        self.started_with = started_with
        self.by_module: dict[str, set[str]] = {}
        for module, qualname in targets:
            self.by_module.setdefault(module, set()).add(qualname)
        self.hits: dict[str, dict] = {}
        self.found: dict[str, str] = {}          # target -> how it is watched
        self.unavailable: list[str] = []
        self.codes: dict[Any, str] = {}          # code object -> target (monitoring)
        self.slots: dict[tuple[int, str], list] = {}   # (owner, attribute) -> targets
        self.lock = threading.RLock()
        self.monitoring = sys.version_info >= (3, 12) and hasattr(sys, "monitoring")
        self.tool: int | None = None
        self.pid = os.getpid()

    # ------------------------------------------------------------ start

    def start(self) -> None:
        if self.monitoring:
            self._claim_tool()
        sys.meta_path.insert(0, _Finder(self))
        for name in list(self.by_module):
            module = sys.modules.get(name)
            if module is not None:
                self.instrument(module)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)
        self.write()

    def _claim_tool(self) -> None:
        mon = sys.monitoring
        for tool in (5, 4, 3, 2):
            if mon.get_tool(tool) is None:
                mon.use_tool_id(tool, TOOL_NAME)
                mon.register_callback(tool, mon.events.PY_START, self._on_start)
                self.tool = tool
                return
        self.monitoring = False
        self.note("no free sys.monitoring tool id: wrapping functions instead")

    def _forked(self) -> None:
        """A forked child is another process: its own record, events re-armed."""
        try:
            self.lock = threading.RLock()    # another thread may have held it at the fork
            with self.lock:
                self.pid, self.hits = os.getpid(), {}
                self.slots = {}
                if self.monitoring:
                    sys.monitoring.restart_events()
                else:
                    for name in self.by_module:
                        if name in sys.modules:
                            self.instrument(sys.modules[name])
            self.write()
        except BaseException as exc:  # noqa: BLE001
            self.note(f"after fork: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------ instrumenting

    def instrument(self, module: Any) -> None:
        """Watch the targets of a module that has just been imported."""
        try:
            name = module.__name__
            for qualname in sorted(self.by_module.get(name, ())):
                key = f"{name}:{qualname}"
                if qualname == MODULE:
                    self.found[key] = "import"
                    self.hit(key)
                elif self.monitoring:
                    self._watch_code(module, qualname, key)
                else:
                    self._wrap(module, qualname, key)
        except BaseException as exc:  # noqa: BLE001
            self.note(f"{getattr(module, '__name__', '?')}: {type(exc).__name__}: {exc}")

    def _watch_code(self, module: Any, qualname: str, key: str) -> None:
        code = _find_code(module, qualname)
        if code is None:
            self.note(f"{key}: no code object with this qualname (built at run time?)")
            return
        self.codes[code] = key
        sys.monitoring.set_local_events(self.tool, code, sys.monitoring.events.PY_START)
        self.found[key] = "sys.monitoring"

    def _on_start(self, code: Any, offset: int) -> Any:
        key = self.codes.get(code)
        if key is not None:
            self.hit(key)
        return sys.monitoring.DISABLE

    def _wrap(self, module: Any, qualname: str, key: str) -> None:
        outer = qualname.split(".<locals>.")[0]
        via = None if outer == qualname else outer
        owner, attr = _owner(module, outer)
        if owner is None:
            self.note(f"{key}: {outer} not found in {module.__name__}")
            return
        self.found[key] = f"wrapped {outer}" if via else "wrapped"
        slot = (id(owner), attr)
        if slot in self.slots:                       # another target of the same function
            self.slots[slot].append((key, via))
            return
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        func = raw.__func__ if kind else raw
        if not callable(func) or getattr(func, "__patchset_traced__", False):
            return
        keys = self.slots[slot] = [(key, via)]
        setattr(owner, attr, self._wrapper(func, kind, owner, attr, raw, keys))

    def _wrapper(self, func: Any, kind: Any, owner: Any, attr: str, raw: Any,
                 keys: list) -> Any:
        tracer, armed = self, [True]

        @functools.wraps(func)
        def traced(*args: Any, **kwargs: Any) -> Any:
            if armed[0]:
                armed[0] = False
                tracer.first_call(keys, owner, attr, raw)
            return func(*args, **kwargs)

        traced.__patchset_traced__ = True            # type: ignore[attr-defined]
        return kind(traced) if kind else traced

    def first_call(self, keys: list, owner: Any, attr: str, raw: Any) -> None:
        try:
            setattr(owner, attr, raw)                # the original back: no cost from now
            self.slots.pop((id(owner), attr), None)
        except BaseException:  # noqa: BLE001
            pass
        for key, via in list(keys):
            self.hit(key, via)

    # ------------------------------------------------------------ records

    def hit(self, key: str, via: str | None = None) -> None:
        try:
            with self.lock:
                if key in self.hits:
                    return
                self.hits[key] = {"first": round(time.time(), 3), "via": via}
            self.write()
        except BaseException as exc:  # noqa: BLE001
            self.note(f"recording {key}: {type(exc).__name__}: {exc}")

    def note(self, why: str) -> None:
        if len(self.unavailable) < 32:
            self.unavailable.append(why[:MAX_TEXT])

    def record(self) -> dict:
        return {
            "format": FORMAT, "pid": self.pid, "ppid": os.getppid(), "title": _title(),
            "role": os.path.basename(self.dir.rstrip("/")),
            "python": ".".join(map(str, sys.version_info[:3])),
            "mode": "sys.monitoring" if self.monitoring else "wrap",
            "started_with": (self.started_with or "")[:4096] or None,
            "targets": {f"{m}:{q}": p for (m, q), p in self.targets.items()},
            "watched": dict(self.found), "hits": dict(self.hits),
            "unavailable": list(self.unavailable), "written": round(time.time(), 3)}

    def write(self) -> None:
        """Atomically: a reader sees the previous record or this one, never a part."""
        try:
            with self.lock:                  # a consistent copy while other threads record
                data = json.dumps(self.record(), sort_keys=True).encode()
            path = os.path.join(self.dir, f"{self.pid}.json")
            tmp = f"{path}.{threading.get_ident()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException as exc:  # noqa: BLE001 - a full disk must not stop a server
            if len(self.unavailable) < 32:
                self.unavailable.append(f"cannot write the record: {exc}"[:MAX_TEXT])


class _Finder:
    """Meta-path finder: for a target module only, the real spec with a loader that
    instruments the module right after it ran."""

    def __init__(self, tracer: _Tracer) -> None:
        self.tracer = tracer

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.tracer.by_module:
            return None
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader, self.tracer)
                    return spec
        except BaseException as exc:  # noqa: BLE001
            self.tracer.note(f"finding {name}: {type(exc).__name__}: {exc}")
        return None


class _Loader:
    def __init__(self, loader: Any, tracer: _Tracer) -> None:
        self._loader, self._tracer = loader, tracer

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)            # the module's own errors propagate
        self._tracer.instrument(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _find_code(module: Any, qualname: str) -> Any:
    """The code object named `qualname` among the module's functions, methods and their
    nested code (co_consts), unwrapping decorators that keep __wrapped__."""
    seen: set[int] = set()
    stack = [code for code in _codes(module)]
    while stack:
        code = stack.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        if getattr(code, "co_qualname", None) == qualname:
            return code
        stack += [c for c in code.co_consts if hasattr(c, "co_code")]
    return None


def _codes(module: Any) -> list[Any]:
    out: list[Any] = []
    todo = list(vars(module).values())
    classes: set[int] = set()
    while todo:
        value = todo.pop()
        if isinstance(value, type):
            if id(value) in classes or value.__module__ != module.__name__:
                continue
            classes.add(id(value))
            todo += list(vars(value).values())
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        elif isinstance(value, property):
            todo += [f for f in (value.fget, value.fset, value.fdel) if f]
            continue
        while hasattr(value, "__wrapped__"):
            out += [value.__code__] if hasattr(value, "__code__") else []
            value = value.__wrapped__
        if hasattr(value, "__code__"):
            out.append(value.__code__)
    return out


def _owner(module: Any, qualname: str) -> tuple[Any, str]:
    """(object holding the attribute, attribute name) for `Class.method` or `func`."""
    parts = qualname.split(".")
    owner: Any = module
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            return None, ""
    return (owner, parts[-1]) if hasattr(owner, parts[-1]) else (None, "")


def _title() -> str:
    """`sglang::scheduler_TP0` (setproctitle writes argv[0]) or the command name; no
    argument and no environment value ever goes in a record."""
    try:
        with open("/proc/self/cmdline", "rb") as handle:
            first = handle.read(256).split(b"\0", 1)[0].decode("utf-8", "replace")
        if first.startswith("sglang::"):
            return first.split()[0][:64]
        with open("/proc/self/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read(64).strip()
    except OSError:
        return "?"


def _last_resort(directory: str | None, why: str) -> None:
    """The tracer could not start: say so in this process's record, if anything can."""
    try:
        if directory:
            path = os.path.join(directory, f"{os.getpid()}.json")
            with open(path + ".tmp", "w", encoding="utf-8") as handle:
                json.dump({"format": FORMAT, "pid": os.getpid(), "title": _title(),
                           "role": os.path.basename(directory.rstrip("/")), "hits": {},
                           "unavailable": [why[:MAX_TEXT]]}, handle)
            os.replace(path + ".tmp", path)
    except BaseException:  # noqa: BLE001
        pass
