"""Helpers shared by the tests that drive the CLI against nspawn test hosts."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.hosts.hostsetup import free_ports  # noqa: F401 - the tests' name for it
from patchset.cli import main
from tests.hosts.nspawn import TestHost, run_ssh
from tests.hosts.ports import reserve_port

TREE = "/opt/sglang"   # the managed tree on test hosts


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `patchset ARGV` in-process; (exit code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@contextlib.contextmanager
def json_server(answer: Callable[[bytes, dict], dict]) -> Iterator[str]:
    """A local HTTP server whose every POST gets `answer(body, headers)` as JSON (an
    OpenAI-shaped stand-in a test scripts); yields its URL."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:                        # the http.server API's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            data = json.dumps(answer(body, dict(self.headers))).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def on_host(host: TestHost, command: str) -> str:
    """Run a shell command on a test host over plain ssh; it must succeed."""
    proc = run_ssh(host, command)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def inventory(path: Path, hosts: list[TestHost], **extra) -> Path:
    lines = ["version: 1", f"default: {hosts[0].name}", "hosts:"]
    for h in hosts:
        lines += [f"  {h.name}:", f"    address: {h.ip}", f"    port: {h.port}",
                  "    user: root", f"    identity_file: {h.client_key}", f"    tree: {TREE}"]
        lines += [f"    {k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def clean_tree(host: TestHost) -> None:
    """No tree at TREE: the next apply provisions it."""
    on_host(host, f"rm -rf {TREE} /opt/.sglang.provisioning-*")


def free_port() -> int:
    """A loopback port in 31000-31999, free now (and the next one too: a prefill stand-in
    also binds port + 1), reserved machine-wide for this process (tests.hosts.ports)."""
    return reserve_port(31000, 32000, span=2)


def http_status(url: str, token: str | None = None, timeout: float = 10) -> int:
    """The HTTP status of GET `url` (with `Authorization: Bearer token`), 0 if unreachable."""
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token
                                 else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0
