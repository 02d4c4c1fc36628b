"""patchset against its peers, in one run, as one Markdown table.

Run with `make bench` (installs quilt, builds the test-host rootfs if needed). Each figure
is the median of --runs runs (default 5) with min and max; ratios are computed from
medians measured in the same run. Not part of the test suite: nothing here asserts.

Sections: apply (patchset vs git am vs quilt push -a, the real series on the real pinned
tree; patchset in process and as a whole `patchset apply` process, the latter paired with
quilt), CLI start (`--help`, `list` as whole processes, paired with the interpreter): both
information, their targets retired (issue 26); checkpoint (dtype facts of a 10 MB and a
100 GB sparse shard: bytes read, time; bench/checkpoint_bench.py), fleet apply (1, 2, 4,
8 nspawn hosts), transfer (bytes sent for a re-apply), audit (one host vs `ssh HOST true`
and a naive loop of one ssh per fact, round trips; fleet audit of 1, 2, 4, 8 hosts;
bench/audit_bench.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]   # never tests/: bench imports no test module

from benchlib import (Row, add_note, bytecode_cached, count_row, measure, paired, ratios, row,
                      run, verdict)

from patchset.connect.local import LocalTransport
from patchset import api
from patchset.series.manifest import load_series
from patchset.series.selection import Selection, plan
from patchset.pin.upstream import materialize, provision

# ---------------------------------------------------------------- apply vs peers

def bench_apply(series: Any, base: Any, runs: int, scratch: Path) -> list[Row]:
    """In process (the library, as the fleet rows use it) vs git am; then the command a user
    types, `patchset apply localhost --target T` as a whole process (start-up, imports,
    manifest, plan, verify, apply), paired round by round with `quilt push -a`, each on a
    fresh tree of the pin. Information, not a target: issue 26 retired "apply no slower
    than quilt push -a" (what a user waits for is the server restart that follows)."""
    counter = iter(range(10_000))
    made: list[Path] = []

    def fresh(layout: str = "git") -> Path:
        """A new tree of the pin; the ones before it (timed already) are removed. Synced:
        the kernel writing back 60 MB of checkout must not compete with the timed run.
        Settled as a tree that has been there a while is: the clone's index is as old as
        the clone's last files (the same second), so the first command to write the index
        after it re-hashes every file of that second (git's racily-clean check: 50 - 130
        ms of 60 MB here, paid once per clone by whoever writes first, `git status`
        included); `settle` pays it, untimed."""
        while made:
            shutil.rmtree(made.pop(), ignore_errors=True)
        made.append(settle(materialize(base, scratch / f"t{next(counter)}", layout=layout)))
        os.sync()
        return made[-1]

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

    python = bytecode_cached(scratch)

    def patchset_process(tree: Path) -> None:
        run([sys.executable, "-m", "patchset.cli", "apply", "localhost", "--target", str(tree),
             "--series", str(Path(series.manifest).resolve())], ROOT, env=python)

    inproc, am = paired(runs, [(fresh, patchset_apply), (fresh, git_am)])
    rows = [row("apply", f"patchset apply ({len(series.patches)} patches, plan+verify), in "
                "process (api.apply)", inproc)]
    rows.append(row("apply", "git am (same patches), paired with the row above", am))
    ratios(rows, rows[1], "vs git am")
    if not shutil.which("quilt"):
        rows.append(count_row("apply", "quilt push -a: SKIPPED (quilt not installed)", 0,
                              "count"))
        return rows
    patchset_process(fresh())                     # untimed: fills the bytecode cache
    whole, quilt_stats = paired(runs, [(fresh, patchset_process), (quilt_tree, quilt_push)])
    process = row("apply", "`patchset apply localhost --target T`, whole process", whole)
    quilt = row("apply", "quilt push -a (same patches), paired with the row above",
                quilt_stats)
    ratios([process, quilt], rows[1], "vs git am")
    add_note(rows[0], f"{rows[0].median / quilt.median:.2f}x quilt")
    add_note(process, f"{process.median / quilt.median:.2f}x quilt")
    return rows + [process, quilt]


def settle(tree: Path) -> Path:
    """`tree`'s index written once in a later second than its files (a refresh after the
    second the clone ended in), so no entry is racily clean: the index a tree has once
    any git command has written it after the clone."""
    if (tree / ".git").is_dir():
        index = tree / ".git" / "index"
        time.sleep(max(0.0, int(index.stat().st_mtime) + 1.05 - time.time()))
        run(["git", "update-index", "-q", "--really-refresh"], tree)
    return tree


def write_mbox(series: Any, path: Path) -> Path:
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


def write_quilt(series: Any, directory: Path) -> Path:
    directory.mkdir(parents=True)
    for p in series.patches:
        shutil.copy(Path(series.root) / p.file, directory / f"{p.name}.patch")
    (directory / "series").write_text("".join(f"{p.name}.patch\n" for p in series.patches))
    return directory


# ---------------------------------------------------------------- CLI start

def bench_cli(runs: int, series: Path, scratch: Path) -> list[Row]:
    """`patchset --help` and `patchset list` as whole processes (`python -m patchset.cli`,
    what the installed `patchset` script runs), paired round by round with the interpreter
    doing nothing. Information, not a target: issue 26 retired "--help under 150 ms"."""
    python = bytecode_cached(scratch)
    cli = [sys.executable, "-m", "patchset.cli"]
    cases = [("patchset --help", [*cli, "--help"]),
             ("patchset list", [*cli, "list", "--series", str(series.resolve())]),
             ("python -c pass (the interpreter)", [sys.executable, "-c", "pass"])]
    for _, argv in cases:
        run(argv, ROOT, env=python)               # untimed: fills the bytecode cache
    os.sync()                                     # no writeback left from earlier sections
    stats = paired(runs, [(lambda: None, lambda _, argv=argv: run(argv, ROOT, env=python))
                          for _, argv in cases])
    return [row("cli", what, s) for (what, _), s in zip(cases, stats)]


# ---------------------------------------------------------------- hosts

def bench_hosts(series, series_path: Path, runs: int, scratch: Path, sizes: list[int],
                skip_audit: bool = False) -> list[Row]:
    from patchset.connect.inventory import Host
    from patchset.connect.ssh import SshTransport
    from tests.hosts.nspawn import (
        build_base,
        make_client_key,
        start_hosts,
        stop_hosts,
        write_known_hosts,
    )

    build_base()
    key = make_client_key(scratch / "keys")
    hosts = start_hosts(max(sizes), workdir=scratch / "hosts", client_key=key, prefix="bench")
    known = write_known_hosts(hosts, scratch / "known_hosts")
    os.environ["PATCHSET_KNOWN_HOSTS"] = str(known)
    os.environ["PATCHSET_SSH_CONFIG"] = str(scratch / "empty_ssh_config")
    os.environ["PATCHSET_HOME"] = str(scratch / "home")
    (scratch / "empty_ssh_config").write_text("")
    try:
        rows = _fleet_rows(series, hosts, runs, sizes, Host, SshTransport)
        if not skip_audit:
            rows += _audit_rows(series, series_path, hosts, known, runs, sizes, scratch)
        return rows
    finally:
        stop_hosts(hosts)


def _audit_rows(series, series_path: Path, hosts: list, known: Path, runs: int,
                sizes: list[int], scratch: Path) -> list[Row]:
    import audit_bench
    audit_bench.setup_hosts(hosts[:max(sizes)], series_path, scratch)
    return (audit_bench.bench_audit_one(series, hosts[0], known, runs)
            + audit_bench.bench_fleet_audit(series, hosts, known, runs, sizes))


def _fleet_rows(series: Any, hosts: list, runs: int, sizes: list[int], Host: Any,
                SshTransport: Any) -> list[Row]:
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
        def work(_: Any, n: int = n) -> None:
            chosen = full if next(toggle) % 2 == 0 else safe
            results = api.apply(series, chosen, transports(n), base_provider=provider)
            assert all(r.ok for r in results), [r.error for r in results]
        rows.append(row("fleet", f"apply to {n} host(s), alternating full/safe series",
                        measure(runs, lambda: None, work)))
    ratios(rows, rows[0], "vs 1 host")
    if len(rows) > 1:
        rows[-1].note += "; " + verdict(rows[-1].median <= 2 * rows[0].median,
                                        f"{sizes[-1]} hosts <= 2x of 1")
    rows.append(_transfer_row(series, transports, full, provider))
    return rows


def _transfer_row(series: Any, transports: Any, full: Any, provider: Any) -> Row:
    api.apply(series, full, transports(1), base_provider=provider)
    [t] = transports(1)
    result = api.apply(series, full, [t], base_provider=provider)[0]
    assert result.ok and not result.changed
    return count_row("transfer", "bytes sent for a re-apply (base already there)",
                     t.bytes_sent, "bytes", f"{t.round_trips} engine command(s); "
                     + verdict(t.bytes_sent < 64 * 1024, "< 64 KiB"))


def _provider(series: Any) -> Any:
    from patchset.pin.basebundle import base_bundle

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
            f"{run(['git', '--version'], ROOT).strip()}")


def fmt(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value:.0f} B"
    if unit == "count":
        return f"{value:.0f}"
    return f"{value * 1000:.1f} ms" if value < 10 else f"{value:.2f} s"


def render(rows: list[Row], runs: int, load: str) -> str:
    out = [f"# patchset benchmarks, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
           f"Machine: {machine()}", "",
           f"Command: `{shlex.join(['python', 'bench/benchmark.py', *sys.argv[1:]])}`", "",
           (f"Load average at start / end: {load} / {loadavg()} (a shared machine: other work "
            "ran alongside, so times are noisy; min - max shows the spread)."), "",
           (f"Each timed figure: median of {runs} runs (min - max); ratios are of medians "
            "measured in this run. Counts and bytes do not vary between runs. Rows run as "
            "whole processes (`python -m patchset.cli ...`, the floors) have their bytecode "
            "cached, as an installed patchset has, after one untimed run; rows measured "
            "\"paired\" took turns with each other round by round."), "",
           "| section | what | median | min - max | notes |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.section} | {r.what} | {fmt(r.median, r.unit)} | "
                   f"{fmt(r.low, r.unit)} - {fmt(r.high, r.unit)} | {r.note} |")
    return "\n".join(out) + "\n"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


SECTIONS = ("apply", "cli", "checkpoint", "hosts")   # hosts: fleet, transfer, audit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--series", default=str(ROOT / "patches.yaml"))
    parser.add_argument("--sizes", default="1,2,4,8")
    parser.add_argument("--skip-hosts", action="store_true", help="no nspawn sections")
    parser.add_argument("--skip-audit", action="store_true", help="no audit sections")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"run only these, comma-separated ({', '.join(SECTIONS)})")
    parser.add_argument("-o", "--output", help="also write the table here")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    if not sections <= set(SECTIONS):
        parser.error(f"--sections: unknown {', '.join(sorted(sections - set(SECTIONS)))}")
    from checkpoint_bench import bench_checkpoint
    load = loadavg()
    series = load_series(args.series)
    base = provision(series.upstream)
    with tempfile.TemporaryDirectory(prefix="patchset-bench-") as tmp:
        rows: list[Row] = []
        if "apply" in sections:
            rows += bench_apply(series, base, args.runs, Path(tmp))
        if "cli" in sections:
            rows += bench_cli(args.runs, Path(args.series), Path(tmp))
        if "checkpoint" in sections:
            rows += bench_checkpoint(args.runs, Path(tmp))
        if "hosts" in sections and not args.skip_hosts:
            rows += bench_hosts(series, Path(args.series), args.runs, Path(tmp),
                                [int(n) for n in args.sizes.split(",")], args.skip_audit)
    table = render(rows, args.runs, load)
    print(table)
    if args.output:
        Path(args.output).write_text(table)


if __name__ == "__main__":
    main()
