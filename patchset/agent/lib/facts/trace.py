"""The tracer's records: which patched functions ran in each process of a server.

patchset/agent/lib/tracer.py writes one JSON file per process into the unit's runtime
directory (PATCHSET_TRACE_DIR in the server's environ); the gatherer reads them all (at
most MAX_FILES, MAX_BYTES each) in one primitive, `trace-dir`.
"""

from __future__ import annotations

from typing import Any

from ..bounded import loads
from .base import RawRecord, Command, Fact, Unavailable, ok_output

MAX_FILES = 256
MAX_BYTES = 256 << 10
FIELDS = ("format", "pid", "ppid", "title", "role", "python", "mode", "started_with",
          "targets", "watched", "hits", "forward", "unavailable", "written")


class TraceRecords(Fact):
    """PATCHSET_TRACE_DIR -> [record per process] (`pid`, `title`, `format`, `hits`:
    target -> {first, returned, raised, via, modes}, `targets`: target -> [name:sha12],
    `watched`: target -> {how, at, why}, `forward`: mode -> {first, last, count},
    `unavailable`: [why]); typed by auditor/observed.py."""

    def command(self, path: str = "", **kwargs: Any) -> Command:
        return Command("trace-dir", target=path, limit=MAX_BYTES)

    def process(self, raw: RawRecord) -> list[dict[str, Any]]:
        files = loads(ok_output(raw) or "{}", str(raw.get("command")))
        if not isinstance(files, dict):
            raise Unavailable("the trace directory listing is not an object")
        out = []
        for name, record in sorted(files.items()):
            if isinstance(record, dict) and type(record.get("pid")) is int:
                rec = {k: record.get(k) for k in FIELDS}
                rec["hits"] = rec["hits"] if isinstance(rec["hits"], dict) else {}
                rec["targets"] = rec["targets"] if isinstance(rec["targets"], dict) else {}
                rec["unavailable"] = [str(u) for u in rec["unavailable"] or []][:32]
                out.append(rec)
            else:
                out.append({"pid": None, "file": name, "hits": {}, "targets": {},
                            "unavailable": [f"{name}: not a trace record"]})
        return out
