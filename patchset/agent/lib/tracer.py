"""patchset's tracer: which patched functions ran, in this very server process, and in
which forward passes.

Standard library only, one file: `patchset deploy` installs it on the host with a
`sitecustomize.py` that calls `install()` in every Python process the unit starts, the
spawned `sglang::scheduler_*` children included (they inherit the environment). Inert
unless PATCHSET_TRACE (what to watch) and PATCHSET_TRACE_DIR (where to write) are set.

PATCHSET_TRACE is space-separated words `NAME:SHA12=MODULE:QUALNAME,MODULE:QUALNAME...`
(the targets patchset/agent/lib/tracetargets.py derived from each applied patch, each
prefixed by what a returned call of it shows, FLAGS: `!` a compiled kernel, listed but
never watchable; `+` the patch's own function; `=` an upstream function whose changed
lines run on every call; `?` one whose changed lines may not; none: a module), and
`~forward=MODULE:QUALNAME`: the server's forward entry (0.5.14's `ModelRunner.forward`).
A target module is instrumented right after it is imported (a meta-path finder wraps its
loader; nothing else is touched):

* Python >= 3.12: `sys.monitoring` PY_START and PY_RETURN events on the target code
  objects only (found by `co_qualname`, nested functions included); each callback records
  once and returns DISABLE, so a target costs nothing after its first call returned.
* Python < 3.12 (the pinned 0.5.14 wheel is cp311): the function or method is replaced on
  its module or class by a wrapper that records the call and, once a call returned, puts
  the original back; references taken before that (a dispatch table built at import) keep
  calling the wrapper, one extra frame and a flag test per call. A nested function
  (`f.<locals>.g`) cannot be wrapped: its outermost enclosing function is watched instead
  (`via` says so, and the audit never reads that as "g ran").
* `<module>`: recorded when the module has been imported.

The forward entry is wrapped in both modes and stays wrapped: each call that returns is
counted per forward mode (`forward_batch.forward_mode.name`, `draft:` for a draft
worker), and a target's hit records the mode of the forward it ran in (`-`: outside any
forward, e.g. a CUDA-graph capture or a request handler). The first forward of a mode
re-arms every target once, so each target's record says in which modes it ran.

Records: one JSON file per process, PATCHSET_TRACE_DIR/PID.json (the unit's root-only
RuntimeDirectory, removed by systemd when the unit stops), written atomically (temp file +
rename) at start, when a target is watched, at a target's first entry, first return and
first run in a mode, and at forward counts 1, 2, 4, 8, ... of each mode (or the first
forward after a target became watched): no I/O on the hot path after that. A record holds
pid, title (`sglang::scheduler_TP0`, never argv values or the environment), role, the
patches it loaded, every target from the first write with how (and since when) it is
watched, per target its first entry, first return, the exception type of a call that
raised and the modes it ran in, the forward passes per mode (first, last recorded,
count), and why tracing is unavailable, if it is. Any exception inside the tracer is
swallowed and recorded; the server never sees it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from typing import Any, List, Optional, Tuple

FORMAT = 2
HOME = "/var/lib/patchset/trace"      # where deploy installs this file + sitecustomize.py
RUN_DIR = "/run/patchset-trace"       # RUN_DIR/ROLE: a unit's RuntimeDirectory (records)
TRACE_VAR = "PATCHSET_TRACE"
DIR_VAR = "PATCHSET_TRACE_DIR"
PATCHES_VAR = "PATCHSET_PATCHES"
MODULE = "<module>"
FORWARD = "~forward"                  # the word naming the server's forward entry points
KERNEL = "!"                          # prefix of a compiled-kernel target (never watchable)
# A target's prefix says what a returned call of it shows (tracetargets.TraceTarget
# .evidence): the tracer strips it to find the code and keeps it in the record's keys.
FLAGS = {"kernel": KERNEL, "new": "+", "declared": "+", "unconditional": "=",
         "conditional": "?", "module": ""}
OUTSIDE = "-"                         # a target's mode when it ran outside any forward
DRAFT = "draft:"                      # prefix of a draft worker's forward mode
MAX_TARGETS = 512
MAX_MODES = 16
MAX_TEXT = 200
TOOL_NAME = "patchset-trace"

_Keys = List[Tuple[str, Optional[str]]]  # one wrapped function's targets: (key, via)

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
    """PATCHSET_TRACE -> (module, qualname) -> the patches (`name:sha12`) it shows ran;
    a kernel target keeps its `!` on the module."""
    out: dict[tuple[str, str], list[str]] = {}
    for word in spec.split()[:MAX_TARGETS]:
        patch, sep, targets = word.partition("=")
        if not sep:
            continue
        for target in targets.split(","):
            module, sep, qualname = target.partition(":")
            if sep and split_flag(module)[1] and qualname:
                out.setdefault((module, qualname), []).append(patch)
    return out


def evidence_flag(target: dict[str, Any]) -> str:
    """The PATCHSET_TRACE prefix of a derived target (tracetargets.TraceTarget.to_json);
    a target of an older host (no `evidence`) is `?`, or `!` for a kernel."""
    if target.get("kind") == "kernel":
        return KERNEL
    if target.get("qualname") == MODULE:
        return ""
    return FLAGS.get(str(target.get("evidence")), "?")


def split_flag(module: str) -> tuple[str, str]:
    """`+sglang.x` -> ("+", "sglang.x")."""
    flag = module[:1] if module[:1] in "!+=?" else ""
    return flag, module[len(flag):]


def forward_mode(runner: Any, batch: Any) -> str:
    """`decode`, `extend`, ... of a ModelRunner.forward call; `draft:decode` when the
    runner is a speculative draft worker (another model: its forwards prove nothing about
    the target model's code)."""
    try:
        name = str(batch.forward_mode.name).lower()[:32]
    except BaseException:  # noqa: BLE001
        name = "unknown"
    try:
        draft = bool(getattr(runner, "is_draft_worker", False))
    except BaseException:  # noqa: BLE001
        draft = False
    return DRAFT + name if draft else name


class _Tracer:
    def __init__(self, targets: dict[tuple[str, str], list[str]], directory: str,
                 started_with: str | None) -> None:
        self.targets = targets
        self.dir = directory
        self.started_with = started_with
        self.by_module: dict[str, set[str]] = {}
        self.keys: dict[tuple[str, str], str] = {}   # (module, qualname) -> record key
        self.forward_keys = {f"{m}:{q}" for (m, q), p in targets.items() if FORWARD in p}
        for module, qualname in targets:
            flag, name = split_flag(module)
            if flag != KERNEL:
                self.by_module.setdefault(name, set()).add(qualname)
                self.keys[(name, qualname)] = _key(module, qualname)
        self.hits: dict[str, dict[str, Any]] = {}
        self.found: dict[str, dict[str, Any]] = {_key(m, q): _pending(m) for (m, q) in targets}
        self.forwards: dict[str, dict[str, Any]] = {}
        self.changed = 0.0                       # when a target last became watched
        self.unavailable: list[str] = []
        self.codes: dict[Any, str] = {}          # code object -> target (monitoring)
        self.slots: dict[tuple[int, str], _Keys] = {}   # (owner, attribute) -> targets
        self.lock = threading.RLock()
        self.local = threading.local()           # .mode: the forward this thread runs
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
        if sys.version_info >= (3, 12):          # as self.monitoring says; mypy checks 3.11
            mon = sys.monitoring
            for tool in (5, 4, 3, 2):
                if mon.get_tool(tool) is None:
                    mon.use_tool_id(tool, TOOL_NAME)
                    mon.register_callback(tool, mon.events.PY_START, self._on_start)
                    mon.register_callback(tool, mon.events.PY_RETURN, self._on_return)
                    self.tool = tool
                    return
        self.monitoring = False
        self.note("no free sys.monitoring tool id: wrapping functions instead")

    def _forked(self) -> None:
        """A forked child is another process: its own record, events re-armed; what it
        watched stays watched (the modules came with the fork)."""
        try:
            self.lock = threading.RLock()    # another thread may have held it at the fork
            self.local = threading.local()
            with self.lock:
                self.pid, self.hits, self.forwards = os.getpid(), {}, {}
                self._rearm()
            self.write()
        except BaseException as exc:  # noqa: BLE001
            self.note(f"after fork: {type(exc).__name__}: {exc}")

    def _rearm(self) -> None:
        """Every target records its next call again (once per target)."""
        if self.monitoring and sys.version_info >= (3, 12):
            sys.monitoring.restart_events()
            return
        self.slots = {}
        for name in self.by_module:
            if name in sys.modules:
                self.instrument(sys.modules[name], rearm=True)

    # ------------------------------------------------------------ instrumenting

    def instrument(self, module: Any, rearm: bool = False) -> None:
        """Watch the targets of a module that has just been imported (and say so in the
        record at once: a reader must not take a watched target for an unimported one)."""
        try:
            self._instrument(module, rearm)
        finally:
            if not rearm:
                self.write()

    def _instrument(self, module: Any, rearm: bool) -> None:
        try:
            name = module.__name__
            for qualname in sorted(self.by_module.get(name, ())):
                key = self.keys[(name, qualname)]
                if key in self.forward_keys:
                    if not rearm:
                        self._wrap_forward(module, qualname, key)
                elif qualname == MODULE:
                    if not rearm:
                        self.watched(key, "import")
                        self.hit(key, returned=True)
                elif self.monitoring:
                    if not rearm:
                        self._watch_code(module, qualname, key)
                else:
                    self._wrap(module, qualname, key)
        except BaseException as exc:  # noqa: BLE001
            self.note(f"{getattr(module, '__name__', '?')}: {type(exc).__name__}: {exc}")

    def watched(self, key: str, how: str, why: str | None = None) -> None:
        with self.lock:
            if self.found.get(key, {}).get("how") is None:
                now = round(time.time(), 3)
                self.found[key] = {"how": how, "at": now, "why": why}
                self.changed = now

    def _watch_code(self, module: Any, qualname: str, key: str) -> None:
        code = _find_code(module, qualname)
        if code is None:
            self._unwatchable(key, "no code object with this qualname (built at run time?)")
            return
        self.codes[code] = key
        if sys.version_info >= (3, 12) and self.tool is not None:   # so is self.monitoring
            events = sys.monitoring.events
            sys.monitoring.set_local_events(self.tool, code, events.PY_START | events.PY_RETURN)
        self.watched(key, "sys.monitoring")

    def _unwatchable(self, key: str, why: str) -> None:
        self.found[key] = {"how": None, "at": None, "why": why}
        self.note(f"{key}: {why}")

    def _on_start(self, code: Any, offset: int) -> Any:
        key = self.codes.get(code)
        if key is not None:
            self.hit(key)
        if sys.version_info >= (3, 12):          # the only Pythons that call it
            return sys.monitoring.DISABLE
        return None

    def _on_return(self, code: Any, offset: int, retval: Any) -> Any:
        key = self.codes.get(code)
        if key is not None:
            self.hit(key, returned=True)
        if sys.version_info >= (3, 12):          # the only Pythons that call it
            return sys.monitoring.DISABLE
        return None

    def _wrap(self, module: Any, qualname: str, key: str) -> None:
        outer = qualname.split(".<locals>.")[0]
        via = None if outer == qualname else outer
        owner, attr = _owner(module, outer)
        if owner is None:
            self._unwatchable(key, f"{outer} not found in {module.__name__}")
            return
        self.watched(key, f"wrapped {outer}" if via else "wrapped")
        slot = (id(owner), attr)
        if slot in self.slots:                       # another target of the same function
            self.slots[slot].append((key, via))
            return
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        kind: type | None = None
        func = raw
        if isinstance(raw, (staticmethod, classmethod)):
            kind, func = type(raw), raw.__func__
        if not callable(func) or getattr(func, "__patchset_traced__", False):
            return
        keys = self.slots[slot] = [(key, via)]
        setattr(owner, attr, self._wrapper(func, kind, owner, attr, raw, keys))

    def _wrapper(self, func: Any, kind: Any, owner: Any, attr: str, raw: Any,
                 keys: _Keys) -> Any:
        """Records each call until one returned, then puts the original back."""
        tracer, armed = self, [True]

        @functools.wraps(func)
        def traced(*args: Any, **kwargs: Any) -> Any:
            if not armed[0]:
                return func(*args, **kwargs)
            tracer.called(keys)
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                tracer.called(keys, raised=exc)
                raise
            if armed[0]:
                armed[0] = False
                tracer.first_return(keys, owner, attr, raw)
            return result

        # a mark on the function object, read back with getattr
        traced.__patchset_traced__ = True            # type: ignore[attr-defined]
        return kind(traced) if kind else traced

    def called(self, keys: _Keys, raised: BaseException | None = None) -> None:
        for key, via in list(keys):
            self.hit(key, via, raised=raised)

    def first_return(self, keys: _Keys, owner: Any, attr: str, raw: Any) -> None:
        try:
            setattr(owner, attr, raw)                # the original back: no cost from now
            self.slots.pop((id(owner), attr), None)
        except BaseException:  # noqa: BLE001
            pass
        for key, via in list(keys):
            self.hit(key, via, returned=True)

    def _wrap_forward(self, module: Any, qualname: str, key: str) -> None:
        """The forward entry: wrapped for good (one frame per batch, against a forward of
        milliseconds), counting each call that returned per mode."""
        owner, attr = _owner(module, qualname)
        raw = getattr(owner, attr, None) if owner is not None else None
        if raw is None or not callable(raw) or getattr(raw, "__patchset_traced__", False):
            self._unwatchable(key, f"{qualname} not found in {module.__name__}")
            return
        tracer = self

        @functools.wraps(raw)
        def forward(runner: Any, *args: Any, **kwargs: Any) -> Any:
            mode = forward_mode(runner, args[0] if args else kwargs.get("forward_batch"))
            previous = getattr(tracer.local, "mode", None)
            tracer.enter_forward(mode)
            try:
                result = raw(runner, *args, **kwargs)
            finally:
                tracer.local.mode = previous
            tracer.forward_returned(mode)
            return result

        # a mark on the function object, read back with getattr
        forward.__patchset_traced__ = True           # type: ignore[attr-defined]
        setattr(owner, attr, forward)
        self.watched(key, "forward entry")

    # ------------------------------------------------------------ forward passes

    def enter_forward(self, mode: str) -> None:
        try:
            self.local.mode = mode
            with self.lock:
                new = mode not in self.forwards and len(self.forwards) < MAX_MODES
                if new:
                    self.forwards[mode] = {"first": None, "last": None, "count": 0}
                    self._rearm()
        except BaseException as exc:  # noqa: BLE001
            self.note(f"forward {mode}: {type(exc).__name__}: {exc}")

    def forward_returned(self, mode: str) -> None:
        """Count it; write at counts 1, 2, 4, ... and after a target became watched."""
        try:
            with self.lock:
                entry = self.forwards.get(mode)
                if entry is None:
                    return
                entry["count"] += 1
                count, last = entry["count"], entry["last"] or 0.0
                due = count & (count - 1) == 0 or last < self.changed
                if due:
                    now = round(time.time(), 3)
                    entry["first"] = entry["first"] or now
                    entry["last"] = now
            if due:
                self.write()
        except BaseException as exc:  # noqa: BLE001
            self.note(f"forward {mode}: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------ records

    def hit(self, key: str, via: str | None = None, returned: bool = False,
            raised: BaseException | None = None) -> None:
        """Record an entry (or a return, or a raise) of a target, once per kind and per
        forward mode."""
        try:
            mode = getattr(self.local, "mode", None) or OUTSIDE
            with self.lock:
                entry = self.hits.get(key)
                if entry is None:
                    entry = self.hits[key] = {"first": round(time.time(), 3), "via": via,
                                              "returned": None, "raised": None, "modes": {}}
                elif not _news(entry, mode, returned, raised):
                    return
                now = round(time.time(), 3)
                entry["modes"].setdefault(mode, now)
                if returned and entry["returned"] is None:
                    entry["returned"] = now
                if raised is not None and entry["raised"] is None:
                    entry["raised"] = type(raised).__name__[:64]
            self.write()
        except BaseException as exc:  # noqa: BLE001
            self.note(f"recording {key}: {type(exc).__name__}: {exc}")

    def note(self, why: str) -> None:
        if len(self.unavailable) < 32:
            self.unavailable.append(why[:MAX_TEXT])

    def record(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "pid": self.pid, "ppid": os.getppid(), "title": _title(),
            "role": os.path.basename(self.dir.rstrip("/")),
            "python": ".".join(map(str, sys.version_info[:3])),
            "mode": "sys.monitoring" if self.monitoring else "wrap",
            "started_with": (self.started_with or "")[:4096] or None,
            "targets": {_key(m, q): p for (m, q), p in self.targets.items()},
            "watched": {k: dict(v) for k, v in self.found.items()},
            "hits": {k: dict(v, modes=dict(v["modes"])) for k, v in self.hits.items()},
            "forward": {k: dict(v) for k, v in self.forwards.items() if v["count"]},
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


def _key(module: str, qualname: str) -> str:
    return f"{module}:{qualname}"


def _pending(module: str) -> dict[str, Any]:
    """A target's watch state before its module is imported."""
    if split_flag(module)[0] == KERNEL:
        return {"how": None, "at": None,
                "why": "a compiled kernel: its Python body never runs, no call can be seen"}
    return {"how": None, "at": None, "why": "not imported in this process"}


def _news(entry: dict[str, Any], mode: str, returned: bool,
          raised: BaseException | None) -> bool:
    """Does this event add anything to the target's record?"""
    return (mode not in entry["modes"] or (returned and entry["returned"] is None)
            or (raised is not None and entry["raised"] is None))


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
                        # a proxy of the real loader (exec_module, then the rest through
                        # __getattr__), not an importlib.abc.Loader subclass
                        spec.loader = _Loader(  # type: ignore[assignment]
                            spec.loader, self.tracer)
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
