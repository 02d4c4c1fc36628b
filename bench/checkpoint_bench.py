"""Section 4: the dtype facts of one safetensors shard, 10 MB vs 100 GB (sparse).

Both shards carry the same real header (a DeepSeek-V4-like layer set); the 100 GB one is
the header plus `truncate`. The reader is the audit's own (`Runner.header` in
patchset/agent/runner.py, which calls `read_header`). Bytes are counted twice: by the
reader's own counter (`bytes_read` in its record) and below Python's buffer, by wrapping
the raw file object the way `open(path, "rb")` stacks it (what reaches read(2)).
"""

from __future__ import annotations

import io
import json
import struct
import time
from pathlib import Path

from benchlib import Row, add_note, count_row, row, spread, verdict

from patchset.agent.lib.facts import checkpoint as ck
from patchset.agent import gather
from patchset.agent import runner as runner_mod
from patchset.agent.lib.redact import Redactor

SIZES = (("10 MB", 10 * 10**6), ("100 GB", 100 * 10**9))
CALLS_PER_RUN = 200        # one run = the mean of this many reads (a read is ~0.1 ms)


class CountingRaw(io.RawIOBase):
    """A raw file that counts the bytes it hands to the buffer above it."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.raw = io.FileIO(path, "rb")
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(buffer)
        self.count += n or 0
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def header_bytes(layers: int = 43) -> bytes:
    """A header like a DeepSeek-V4 NVFP4 shard's: hc tensors F32, experts U8 + scales."""
    tensors: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for i in range(layers):
        for name, dtype, shape, size in (
                ("hc_attn_fn", "F32", [24, 16384], 4), ("hc_ffn_fn", "F32", [24, 16384], 4),
                *((f"ffn.experts.{e}.w{w}.weight", "U8", [2048, 1024], 1)
                  for e in range(8) for w in (1, 2, 3)),
                *((f"ffn.experts.{e}.w{w}.weight_scale", "F8_E4M3", [2048, 128], 1)
                  for e in range(8) for w in (1, 2, 3))):
            n = size
            for d in shape:
                n *= d
            tensors[f"layers.{i}.{name}"] = {"dtype": dtype, "shape": shape,
                                             "data_offsets": [offset, offset + n]}
            offset += n
    return json.dumps(tensors).encode()


def write_shard(path: Path, header: bytes, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
        if size <= 100 * 10**6:
            handle.write(b"\0" * (size - handle.tell()))     # real bytes on disk
        handle.truncate(size)                                # sparse beyond what was written
    return path


def wanted_of(header: bytes) -> set[str]:
    return {k for k in json.loads(header) if k.endswith(("hc_attn_fn", "hc_ffn_fn",
                                                          "experts.0.w1.weight"))}


def os_bytes(path: Path) -> int:
    raw = CountingRaw(path)
    with io.BufferedReader(raw) as handle:
        runner_mod.read_header(handle, path.stat().st_size)
    return raw.count


def timed_reads(runner: runner_mod.Runner, path: Path, wanted: set[str], runs: int) -> list[float]:
    cmd = ck.SafetensorsHeader().command(path=str(path))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(CALLS_PER_RUN):
            runner.header(cmd, wanted)
        times.append((time.perf_counter() - start) / CALLS_PER_RUN)
    return times


def bench_checkpoint(runs: int, scratch: Path) -> list[Row]:
    header = header_bytes()
    wanted = wanted_of(header)
    runner = runner_mod.Runner(Redactor(tagged=True))
    rows: list[Row] = []
    medians = []
    for label, size in SIZES:
        path = write_shard(scratch / f"shard-{label.replace(' ', '')}.safetensors",
                           header, size)
        rec = runner.header(ck.SafetensorsHeader().command(path=str(path)), wanted)
        assert rec["exit_code"] == 0, rec
        expected = 8 + rec["header_len"]
        raw = os_bytes(path)
        rows.append(count_row("checkpoint", f"bytes read, dtype facts of a {label} shard",
                              rec["bytes_read"], "bytes",
                              f"reader's count; 8 + header {rec['header_len']} B = "
                              f"{expected} B; read(2) saw {raw} B (Python's 8 KiB buffer "
                              f"rounds up); {len(wanted)} tensors' dtypes; "
                              + verdict(rec["bytes_read"] == expected,
                                        "= 8 + header length")))
        stats = spread(timed_reads(runner, path, wanted, runs))
        medians.append(stats[0])
        rows.append(row("checkpoint", f"time, dtype facts of a {label} shard", stats,
                        note=f"mean of {CALLS_PER_RUN} reads per run, page cache warm"))
    ratio = medians[1] / medians[0]
    add_note(rows[-1], f"{ratio:.2f}x the 10 MB shard; "
                       + verdict(abs(ratio - 1) <= 0.10, "within 10%"))
    for path in scratch.glob("shard-*.safetensors"):
        path.unlink()
    return rows
