"""The checkpoint on disk: config.json, the quantization config, and tensor dtypes read from
safetensors headers (8-byte little-endian length N + N bytes of JSON; never the weights).

`model.safetensors.index.json` maps tensor -> shard; the gatherer reads it on the host and
sends back only the entries the audit asked for, then reads only those shards' headers.
"""

from __future__ import annotations

import errno
from typing import Any

from ..bounded import loads
from .base import RawRecord, Command, Fact, Unavailable, ok_output

MAX_HEADER = 100 * 1024 * 1024     # what the safetensors parsers accept


class ConfigJson(Fact):
    """MODEL/config.json -> dict (model_type, quantization_config, swiglu_limit, ...)."""

    def command(self, model: str = "", **kwargs: Any) -> Command:
        return Command("read", target=f"{model.rstrip('/')}/config.json", limit=4 << 20)

    def process(self, raw: RawRecord) -> dict[str, Any]:
        data = loads(ok_output(raw), str(raw.get("command")))
        if not isinstance(data, dict):
            raise Unavailable("config.json is not a JSON object")
        return data


class HfQuantConfig(Fact):
    """MODEL/hf_quant_config.json (ModelOpt's older export) -> dict, or None when absent."""

    def command(self, model: str = "", **kwargs: Any) -> Command:
        return Command("read", target=f"{model.rstrip('/')}/hf_quant_config.json",
                       limit=4 << 20)

    def process(self, raw: RawRecord) -> dict[str, Any] | None:
        if raw.get("exit_code") == errno.ENOENT:
            return None
        data = loads(ok_output(raw), str(raw.get("command")))
        if not isinstance(data, dict):
            raise Unavailable("hf_quant_config.json is not a JSON object")
        return data


class SafetensorsIndex(Fact):
    """MODEL/model.safetensors.index.json -> {"weight_map": {tensor: shard}, "tensors": n}.

    On the host the map is cut down to the tensors asked for (`trimmed`), so a 130k-entry
    index costs a few hundred bytes on the wire. Absent (a single-file checkpoint): None.
    """

    def command(self, model: str = "", **kwargs: Any) -> Command:
        return Command("read", target=f"{model.rstrip('/')}/model.safetensors.index.json",
                       limit=256 << 20)

    def process(self, raw: RawRecord) -> dict[str, Any] | None:
        if raw.get("exit_code") == errno.ENOENT:
            return None
        data = loads(ok_output(raw), str(raw.get("command")))
        if not isinstance(data, dict):
            raise Unavailable("index is not a JSON object")
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict):
            raise Unavailable("index has no weight_map")
        return {"weight_map": weight_map,
                "tensors": int(data.get("tensors", len(weight_map))),
                "shards": int(data.get("shards", len(set(weight_map.values()))))}


class SafetensorsHeader(Fact):
    """One shard's header -> {"tensors": {name: {dtype, shape}}, "header_len", "bytes_read",
    "file_size"}: only the tensors asked for; bytes_read is 8 + header_len by construction."""

    def command(self, path: str = "", **kwargs: Any) -> Command:
        return Command("st-header", target=path)

    def process(self, raw: RawRecord) -> dict[str, Any]:
        tensors = loads(ok_output(raw), str(raw.get("command")))
        for name, entry in tensors.items():
            if not isinstance(entry, dict) or "dtype" not in entry:
                raise Unavailable(f"tensor {name} has no dtype")
        return {"tensors": {k: {"dtype": v["dtype"], "shape": v.get("shape")}
                            for k, v in tensors.items()},
                "header_len": raw.get("header_len"), "bytes_read": raw.get("bytes_read"),
                "file_size": raw.get("file_size")}
