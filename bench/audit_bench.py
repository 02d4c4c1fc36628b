"""Sections 2 and 3 (audit): one audited host against `ssh HOST true` and a naive loop of
one `ssh` per fact, and the audit of 1, 2, 4, 8 hosts.

Every host is set up as tests/system/test_audit_hosts.py sets its host up
(tests/hosts/hostsetup.py, which both use): the series applied (the fleet section did
that), the SGLang stand-in venv, a checkpoint (config.json + a 20 GB sparse shard) and a
fake nvidia-smi, and prefill + decode units from `patchset deploy`.

Round trips are counted on the wire library: SSH connections opened (paramiko
`SSHClient.connect`) + exec requests (`Channel.exec_command`); the SFTP channel the upload
rides on (`invoke_subsystem`) is counted and shown apart. Plain OpenSSH with
ControlMaster=no costs one connection + one exec per `ssh` call.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from benchlib import Row, add_note, count_row, measure, ratios, row, verdict
from tests.hosts.hostsetup import ARGS, MODEL, TREE, VENV, checkpoint, free_ports

from patchset.auditor import api as audit_api
from patchset.auditor import policy as policy_mod

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class SshCount:
    connections: int = 0
    execs: int = 0
    sftp: int = 0

    @property
    def round_trips(self) -> int:
        return self.connections + self.execs


@contextlib.contextmanager
def count_ssh() -> Iterator[SshCount]:
    """Count paramiko connections, exec requests and subsystem (SFTP) channels."""
    import paramiko
    count = SshCount()
    patched = [(paramiko.SSHClient, "connect", "connections"),
               (paramiko.Channel, "exec_command", "execs"),
               (paramiko.Channel, "invoke_subsystem", "sftp")]
    originals = [getattr(cls, name) for cls, name, _ in patched]

    def counting(original: Any, field: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            setattr(count, field, getattr(count, field) + 1)
            return original(*args, **kwargs)
        return wrapper

    for (cls, name, field), original in zip(patched, originals):
        setattr(cls, name, counting(original, field))
    try:
        yield count
    finally:
        for (cls, name, _), original in zip(patched, originals):
            setattr(cls, name, original)


# ---------------------------------------------------------------- host setup

def setup_hosts(hosts: list, series_path: Path, scratch: Path) -> None:
    """Stand-in, checkpoint and fake nvidia-smi on every host, then `patchset deploy`."""
    from tests.standin.install import install_standin

    def prepare(host: Any) -> None:
        install_standin(host, venv=VENV, tree=TREE)
        checkpoint(host)
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(prepare, hosts))
    os.environ["PATCHSET_INVENTORY"] = str(write_inventory(hosts, free_ports(3 * len(hosts)),
                                                           scratch / "hosts.yaml"))
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda h: deploy(h.name, series_path), hosts))


def write_inventory(hosts: list, ports: list[int], path: Path) -> Path:
    spec = {}
    for i, h in enumerate(hosts):
        prefill, decode, bootstrap = ports[3 * i: 3 * i + 3]
        spec[h.name] = {
            "address": h.ip, "port": h.port, "user": "root", "identity_file": str(h.client_key),
            "tree": TREE, "python": f"{VENV}/bin/python",
            "serving": {"model_path": MODEL, "transfer_backend": "fake",
                        "env": {"STANDIN_STARTUP_DELAY": "0.2"}},
            "roles": {"prefill": {"gpus": "0,1", "port": prefill, "bootstrap_port": bootstrap,
                                  "extra_args": ARGS,
                                  "env": {"TRITON_INDEXER": "0", "MMA_FLASHMLA": "0"}},
                      "decode": {"gpus": "2,3", "port": decode, "extra_args": ARGS}}}
    path.write_text(yaml.safe_dump({"version": 1, "default": hosts[0].name, "hosts": spec},
                                   sort_keys=False))
    return path


def deploy(name: str, series_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "patchset.cli", "deploy", name,
                           "--series", str(series_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"deploy {name} failed: {proc.stderr.strip()[-600:]}")


def transports(hosts: list) -> list:
    from patchset.connect.inventory import Host
    from patchset.connect.ssh import SshTransport
    return [SshTransport(Host(name=h.name, address=h.ip, port=h.port, user="root",
                              identity_file=str(h.client_key)), TREE, python=f"{VENV}/bin/python")
            for h in hosts]


def audit(series: Any, hosts: list, pol: Any = None) -> Any:
    ts = transports(hosts)
    try:
        report = audit_api.audit(series, ts, pol=pol)
    finally:
        for t in ts:
            t.close()
    bad = [(h.host, h.facts.error) for h in report.hosts
           if not h.facts.reachable or h.facts.error]
    assert not bad, bad
    return report


# ---------------------------------------------------------------- the naive loop

def naive_commands(series: Any, host: Any) -> list[str]:
    """One shell command per fact the gatherer collected on this host (from its records)."""
    [t] = transports([host])
    try:
        raw = t.call(audit_api.gather_request(series, policy_mod.load()))
    finally:
        t.close()
    assert raw.get("ok"), raw.get("error")
    out: list[str] = []
    for rec in records(raw["raw"]):
        out += naive_for(rec, t.target)
    for server in raw["raw"]["servers"]:
        out += [f"readlink /proc/{server['pid']}/exe", f"readlink /proc/{server['pid']}/cwd"]
    return out


def records(value: Any) -> Iterator[dict]:
    if isinstance(value, dict):
        if "kind" in value and "command" in value:
            yield value
            return
        for v in value.values():
            yield from records(v)
    elif isinstance(value, list):
        for v in value:
            yield from records(v)


def naive_for(rec: dict, tree: str) -> list[str]:
    kind, command = rec["kind"], rec["command"]
    target = command.split(" ", 1)[-1]
    if kind == "run":
        return [command]
    if kind == "read":
        return [f"cat {target}"]
    if kind == "http":
        return [f"curl -s {target}"]
    if kind == "st-header":
        n = rec.get("header_len") or 0
        return [f"head -c 8 {target} | od -An -tu8", f"head -c {8 + n} {target} | tail -c {n}"]
    if kind == "engine":
        return [f"git -C {tree} rev-parse HEAD", f"git -C {tree} status --porcelain",
                f"cat {tree}/.patchset/state.json"]
    return ["ps -eo pid,ppid,lstart,args"]          # scan: the process table


def naive_loop(host: Any, known: Path, commands: list[str]) -> None:
    from tests.hosts.nspawn import run_ssh
    for command in commands:
        run_ssh(host, command, known_hosts=known)


# ---------------------------------------------------------------- sections

def bench_audit_one(series: Any, host: Any, known: Path, runs: int) -> list[Row]:
    from tests.hosts.nspawn import run_ssh
    with count_ssh() as count:
        report = audit(series, [host])
    servers = len(report.hosts[0].facts.servers or [])
    commands = naive_commands(series, host)
    rows = [row("audit", f"patchset audit, 1 host ({servers} servers)",
                measure(runs, lambda: None, lambda _: audit(series, [host]))),
            row("audit", "ssh HOST true (OpenSSH, ControlMaster=no)",
                measure(runs, lambda: None, lambda _: run_ssh(host, "true", known_hosts=known))),
            row("audit", f"naive loop: one ssh per fact ({len(commands)} commands)",
                measure(runs, lambda: None, lambda _: naive_loop(host, known, commands)))]
    audit_row, true_row, naive_row = rows
    to_true = audit_row.median / true_row.median
    add_note(audit_row, f"{to_true:.2f}x ssh true; " + verdict(to_true <= 3, "<= 3x ssh true"))
    speedup = naive_row.median / audit_row.median
    add_note(naive_row, f"patchset {speedup:.1f}x faster; " + verdict(speedup >= 5, ">= 5x"))
    rows.append(count_row("audit", "SSH round trips, patchset audit of 1 host",
                          count.round_trips, "count",
                          f"{count.connections} connection + {count.execs} exec; "
                          f"+{count.sftp} SFTP channel (mkdir + upload) on that connection; "
                          + verdict(count.round_trips <= 2, "<= 2")))
    rows.append(count_row("audit", "SSH round trips, naive loop", 2 * len(commands), "count",
                          f"{len(commands)} connections + {len(commands)} execs"))
    return rows


def parallel_true(hosts: list, known: Path) -> None:
    from tests.hosts.nspawn import run_ssh
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        list(pool.map(lambda h: run_ssh(h, "true", known_hosts=known), hosts))


def bench_fleet_audit(series: Any, hosts: list, known: Path, runs: int,
                      sizes: list[int]) -> list[Row]:
    pol = policy_mod.load()
    rows = [row("fleet", f"audit of {n} host(s), 2 servers each",
                measure(runs, lambda: None, lambda _, n=n: audit(series, hosts[:n], pol)))
            for n in sizes]
    ratios(rows, rows[0], "vs 1 host")
    if len(rows) > 1:
        last = rows[-1].median / rows[0].median
        add_note(rows[-1], verdict(last <= 2, f"{sizes[-1]} hosts <= 2x of 1"))
    floor = [row("fleet", f"floor: ssh HOST true to {n} host(s) in parallel",
                 measure(runs, lambda: None, lambda _, n=n: parallel_true(hosts[:n], known)))
             for n in sorted({sizes[0], sizes[-1]})]
    ratios(floor, floor[0], "vs 1 host (this machine's scaling floor)")
    return rows + floor
