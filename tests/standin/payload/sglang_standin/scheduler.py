"""Where the model runs: in the ``sglang::scheduler_*`` children, as in SGLang.

Process layout (procs.py starts the children):

* the MAIN process (HTTP server, ``TokenizerManager.generate_request``, request checks,
  answers, P/D hand-over) holds a :class:`SchedulerClient`: the interface generate.py uses
  of ``toy.Runner`` (``run``, ``resume``, ``model_work``, ``flush``, ``tokenizer``), each call
  sent over a multiprocessing pipe to every scheduler of DP group 0 and answered by the
  first of them (TP rank 0); it computes nothing itself;
* each of those SCHEDULER children runs a :class:`Worker`: the real ``toy.Runner`` (its
  prefix cache lives there, as SGLang's radix cache does; ``/flush_cache`` clears it there)
  whose every model step is one ``ModelRunner.forward`` call (model_runner.py, served as
  ``sglang.srt.model_executor.model_runner``): mode ``EXTEND`` per prefill chunk, ``DECODE``
  per decode token.  Every TP/PP rank of the group runs the same forwards with the same
  random draws (the main sends each call's entropy), as SGLang's ranks run the same batch;
  other DP groups (``--dp-size`` > 1) get no work: the stand-in has no DP load balancer.

A forward executes the served tree's code for its batch (:class:`Hook`): by default
``sglang.srt.environ:envs.SGLANG_OPT_USE_TILELANG_MHC_PRE.get`` (DeepSeek-V4's ``hc_pre``
reads it in every forward, models/deepseek_v4.py l.1323; environ.py is standard library
only), plus those of ``STANDIN_FORWARD_HOOKS=FILE``, a JSON list of
``{"mode": "extend" | "decode" | "any", "call": "sglang.srt.MODULE:QUALNAME"}``: for each
forward of that mode (``extend``: every extend-like mode, ``ForwardMode.is_extend``) the
scheduler calls the target with no arguments.  QUALNAME is ``func``, ``Class.method`` (a
class on the way is instantiated with no arguments, per call) or ``obj.attr.method``.
The modules are imported when the scheduler starts (as a real scheduler imports its
model's modules), through the normal import system.  A malformed file, an unknown key or
mode, or a target outside ``sglang.srt`` is a startup error (the main process checks the
file before it starts the children); a target that raises makes that forward raise: the
request gets a 500, as with a failing kernel.

A call that gets no answer within ``--watchdog-timeout`` seconds (SGLang's scheduler
watchdog; default 300), or whose scheduler died, raises :class:`SchedulerError` in the
main process: a 500, never a hung HTTP server.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from sglang_standin import derive, toy

HOOKS_ENV = "STANDIN_FORWARD_HOOKS"
MODES = ("extend", "decode", "any")
_TARGET = re.compile(r"sglang\.srt(\.[A-Za-z_]\w*)+:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
METHODS = ("run", "resume", "model_work", "flush")


class SchedulerError(RuntimeError):
    """The scheduler did not answer (dead, or hung past the timeout) or its forward raised."""


# ---------------------------------------------------------------- served code per forward


@dataclasses.dataclass(frozen=True)
class Hook:
    """One served-tree call a forward of *mode* makes (``MODULE:QUALNAME``, no arguments)."""

    mode: str
    call: str

    @property
    def module(self) -> str:
        return self.call.partition(":")[0]

    def applies(self, mode: Any) -> bool:
        """*mode* is a ``ForwardMode``; ``extend`` covers every extend-like mode."""
        return self.mode == "any" or (self.mode == "extend" and mode.is_extend()) or (
            self.mode == "decode" and mode.is_decode())

    def run(self) -> None:
        """Resolve QUALNAME in the (imported) module and call it; its exceptions propagate."""
        target: Any = importlib.import_module(self.module)
        *path, last = self.call.partition(":")[2].split(".")
        for name in path:
            target = getattr(target, name)
            if isinstance(target, type):
                target = target()
        getattr(target, last)()


DEFAULT_HOOKS = (Hook("any", "sglang.srt.environ:envs.SGLANG_OPT_USE_TILELANG_MHC_PRE.get"),)


def load_hooks(environ: Mapping[str, str]) -> tuple[Hook, ...]:
    """The default hooks plus those of ``STANDIN_FORWARD_HOOKS`` (ValueError: a startup error)."""
    path = environ.get(HOOKS_ENV)
    if not path:
        return DEFAULT_HOOKS
    try:
        items = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{HOOKS_ENV}: {path}: {exc}") from None
    if not isinstance(items, list):
        raise ValueError(f"{HOOKS_ENV}: {path}: must be a JSON list of objects")
    return DEFAULT_HOOKS + tuple(_hook(i, item) for i, item in enumerate(items))


def _hook(i: int, item: Any) -> Hook:
    """One entry of the hooks file, checked."""
    if not isinstance(item, dict) or set(item) != {"mode", "call"}:
        raise ValueError(f"{HOOKS_ENV}: hook {i}: must be an object with exactly 'mode' and 'call'")
    if item["mode"] not in MODES:
        raise ValueError(f"{HOOKS_ENV}: hook {i}: unknown mode {item['mode']!r} ({' | '.join(MODES)})")
    if not isinstance(item["call"], str) or not _TARGET.fullmatch(item["call"]):
        raise ValueError(f"{HOOKS_ENV}: hook {i}: call {item['call']!r} is not sglang.srt.MODULE:QUALNAME")
    return Hook(item["mode"], item["call"])


def served_code(hooks: Sequence[Hook]) -> Callable[[Any], None]:
    """``ModelRunner``'s per-forward served code: the hooks that apply to the batch's mode."""
    for module in dict.fromkeys(h.module for h in hooks):
        importlib.import_module(module)

    def run(mode: Any) -> None:
        for hook in hooks:
            if hook.applies(mode):
                hook.run()

    return run


# ---------------------------------------------------------------- in the scheduler child


class Worker:
    """The scheduler child's model: a ``toy.Runner`` whose every step is a ``ModelRunner.forward``."""

    def __init__(self, cache: bool) -> None:
        # under their real names, through the import system (the stand-in's finder serves them)
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        from sglang.srt.model_executor.model_runner import ModelRunner

        self._batch, self._mode = ForwardBatch, ForwardMode
        self.model_runner = ModelRunner(served_code(load_hooks(os.environ)))
        numerics = toy.Numerics.from_env(dict(os.environ), derive.locate_tree())
        self.runner = toy.Runner(numerics, cache=cache, forward=self.forward)

    def forward(self, mode: str, step: Callable[[], Any]) -> Any:
        """toy.Forward: one batch of one request through ModelRunner.forward."""
        return self.model_runner.forward(self._batch(self._mode[mode], 1, step)).logits_output

    def serve(self, conn: Any) -> None:
        """Answer the main process's calls, in order, until it goes away."""
        while True:
            try:
                seq, method, args = conn.recv()
            except (EOFError, OSError):
                os._exit(0)
            try:
                if method not in METHODS:
                    raise ValueError(f"unknown call {method!r}")
                answer = (seq, True, getattr(self.runner, method)(*args))
            except Exception as exc:  # a failing forward: the request's 500, the scheduler lives on
                traceback.print_exc()
                answer = (seq, False, f"stand-in: scheduler (pid {os.getpid()}): {method} failed: "
                                      f"{type(exc).__name__}: {exc}")
            conn.send(answer)


# ---------------------------------------------------------------- in the main process


class SchedulerClient:
    """The main process's stand-in for ``toy.Runner``: every call runs in the schedulers."""

    def __init__(self, timeout: float) -> None:
        self.tokenizer = toy.tokenizer()
        self.timeout = timeout
        self._conns: list[Any] = []
        self._lock = threading.Lock()
        self._seq = 0

    def connect(self, conns: Sequence[Any]) -> None:
        """The main ends of the work pipes of DP group 0's schedulers, TP rank 0 first."""
        self._conns = list(conns)

    def run(self, req: toy.Request) -> toy.Result:
        return self._call("run", req, os.urandom(32))

    def resume(self, req: toy.Request, state: toy.State, first: int, first_logprob: float | None,
               first_top: list | None, cached_tokens: int) -> toy.Result:
        return self._call("resume", req, state, first, first_logprob, first_top, cached_tokens, os.urandom(32))

    def model_work(self, ids: Sequence[int], new_tokens: int, prefill: bool, decode: bool) -> None:
        self._call("model_work", list(ids), new_tokens, prefill, decode)

    def flush(self) -> None:
        self._call("flush")

    def _call(self, method: str, *args: Any) -> Any:
        """Send to every scheduler, wait for all (one call at a time), rank 0's answer."""
        if not self._conns:
            raise SchedulerError("stand-in: no scheduler process serves the model")
        deadline = time.monotonic() + self.timeout
        if not self._lock.acquire(timeout=self.timeout):
            raise SchedulerError(f"stand-in: the schedulers stayed busy for {self.timeout:g}s")
        try:
            self._seq += 1
            for conn in self._conns:
                conn.send((self._seq, method, args))
            answers = [self._answer(conn, method, deadline) for conn in self._conns]
        except (EOFError, OSError) as exc:
            raise SchedulerError(f"stand-in: a scheduler process is gone ({type(exc).__name__})") from None
        finally:
            self._lock.release()
        for ok, value in answers:
            if not ok:
                raise SchedulerError(value)
        return answers[0][1]

    def _answer(self, conn: Any, method: str, deadline: float) -> tuple[bool, Any]:
        """This call's answer on *conn* (a late answer to an earlier, timed-out call is dropped)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not conn.poll(left):
                raise SchedulerError(f"stand-in: the scheduler did not answer {method} within "
                                     f"{self.timeout:g}s (--watchdog-timeout)")
            seq, ok, value = conn.recv()
            if seq == self._seq:
                return ok, value
