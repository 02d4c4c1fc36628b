"""Shared pieces of bench/benchmark.py: a result row, the timing loop, ratios, subprocess."""

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


def run(argv: list[str], cwd: Path, env: dict | None = None) -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False,
                          env=dict(os.environ, **(env or {})))
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.strip()[-400:]}")
    return proc.stdout
