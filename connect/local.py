"""The local transport: the agent for a tree on this machine.

In this process (the bundle staged in a private temporary directory exactly as on a host),
except for what must outlive the controller (main.ISOLATED_OPS: a deploy's transaction)
and what runs as root once `elevate()` was called: those run the shipped bundle with the
one bootstrap in a child process (`sudo -n` when elevated), like on an SSH host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping

from patchset import transport as wire
from patchset.agent.main import ISOLATED_OPS, serve_json
from patchset.agent.lib.protocol import Events
from patchset.agent.lib.wire import Failure, Request, Result, encode_request


class LocalTransport:
    """The agent on `target`, a tree on this machine."""

    provisions = False

    def __init__(self, target: Path | str, host: str = "localhost",
                 in_process: bool = True) -> None:
        self.host = host
        self.target = str(target)
        self.in_process = in_process      # False: every call runs the shipped bundle
        self.sudo = False
        self.round_trips = 0
        self.bytes_sent = 0

    def call(self, request: Request, files: Mapping[str, Path] | None = None,
             on_event: wire.EventSink | None = None) -> Result | Failure:
        request = wire.stamp(request, self.target)
        self.round_trips += 1
        with tempfile.TemporaryDirectory(prefix=wire.workdir_name(request, "")) as tmp:
            if self.sudo or not self.in_process or request.op in ISOLATED_OPS:
                return self._child(Path(tmp), request, files, on_event)
            for name, source in (files or {}).items():
                dest = Path(tmp) / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, dest)
            # through JSON as over SSH: the same exact-type checks on both sides
            answer = serve_json(encode_request(request), Path(tmp),
                                      Events(sink=on_event or (lambda e: None)))
            return wire.decode(self.host, request.op, answer)

    def _child(self, tmp: Path, request: Request, files: Mapping[str, Path] | None,
               on_event: wire.EventSink | None) -> Result | Failure:
        payload = wire.bundle(request, files)
        (tmp / "bundle.tar").write_bytes(payload)
        self.bytes_sent += len(payload)
        argv = (["sudo", "-n"] if self.sudo else []) + [
            "env", *(f"{k}={v}" for k, v in wire.REMOTE_ENV.items()), *_test_env(),
            sys.executable, "-c", wire.BOOTSTRAP, str(tmp)]
        sink = wire.LineSink(on_event)
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True) as proc:
            assert proc.stdout is not None and proc.stderr is not None     # both PIPE
            for line in proc.stdout:
                sink.write(line)
            stderr = proc.stderr.read()
        sink.close()
        return sink.outcome(self.host, proc.returncode, stderr, request.op)

    def elevate(self) -> None:
        """Root through `sudo -n` from now on (the agent said it does not run as root)."""
        self.sudo = True

    def close(self) -> None:
        pass


def _test_env() -> list[str]:
    """The engine's fault-injection hook, passed on when a test sets it."""
    crash = os.environ.get("PATCHSET_TEST_CRASH_AT")
    return [f"PATCHSET_TEST_CRASH_AT={crash}"] if crash else []
