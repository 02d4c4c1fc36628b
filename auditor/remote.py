"""Run the gatherer where the facts are: in-process for localhost, shipped over SSH else.

Over SSH it is the engine's recipe (deploy/ssh.py): one SFTP upload of a tar holding the
gatherer, the fact classes, the redactor, patchset's engine and the request into a fresh
private directory, then one command that unpacks, runs and removes it. It reuses the
transport's connection, so host keys are checked exactly as for apply.
"""

from __future__ import annotations

import io
import json
import secrets
import shlex
import tarfile
from pathlib import Path
from typing import Any

from patchset.errors import HostUnreachable

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("auditor/__init__.py", "auditor/facts/*.py", "auditor/host/*.py",
           "patchset/__init__.py", "patchset/engine.py", "patchset/redact.py")
BOOTSTRAP = """\
import json, os, shutil, sys, tarfile
d = sys.argv[1]
try:
    with tarfile.open(os.path.join(d, "bundle.tar")) as t:
        t.extractall(d)
    sys.path.insert(0, d)
    sys.dont_write_bytecode = True
    from auditor.host import gather
    request = json.load(open(os.path.join(d, "request.json")))
    sys.stdout.write(json.dumps(gather.run(request)) + "\\n")
finally:
    shutil.rmtree(d, ignore_errors=True)
"""
REMOTE_ENV = {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}


def shipped_files() -> dict[str, bytes]:
    """Bundle name -> content: the standard-library-only modules the gatherer needs."""
    out: dict[str, bytes] = {}
    for pattern in SHIPPED:
        for path in sorted(ROOT.glob(pattern)):
            out[str(path.relative_to(ROOT))] = path.read_bytes()
    return out


def bundle(request: dict) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in [*shipped_files().items(),
                           ("request.json", json.dumps(request).encode())]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def gather_on(transport: Any, request: dict) -> dict:
    """The gather result of one host; HostUnreachable when it cannot be reached."""
    if hasattr(transport, "gather"):                # test doubles, replayed fixtures
        return transport.gather(request)
    target = getattr(transport, "target", None)
    request = dict(request, tree=str(target) if target else request.get("tree"))
    if not hasattr(transport, "connection"):        # localhost: the same code, in-process
        from .host import gather
        return gather.run(request)
    return _over_ssh(transport, request)


def _over_ssh(transport: Any, request: dict) -> dict:
    python = getattr(transport, "python", None)
    if python:
        request.setdefault("python", python)
    conn = transport.connection()
    remote = f"/tmp/patchset-audit-{secrets.token_hex(8)}"
    try:
        sftp = conn.sftp()
        sftp.mkdir(remote, 0o700)
        payload = bundle(request)
        sftp.putfo(io.BytesIO(payload), f"{remote}/bundle.tar")
        command = shlex.join(["env", *(f"{k}={v}" for k, v in REMOTE_ENV.items()),
                              "python3", "-c", BOOTSTRAP, remote])
        result = conn.run(command, hide=True, warn=True, in_stream=False, encoding="utf-8")
    except HostUnreachable:
        raise
    except (OSError, EOFError) as exc:
        raise transport._unreachable(exc) from None
    except Exception as exc:
        import paramiko
        if isinstance(exc, paramiko.SSHException):
            raise transport._unreachable(exc) from None
        raise
    lines = (result.stdout or "").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (result.stderr or result.stdout or "").strip().splitlines()[-3:]
        return {"ok": False, "error": f"the gatherer exited {result.exited} without a result "
                f"({' / '.join(tail) or 'no output'}); is python3 >= 3.8 installed there?"}
