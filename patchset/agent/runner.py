"""The one place a host is read: runs fact Commands and returns raw records (redacted).

Every host read of the agent goes through here and through the fact classes' parsers
(patchset/agent/lib/facts/): the gatherer of the audit, the engine's `status` (units serving
the tree, the interpreter) and the deploy runner (a unit's state) read systemctl,
/proc/PID/environ, the interpreter and env files the same way by construction.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import time
from pathlib import Path
from typing import Any, BinaryIO

from .lib import bounded
from .lib.facts import checkpoint as ck
from .lib.facts import procs, systemd, trace, tree
from .lib.facts.base import Command
from .lib.redact import Redactor, is_secret_name

RUN_TIMEOUT = 30.0
HTTP_TIMEOUT = 5.0
HTTP_LIMIT = 8 << 20


# ---------------------------------------------------------------- primitives

def read_header(handle: BinaryIO, size: int) -> tuple[int, dict, int]:
    """Read a safetensors header from an open file: (N, header, bytes read).

    Reads exactly 8 bytes, then exactly N: the cost is the header, not the file.
    """
    head = handle.read(8)
    if len(head) != 8:
        raise ValueError(f"file too short for a safetensors header ({len(head)} bytes)")
    (length,) = struct.unpack("<Q", head)
    if length > min(ck.MAX_HEADER, max(size - 8, 0)):
        raise ValueError(f"header length {length} exceeds min(100 MB, file size - 8)")
    body = handle.read(length)
    if len(body) != length:
        raise ValueError(f"header truncated: {len(body)} of {length} bytes")
    header = bounded.loads(body, "safetensors header", ck.MAX_HEADER)
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return length, header, len(head) + len(body)


class Runner:
    """Runs Commands and returns raw records; redacts everything it returns."""

    def __init__(self, redactor: Redactor, run_timeout: float = RUN_TIMEOUT,
                 http_timeout: float = HTTP_TIMEOUT) -> None:
        self.red = redactor
        self.run_timeout = run_timeout
        self.http_timeout = http_timeout

    def record(self, cmd: Command, start: float, **fields: Any) -> dict:
        rec = {"kind": cmd.kind, "command": self.red.text(cmd.render()),
               "duration_ms": round((time.monotonic() - start) * 1000, 2),
               "exit_code": None, "stdout": "", "stderr": "", "error": None}
        rec.update(fields)
        return rec

    def run(self, cmd: Command, timeout: float | None = None) -> dict:
        start = time.monotonic()
        env = dict(os.environ, LC_ALL="C.UTF-8", LANG="C.UTF-8")
        env.pop("PYTHONPATH", None)
        env.update(dict(cmd.env))
        try:
            proc = subprocess.run(list(cmd.argv), capture_output=True, cwd=cmd.cwd or None,
                                  env=env, timeout=timeout or self.run_timeout,
                                  stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError:
            return self.record(cmd, start, exit_code=127, stderr=f"{cmd.argv[0]}: not found")
        except PermissionError as exc:
            return self.record(cmd, start, exit_code=126, stderr=str(exc))
        except subprocess.TimeoutExpired:
            return self.record(cmd, start, error=f"timed out after {timeout or self.run_timeout:g}s")
        except OSError as exc:
            return self.record(cmd, start, error=f"{type(exc).__name__}: {exc}")
        return self.record(cmd, start, exit_code=proc.returncode,
                           stdout=self.red.text(proc.stdout.decode("utf-8", "replace")),
                           stderr=self.red.text(proc.stderr.decode("utf-8", "replace")[-4000:]))

    def read(self, cmd: Command, mode: str = "text", stat: bool = False) -> dict:
        """mode: text | environ | cmdline | json (how to redact what was read)."""
        start = time.monotonic()
        try:
            data, info = bounded.read_file(cmd.target, cmd.limit or (1 << 20), clip=True)
        except bounded.InputError as exc:      # a FIFO or device there blocks no read
            return self.record(cmd, start, exit_code=exc.errno or 1, stderr=exc.message)
        text = data.decode("utf-8", "replace")
        extra: dict[str, Any] = {}
        if stat:
            extra["stat"] = {"mode": f"{info.st_mode & 0o7777:04o}", "uid": info.st_uid,
                             "gid": info.st_gid, "mtime": info.st_mtime, "size": info.st_size}
        return self.record(cmd, start, exit_code=0, stdout=self.redact(text, mode), **extra)

    def redact(self, text: str, mode: str) -> str:
        if mode == "raw":      # host-side use only (a token to authenticate): never returned
            return text
        if mode == "keys":     # a --config file: its top-level key names, never a value
            return "\n".join(re.findall(r"(?m)^([A-Za-z0-9_][A-Za-z0-9_.-]*)[ \t]*:", text))
        if mode == "environ":
            out = []
            for item in text.split("\0"):
                name, sep, value = item.partition("=")
                out.append(f"{name}={self.red.mask(value)}" if sep and value and
                           is_secret_name(name) else self.red.text(item))
            return "\0".join(out)
        if mode == "cmdline":
            return "\0".join(self.red.argv(text.split("\0")))
        if mode == "json":
            try:
                return json.dumps(self.red.value(bounded.loads(text, "answer", HTTP_LIMIT)))
            except ValueError:
                return self.red.text(text)
        return self.red.text(text)

    def http(self, cmd: Command, token: str | None = None) -> dict:
        """GET cmd.target, the whole exchange within http_timeout (one deadline: a server
        that drips its answer cannot hold the gather)."""
        import http.client                   # here: an apply or a status never loads http

        from .lib import httpdeadline
        start = time.monotonic()
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            status, body = httpdeadline.get(cmd.target, headers, self.http_timeout,
                                            HTTP_LIMIT)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            return self.record(cmd, start, error=f"{cmd.target}: {httpdeadline.reason(exc)}")
        text = body.decode("utf-8", "replace")
        return self.record(cmd, start, exit_code=0, status=status,
                           stdout=self.redact(text, "json"))

    def header(self, cmd: Command, wanted: set[str]) -> dict:
        start = time.monotonic()
        try:
            handle = bounded.open_regular(cmd.target, "checkpoint shard")
        except bounded.InputError as exc:      # a FIFO or device there blocks no open
            return self.record(cmd, start, exit_code=exc.errno or 1, stderr=exc.message)
        try:
            with handle:
                size = os.fstat(handle.fileno()).st_size
                length, header, read = read_header(handle, size)
        except OSError as exc:
            return self.record(cmd, start, exit_code=exc.errno or 1,
                               stderr=exc.strerror or str(exc))
        except ValueError as exc:
            return self.record(cmd, start, error=f"{cmd.target}: {exc}")
        picked = {k: {"dtype": v.get("dtype"), "shape": v.get("shape")}
                  for k, v in header.items() if k in wanted and isinstance(v, dict)}
        return self.record(cmd, start, exit_code=0, stdout=json.dumps(picked),
                           header_len=length, bytes_read=read, file_size=size,
                           tensors_in_header=len(header) - ("__metadata__" in header))

    def trace_dir(self, cmd: Command) -> dict:
        """Every *.json of a trace directory (the tracer's per-process records), parsed;
        bounded in files and bytes. Redacted like everything else (they hold no secret)."""
        start = time.monotonic()
        try:
            names = sorted(n for n in os.listdir(cmd.target) if n.endswith(".json"))
        except OSError as exc:
            return self.record(cmd, start, exit_code=exc.errno or 1,
                               stderr=exc.strerror or str(exc))
        files: dict[str, Any] = {}
        for name in names[:trace.MAX_FILES]:
            try:
                path = os.path.join(cmd.target, name)
                files[name] = bounded.loads(bounded.read_bytes(
                    path, cmd.limit or trace.MAX_BYTES, "trace record"), path)
            except ValueError as exc:
                files[name] = {"error": f"{type(exc).__name__}: {exc}"}
        return self.record(cmd, start, exit_code=0, stdout=json.dumps(self.red.value(files)),
                           files=len(names))

    def scan(self, cmd: Command) -> dict:
        """Processes mentioning sglang and all their descendants, from /proc."""
        start = time.monotonic()
        table: dict[int, tuple[int, int, str]] = {}
        for entry in os.listdir(cmd.target):
            if not entry.isdigit():
                continue
            try:
                stat = Path(cmd.target, entry, "stat").read_text()
                argv = Path(cmd.target, entry, "cmdline").read_bytes()
            except OSError:
                continue
            fields = stat.rpartition(")")[2].split()
            args = " ".join(self.red.argv(argv.decode("utf-8", "replace").rstrip("\0")
                                          .split("\0")))
            table[int(entry)] = (int(fields[1]), int(fields[19]), args)
        keep = {pid for pid, (_, _, args) in table.items() if "sglang" in args}
        changed = True
        while changed:
            more = {pid for pid, (ppid, _, _) in table.items() if ppid in keep} - keep
            keep |= more
            changed = bool(more)
        lines = [f"{pid}\t{table[pid][0]}\t{table[pid][1]}\t{table[pid][2]}"
                 for pid in sorted(keep)]
        return self.record(cmd, start, exit_code=0, stdout="\n".join(lines))



# ---------------------------------------------------------------- one-call reads

def unit_show(unit: str, runner: Runner | None = None) -> dict[str, Any]:
    """`systemctl show UNIT`: every property of systemd.SHOW_PROPERTIES ({} if systemctl
    cannot be run); a unit that is not installed reads LoadState=not-found."""
    raw = (runner or Runner(Redactor())).run(systemd.UnitShow().command(unit=unit))
    if raw.get("exit_code") != 0:
        return {}
    return systemd.parse_show(raw.get("stdout") or "")


def environ_of(pid: int, runner: Runner | None = None,
               unredacted: bool = False) -> dict[str, str] | None:
    """/proc/PID/environ, secret values redacted unless `unredacted` (host-side use only:
    the server's API key to authenticate to it); None when it cannot be read."""
    fact = procs.ProcEnviron()
    raw = (runner or Runner(Redactor())).read(fact.command(pid=pid),
                                              "raw" if unredacted else "environ")
    value = fact.collect(raw)
    return value.value if value.known else None


def argv_of(pid: int, runner: Runner | None = None) -> list[str]:
    """/proc/PID/cmdline, unredacted: for the host-side chain only, never returned."""
    fact = procs.ProcCmdline()
    value = fact.collect((runner or Runner(Redactor())).read(fact.command(pid=pid), "raw"))
    return value.value if value.known else []


def import_origin(python: str, package: str, cwd: str = "", pythonpath: str | None = None,
                  runner: Runner | None = None, timeout: float = 60) -> tuple[dict, Any]:
    """Where `import PACKAGE` resolves for an interpreter (find_spec, never an import):
    (the raw record, the parsed fact value)."""
    fact = tree.ImportOrigin()
    raw = (runner or Runner(Redactor())).run(
        fact.command(python=python, cwd=cwd, pythonpath=pythonpath, package=package),
        timeout=timeout)
    return raw, fact.collect(raw)


def process_import(pid: int, argv: list[str], environ: dict[str, str], package: str,
                   runner: Runner | None = None) -> tuple[dict, Any]:
    """Where `import PACKAGE` resolves for a running process, asked the way it was started
    (its interpreter, working directory and PYTHONPATH): the one answer the audit (per
    server) and `status` (per unit) both give. (raw record, parsed fact value)."""
    return import_origin(interpreter_of(argv, readlink(f"/proc/{pid}/exe"), environ), package,
                         cwd=readlink(f"/proc/{pid}/cwd") or "",
                         pythonpath=environ.get("PYTHONPATH"), runner=runner)


def interpreter_of(argv: list[str], exe: str | None, environ: dict[str, str]) -> str:
    """The interpreter as the server was started: argv[0], not /proc/PID/exe, because a
    venv's python is a symlink and only its own path activates the venv."""
    import shutil
    first = argv[0] if argv else ""
    if first and os.path.isabs(first) and os.path.exists(first):
        return first
    found = shutil.which(first, path=environ.get("PATH")) if first else None
    return found or exe or "python3"


def readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def git_processes(dirs: list[Path]) -> list[str]:
    """Live git processes that may be working in `dirs` (a tree and its git directories):
    "git (pid N)" for each whose working directory or an open file is inside one, and for
    each this user may not inspect (it might be). Zombies hold nothing and are skipped.
    The engine's recovery (engine.recovery_plan) calls a git lock file stale, and removes
    it, only when this finds none."""
    roots = [str(d.resolve()) for d in dirs]
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue                              # gone meanwhile
        comm, _, tail = stat.partition(" (")[2].rpartition(")")
        if not (comm == "git" or comm.startswith("git-")) or tail.split()[:1] == ["Z"]:
            continue
        places = _open_places(int(entry))
        if places is None:
            out.append(f"git (pid {entry}, not inspectable by this user)")
        elif any(p == r or p.startswith(r + "/") for p in places for r in roots):
            out.append(f"git (pid {entry})")
    return out


def _open_places(pid: int) -> list[str] | None:
    """A process's working directory and open files; None if this user may not see them."""
    cwd = readlink(f"/proc/{pid}/cwd")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = None
    if cwd is None or fds is None:
        return None if Path(f"/proc/{pid}").exists() else []
    links = (readlink(f"/proc/{pid}/fd/{fd}") for fd in fds)
    return [cwd, *(link for link in links if link)]
