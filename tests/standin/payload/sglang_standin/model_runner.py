"""Served as ``sglang.srt.model_executor.model_runner`` inside stand-in server processes.

In SGLang every model forward of a scheduler process goes through
``ModelRunner.forward(forward_batch, ...)`` (model_runner.py l.2896 in 0.5.14); patchset's
tracer counts a forward pass when that function returns, reading
``forward_batch.forward_mode.name`` and the runner's ``is_draft_worker``, in the process
where it ran.  The real module imports torch; this one keeps that contract:

* ``ModelRunner.forward`` with the pinned signature (the extra arguments are accepted and
  ignored), called once per prefill chunk (``ForwardMode.EXTEND``) and once per decode
  step (``ForwardMode.DECODE``) by the scheduler child that computes the toy model
  (scheduler.py); never in the server's main process;
* ``is_draft_worker = False`` (no speculative decoding here) and ``forward_pass_id``
  counting forwards, as upstream;
* a forward first runs the served tree's code that the batch's mode runs
  (``served_code(mode)``: scheduler.ForwardHooks, e.g. ``envs.SGLANG_OPT_USE_TILELANG_MHC_PRE
  .get()`` as DeepSeek-V4's ``hc_pre`` reads it each forward), then the toy step; an
  exception of either propagates, as a failing kernel's would.

The module is found by the stand-in's meta-path finder with a source loader, so a tracer
that wraps the loaders of the modules it watches sees it imported like the real one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


@dataclasses.dataclass
class ModelRunnerOutput:
    """What ``forward`` returns (upstream: logits output, whether a CUDA graph ran, ...)."""

    logits_output: Any
    can_run_graph: bool = False


class ModelRunner:
    is_draft_worker = False

    def __init__(self, served_code: Callable[[ForwardMode], None], is_draft_worker: bool = False) -> None:
        self.served_code = served_code
        self.is_draft_worker = is_draft_worker
        self.forward_pass_id = 0

    def forward(
        self,
        forward_batch: ForwardBatch,
        skip_attn_backend_init: bool | None = None,
        pp_proxy_tensors: Any = None,
        reinit_attn_backend: bool = False,
        split_forward_count: int = 1,
    ) -> ModelRunnerOutput:
        """One forward pass: the served code of this mode, then the batch's toy step."""
        self.forward_pass_id += 1
        self.served_code(forward_batch.forward_mode)
        return ModelRunnerOutput(forward_batch.step())
