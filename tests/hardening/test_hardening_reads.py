"""Hostile files (issue 25, class 3): every file a user or a host supplies is read through
one bounded, non-blocking, regular-file-only reader (patchset/agent/lib/bounded.py; on the
controller patchset/inputfile.py): a saved drift run, the target's state records (read by
the engine, on hosts too), the request the agent is shipped, known_hosts, the host's
fact reads (env files, /proc, a checkpoint's files and headers, the tracer's records).

A FIFO, /dev/zero, a symlink to a device, a directory or a huge file is refused in one
line naming the file; nothing blocks. Reads that could block run in a subprocess with a
timeout, so a reader that hangs fails the test instead of hanging the run.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from patchset.agent.lib.facts.base import Command
from patchset.agent.lib.redact import Redactor
from patchset.agent.runner import Runner

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 30
MEMORY = 2 << 30        # a child that reads /dev/zero fails here, not the machine


def _bounded_child() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _link(path: Path, to: str) -> Path:
    path.symlink_to(to)
    return path


def _huge(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:            # sparse: no disk used
        handle.truncate(size)
    return path


KINDS = {
    "fifo": (lambda p: _fifo(p), "not a regular file (a FIFO)"),
    "dev-zero": (lambda p: Path("/dev/zero"), "not a regular file (a character device)"),
    "symlink-to-zero": (lambda p: _link(p, "/dev/zero"),
                        "not a regular file (a character device)"),
    "directory": (lambda p: (p.mkdir(), p)[1], "not a regular file (a directory)"),
}


def python(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter at the repository root, with a timeout."""
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=TIMEOUT,
                          preexec_fn=_bounded_child)


def patchset(*argv: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "patchset.cli", *argv], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=TIMEOUT,
                          preexec_fn=_bounded_child)


def one_error_line(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    for fragment in fragments:
        assert fragment in line, line
    return line


# ---------------------------------------------------------------- saved runs (controller)

@pytest.mark.parametrize("kind", KINDS, ids=list(KINDS))
def test_a_saved_run_that_is_not_a_file_is_refused(tmp_path: Path, kind: str) -> None:
    make, fragment = KINDS[kind]
    path = make(tmp_path / "run.json")
    proc = patchset("probe", "--url", "http://127.0.0.1:9", "--kind", "drift",
                    "--against", str(path))
    one_error_line(proc, 2, str(path), fragment)


def test_a_huge_saved_run_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = _huge(tmp_path / "run.json", 300 * 1024 * 1024)
    proc = patchset("probe", "--url", "http://127.0.0.1:9", "--kind", "drift",
                    "--against", str(path))
    one_error_line(proc, 2, str(path), "larger than the 256 MiB a drift run may have")


# ---------------------------------------------------------------- known_hosts

@pytest.mark.parametrize("kind", KINDS, ids=list(KINDS))
def test_a_known_hosts_that_is_not_a_file_is_refused(tmp_path: Path, kind: str) -> None:
    """Before any connection: paramiko's own open would block on a FIFO, read /dev/zero
    until memory ran out, or fail on a directory with a traceback."""
    make, fragment = KINDS[kind]
    known = make(tmp_path / "known_hosts")
    config = tmp_path / "ssh_config"
    config.write_text("")
    proc = patchset("status", "root@127.0.0.1:9", env={
        "PATCHSET_KNOWN_HOSTS": str(known), "PATCHSET_SSH_CONFIG": str(config),
        "PATCHSET_HOME": str(tmp_path / "home")})
    one_error_line(proc, 2, str(known), fragment)


def test_known_hosts_keys_load_as_paramiko_loads_them(tmp_path: Path) -> None:
    """The checked text gives the keys HostKeys.load gives (plain, hashed, several names,
    comments and unreadable lines skipped)."""
    import paramiko
    from patchset.connect.ssh import load_known_hosts
    key = paramiko.RSAKey.generate(1024)
    hashed = paramiko.HostKeys.hash_host("h3.example")
    path = tmp_path / "known_hosts"
    path.write_text(f"# comment\n\nh1.example,h2.example {key.get_name()} {key.get_base64()}\n"
                    f"{hashed} {key.get_name()} {key.get_base64()}\n"
                    "garbage line\n")
    ours, theirs = paramiko.HostKeys(), paramiko.HostKeys()
    load_known_hosts(ours, path)
    theirs.load(str(path))
    for name in ("h1.example", "h2.example", "h3.example", "[h4]:2222", "other"):
        assert (ours.lookup(name) is None) == (theirs.lookup(name) is None), name
    assert ours.check("h3.example", key) and ours.check("h1.example", key)
    load_known_hosts(ours, tmp_path / "absent")          # a missing file holds no keys
    bad = tmp_path / "bad_known_hosts"                   # paramiko raises on this line
    bad.write_text(f"[h4]:2222 ssh-rsa notbase64!!\nh5 {key.get_name()} {key.get_base64()}\n")
    load_known_hosts(ours, bad)
    assert ours.lookup("[h4]:2222") is None and ours.check("h5", key)


# ---------------------------------------------------------------- on hosts: the engine

ENGINE_READ = """
import sys
from pathlib import Path
from patchset.agent import engine
try:
    engine.read_json(Path(sys.argv[1]))
except engine.EngineError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("kind", KINDS, ids=list(KINDS))
def test_a_state_record_that_is_not_a_file_is_refused(tmp_path: Path, kind: str) -> None:
    make, fragment = KINDS[kind]
    path = make(tmp_path / "state.json")
    proc = python(ENGINE_READ, str(path))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith(f"refused: {path} is corrupt or not a state record")
    assert fragment in proc.stdout, proc.stdout


def test_a_huge_state_record_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = _huge(tmp_path / "state.json", 100 * 1024 * 1024)
    proc = python(ENGINE_READ, str(path))
    assert "larger than the 64 MiB a state record may have" in proc.stdout, proc


@pytest.mark.parametrize("kind", ["fifo", "symlink-to-zero", "directory"])
def test_the_agents_request_that_is_not_a_file_is_a_usage_error(tmp_path: Path,
                                                               kind: str) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    make, fragment = KINDS[kind]
    make(bundle / "request.json")
    proc = python("import sys; from patchset.agent.main import main; main(['agent', "
                  "sys.argv[1]])", str(bundle))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])["result"]
    assert result["ok"] is False and result["error"]["kind"] == "usage"
    assert fragment in result["error"]["message"], result


# ---------------------------------------------------------------- on hosts: fact reads

RUNNER_READ = """
import json, sys
from patchset.agent.lib.facts.base import Command
from patchset.agent.lib.redact import Redactor
from patchset.agent.runner import Runner
runner = Runner(Redactor())
kind, target = sys.argv[1], sys.argv[2]
if kind == "read":
    record = runner.read(Command("read", target=target, limit=4096))
elif kind == "header":
    record = runner.header(Command("st-header", target=target), set())
else:
    record = runner.trace_dir(Command("trace-dir", target=target))
print(json.dumps(record))
"""


@pytest.mark.parametrize("kind", KINDS, ids=list(KINDS))
@pytest.mark.parametrize("how", ["read", "header"])
def test_a_host_file_that_is_not_a_file_is_a_failed_read(tmp_path: Path, kind: str,
                                                         how: str) -> None:
    """An env file, a checkpoint's config.json or a shard replaced by a FIFO or a device:
    the fact says why it could not be read; the gatherer does not hang."""
    make, fragment = KINDS[kind]
    path = make(tmp_path / "model.safetensors")
    proc = python(RUNNER_READ, how, str(path))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    record = json.loads(proc.stdout)
    assert record["exit_code"] != 0 and fragment in record["stderr"], record


def test_a_trace_record_that_is_not_a_file_is_an_error_entry(tmp_path: Path) -> None:
    traces = tmp_path / "trace"
    traces.mkdir()
    _fifo(traces / "1.json")
    _link(traces / "2.json", "/dev/zero")
    (traces / "3.json").write_text("[" * 100_000 + "]" * 100_000)
    (traces / "4.json").write_text('{"pid": 4}')
    proc = python(RUNNER_READ, "trace", str(traces))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    files = json.loads(json.loads(proc.stdout)["stdout"])
    assert "a FIFO" in files["1.json"]["error"]
    assert "a character device" in files["2.json"]["error"]
    assert "nested deeper than 64 levels" in files["3.json"]["error"]
    assert files["4.json"] == {"pid": 4}


def test_a_proc_file_is_read_clipped_as_before() -> None:
    """/proc files say size 0 and may be longer than the limit: read up to it, as before
    (the limit clips a fact read, it does not refuse it)."""
    record = Runner(Redactor()).read(Command("read", target="/proc/self/status", limit=16))
    assert record["exit_code"] == 0 and len(record["stdout"]) == 16
    missing = Runner(Redactor()).read(Command("read", target="/nonexistent/x", limit=16))
    assert missing["exit_code"] == 2                      # ENOENT: the facts' "absent"


# ---------------------------------------------------------------- on hosts: the deployer

DEPLOYER_READ = """
import sys
from patchset.agent import deployer
try:
    deployer.read_text(sys.argv[2])
    print("read")
except deployer.EngineError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("kind", KINDS, ids=list(KINDS))
def test_a_unit_file_that_is_not_a_file_stops_the_deploy_in_one_line(tmp_path: Path,
                                                                      kind: str) -> None:
    """The deployer reads the installed unit, env and config files to compare and keep
    them: one planted as a FIFO or a device is refused, not read for ever."""
    make, fragment = KINDS[kind]
    path = make(tmp_path / "sglang-decode.service")
    proc = python(DEPLOYER_READ, "unit", str(path))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith(f"refused: {path}: (file): {fragment}"), proc.stdout
    assert python(DEPLOYER_READ, "unit", str(tmp_path / "absent")).stdout == "read\n"


@pytest.mark.parametrize("kind", KINDS, ids=list(KINDS))
@pytest.mark.parametrize("which", ["ssh_config", "identity"])
def test_an_ssh_file_that_is_not_a_file_is_refused(tmp_path: Path, kind: str,
                                                   which: str) -> None:
    """fabric reads the ssh_config and paramiko the key itself: both are checked by the
    bounded reader first, before any connection is tried."""
    make, fragment = KINDS[kind]
    bad = make(tmp_path / which)
    config, known = tmp_path / "ssh_config.ok", tmp_path / "known_hosts"
    config.write_text("")
    known.write_text("")
    series = tmp_path / "series"
    series.mkdir()
    (series / "hosts.yaml").write_text(
        "version: 1\nhosts:\n  h1:\n    address: 127.0.0.1\n    port: 9\n    user: root\n"
        f"    identity_file: {bad if which == 'identity' else tmp_path / 'absent-key'}\n"
        "    tree: /opt/sglang\n")
    proc = patchset("status", "h1", "--inventory", str(series / "hosts.yaml"), env={
        "PATCHSET_KNOWN_HOSTS": str(known), "PATCHSET_HOME": str(tmp_path / "home"),
        "PATCHSET_SSH_CONFIG": str(bad if which == "ssh_config" else config)})
    one_error_line(proc, 2, str(bad), fragment)
