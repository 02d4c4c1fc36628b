"""The gatherer: runs on the audited host, collects every raw fact in one go, prints JSON.

Part of the agent (standard library only): the `audit` op, one upload and one command per
host like every other op; in-process for localhost. It reads through runner.py and the
fact classes (facts/), and asks the engine for the tree's status.

It chains what one step tells the next (unit -> MainPID -> scheduler children -> port ->
/server_info -> model path -> index -> shard headers; cgroup unit + pid -> the startup
server_args= line of the journal), so it parses a little itself, with
the same fact classes the controller uses. Every record keeps its provenance (command,
exit code, duration); nothing here raises for a fact that cannot be had: the record says
why. Secrets are redacted before anything is returned (redact.py).
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

from .lib import bounded, wire
from .lib.facts import checkpoint as ck
from .lib.facts import gpu, http, journal, procs, systemd, trace, tree
from .lib.tracer import DIR_VAR as TRACE_DIR_VAR
from .lib.facts.base import Command
from .lib.protocol import Events
from .lib.records import TensorPattern
from .lib.redact import Redactor
from .runner import (HTTP_TIMEOUT, RUN_TIMEOUT, Runner, argv_of, environ_of, process_import,
                     readlink)

FORMAT = 1
VERSION = "1"
SERVER_MARK = "sglang.launch_server"
ROUTER_MARK = "sglang_router.launch_router"
DEFAULT_PORT = 30000


# ---------------------------------------------------------------- the chain

class Gatherer:
    def __init__(self, request: wire.AuditRequest) -> None:
        self.req = request
        self.red = Redactor(tagged=True)
        self.r = Runner(self.red, RUN_TIMEOUT if request.run_timeout is None
                        else request.run_timeout,
                        HTTP_TIMEOUT if request.http_timeout is None else request.http_timeout)

    def gather(self) -> wire.AuditResult:
        start = time.monotonic()
        raw: dict[str, Any] = {}
        clock = self.r.read(procs.HostClock().command())
        clock.update(clk_tck=os.sysconf("SC_CLK_TCK"), now=time.time(),
                     stdout="".join(line for line in clock["stdout"].splitlines(True)
                                    if line.startswith("btime ")))
        raw["clock"] = clock
        raw["gpus"] = self.r.run(gpu.GpuList().command())
        raw["tree"] = self.tree()
        raw["units"] = self.units(raw)
        scan = self.r.scan(procs.ProcScan().command())
        raw["scan"] = scan
        table = procs.ProcScan().collect(scan).value or []
        raw["servers"] = [self.server(p, table) for p in _mains(table)]
        raw["checkpoints"] = self.checkpoints(raw["servers"])
        return wire.AuditResult(format=FORMAT, gatherer=VERSION, hostname=socket.gethostname(),
                                uid=os.geteuid(), raw=raw,
                                duration_ms=round((time.monotonic() - start) * 1000, 2))

    def tree(self) -> dict | None:
        if not self.req.tree:
            return None
        cmd = tree.TreeStatus().command(tree=self.req.tree)
        request = wire.StatusRequest(target=self.req.tree, git_prefix=self.req.git_prefix,
                                     package=self.req.package, python=self.req.python)
        start = time.monotonic()
        try:
            # Here, not in runner.py: the engine reads units through runner (no import loop).
            from . import engine
            result = wire.encode_result(engine.serve(request))
        except Exception as exc:  # noqa: BLE001 - a broken tree must not stop the audit
            return self.r.record(cmd, start, error=f"engine status failed: {exc}")
        return self.r.record(cmd, start, exit_code=0, data=self.red.value(result))

    def units(self, raw: dict) -> dict:
        pattern = self.req.unit_pattern or systemd.UNIT_PATTERN
        raw["unit_files"] = self.r.run(systemd.UnitFiles().command(pattern=pattern))
        raw["loaded_units"] = self.r.run(systemd.LoadedUnits().command(pattern=pattern))
        names = set(self.req.units)
        for key, fact in (("unit_files", systemd.UnitFiles()), ("loaded_units", systemd.LoadedUnits())):
            names |= set(fact.collect(raw[key]).value or ())
        units = {}
        for name in sorted(names):
            show = self.r.run(systemd.UnitShow().command(unit=name))
            props = systemd.UnitShow().collect(show).value or {}
            rec: dict[str, Any] = {"show": show, "file": None, "env_files": {}}
            if props.get("FragmentPath"):
                rec["file"] = self.r.read(systemd.UnitFile().command(path=props["FragmentPath"]),
                                          stat=True)
            for path, _optional in props.get("environment_files", []):
                rec["env_files"][path] = self.r.read(
                    systemd.EnvironmentFile().command(path=path), stat=True)
            units[name] = rec
        return units

    def server(self, proc: dict, table: list[dict]) -> dict:
        pid = proc["pid"]
        kind = "router" if ROUTER_MARK in proc["args"] else "server"
        argv = argv_of(pid, self.r)
        environ = environ_of(pid, self.r, unredacted=True) or {}
        rec: dict[str, Any] = {
            "pid": pid, "kind": kind,
            "stat": self.r.read(procs.ProcStat().command(pid=pid)),
            "cmdline": self.r.read(procs.ProcCmdline().command(pid=pid), "cmdline"),
            "environ": self.r.read(procs.ProcEnviron().command(pid=pid), "environ"),
            "cgroup": self.r.read(Command("read", target=f"/proc/{pid}/cgroup", limit=65536)),
            "exe": readlink(f"/proc/{pid}/exe"), "cwd": readlink(f"/proc/{pid}/cwd"),
            "children": [],
        }
        config = _flag(argv, "--config")
        config_path = os.path.join(rec["cwd"] or "/", config) if config else None
        if config_path:             # which settings it holds and who may read it
            rec["config_file"] = self.r.read(procs.ConfigFile().command(path=config_path),
                                             "keys", stat=True)
        for child in _descendants(pid, table):
            if not child["args"].startswith("sglang::"):
                continue
            cpid = child["pid"]
            rec["children"].append({
                "pid": cpid, "title": child["args"].split()[0],
                "stat": self.r.read(procs.ProcStat().command(pid=cpid)),
                "environ": self.r.read(procs.ProcEnviron().command(pid=cpid), "environ")})
        if kind == "router":
            return rec
        if environ.get(TRACE_DIR_VAR):        # the tracer's records (deploy's `trace: true`)
            rec["trace"] = self.r.trace_dir(trace.TraceRecords().command(
                path=environ[TRACE_DIR_VAR]))
        host, port = _listen(argv)
        base = f"http://{_connect_host(host)}:{port}"
        token = (_flag(argv, "--api-key") or _config_value(config_path, "api-key")
                 or environ.get("SGLANG_API_KEY"))
        rec["base_url"] = base
        rec["server_info"] = self.http_first(http.ServerInfo(), base, token)
        rec["model_info"] = self.http_first(http.ModelInfo(), base, token)
        rec["health"] = self.r.http(http.Health().command(base=base), token)
        unit = procs.cgroup_unit(rec["cgroup"].get("stdout") or "")
        if unit:     # the ServerArgs it logged at startup (redacted by the runner)
            rec["server_args_log"] = self.r.run(journal.ServerArgsLog().command(unit=unit,
                                                                                pid=pid))
        rec["imports"], _ = process_import(pid, argv, environ, self.req.package,
                                           self.r)
        info = http.ServerInfo().collect(rec["server_info"]).value or {}
        rec["model"] = info.get("model_path") or _flag(argv, "--model-path") or \
            _flag(argv, "--model")
        rec["model_home"] = environ.get("HF_HUB_CACHE") or (
            os.path.join(environ["HF_HOME"], "hub") if environ.get("HF_HOME") else
            os.path.join(environ.get("HOME", "/root"), ".cache", "huggingface", "hub"))
        return rec

    def http_first(self, fact: Any, base: str, token: str | None) -> dict:
        """The new endpoint, then its deprecated alias when the new one is 404."""
        rec: dict = {}
        for path in fact.paths:
            rec = self.r.http(fact.command(base=base, path=path), token)
            if rec.get("status") != 404:
                return rec
        return rec

    def checkpoints(self, servers: list[dict]) -> dict:
        out: dict[str, dict] = {}
        for srv in servers:
            model = srv.get("model")
            if not model or model in out:
                continue
            out[model] = self.checkpoint(model, srv.get("model_home"))
        return out

    def checkpoint(self, model: str, hub: str | None) -> dict:
        path, how = resolve_model(model, hub)
        rec: dict[str, Any] = {"resolved": path, "how": how, "headers": {}}
        if path is None:
            return rec
        rec["config"] = self.r.read(ck.ConfigJson().command(model=path), "json")
        rec["hf_quant"] = self.r.read(ck.HfQuantConfig().command(model=path), "json")
        index = self.r.read(ck.SafetensorsIndex().command(model=path))
        weight_map = (ck.SafetensorsIndex().collect(index).value or {}).get("weight_map")
        patterns = self.req.tensors
        if weight_map is None and index.get("exit_code") == errno.ENOENT:
            single = os.path.join(path, "model.safetensors")
            rec["index"] = index
            if os.path.exists(single):
                rec["headers"]["model.safetensors"] = self.header(single, patterns, None)
            return rec
        if weight_map is None:
            rec["index"] = index
            return rec
        wanted = _match(weight_map, patterns)
        index["stdout"] = json.dumps({"weight_map": wanted, "tensors": len(weight_map),
                                      "shards": len(set(weight_map.values()))})
        index["trimmed"] = True
        rec["index"] = index
        shards = sorted(set(wanted.values()))[: self.req.max_shards]
        for shard in shards:
            names = {t for t, s in wanted.items() if s == shard}
            rec["headers"][shard] = self.header(os.path.join(path, shard), patterns, names)
        return rec

    def header(self, file: str, patterns: list[TensorPattern], names: set[str] | None) -> dict:
        cmd = ck.SafetensorsHeader().command(path=file)
        if names is not None:
            return self.r.header(cmd, names)
        # single-file checkpoint: the header itself says which tensors there are
        rec = self.r.header(cmd, _AnyMatch(patterns))
        return rec


class _AnyMatch(set):
    """`name in wanted` for a single-file checkpoint: true when a pattern matches."""

    def __init__(self, patterns: list[TensorPattern]) -> None:
        super().__init__()
        self.patterns = [p.pattern for p in patterns]

    def __contains__(self, name: object) -> bool:
        return any(fnmatch.fnmatchcase(str(name), p) for p in self.patterns)


def _match(weight_map: dict[str, str], patterns: list[TensorPattern]) -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in patterns:
        hits = sorted(n for n in weight_map if fnmatch.fnmatchcase(n, spec.pattern))
        for name in hits[: spec.max]:
            out[name] = weight_map[name]
    return out


def resolve_model(model: str, hub: str | None) -> tuple[str | None, str]:
    """A --model-path is a directory, or a hub id cached under HF_HUB_CACHE."""
    if os.path.isdir(model):
        return os.path.realpath(model), "directory"
    if hub and "/" in model and not model.startswith("/"):
        repo = Path(hub) / ("models--" + model.replace("/", "--"))
        ref = repo / "refs" / "main"
        try:
            snapshot = repo / "snapshots" / ref.read_text().strip()
        except OSError:
            snapshots = sorted((repo / "snapshots").glob("*")) if repo.is_dir() else []
            if not snapshots:
                return None, f"{model}: not a directory and not in the hub cache {hub}"
            snapshot = snapshots[-1]
        return str(snapshot), f"hub cache {snapshot}"
    return None, f"{model}: no such directory on the host"


# ---------------------------------------------------------------- process helpers

def _mains(table: list[dict]) -> list[dict]:
    """Server and router main processes (not their own spawned copies)."""
    marks = (SERVER_MARK, ROUTER_MARK)
    pids = {p["pid"]: p for p in table}
    mains = []
    for p in table:
        if not any(m in p["args"] for m in marks) or p["args"].startswith("sglang::"):
            continue
        parent = pids.get(p["ppid"])
        if parent and any(m in parent["args"] for m in marks):
            continue
        mains.append(p)
    return mains


def _descendants(pid: int, table: list[dict]) -> list[dict]:
    out, frontier = [], {pid}
    while frontier:
        nxt = [p for p in table if p["ppid"] in frontier]
        out += nxt
        frontier = {p["pid"] for p in nxt}
    return out


def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.partition("=")[2]
    return None


def _config_value(path: str | None, key: str) -> str | None:
    """A scalar of a --config YAML file (`key: "v"`, `key: 'v'`, `key: v`), read here to
    authenticate to the server; it never leaves the host."""
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")[: 1 << 16]
    except (OSError, UnicodeDecodeError):
        return None
    m = re.search(r"(?m)^" + re.escape(key) + r"[ \t]*:[ \t]*(.*?)[ \t]*$", text)
    if not m or not m.group(1):
        return None
    raw = m.group(1)
    if raw.startswith('"'):
        try:
            return str(bounded.loads(raw, "config"))
        except ValueError:
            return None
    if raw.startswith("'") and raw.endswith("'") and len(raw) > 1:
        return raw[1:-1].replace("''", "'")
    return raw.split(" #", 1)[0]


def _listen(argv: list[str]) -> tuple[str, int]:
    port = _flag(argv, "--port")
    try:
        return _flag(argv, "--host") or "127.0.0.1", int(port) if port else DEFAULT_PORT
    except ValueError:
        return _flag(argv, "--host") or "127.0.0.1", DEFAULT_PORT


def _connect_host(host: str) -> str:
    if host in ("0.0.0.0", "", "localhost"):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# ---------------------------------------------------------------- entry points

def op_audit(request: wire.AuditRequest) -> wire.AuditResult:
    """Every raw fact of the audit in one go."""
    return Gatherer(request).gather()


def serve(request: wire.Request, bundle: str | Path = ".",
          events: Events | None = None) -> wire.Result | wire.Failure:
    """The audit's frame (wire.OPS names the op's function): always a result (an
    unexpected error is a Failure naming it, its redacted traceback in the details)."""
    try:
        return wire.op_function(sys.modules[__name__], request)(request)
    except wire.WireError as exc:
        return wire.Failure(exc.kind, str(exc))
    except Exception as exc:  # noqa: BLE001 - report, never crash the round trip
        import traceback
        return wire.Failure("target", f"{type(exc).__name__}: {exc}",
                            Redactor().text(traceback.format_exc()[-4000:]))
