"""Turn a compact description of a deployment (YAML) into the gatherer's raw result.

The raw records are what the real commands print (systemctl show lines, NUL-separated
/proc files, nvidia-smi CSV, JSON bodies), so a fixture goes through the same parsers as
a live host. Used for the seed deployment (seed.yaml: DeepSeek-V4-Flash-NVFP4, P/D under
systemd on 8 sm_120 GPUs) and the state tests.
"""

from __future__ import annotations

import calendar
import copy
import json
import time
from pathlib import Path
from typing import Any

import yaml

from patchset.api import base_files
from patchset.agent.lib import wire
from patchset.series.model import Series

BTIME = 1_795_000_000
CLK_TCK = 100
HERE = Path(__file__).resolve().parent


def epoch(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def load(name: str) -> dict:
    return yaml.safe_load((HERE / name).read_text())


def _rec(kind: str, command: str, stdout: str = "", exit_code: int | None = 0, **extra) -> dict:
    return {"kind": kind, "command": command, "duration_ms": 1.0, "exit_code": exit_code,
            "stdout": stdout, "stderr": "", "error": None, **extra}


def _stat(pid: int, ppid: int, started: str) -> dict:
    ticks = int((epoch(started) - BTIME) * CLK_TCK)
    fields = ["S", str(ppid)] + ["0"] * 17 + [str(ticks)] + ["0"] * 10
    return _rec("read", f"read /proc/{pid}/stat", f"{pid} (python3) " + " ".join(fields))


def _environ(pid: int, env: dict, denied: bool = False) -> dict:
    if denied:
        return _rec("read", f"read /proc/{pid}/environ", "", 13, stderr="Permission denied")
    return _rec("read", f"read /proc/{pid}/environ",
                "\0".join(f"{k}={v}" for k, v in env.items()))


def gather_result(desc: dict, series: Series) -> dict:
    """The `gather.run` result for `desc` (see seed.yaml for the format)."""
    desc = copy.deepcopy(desc)
    desc["_sha"] = {p.name: p.sha256 for p in series.patches}
    raw: dict[str, Any] = {
        "clock": _rec("read", "read /proc/stat", f"btime {BTIME}\n", clk_tck=CLK_TCK,
                      now=epoch(desc.get("now", "2026-11-29T12:00:00Z"))),
        "gpus": _gpus(desc.get("gpus")),
        "tree": _tree(desc.get("tree"), series),
        "unit_files": _rec("run", "systemctl list-unit-files ...",
                           "\n".join(f"{u} enabled enabled" for u in desc.get("units", {}))),
        "loaded_units": _rec("run", "systemctl list-units ...",
                             "\n".join(f"{u} loaded active running x" for u in
                                       desc.get("units", {}))),
        "units": {name: _unit(name, u, desc) for name, u in desc.get("units", {}).items()},
        "scan": _rec("scan", "scan /proc", ""),
        "servers": [_server(s, desc) for s in desc.get("servers", [])],
        "checkpoints": {path: _checkpoint(c) for path, c in desc.get("checkpoints", {}).items()},
    }
    return {"ok": True, "format": 1, "gatherer": "1", "hostname": desc.get("host", "gpu1"),
            "uid": 0, "duration_ms": 12.0, "raw": raw}


def _gpus(gpus: list[dict] | None) -> dict:
    cmd = ("nvidia-smi --query-gpu=index,uuid,name,compute_cap,driver_version "
           "--format=csv,noheader")
    if gpus is None:
        return _rec("run", cmd, "", 127, stderr="nvidia-smi: not found")
    lines = [f"{g['index']}, {g['uuid']}, {g['name']}, {g['compute_cap']}, {g['driver']}"
             for g in gpus]
    return _rec("run", cmd, "\n".join(lines) + "\n")


def _tree(tree: dict | None, series: Series) -> dict | None:
    if tree is None:
        return None
    by_name = series.by_name()
    applied = []
    for item in tree.get("applied", []):
        name = item if isinstance(item, str) else item["name"]
        patch = by_name[name]
        sha = patch.sha256 if isinstance(item, str) else item.get("sha256", patch.sha256)
        applied.append({"name": name, "sha256": sha, "commit": None, "tier": patch.tier,
                        "path": patch.path, "gate": {"env": patch.gate.env, "on": patch.gate.on}
                        if patch.gate else None})
    pin = series.upstream
    data = {"ok": True, "target": tree["target"], "kind": tree.get("kind", "git"),
            "layout": tree.get("layout", "git"), "managed": tree.get("managed", True),
            "state_version": 1, "tool_version": "0.1.0", "updated": tree.get("updated"),
            "upstream": tree.get("upstream", {"name": pin.name, "version": pin.version}),
            "base": {"commit": "3570f4785cd7" + "0" * 28, "files": tree.get("base_files")
                     or base_files(series)},
            "applied": applied, "head": None, "drift": tree.get("drift", []),
            "dirty": tree.get("dirty", []), "foreign_commits": tree.get("foreign_commits", []),
            "interrupted": tree.get("interrupted"), "locked_by": None, "interpreter": None}
    return _rec("engine", f"patchset-engine status {tree['target']}", data=data)


def _unit(name: str, unit: dict, desc: dict) -> dict:
    env_files = unit.get("env_files", {})
    show = [f"Id={name}", "LoadState=loaded", f"ActiveState={unit.get('active', 'active')}",
            f"SubState={unit.get('sub', 'running')}", "Result=success",
            f"MainPID={unit.get('main_pid', 0)}", f"NRestarts={unit.get('restarts', 0)}",
            f"FragmentPath=/etc/systemd/system/{name}",
            f"NeedDaemonReload={unit.get('need_reload', 'no')}",
            "Environment=" + " ".join(f"{k}={v}" for k, v in unit.get("environment", {}).items())]
    show += [f"EnvironmentFiles={p} (ignore_errors=no)" for p in env_files]
    text = "[Unit]\nDescription=x\n[Service]\n" + "".join(
        f"X-Patchset-{k.capitalize()}={v}\n" for k, v in unit.get("x", {}).items())
    changed = epoch(unit.get("changed", "2026-11-28T09:00:00Z"))
    return {
        "show": _rec("run", f"systemctl show {name}", "\n".join(show) + "\n"),
        "file": _rec("read", f"read /etc/systemd/system/{name}", text,
                     stat={"mode": "0644", "uid": 0, "gid": 0, "mtime": changed, "size": 1}),
        "env_files": {path: _rec("read", f"read {path}",
                                 "\n".join(f"{k}={v}" for k, v in spec["values"].items()) + "\n",
                                 stat={"mode": spec.get("mode", "0640"), "uid": 0, "gid": 0,
                                       "mtime": epoch(spec.get("changed", unit.get(
                                           "changed", "2026-11-28T09:00:00Z"))), "size": 1})
                      for path, spec in env_files.items()},
    }


def _server(s: dict, desc: dict) -> dict:
    pid, started = s["pid"], s["started"]
    env = s.get("env", {})
    argv = [str(a) for a in s["argv"]]
    children = []
    for i in range(s.get("schedulers", 0)):
        cpid = pid + 1 + i
        cenv = dict(env, **s.get("child_env", {}))
        children.append({"pid": cpid, "title": f"sglang::scheduler_TP{i}",
                         "stat": _stat(cpid, pid, started),
                         "environ": _environ(cpid, cenv, s.get("environ_denied", False))})
    rec = {"pid": pid, "kind": s.get("kind", "server"), "stat": _stat(pid, 1, started),
           "cmdline": _rec("read", f"read /proc/{pid}/cmdline", "\0".join(argv)),
           "environ": _environ(pid, env, s.get("environ_denied", False)),
           "cgroup": _rec("read", f"read /proc/{pid}/cgroup",
                          f"0::/system.slice/{s['unit']}\n" if s.get("unit") else "0::/user\n"),
           "exe": argv[0], "cwd": s.get("cwd", "/"), "children": children,
           "base_url": f"http://127.0.0.1:{s.get('port', 30000)}", "model": s.get("model")}
    base = rec["base_url"]
    if s.get("server_info") is None:
        rec["server_info"] = _rec("http", f"GET {base}/server_info", exit_code=None,
                                  error=f"{base}/server_info: [Errno 111] Connection refused")
    else:
        rec["server_info"] = _rec("http", f"GET {base}/server_info",
                                  json.dumps(s["server_info"]), status=200)
    rec["model_info"] = _rec("http", f"GET {base}/model_info",
                             json.dumps({"model_path": s.get("model")}), status=200)
    health = s.get("health", 200)
    rec["health"] = _rec("http", f"GET {base}/health", "", status=health) if health else \
        _rec("http", f"GET {base}/health", exit_code=None, error="Connection refused")
    origin = s.get("imports")
    rec["imports"] = _rec("run", f"{argv[0]} -c ... sglang",
                          json.dumps({"origin": origin, "python": "3.11.7"}) + "\n")
    if s.get("trace") is not None:
        rec["trace"] = _trace(s, desc)
    return rec


def _trace(s: dict, desc: dict) -> dict:
    """The tracer's records (patchset/agent/lib/tracer.py, format 2) for `trace:` of a server:
    a list of {pid, title, watch: {target: [patch name...]}, ran: [target...] (a call
    returned; `ran_in: {target: [mode...]}` says in which forward modes, else outside any),
    entered: [target...] (entered, never returned), raised: {target: ExcType}, via:
    {target: outer}, unwatched: [target...], forward: {mode: count}, format (2)}; every
    target is watched from t0 (+ watched_at), forwards returned at t0 + 50; a patch name is written
    `name:sha12` with the sha of the series (as the tracer's PATCHSET_TRACE has it)."""
    t0 = 1_795_100_000.0
    files = {}
    for proc in s["trace"]:
        targets = {t: [_word(n, desc) for n in names] for t, names in proc["watch"].items()}
        hits = {}
        for i, t in enumerate(proc.get("ran", []) + proc.get("entered", [])):
            returned = t in proc.get("ran", [])
            hits[t] = {"first": t0 + 10 + i, "returned": t0 + 11 + i if returned else None,
                       "raised": (proc.get("raised") or {}).get(t),
                       "via": (proc.get("via") or {}).get(t),
                       "modes": {m: t0 + 10 + i for m in (proc.get("ran_in") or {}).get(
                           t, ["-"])}}
        unwatched = set(proc.get("unwatched", []))
        watched = {t: {"how": None, "at": None, "why": "not imported in this process"}
                   if t in unwatched else {"how": "wrapped",
                                           "at": t0 + proc.get("watched_at", 0), "why": None}
                   for t in targets}
        forward = {m: {"first": t0 + 50, "last": t0 + 50, "count": n}
                   for m, n in (proc.get("forward") or {}).items()}
        files[f"{proc['pid']}.json"] = {
            "format": proc.get("format", 2), "pid": proc["pid"], "ppid": s["pid"],
            "title": proc.get("title"), "role": "decode", "python": "3.11.7", "mode": "wrap",
            "started_with": s.get("env", {}).get("PATCHSET_PATCHES"), "targets": targets,
            "watched": watched, "hits": hits, "forward": forward,
            "unavailable": proc.get("unavailable", []), "written": t0 + 100}
    return _rec("trace-dir", "read /run/patchset-trace/decode/*.json", json.dumps(files),
                files=len(files))


def _word(name: str, desc: dict) -> str:
    return name if name.startswith("~") or ":" in name else f"{name}:{desc['_sha'][name][:12]}"


def _checkpoint(c: dict) -> dict:
    tensors = c.get("tensors", {})
    shard = "model-00001-of-00002.safetensors"
    header = {k: {"dtype": v["dtype"], "shape": v.get("shape")} for k, v in tensors.items()}
    length = len(json.dumps(header))
    return {"resolved": c.get("path", "/models/x"), "how": "directory",
            "config": _rec("read", "read config.json", json.dumps(c.get("config", {}))),
            "hf_quant": _rec("read", "read hf_quant_config.json", "", 2),
            "index": _rec("read", "read model.safetensors.index.json",
                          json.dumps({"weight_map": {k: shard for k in tensors},
                                      "tensors": 90000, "shards": 2}), trimmed=True),
            "headers": {shard: _rec("st-header", f"safetensors-header {shard}",
                                    json.dumps(header), header_len=length,
                                    bytes_read=8 + length, file_size=5 * 10**9)}}


def real_series(workdir: Path) -> Series:
    """The project's series: patches.yaml, or (while it is being authored) patches.yaml's
    upstream with the draft series in patches/series.draft.yaml."""
    import shutil

    from patchset.series.manifest import load_series

    root = HERE.parent.parent
    manifest = yaml.safe_load((root / "patches.yaml").read_text())
    if manifest.get("series"):
        return load_series(root / "patches.yaml")
    draft = yaml.safe_load((root / "patches" / "series.draft.yaml").read_text())
    manifest["series"] = draft["series"]
    (workdir / "patches").mkdir(parents=True, exist_ok=True)
    for entry in draft["series"]:
        shutil.copyfile(root / entry["file"], workdir / entry["file"])
    (workdir / "patches.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return load_series(workdir / "patches.yaml")


def variant(series: Series, **changes: dict) -> Series:
    """The series with some patches' fields replaced: variant(s, mhc_bf16={"tier": "safe"})
    (underscores for dashes); {"name": ...} renames the patch."""
    import dataclasses
    patches = []
    for p in series.patches:
        change = changes.get(p.name.replace("-", "_"))
        patches.append(dataclasses.replace(p, **change) if change else p)
    return dataclasses.replace(series, patches=tuple(patches))


def facts(desc: dict, series: Series, host: str = "gpu1"):
    from patchset.auditor import hostfacts
    return hostfacts.build(host, wire.decode_result("audit", gather_result(desc, series)))
