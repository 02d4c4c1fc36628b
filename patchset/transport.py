"""How the controller talks to a host: the Transport interface and the agent's shipping.

patchset/ only knows this interface; the implementations are in deploy/ (local.py: a tree
on this machine; ssh.py: a host over SSH) and tests/ (a fake). A transport owns the whole
round trip: it ships the agent (one tar: the agent package, the request, the data files),
runs it (as root through `sudo -n` once `elevate()` was called), streams its progress
events to `on_event`, and maps what came back to the project's errors here, in
`raise_for`: the one place a host failure becomes a PatchsetError.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, TypeVar

from patchset.agent.lib import bounded, wire
from patchset.agent.lib.protocol import ended, killed
from patchset.agent.lib.records import Event
from .errors import BisectPending, LockedError, PatchsetError, TargetError, UsageError

if TYPE_CHECKING:
    import tarfile

EventSink = Callable[[Event], None]
AGENT_DIR = Path(__file__).resolve().parent / "agent"
AGENT_NAME = "patchset_agent"       # the package's name on a host (never `patchset`)
REMOTE_ENV = {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}

# The one bootstrap: unpack the bundle into the private directory it was uploaded to
# (the tar `data` filter where Python has it; else only plain files and directories
# inside the directory are accepted), run the agent, remove the directory.
BOOTSTRAP = """\
import os, runpy, shutil, sys, tarfile
d = sys.argv[1]
try:
    with tarfile.open(os.path.join(d, "bundle.tar")) as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(d, filter="data")
        else:
            for m in t.getmembers():
                p = os.path.normpath(m.name)
                if not (m.isfile() or m.isdir()) or p.startswith(("/", "..")):
                    raise SystemExit("patchset: refusing bundle member %r" % m.name)
            t.extractall(d)
    sys.path.insert(0, d)
    sys.dont_write_bytecode = True
    sys.argv = ["patchset-agent", d]
    runpy.run_module("patchset_agent", run_name="__main__", alter_sys=True)
finally:
    shutil.rmtree(d, ignore_errors=True)
"""


class Transport(Protocol):
    """One host as the controller sees it."""

    host: str              # what the user typed (inventory name, user@host, localhost)
    target: str            # the SGLang tree's path on that host
    provisions: bool       # may a missing tree be provisioned there from the pin?
    round_trips: int       # agent runs so far (what the benchmarks count)
    bytes_sent: int        # bundle bytes uploaded so far

    def call(self, request: wire.Request, files: Mapping[str, Path] | None = None,
             on_event: EventSink | None = None) -> wire.Result | wire.Failure:
        """Run the agent on `request` (`target` is filled in, the wire adds `protocol`)
        with `files` (bundle name -> local path) beside it; its typed result, a Failure
        included. Raises Unreachable when the host is not there, TargetError when the
        agent gave no result or one the wire does not accept."""
        ...

    def elevate(self) -> None:
        """Run the following calls as root (`sudo -n`); a no-op when already root."""
        ...

    def close(self) -> None:
        ...


R = TypeVar("R", bound=wire.Request)


def stamp(request: R, target: str, python: str | None = None) -> R:
    """The request as sent: the tree path filled in (and the interpreter, when the
    request names none)."""
    return dataclasses.replace(request, target=target, tree=request.tree or target,
                               python=request.python or python)


def workdir_name(request: wire.Request, token: str) -> str:
    """`patchset-OP-TOKEN`: the private directory of one agent run (ps shows what runs)."""
    return f"patchset-{request.op}-{token}"


def agent_files() -> dict[str, bytes]:
    """The agent package, as bundle name -> content (AGENT_NAME/...)."""
    out: dict[str, bytes] = {}
    for path in sorted(AGENT_DIR.rglob("*.py")):
        out[f"{AGENT_NAME}/{path.relative_to(AGENT_DIR).as_posix()}"] = path.read_bytes()
    return out


def bundle(request: wire.Request, files: Mapping[str, Path] | None = None) -> bytes:
    """The one transfer: the agent + request.json + the data files, gzipped. tarfile is
    imported here: a localhost apply runs the agent in process and ships no bundle."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for name, data in agent_files().items():
            _add(tar, name, data)
        _add(tar, "request.json", json.dumps(wire.encode_request(request)).encode())
        for name, source in sorted((files or {}).items()):
            _add(tar, name, Path(source).read_bytes())
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    import tarfile

    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    tar.addfile(info, io.BytesIO(data))


class LineSink:
    """The agent's stdout as it comes: events go to `on_event`, the result line is kept,
    anything else is kept for the error message."""

    def __init__(self, on_event: EventSink | None) -> None:
        self.on_event = on_event
        self.buffer = ""
        self.result: dict | None = None
        self.other: list[str] = []

    def write(self, text: str) -> int:
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            self.line(line)
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.buffer:
            self.line(self.buffer)
            self.buffer = ""

    def line(self, line: str) -> None:
        try:
            value = bounded.loads(line, "the agent's output")
        except ValueError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("result"), dict):
            self.result = value["result"]
        elif isinstance(value, dict) and "event" in value:
            try:
                event = Event.from_json(value, "an event line")
            except wire.WireError:        # not this protocol's event: shown with the rest
                self.other.append(line)
                return
            if self.on_event:
                self.on_event(event)
        elif line.strip():
            self.other.append(line)

    def outcome(self, host: str, exited: int | None, stderr: str, op: str,
                shell: bool = False) -> wire.Result | wire.Failure:
        """The result line decoded (wire.decode_result), or TargetError saying why there
        is none (naming the part of the agent that ran: the engine, the deploy runner, the
        gatherer). A part killed by a signal is reported as killed (protocol.ended;
        `shell`: `exited` is a remote shell's status), not as a host that lacks python3
        or git."""
        if self.result is not None:
            return decode(host, op, self.result)
        tail = (stderr.strip().splitlines() or self.other)[-3:]
        part = wire.OPS[op].serves if op in wire.OPS else "the agent"
        output = " / ".join(tail) or "no output"
        if killed(exited, shell):
            raise TargetError(f"{host}: {part} {ended(exited, shell)} before it gave a "
                              f"result ({output}); a transaction it left is repaired by "
                              "the next command: `patchset status` says what it will do")
        raise TargetError(f"{host}: {part} {ended(exited, shell)} without a result "
                          f"({output}); is python3 >= 3.8 and git installed there?")


ERROR_KINDS: dict[str, type[PatchsetError]] = {
    "usage": UsageError, "locked": LockedError, "bisect_pending": BisectPending}


def decode(host: str, op: str, data: object) -> wire.Result | wire.Failure:
    """The agent's result object as the op's Result (or a Failure); one that the wire
    does not accept is TargetError naming the host and the field."""
    try:
        return wire.decode_result(op, data)
    except wire.WireError as exc:
        raise TargetError(f"{host}: the agent's answer does not match this patchset's "
                          f"protocol ({exc})") from None


def raise_for(host: str, result: wire.Result | wire.Failure) -> wire.Result:
    """The one mapping of an agent Failure to the project's errors: returns an ok
    result, raises the error of its kind (TargetError for any other kind) otherwise.
    The error keeps its kind (`exc.kind`) and details; BisectPending its record."""
    if not isinstance(result, wire.Failure):
        return result
    exc = ERROR_KINDS.get(result.kind, TargetError)(f"{host}: {result.message}")
    exc.kind = result.kind or "target"
    exc.details = result.details
    if isinstance(exc, BisectPending):
        try:
            record = bounded.loads(exc.details or "{}", f"{host}: the bisect record")
        except bounded.InputError:
            record = {}
        exc.record, exc.details = record if isinstance(record, dict) else {}, ""
    raise exc
