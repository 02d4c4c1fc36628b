"""Processes: the SGLang servers, their scheduler children, their command lines and environ.

The engine edits its environment before it spawns the schedulers (mp spawn), so the env
of the main process (what systemd gave it) and of `sglang::scheduler_TP{n}` (where the
kernels run and the patch gates are read) are both facts.
"""

from __future__ import annotations

import re
from typing import Any

from .base import RawRecord, Command, Fact, Unavailable, ok_output


class ProcScan(Fact):
    """Every process whose command line mentions sglang, and their descendants:
    one line per process, `pid<TAB>ppid<TAB>starttime_ticks<TAB>args` (NULs as spaces)."""

    def command(self, **kwargs: Any) -> Command:
        return Command("scan", target="/proc")

    def process(self, raw: RawRecord) -> list[dict[str, Any]]:
        procs = []
        for line in ok_output(raw).splitlines():
            pid, ppid, start, args = line.split("\t", 3)
            procs.append({"pid": int(pid), "ppid": int(ppid), "start_ticks": int(start),
                          "args": args})
        return procs


class ProcCmdline(Fact):
    """/proc/PID/cmdline -> argv (secrets already redacted on the host)."""

    def command(self, pid: int = 0, **kwargs: Any) -> Command:
        return Command("read", target=f"/proc/{pid}/cmdline", limit=1 << 20)

    def process(self, raw: RawRecord) -> list[str]:
        text = ok_output(raw)
        if not text:
            raise Unavailable(f"{raw.get('command')}: empty (a zombie or kernel thread)")
        return text.rstrip("\0").split("\0")


class ProcEnviron(Fact):
    """/proc/PID/environ -> {NAME: value} (needs root or the process's user)."""

    def command(self, pid: int = 0, **kwargs: Any) -> Command:
        return Command("read", target=f"/proc/{pid}/environ", limit=4 << 20)

    def process(self, raw: RawRecord) -> dict[str, str]:
        if raw.get("exit_code") == 13:
            raise Unavailable(f"permission denied reading {raw.get('command', '')[5:]} "
                              "(audit as root or as the service's user)")
        env: dict[str, str] = {}
        for item in ok_output(raw).split("\0"):
            name, sep, value = item.partition("=")
            if sep and name:
                env[name] = value
        return env


class ProcStat(Fact):
    """/proc/PID/stat -> {pid, comm, state, ppid, start_ticks} (start in clock ticks after
    boot; with the host's btime and CLK_TCK that is the wall-clock start)."""

    def command(self, pid: int = 0, **kwargs: Any) -> Command:
        return Command("read", target=f"/proc/{pid}/stat", limit=4096)

    def process(self, raw: RawRecord) -> dict[str, Any]:
        text = ok_output(raw)
        head, _, tail = text.rpartition(")")
        pid, _, comm = head.partition(" (")
        fields = tail.split()
        return {"pid": int(pid), "comm": comm, "state": fields[0], "ppid": int(fields[1]),
                "start_ticks": int(fields[19])}


class HostClock(Fact):
    """/proc/stat btime + CLK_TCK + the host's clock: turns process start ticks into time."""

    def command(self, **kwargs: Any) -> Command:
        return Command("read", target="/proc/stat", limit=1 << 16)

    def process(self, raw: RawRecord) -> dict[str, Any]:
        for line in ok_output(raw).splitlines():
            if line.startswith("btime "):
                return {"btime": int(line.split()[1]), "clk_tck": int(raw.get("clk_tck") or 100),
                        "now": float(raw.get("now") or 0.0)}
        raise Unavailable("no btime line in /proc/stat")


class ConfigFile(Fact):
    """A server's `--config FILE.yaml` (SGLang reads options, credentials included, from
    it): the top-level keys the gatherer found (it sends no values) and the file's mode and
    owner -> {"keys": [...], "stat": {...}}."""

    def command(self, path: str = "", **kwargs: Any) -> Command:
        return Command("read", target=path, limit=1 << 16)

    def process(self, raw: RawRecord) -> dict[str, Any]:
        keys = [line.strip() for line in ok_output(raw).splitlines() if line.strip()]
        return {"keys": keys, "stat": raw.get("stat")}


def cgroup_unit(text: str) -> str | None:
    """The systemd service a process runs in, from its /proc/PID/cgroup lines
    (`0::/system.slice/sglang-decode.service`), or None outside one."""
    for line in text.splitlines():
        m = re.search(r"/([^/]+\.service)(?:/|$)", line.rpartition(":")[2])
        if m:
            return m.group(1)
    return None
