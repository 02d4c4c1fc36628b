"""The one table from a declared fact name (`namespace.name`, as patches' `requires` and
the hazards use them) to the gathered fact it means, for one server on one host.

    namespace   | value                                       | gathered from
    gpu.X       | field X of the GPUs this server sees         | nvidia-smi, filtered by the
                | (compute_cap, name, driver_version, uuid,    | server's CUDA_VISIBLE_DEVICES
                | count); all must agree                       | (by index or UUID)
    server.X    | ServerArgs field X after SGLang's hooks      | GET /server_info (fallback
                |                                              | /get_server_info); an auto
                |                                              | backend: its internal_states,
                |                                              | then the startup server_args=
                |                                              | line (auditor/running.py);
                |                                              | else the command line
    env.X       | X in the environment the kernels run with    | /proc/PID/environ of the
                | (None = unset)                               | sglang::scheduler_* children
                |                                              | (all agree), else the main pid
    checkpoint.X| config.json key X, or a derived quant field  | MODEL/config.json,
                | (quant_method, quant_algo, moe_quant_algo,   | hf_quant_config.json
                | kv_cache_quant_algo)                         |
    unit.X      | role (prefill|decode|router|null), name, or  | X-Patchset-Role in the unit
                | any `systemctl show` property                | file, disaggregation_mode;
                |                                              | systemctl show UNIT
    patch.X     | effective state of patch X in this server    | auditor.states

A fact that cannot be had resolves to `unknown` with the reason, never an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from patchset.series.factnames import QUANT_FIELDS

from patchset.agent.lib.facts.base import FactValue
from .model import Checkpoint, HostFacts, Server
from .running import running

UNDECIDED_BACKEND = ("auto", None)     # a backend not decided yet


@dataclass
class Context:
    """What `namespace.name` is resolved against: one server (or none) on one host."""

    host: HostFacts
    server: Server | None
    patch_state: Callable[[str], FactValue] = field(
        default=lambda name: FactValue.unknown("patch states not evaluated"))

    @property
    def checkpoint(self) -> Checkpoint | None:
        if self.server is None or not self.server.model:
            return None
        return self.host.checkpoints.get(self.server.model)


def resolve(fact: str, ctx: Context) -> FactValue:
    namespace, _, name = fact.partition(".")
    resolver = RESOLVERS.get(namespace)
    if resolver is None or not name:
        return FactValue.unknown(f"{fact}: no such fact (namespaces: {', '.join(RESOLVERS)})")
    return resolver(name, ctx)


def _no_server(ctx: Context) -> FactValue:
    return FactValue.unknown(f"no SGLang server process running on {ctx.host.host}")


# ---------------------------------------------------------------- env

def env(name: str, ctx: Context) -> FactValue:
    if ctx.server is None:
        return _no_server(ctx)
    main = ctx.server.main.environ
    scheds = ctx.server.schedulers
    readable = [p for p in scheds if not p.environ.known or p.environ.value]
    if not readable:
        if not main.known:
            return main
        why = ("no scheduler children" if not scheds else "the schedulers' /proc environ is "
               "overwritten by their process title (setproctitle; SPT_NOENV=1 keeps it)")
        return FactValue(main.value.get(name), provenance=main.provenance,
                         source=f"{main.source}; {why}")
    values = {}
    for proc in readable:
        if not proc.environ.known:
            return FactValue.unknown(proc.environ.reason, proc.environ.provenance,
                                     proc.environ.source)
        values[proc.title] = proc.environ.value.get(name)
    distinct = set(values.values())
    first = readable[0].environ
    if len(distinct) > 1:
        listing = ", ".join(f"{t}={'unset' if v is None else v}" for t, v in values.items())
        return FactValue.unknown(f"the scheduler processes disagree on {name}: {listing}",
                                 first.provenance)
    return FactValue(distinct.pop(), provenance=first.provenance,
                     source=f"{first.source}" + (f" (+{len(readable) - 1} more agree)"
                                                 if len(readable) > 1 else ""))


# ---------------------------------------------------------------- server

def server(name: str, ctx: Context) -> FactValue:
    if ctx.server is None:
        return _no_server(ctx)
    info = ctx.server.server_info
    if info.known and name.endswith("_backend") and info.value.get(name) == "auto":
        # SGLang may decide an `auto` backend after /server_info's copy was taken: read it
        # where the resolved-args check reads it (kv_cache_dtype=auto and the like are
        # real, comparable settings, not decided later).
        return running(ctx.server, name, UNDECIDED_BACKEND).fact(name)
    if info.known and name in info.value:
        return FactValue(info.value[name], provenance=info.provenance, source="server_info")
    flag = argv_flag(ctx.server.argv, name)
    if flag is not None:
        return FactValue(flag, provenance=ctx.server.main.cmdline.provenance
                         if ctx.server.main.cmdline else None,
                         source="command line" + ("" if not info.known else
                                                  " (not in server_info)"))
    if info.known:
        return FactValue.unknown(f"server_info has no field {name!r} and the command line "
                                 "does not set it", info.provenance)
    return FactValue.unknown(f"server_info unavailable ({info.reason}) and --"
                             f"{name.replace('_', '-')} is not on the command line",
                             info.provenance)


def argv_flag(argv: list[str], field_name: str) -> Any:
    """`--field-name VALUE` / `--field-name=VALUE` / a bare `--enable-x` (True)."""
    flag = "--" + field_name.replace("_", "-")
    for i, arg in enumerate(argv):
        if arg == flag:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            return True if nxt is None or nxt.startswith("--") else nxt
        if arg.startswith(flag + "="):
            return arg.partition("=")[2]
    return None


# ---------------------------------------------------------------- gpu

def gpu(name: str, ctx: Context) -> FactValue:
    gpus = ctx.host.gpus
    if not gpus.known:
        return gpus
    rows = list(gpus.value)
    source = "all GPUs of the host"
    if ctx.server is not None:
        visible = env("CUDA_VISIBLE_DEVICES", ctx)
        if not visible.known:
            visible = FactValue(None)
        order = env("CUDA_DEVICE_ORDER", ctx).value
        if visible.value not in (None, ""):
            picked, why = _visible(rows, str(visible.value), order)
            if picked is None:
                return FactValue.unknown(why, gpus.provenance)
            rows, source = picked, f"GPUs {visible.value} (CUDA_VISIBLE_DEVICES)"
    if name == "count":
        return FactValue(len(rows), provenance=gpus.provenance, source=source)
    values = {r.get(name) for r in rows}
    if not rows or any(name not in r for r in rows):
        return FactValue.unknown(f"nvidia-smi has no GPU field {name!r}", gpus.provenance)
    if len(values) > 1:
        return FactValue.unknown(f"{source} disagree on {name}: "
                                 f"{', '.join(sorted(map(str, values)))}", gpus.provenance)
    value = values.pop()
    if value is None:
        return FactValue.unknown(f"nvidia-smi reports no {name} (old driver?)", gpus.provenance)
    return FactValue(value, provenance=gpus.provenance, source=source)


def _visible(rows: list[dict], spec: str, order: Any) -> tuple[list[dict] | None, str]:
    picked = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if item.startswith(("GPU-", "MIG-")):
            match = [r for r in rows if r["uuid"].startswith(item)]
        elif item.isascii() and item.isdigit():     # int() refuses "²"
            match = [r for r in rows if r["index"] == int(item)]
        else:
            return None, f"CUDA_VISIBLE_DEVICES={spec!r} is not a list of indices or UUIDs"
        if not match:
            return None, f"CUDA_VISIBLE_DEVICES={spec!r} names GPU {item}, not on this host"
        picked += match
    uniform = len({(r["name"], r["compute_cap"]) for r in rows}) == 1
    if not uniform and order != "PCI_BUS_ID" and any(not i.startswith("GPU-") for i in
                                                     spec.split(",")):
        return None, (f"CUDA_VISIBLE_DEVICES={spec} by index without CUDA_DEVICE_ORDER="
                      "PCI_BUS_ID on a host with mixed GPUs: which GPUs it means is unknown")
    return picked, ""


# ---------------------------------------------------------------- checkpoint

def checkpoint(name: str, ctx: Context) -> FactValue:
    if ctx.server is None:
        return _no_server(ctx)
    ckpt = ctx.checkpoint
    if ckpt is None:
        return FactValue.unknown(f"{ctx.server.id}: model path unknown "
                                 "(no server_info and no --model-path)")
    config = ckpt.config
    if not config.known:
        return config
    if name in QUANT_FIELDS:
        return FactValue(quant_fields(config.value, ckpt.hf_quant.value if ckpt.hf_quant.known
                                      else None)[name],
                         provenance=config.provenance, source="quantization config")
    return FactValue(config.value.get(name), provenance=config.provenance,
                     source=f"{ckpt.path}/config.json")


def quant_fields(config: dict, hf_quant: dict | None) -> dict[str, Any]:
    """ModelOpt writes either config.json `quantization_config` or hf_quant_config.json;
    MIXED_PRECISION checkpoints name the experts' algorithm in `moe_quant_algo`."""
    qc = dict(config.get("quantization_config") or {})
    if hf_quant and isinstance(hf_quant.get("quantization"), dict):
        for key, value in hf_quant["quantization"].items():
            qc.setdefault(key, value)
        qc.setdefault("quant_method", (hf_quant.get("producer") or {}).get("name"))
    algo = qc.get("quant_algo")
    moe = qc.get("moe_quant_algo") or (algo if algo != "MIXED_PRECISION" else None)
    return {"quant_method": qc.get("quant_method"), "quant_algo": algo,
            "moe_quant_algo": moe, "kv_cache_quant_algo": qc.get("kv_cache_quant_algo")}


# ---------------------------------------------------------------- unit

def unit(name: str, ctx: Context) -> FactValue:
    if ctx.server is None:
        return _no_server(ctx)
    if name == "role":
        return role(ctx)
    if name == "name":
        return FactValue(ctx.server.unit, source="process cgroup")
    record = ctx.host.units.get(ctx.server.unit or "")
    if record is None:
        return FactValue.unknown(f"{ctx.server.id} does not run under a systemd unit")
    if not record.show.known:
        return record.show
    return FactValue(record.show.value.get(name), provenance=record.show.provenance,
                     source=f"systemctl show {record.name}")


def role(ctx: Context) -> FactValue:
    """prefill | decode | router | null: what the server does, whatever the unit says."""
    if ctx.server is None:
        return _no_server(ctx)
    if ctx.server.kind == "router":
        return FactValue("router", source="sglang_router process")
    mode = server("disaggregation_mode", ctx)
    if mode.known:
        value = "null" if mode.value in (None, "null", "None") else str(mode.value)
        return FactValue(value, provenance=mode.provenance,
                         source=f"server.disaggregation_mode ({mode.source})")
    record = ctx.host.units.get(ctx.server.unit or "")
    declared = record.x("X-Patchset-Role") if record else None
    if record and declared:
        return FactValue(declared, source=f"X-Patchset-Role in {record.name}")
    cmdline = ctx.server.main.cmdline
    if cmdline and ctx.server.argv:   # no flag: ServerArgs' default, no startup hook changes
        return FactValue("null", provenance=cmdline.provenance,
                         source="command line (no --disaggregation-mode: default null)")
    return mode


# ---------------------------------------------------------------- patch

def patch(name: str, ctx: Context) -> FactValue:
    return ctx.patch_state(name)


RESOLVERS: dict[str, Callable[[str, Context], FactValue]] = {
    "gpu": gpu, "server": server, "env": env, "checkpoint": checkpoint, "unit": unit,
    "patch": patch,
}
