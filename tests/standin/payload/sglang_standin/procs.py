"""The engine's child processes: ``sglang::scheduler_*``, ``sglang::detokenizer``, ...

As in SGLang, children are started with multiprocessing "spawn" after
``_set_envs_and_config`` edited ``os.environ`` (so a child's
``/proc/PID/environ`` at exec is the parent's environment with those edits,
while the main process's ``/proc/PID/environ`` still shows what systemd
exec'd), and each child then renames itself the way the ``setproctitle``
package does on Linux (checked against setproctitle 1.3.8 under mp spawn):

* the title is written over the original argv area and the rest is padded
  with NULs: ``/proc/PID/cmdline`` is ``b"sglang::scheduler_TP0\\0\\0..."``;
* ``/proc/PID/comm`` is the title cut to 15 bytes (``prctl(PR_SET_NAME)``);
* unless ``SPT_NOENV`` is set (non-empty) in the child's environment, the
  environ strings right after argv are part of that buffer and get padded
  too: ``/proc/PID/environ`` of a scheduler reads as NUL bytes only, exactly
  like a real SGLang scheduler.  libc's ``environ`` is moved out of the way
  first, so ``os.environ``/``getenv`` in the child keep working.

Children die with their parent (``PR_SET_PDEATHSIG``, as SGLang's
``kill_itself_when_parent_died``) and exit 0 on SIGTERM.

The schedulers compute the model (scheduler.py): each scheduler of DP group 0 gets one
end of a duplex work pipe (passed through the ``sglang::data_parallel_controller`` when
``--dp-size`` > 1), builds its ``scheduler.Worker`` before it reports ready, then answers
the main process's calls until the pipe closes.  The other children only sleep.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import multiprocessing
import os
import signal
import time
import types
from typing import Any

from sglang_standin import scheduler

logger = logging.getLogger("sglang.srt.entrypoints.engine")

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_libc = ctypes.CDLL(None, use_errno=True)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "y", "on")


# ---------------------------------------------------------------------------
# setproctitle, as the C extension does it on Linux
# ---------------------------------------------------------------------------


def _move_environ() -> None:
    """Give libc's ``environ`` its own heap copies (setproctitle's "move the environment")."""
    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(_libc, "environ")
    pairs = []
    i = 0
    while environ and environ[i] is not None:
        pairs.append(environ[i])
        i += 1
    _libc.clearenv()
    for item in pairs:
        name, sep, value = item.partition(b"=")
        if sep:
            _libc.setenv(name, value, 1)


def setproctitle(title: str) -> None:
    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])  # stat fields 48-51
    end = arg_end - 1  # the NUL ending the last argv string
    if not os.environ.get("SPT_NOENV") and env_start == arg_end and env_end > env_start:
        _move_environ()
        end = env_end - 1
    size = end - arg_start
    if size > 0:
        data = title.encode()[: size - 1]
        ctypes.memmove(arg_start, data + b"\0" * (size - len(data)), size)
    _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)


# ---------------------------------------------------------------------------
# In the parent
# ---------------------------------------------------------------------------


class Child:
    """One spawned child, the read end of its readiness pipe and the main ends of the work
    pipes of the schedulers that compute the model (its own, or its DP group 0's)."""

    def __init__(self, name: str, proc: Any, reader: Any, work: list[Any] | None = None) -> None:
        self.name = name
        self.proc = proc
        self.reader = reader
        self.work = work or []

    @property
    def pid(self) -> int:
        return self.proc.pid


def spawn(name: str, title: str, role: str, extra: dict[str, Any] | None = None,
          cuda_visible: str | None = None, work: Any = None) -> Child:
    """Start one child with mp spawn (``cuda_visible``: maybe_reindex_device_id's override;
    ``work``: the child's end of its work pipe, or a list of them for a DP controller to
    hand on; closed here once the child has its copy, so the main sees EOF when it dies)."""
    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    payload = json.dumps({"role": role, "title": title, "parent": os.getpid(), **(extra or {})})
    proc = ctx.Process(target=child_main, args=(payload, writer, work), name=title)
    with _env_override("CUDA_VISIBLE_DEVICES", cuda_visible):
        proc.start()
    writer.close()
    ends = work if isinstance(work, list) else [] if work is None else [work]
    for end in ends:
        end.close()
    return Child(name, proc, reader)


def _work_pipes(n: int) -> tuple[list[Any], list[Any]]:
    """*n* duplex pipes: (main ends, scheduler ends)."""
    ctx = multiprocessing.get_context("spawn")
    pairs = [ctx.Pipe() for _ in range(n)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def wait_ready(children: list[Child], timeout: float = 120.0) -> None:
    """``_wait_for_scheduler_ready``: every child reports in (after its title is set)."""
    deadline = time.monotonic() + timeout
    for child in children:
        while not child.reader.poll(0.1):
            if not child.proc.is_alive():
                raise RuntimeError(f"{child.name} (pid {child.pid}) died during initialization "
                                   f"(exit code: {child.proc.exitcode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{child.name} (pid {child.pid}) did not get ready in {timeout:.0f}s")
        child.reader.recv()


@contextlib.contextmanager
def _env_override(name: str, value: str | None):
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def launch_engine_children(values: dict[str, Any], derived: Any) -> list[Child]:
    """Start the children ``Engine._launch_subprocesses`` starts on node 0.

    dp_size == 1: one scheduler per (pp_rank, tp_rank) of this node, ranks
    and GPU ids computed with the tree's own ``_calculate_rank_ranges`` and
    ``_compute_parallelism_ranks``, titled by the tree's
    ``configure_scheduler_process`` rule.  dp_size > 1: a
    ``sglang::data_parallel_controller`` child that starts the schedulers
    (simplified rank layout, see child_main).  Then the detokenizer(s).
    """
    sa = types.SimpleNamespace(**values)
    children: list[Child] = []
    cache = {"cache": not sa.disable_radix_cache}
    if sa.dp_size == 1:
        for rank in scheduler_ranks(sa, derived, dp_rank=None):
            (main_end,), (child_end,) = _work_pipes(1)
            children.append(spawn(f"scheduler_{len(children)}", rank["title"], "scheduler", cache,
                                  cuda_visible=_reindexed(rank["gpu_id"]), work=child_end))
            children[-1].work = [main_end]
    else:
        group0 = sum(1 for rank in dp_scheduler_ranks(sa, derived) if rank["dp_rank"] == 0)
        main_ends, child_ends = _work_pipes(group0)
        children.append(spawn("data_parallel_controller", derived.dp_controller_title, "dp_controller",
                              {"values": _jsonable(values), "tree": str(derived.tree.pkg_dir), **cache},
                              work=child_ends))
        children[-1].work = main_ends
    if sa.detokenizer_worker_num <= 1:
        children.append(spawn("detokenizer", derived.detokenizer_title, "detokenizer"))
    else:
        for i in range(sa.detokenizer_worker_num):
            children.append(spawn(f"detokenizer_{i}", derived.detokenizer_title, "detokenizer"))
        children.append(spawn("detokenizer_router", "sglang::detokenizer_router", "detokenizer"))
    return children


def scheduler_ranks(sa: Any, derived: Any, dp_rank: int | None) -> list[dict]:
    pp_range, tp_range, pp_per_node, tp_per_node = derived.calculate_rank_ranges(
        sa.nnodes, sa.pp_size, sa.tp_size, sa.node_rank
    )
    out = []
    for pp_rank in pp_range:
        for tp_rank in tp_range:
            gpu_id = sa.base_gpu_id + (pp_rank % pp_per_node) * tp_per_node + (tp_rank % tp_per_node) * sa.gpu_id_step
            attn_cp_rank, moe_dp_rank, moe_ep_rank = derived.compute_parallelism_ranks(sa, tp_rank)
            title = derived.scheduler_title(
                server_args=sa, gpu_id=gpu_id, tp_rank=tp_rank, attn_cp_rank=attn_cp_rank,
                moe_dp_rank=moe_dp_rank, moe_ep_rank=moe_ep_rank, pp_rank=pp_rank, dp_rank=dp_rank,
            )
            out.append({"title": title, "gpu_id": gpu_id, "tp_rank": tp_rank, "pp_rank": pp_rank})
    return out


def dp_scheduler_ranks(sa: Any, derived: Any) -> list[dict]:
    """The schedulers a ``sglang::data_parallel_controller`` starts, in order, with their DP
    rank.  The real controller starts dp_size groups of tp_size schedulers (or, with
    --enable-dp-attention, tp_size schedulers split into dp_size groups); titles carry the
    DP rank.  GPU ids are not modelled here."""
    out = []
    if sa.enable_dp_attention:
        per_dp = max(1, sa.tp_size // sa.dp_size)
        for rank in scheduler_ranks(sa, derived, dp_rank=None):
            dp_rank = rank["tp_rank"] // per_dp
            title = derived.scheduler_title(
                server_args=sa, gpu_id=rank["gpu_id"], tp_rank=rank["tp_rank"], attn_cp_rank=0,
                moe_dp_rank=0, moe_ep_rank=0, pp_rank=rank["pp_rank"], dp_rank=dp_rank,
            )
            out.append({"title": title, "dp_rank": dp_rank})
    else:
        for dp_rank in range(sa.dp_size):
            out.extend({"title": rank["title"], "dp_rank": dp_rank}
                       for rank in scheduler_ranks(sa, derived, dp_rank=dp_rank))
    return out


def _reindexed(gpu_id: int) -> str | None:
    """``maybe_reindex_device_id``: one visible GPU per child with SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS."""
    if not _truthy(os.environ.get("SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS")):
        return None
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return visible[gpu_id] if visible else str(gpu_id)


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(values, default=lambda o: list(o) if isinstance(o, (set, tuple)) else str(o)))


def stop_children(children: list[Child], timeout: float = 5.0) -> None:
    for c in children:
        if c.proc.is_alive():
            with contextlib.suppress(ProcessLookupError, OSError):
                c.proc.terminate()
    deadline = time.monotonic() + timeout
    for c in children:
        c.proc.join(max(0.1, deadline - time.monotonic()))
        if c.proc.is_alive():
            c.proc.kill()
            c.proc.join()


# ---------------------------------------------------------------------------
# In the child
# ---------------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # parent died before prctl took effect
        os._exit(0)


def child_main(payload_json: str, ready_writer: Any, work: Any = None) -> None:
    """A child's life: title, signals, (DP controller) its schedulers, (scheduler with a work
    pipe) the model, then "ready" and its loop."""
    payload = json.loads(payload_json)
    _die_with_parent(payload["parent"])
    setproctitle(payload["title"])
    grandchildren: list[Child] = []

    def on_term(signum: int, frame: Any) -> None:
        stop_children(grandchildren, timeout=2.0)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business
    worker = None
    if payload["role"] == "dp_controller":
        grandchildren.extend(_start_dp_schedulers(payload, work or []))
        wait_ready(grandchildren)
    elif payload["role"] == "scheduler" and work is not None:
        worker = scheduler.Worker(cache=payload.get("cache", True))
    ready_writer.send({"status": "ready", "pid": os.getpid(), "title": payload["title"]})
    ready_writer.close()
    if worker is not None:
        worker.serve(work)
    while True:
        signal.pause()


def _start_dp_schedulers(payload: dict, work: list[Any]) -> list[Child]:
    """The DP controller's schedulers; DP group 0's get the work pipes, in order."""
    from sglang_standin import derive

    derived = derive.load(payload["tree"])
    sa = types.SimpleNamespace(**payload["values"])
    pending = list(work)
    out = []
    for rank in dp_scheduler_ranks(sa, derived):
        end = pending.pop(0) if rank["dp_rank"] == 0 and pending else None
        out.append(spawn(rank["title"], rank["title"], "scheduler", {"cache": payload.get("cache", True)},
                         work=end))
    return out
