"""patchset against its peers and against the floor, in one run, as one Markdown table.

Run with `make bench` (installs quilt, builds the test-host rootfs if needed). Each figure
is the median of --runs runs (default 5) with min and max; ratios are computed from
medians measured in the same run. Not part of the test suite: nothing here asserts.

Sections: apply (patchset vs git am vs quilt push -a, the real series on the real pinned
tree), fleet apply (1, 2, 4, 8 nspawn hosts), transfer (bytes sent for a re-apply),
CLI start (`--help`, `list`).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from deploy.local import LocalTransport  # noqa: E402
from patchset import api  # noqa: E402
from patchset.manifest import load_series  # noqa: E402
from patchset.selection import Selection, plan  # noqa: E402
from patchset.upstream import materialize, provision  # noqa: E402


@dataclass
class Row:
    section: str
    what: str
    median: float
    low: float
    high: float
    unit: str
    note: str = ""


def measure(runs: int, setup: Callable[[], object], work: Callable[[object], None]
            ) -> tuple[float, float, float]:
    """Median/min/max seconds of `work(setup())`; setup is not timed."""
    times = []
    for _ in range(runs):
        arg = setup()
        start = time.perf_counter()
        work(arg)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)


def row(section: str, what: str, stats: tuple[float, float, float], unit: str = "s",
        note: str = "") -> Row:
    return Row(section, what, *stats, unit=unit, note=note)


# ---------------------------------------------------------------- apply vs peers

def bench_apply(series, base, runs: int, scratch: Path) -> list[Row]:
    counter = iter(range(10_000))

    def fresh(layout: str = "git") -> Path:
        return materialize(base, scratch / f"t{next(counter)}", layout=layout)

    def patchset_apply(tree: Path) -> None:
        chosen = plan(series, Selection())
        [result] = api.apply(series, chosen, [LocalTransport(tree)])
        assert result.ok, result.error

    mbox = write_mbox(series, scratch / "series.mbox")
    quilt_dir = write_quilt(series, scratch / "quilt-patches")

    def git_am(tree: Path) -> None:
        run(["git", "am", "-q", "--committer-date-is-author-date", str(mbox)], tree)

    def quilt_tree() -> Path:
        tree = fresh()
        shutil.rmtree(tree / ".git")
        return tree

    def quilt_push(tree: Path) -> None:
        run(["quilt", "push", "-a", "-q", "--fuzz=0"], tree,
            env={"QUILT_PATCHES": str(quilt_dir), "QUILT_PC": ".pc"})

    rows = [row("apply", f"patchset apply ({len(series.patches)} patches, plan+verify)",
                measure(runs, fresh, patchset_apply))]
    rows.append(row("apply", "git am (same patches)", measure(runs, fresh, git_am)))
    if shutil.which("quilt"):
        rows.append(row("apply", "quilt push -a (same patches)",
                        measure(runs, quilt_tree, quilt_push)))
    return _ratios(rows, base_index=1, label="vs git am")


def _ratios(rows: list[Row], base_index: int, label: str) -> list[Row]:
    base = rows[base_index].median
    for r in rows:
        r.note = (r.note + " " if r.note else "") + f"{r.median / base:.2f}x {label}"
    return rows


def write_mbox(series, path: Path) -> Path:
    parts = []
    for p in series.patches:
        text = (Path(series.root) / p.file).read_text()
        diff = text[text.index("diff --git "):]
        author = p.header.get("Author", "patchset <patchset@invalid>")
        parts.append(f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
                     f"From: {author}\nDate: Thu, 1 Jan 2026 00:00:00 +0000\n"
                     f"Subject: [PATCH] {p.name}: {p.summary}\n\n{p.summary}\n---\n{diff}\n")
    path.write_text("".join(parts))
    return path


def write_quilt(series, directory: Path) -> Path:
    directory.mkdir(parents=True)
    for p in series.patches:
        shutil.copy(Path(series.root) / p.file, directory / f"{p.name}.patch")
    (directory / "series").write_text("".join(f"{p.name}.patch\n" for p in series.patches))
    return directory


def run(argv: list[str], cwd: Path, env: dict | None = None) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.strip()[-400:]}")


# ---------------------------------------------------------------- CLI start

def bench_cli(runs: int) -> list[Row]:
    rows = []
    for args in (["--help"], ["list"]):
        stats = measure(runs, lambda: None, lambda _: run([sys.executable, "-m", "patchset.cli",
                                                          *args], ROOT))
        rows.append(row("cli", f"patchset {' '.join(args)}", stats,
                        note="target < 0.3 s"))
    return rows


# ---------------------------------------------------------------- hosts

def bench_hosts(series, runs: int, scratch: Path, sizes: list[int]) -> list[Row]:
    from deploy.inventory import Host
    from deploy.ssh import SshTransport
    from tests.hosts.nspawn import (build_base, make_client_key, start_hosts, stop_hosts,
                                    write_known_hosts)

    build_base()
    key = make_client_key(scratch / "keys")
    hosts = start_hosts(max(sizes), workdir=scratch / "hosts", client_key=key, prefix="bench")
    os.environ["PATCHSET_KNOWN_HOSTS"] = str(write_known_hosts(hosts, scratch / "known_hosts"))
    os.environ["PATCHSET_SSH_CONFIG"] = str(scratch / "empty_ssh_config")
    (scratch / "empty_ssh_config").write_text("")
    try:
        return _fleet_rows(series, hosts, runs, sizes, Host, SshTransport)
    finally:
        stop_hosts(hosts)


def _fleet_rows(series, hosts, runs, sizes, Host, SshTransport) -> list[Row]:
    def transports(n: int, tier: str | None = None):
        return [SshTransport(Host(name=h.name, address=h.ip, port=h.port, user="root",
                                  identity_file=str(h.client_key)), "/opt/sglang")
                for h in hosts[:n]]

    provider = _provider(series)
    full, safe = plan(series, Selection()), plan(series, Selection(tier="safe"))
    # Provision every host once (ships the base), outside the timings.
    api.apply(series, safe, transports(len(hosts)), base_provider=provider)
    rows = []
    toggle = iter(range(10_000))
    for n in sizes:
        def work(_):
            chosen = full if next(toggle) % 2 == 0 else safe
            results = api.apply(series, chosen, transports(n), base_provider=provider)
            assert all(r.ok for r in results), [r.error for r in results]
        rows.append(row("fleet", f"apply to {n} host(s), alternating full/safe series",
                        measure(runs, lambda: None, work)))
    _ratios(rows, base_index=0, label="vs 1 host (target 8 hosts < 2x)")
    rows.append(_transfer_row(series, transports, full, provider))
    return rows


def _transfer_row(series, transports, full, provider) -> Row:
    api.apply(series, full, transports(1), base_provider=provider)
    [t] = transports(1)
    result = api.apply(series, full, [t], base_provider=provider)[0]
    assert result.ok and not result.changed
    return Row("transfer", "bytes sent for a re-apply (base already there)", t.bytes_sent,
               t.bytes_sent, t.bytes_sent, "bytes", f"{t.round_trips} engine command(s); "
               "target < 64 KiB")


def _provider(series):
    from patchset.basebundle import base_bundle

    def provide():
        base = provision(series.upstream)
        return base.commit, base_bundle(base)
    return provide


# ---------------------------------------------------------------- report

def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) // (1024 * 1024)
    return (f"{platform.node()}: {os.cpu_count()} x {cpu}, {mem} GiB, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
            f"{subprocess.run(['git', '--version'], capture_output=True, text=True).stdout.strip()}")


def render(rows: list[Row], runs: int) -> str:
    out = [f"# patchset benchmarks, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
           f"Machine: {machine()}", "", f"Each figure: median of {runs} runs (min - max).", "",
           "| section | what | median | min - max | notes |", "|---|---|---|---|---|"]
    for r in rows:
        fmt = (lambda v: f"{v:.0f} B") if r.unit == "bytes" else (lambda v: f"{v * 1000:.1f} ms")
        out.append(f"| {r.section} | {r.what} | {fmt(r.median)} | {fmt(r.low)} - "
                   f"{fmt(r.high)} | {r.note} |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--series", default=str(ROOT / "patches.yaml"))
    parser.add_argument("--sizes", default="1,2,4,8")
    parser.add_argument("--skip-hosts", action="store_true", help="no nspawn sections")
    parser.add_argument("-o", "--output", help="also write the table here")
    args = parser.parse_args()
    series = load_series(args.series)
    base = provision(series.upstream)
    with tempfile.TemporaryDirectory(prefix="patchset-bench-") as tmp:
        rows = bench_apply(series, base, args.runs, Path(tmp)) + bench_cli(args.runs)
        if not args.skip_hosts:
            rows += bench_hosts(series, args.runs, Path(tmp),
                                [int(n) for n in args.sizes.split(",")])
    table = render(rows, args.runs)
    print(table)
    if args.output:
        Path(args.output).write_text(table)


if __name__ == "__main__":
    main()
