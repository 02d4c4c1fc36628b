"""safetensors headers are read with 8 + N bytes, whatever the size of the shard: a 100 GB
shard costs what a 10 MB one does. Large shards are sparse files (truncate), so the test
costs nothing on disk."""

from __future__ import annotations

import io
import json
import os
import struct
from pathlib import Path

import pytest

from patchset.agent.lib.records import TensorPattern
from patchset.agent.lib.facts.checkpoint import SafetensorsHeader
from patchset.agent.gather import Gatherer
from patchset.agent.lib import wire
from patchset.agent.runner import Runner, read_header
from patchset.agent.lib.redact import Redactor


class CountingFile(io.RawIOBase):
    """A file wrapper that counts every byte handed out."""

    def __init__(self, path: Path) -> None:
        self.handle = open(path, "rb")
        self.bytes_read = 0

    def read(self, n: int = -1) -> bytes:
        data = self.handle.read(n)
        self.bytes_read += len(data)
        return data

    def close(self) -> None:
        self.handle.close()


def write_shard(path: Path, tensors: dict, size: int) -> int:
    """A safetensors file of `size` bytes (sparse past the header); returns N."""
    header = json.dumps({"__metadata__": {"format": "pt"}, **tensors}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
    os.truncate(path, size)
    return len(header)


HC = {"layers.0.hc_attn_fn": {"dtype": "F32", "shape": [24, 16384], "data_offsets": [0, 1572864]},
      "layers.0.ffn.experts.0.w1.weight": {"dtype": "U8", "shape": [2048, 2048],
                                           "data_offsets": [1572864, 5767168]}}


@pytest.mark.parametrize("size", [10 * 2**20, 100 * 2**30], ids=["10MB", "100GB-sparse"])
def test_header_costs_8_plus_n_bytes(tmp_path: Path, size: int) -> None:
    path = tmp_path / "model-00001-of-00002.safetensors"
    n = write_shard(path, HC, size)
    assert path.stat().st_size == size
    counting = CountingFile(path)
    length, header, read = read_header(counting, size)
    counting.close()
    assert length == n
    assert counting.bytes_read == read == 8 + n
    assert header["layers.0.hc_attn_fn"]["dtype"] == "F32"


def test_runner_header_record_keeps_only_wanted_tensors(tmp_path: Path) -> None:
    path = tmp_path / "shard.safetensors"
    n = write_shard(path, HC, 100 * 2**30)
    rec = Runner(Redactor()).header(SafetensorsHeader().command(path=str(path)),
                                    {"layers.0.hc_attn_fn"})
    value = SafetensorsHeader().collect(rec)
    assert value.known, value.reason
    assert value.value["bytes_read"] == 8 + n and value.value["header_len"] == n
    assert value.value["file_size"] == 100 * 2**30
    assert value.value["tensors"] == {"layers.0.hc_attn_fn": {"dtype": "F32",
                                                              "shape": [24, 16384]}}
    assert rec["tensors_in_header"] == 2


@pytest.mark.parametrize("payload,why", [
    (struct.pack("<Q", 2**40), "exceeds min(100 MB, file size - 8)"),
    (b"\x01\x02", "file too short"),
    (struct.pack("<Q", 4) + b"[1] ", "not a JSON object"),
])
def test_bad_headers_are_unknown_with_the_reason(tmp_path: Path, payload: bytes, why: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(payload)
    rec = Runner(Redactor()).header(SafetensorsHeader().command(path=str(path)), set())
    value = SafetensorsHeader().collect(rec)
    assert not value.known and why in value.reason


def test_checkpoint_through_the_index_reads_only_shards_with_wanted_tensors(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "deepseek_v4",
                                                   "swiglu_limit": 10.0}))
    n1 = write_shard(model / "a.safetensors", {"layers.0.hc_attn_fn": HC["layers.0.hc_attn_fn"]},
                     50 * 2**30)
    write_shard(model / "b.safetensors", {"lm_head.weight": {"dtype": "BF16", "shape": [1, 1],
                                                             "data_offsets": [0, 2]}}, 50 * 2**30)
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "layers.0.hc_attn_fn": "a.safetensors", "lm_head.weight": "b.safetensors"}}))
    g = Gatherer(wire.AuditRequest(tensors=[TensorPattern(pattern="*hc_attn_fn")]))
    rec = g.checkpoint(str(model), None)
    assert sorted(rec["headers"]) == ["a.safetensors"]        # b holds nothing wanted
    assert rec["headers"]["a.safetensors"]["bytes_read"] == 8 + n1
    index = json.loads(rec["index"]["stdout"])
    assert index == {"weight_map": {"layers.0.hc_attn_fn": "a.safetensors"}, "tensors": 2,
                     "shards": 2}


def test_single_file_checkpoint_and_hub_cache(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    snap = hub / "models--org--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (hub / "models--org--tiny" / "refs").mkdir()
    (hub / "models--org--tiny" / "refs" / "main").write_text("abc123\n")
    (snap / "config.json").write_text("{}")
    write_shard(snap / "model.safetensors", HC, 2**30)
    rec = Gatherer(wire.AuditRequest(tensors=[TensorPattern(pattern="*hc_attn_fn")])).checkpoint("org/tiny", str(hub))
    assert rec["resolved"] == str(snap)
    header = SafetensorsHeader().collect(rec["headers"]["model.safetensors"])
    assert list(header.value["tensors"]) == ["layers.0.hc_attn_fn"]
