"""Served as ``sglang.srt.model_executor.forward_batch_info`` inside stand-in server processes.

The real module imports torch; what the stand-in keeps of it is what a reader of a forward
pass sees (patchset's tracer reads ``forward_batch.forward_mode.name``):

* ``ForwardMode``: an ``IntEnum`` with the pinned members, names and ``auto()`` values in
  0.5.14's order (forward_batch_info.py l.77-101: EXTEND=1 ... DLLM_EXTEND=9), and its
  ``is_extend`` / ``is_decode`` as upstream defines them;
* ``ForwardBatch``: the batch one ``ModelRunner.forward`` call runs.  Upstream it carries
  tensors (input ids, positions, KV locations); here ``forward_mode``, ``batch_size`` and
  ``step``, the toy model's computation for that batch (a prefill chunk or one decode
  token, toy.py), which ``ModelRunner.forward`` (model_runner.py) calls.
"""

from __future__ import annotations

import dataclasses
from enum import IntEnum, auto
from typing import Any, Callable


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()
    IDLE = auto()
    TARGET_VERIFY = auto()
    DRAFT_EXTEND_V2 = auto()
    PREBUILT = auto()
    SPLIT_PREFILL = auto()
    DLLM_EXTEND = auto()

    def is_extend(self, include_draft_extend_v2: bool = False) -> bool:
        """Upstream's rule: the modes that run a prefill-like forward."""
        return (self in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY,
                         ForwardMode.SPLIT_PREFILL, ForwardMode.DLLM_EXTEND)
                or (include_draft_extend_v2 and self == ForwardMode.DRAFT_EXTEND_V2))

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclasses.dataclass
class ForwardBatch:
    """One forward's batch: its mode, its size, and the toy step that computes it."""

    forward_mode: ForwardMode
    batch_size: int
    step: Callable[[], Any]
