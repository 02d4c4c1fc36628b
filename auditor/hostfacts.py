"""Raw records from the gatherer -> typed HostFacts, through the fact classes' parsers."""

from __future__ import annotations

from patchset.agent.lib import wire
from patchset.agent.lib.facts import checkpoint as ck
from patchset.agent.lib.facts import gpu, http, journal, procs, systemd, trace, tree
from patchset.agent.lib.facts.base import Fact, FactValue
from .model import Checkpoint, HostFacts, Proc, Server, Unit


def build(host: str, result: wire.AuditResult | wire.Failure) -> HostFacts:
    """Parse one host's typed gather result; a failed gathering is a HostFacts saying why.
    The envelope is the wire's record; only `raw` is free-form, read by the fact parsers."""
    if isinstance(result, wire.Failure):
        return HostFacts(host=host, reachable=True,
                         error=f"the gatherer failed: {result.message or 'no result'}")
    raw = result.raw
    facts = HostFacts(host=host, hostname=result.hostname, duration_ms=result.duration_ms)
    facts.clock = procs.HostClock().collect(raw.get("clock"))
    facts.gpus = gpu.GpuList().collect(raw.get("gpus"))
    facts.tree = (tree.TreeStatus().collect(raw["tree"]) if raw.get("tree") is not None
                  else FactValue.unknown("no tree given (inventory `tree` or --target)"))
    facts.units = {name: _unit(name, rec) for name, rec in (raw.get("units") or {}).items()}
    facts.unit_list = systemd.LoadedUnits().collect(raw.get("loaded_units"))
    facts.servers = [_server(rec, facts) for rec in raw.get("servers") or []]
    facts.checkpoints = {model: _checkpoint(model, rec)
                         for model, rec in (raw.get("checkpoints") or {}).items()}
    return facts


def _unit(name: str, rec: dict) -> Unit:
    return Unit(name=name, show=systemd.UnitShow().collect(rec.get("show")),
                file=systemd.UnitFile().collect(rec["file"]) if rec.get("file") else None,
                env_files={path: systemd.EnvironmentFile().collect(r)
                           for path, r in (rec.get("env_files") or {}).items()})


def _started(stat: FactValue, clock: FactValue) -> float | None:
    if not (stat.known and clock.known):
        return None
    c = clock.value
    return round(c["btime"] + stat.value["start_ticks"] / c["clk_tck"], 2)


def _server(rec: dict, facts: HostFacts) -> Server:
    stat = procs.ProcStat().collect(rec.get("stat"))
    cmdline = procs.ProcCmdline().collect(rec.get("cmdline"))
    main = Proc(pid=rec["pid"], title=" ".join(cmdline.value) if cmdline.known else "?",
                started=_started(stat, facts.clock),
                environ=procs.ProcEnviron().collect(rec.get("environ")).with_source(
                    f"main process environ (pid {rec['pid']})"),
                cmdline=cmdline)
    children = []
    for child in rec.get("children") or []:
        cstat = procs.ProcStat().collect(child.get("stat"))
        children.append(Proc(pid=child["pid"], title=child.get("title", "?"),
                             started=_started(cstat, facts.clock),
                             environ=procs.ProcEnviron().collect(child.get("environ"))
                             .with_source(f"{child.get('title')} environ (pid {child['pid']})")))
    unit = _unit_of(rec, facts)
    srv = Server(id=unit or f"pid {rec['pid']}", kind=rec.get("kind", "server"), unit=unit,
                 main=main, children=children, exe=rec.get("exe"), cwd=rec.get("cwd"),
                 base_url=rec.get("base_url"), model=rec.get("model"))
    if rec.get("config_file") is not None:
        srv.config_file = procs.ConfigFile().collect(rec["config_file"]).with_source(
            f"--config file of pid {rec['pid']}")
    if srv.kind == "server":
        srv.server_info = _collect(http.ServerInfo(), rec, "server_info")
        srv.model_info = _collect(http.ModelInfo(), rec, "model_info")
        srv.health = _collect(http.Health(), rec, "health")
        srv.imports = _collect(tree.ImportOrigin(), rec, "imports")
        srv.server_args_log = (
            journal.ServerArgsLog().collect(rec["server_args_log"]).with_source(
                f"journal of {unit}, pid {rec['pid']}: its startup server_args= line")
            if rec.get("server_args_log") is not None else FactValue.unknown(
                "no journal to read: the server does not run under a systemd unit" if not unit
                else "the journal line was not gathered"))
        if rec.get("trace") is not None:
            srv.trace = trace.TraceRecords().collect(rec["trace"]).with_source(
                f"trace records of {srv.id}")
    return srv


def _collect(fact: Fact, rec: dict, key: str) -> FactValue:
    return fact.collect(rec.get(key)) if rec.get(key) is not None else \
        FactValue.unknown(f"{key} not gathered")


def _unit_of(rec: dict, facts: HostFacts) -> str | None:
    """The systemd unit a process runs in: its cgroup, else a unit whose MainPID it is."""
    unit = procs.cgroup_unit((rec.get("cgroup") or {}).get("stdout") or "")
    if unit:
        return unit
    for name, record in facts.units.items():
        if record.show.known and record.show.value.get("MainPID") == rec["pid"]:
            return name
    return None


def _checkpoint(model: str, rec: dict) -> Checkpoint:
    if rec.get("resolved") is None:
        reason = rec.get("how") or "not found"
        miss = FactValue.unknown(reason)
        return Checkpoint(model, None, reason, miss, miss, miss, miss)
    index = ck.SafetensorsIndex().collect(rec.get("index"))
    tensors: dict[str, dict] = {}
    reads: list[dict] = []
    problems: list[str] = []
    for shard, hrec in sorted((rec.get("headers") or {}).items()):
        header = ck.SafetensorsHeader().collect(hrec)
        if not header.known:
            problems.append(f"{shard}: {header.reason}")
            continue
        reads.append({"shard": shard, "header_len": header.value["header_len"],
                      "bytes_read": header.value["bytes_read"],
                      "file_size": header.value["file_size"]})
        for name, entry in header.value["tensors"].items():
            tensors[name] = dict(entry, shard=shard)
    if problems and not tensors:
        tensor_fact = FactValue.unknown("; ".join(problems))
    else:
        tensor_fact = FactValue(tensors, source=f"{len(reads)} safetensors header(s)")
    return Checkpoint(model=model, path=rec["resolved"], how=rec.get("how", ""),
                      config=ck.ConfigJson().collect(rec.get("config")),
                      hf_quant=ck.HfQuantConfig().collect(rec.get("hf_quant")),
                      index=index, tensors=tensor_fact, header_reads=reads)
