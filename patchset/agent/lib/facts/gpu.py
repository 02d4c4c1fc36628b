"""GPUs, from nvidia-smi: which architecture the kernels really run on (sm_120 = 12.0)."""

from __future__ import annotations

from typing import Any

from .base import RawRecord, Command, Fact, Unavailable, ok_output

QUERY = "index,uuid,name,compute_cap,driver_version"


class GpuList(Fact):
    """`nvidia-smi --query-gpu=...` -> [{index, uuid, name, compute_cap, driver_version}].

    compute_cap is kept as nvidia-smi prints it ("12.0"): patches compare it as a string.
    Old drivers print "[N/A]" (or lack the field): that GPU's compute_cap is None.
    """

    def command(self, **kwargs: Any) -> Command:
        return Command("run", ("nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader"))

    def process(self, raw: RawRecord) -> list[dict[str, Any]]:
        out = ok_output(raw)
        gpus = []
        for line in out.splitlines():
            if not line.strip():
                continue
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != 5:
                raise Unavailable(f"nvidia-smi printed {len(cells)} columns, expected 5: "
                                  f"{line.strip()!r} (driver without compute_cap?)")
            index, uuid, name, cap, driver = cells
            gpus.append({"index": int(index), "uuid": uuid, "name": name,
                         "compute_cap": None if cap.startswith("[") else cap,
                         "driver_version": driver})
        if not gpus:
            raise Unavailable("nvidia-smi listed no GPUs")
        return gpus
