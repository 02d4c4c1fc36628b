"""Shared pieces of bench/benchmark.py: a result row, the timing loops, ratios, subprocess."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Stats = tuple[float, float, float]


@dataclass
class Row:
    section: str
    what: str
    median: float
    low: float
    high: float
    unit: str
    note: str = ""


def measure(runs: int, setup: Callable[[], Any], work: Callable[[Any], Any]) -> Stats:
    """Median/min/max seconds of `work(setup())`; setup is not timed."""
    times = []
    for _ in range(runs):
        arg = setup()
        start = time.perf_counter()
        work(arg)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)


def paired(runs: int, cases: list[tuple[Callable[[], Any], Callable[[Any], Any]]]
           ) -> list[Stats]:
    """Median/min/max seconds of each case's `work(setup())`, the cases taking turns in
    every round (the order flips from round to round): on a shared machine a load that
    comes and goes then falls on all of them alike, so their ratio means something. Setup
    is not timed."""
    times: list[list[float]] = [[] for _ in cases]
    for number in range(runs):
        order = list(enumerate(cases))
        for index, (setup, work) in (order if number % 2 == 0 else order[::-1]):
            arg = setup()
            start = time.perf_counter()
            work(arg)
            times[index].append(time.perf_counter() - start)
    return [spread(t) for t in times]


def spread(values: list[float]) -> Stats:
    return statistics.median(values), min(values), max(values)


def row(section: str, what: str, stats: Stats, unit: str = "s", note: str = "") -> Row:
    return Row(section, what, *stats, unit=unit, note=note)


def count_row(section: str, what: str, value: float, unit: str, note: str = "") -> Row:
    """A figure that does not vary between runs (bytes, round trips)."""
    return Row(section, what, value, value, value, unit, note)


def add_note(r: Row, text: str) -> Row:
    r.note = f"{r.note}; {text}" if r.note else text
    return r


def ratios(rows: list[Row], base: Row, label: str) -> list[Row]:
    for r in rows:
        add_note(r, f"{r.median / base.median:.2f}x {label}")
    return rows


def verdict(ok: bool, target: str) -> str:
    return f"target {target}: {'MET' if ok else 'NOT MET'}"


def run(argv: list[str], cwd: Path, env: dict[str, str | None] | None = None) -> str:
    """`argv`'s stdout; its failure ends the benchmark. `env` is added to this process's
    environment; a None value removes that variable."""
    merged = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False,
                          env=merged)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.strip()[-400:]}")
    return proc.stdout


def bytecode_cached(scratch: Path) -> dict[str, str | None]:
    """The environment for timing `python -m patchset.cli` as a process: its bytecode cached
    under `scratch` even where PYTHONDONTWRITEBYTECODE is set (as in this repository's test
    environment). An installed patchset has its .pyc from pip; a checkout run without a
    cache compiles each of its own modules again on every run (25 ms of `list`), a cost no
    user of the command pays. Time such a process only after one untimed run has filled
    the cache."""
    return {"PYTHONPYCACHEPREFIX": str(scratch / "pycache"), "PYTHONDONTWRITEBYTECODE": None}
