"""What the tracer saw, and the only conclusions it supports.

The records (patchset/agent/lib/tracer.py, gathered as Server.trace) say, per process, which
targets it watched since when, which it entered, which returned (or raised), in which
forward modes, and how many forward passes of each mode returned. Three outcomes per
patch and server, and nothing else:

* **ran**: a call of one of its targets returned in some process, and that target's
  execution shows the patch's code ran: the patch's own function (`+`), an upstream
  function whose every changed line runs on each call (`=`) of a patch with no gate, a
  manifest `trace:` entry, or the import of a patch that changes module level only.
  Entering is not running (a call that raised proved nothing); a hit on the enclosing
  function of a nested target (`via`) shows only that the enclosing function ran; an
  upstream function whose changed lines may not run (`?`: a dispatcher, a branch), or
  any changed upstream function of a gated patch, runs with the patch's behaviour off
  too: its call only corroborates a state already declared active (`weak`);
* **not run**: in one process, every target that would show the patch's code ran (its
  own functions; else all its changed functions) was watched, none was entered there or
  anywhere, and after they became watched that same process returned a forward pass of
  every mode the patch's path serves in this server; a patch with a compiled kernel is
  never shown not to run (a kernel's launches cannot be watched). Request handling, health checks, a rejected
  request, a forward of a draft model or work in another process never count: the code
  that would run the patch had to run, in the process that would run it;
* **none**: anything else, with the reason (tracing off, an older record format, a
  target that cannot be watched, no forward pass of the needed modes yet ...).

Absence of evidence is reported as absence of evidence: `none` changes no state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from patchset.agent.lib.staleness import PATCHES_VAR
from patchset.agent.lib.tracer import FORWARD, KERNEL, MODULE, OUTSIDE, split_flag

from .model import Server

FORMAT = 2
# forward modes (0.5.14 ForwardMode, lower case) and the paths they serve: extend-like
# modes run prefill code, MIXED runs both, IDLE/PREBUILT run no request's tokens
PATH_MODES = {
    "prefill": frozenset({"extend", "mixed", "target_verify", "split_prefill",
                          "dllm_extend"}),
    "decode": frozenset({"decode", "mixed"}),
}


@dataclass(frozen=True)
class Watch:
    how: str | None                  # how it is watched; None: not (yet) watchable
    at: float | None                 # since when
    why: str | None = None           # why not


@dataclass(frozen=True)
class Hit:
    first: float | None              # first entry
    returned: float | None           # first call that returned
    raised: str | None               # exception type of a call that raised (wrap mode)
    via: str | None                  # the enclosing function was what ran
    modes: dict[str, float] = field(default_factory=dict)   # forward mode -> first time

    @property
    def ran(self) -> bool:
        return self.returned is not None and self.via is None


@dataclass(frozen=True)
class Forward:
    mode: str
    first: float | None
    last: float | None               # the last recorded forward of this mode
    count: int


@dataclass(frozen=True)
class ProcessRecord:
    """One process's record, typed; tolerant of anything a host sends."""

    pid: int | None
    title: str | None
    format: int
    targets: dict[str, tuple[str, ...]]
    watched: dict[str, Watch]
    hits: dict[str, Hit]
    forwards: dict[str, Forward]
    unavailable: tuple[str, ...]

    @classmethod
    def of(cls, rec: dict) -> "ProcessRecord":
        fmt, pid = rec.get("format"), rec.get("pid")
        return cls(
            pid if type(pid) is int else None, rec.get("title"), fmt if type(fmt) is int else 1,
            {str(t): tuple(str(p) for p in ps or ()) for t, ps in _items(rec.get("targets"))},
            {str(t): _watch(w) for t, w in _items(rec.get("watched"))},
            {str(t): _hit(h) for t, h in _items(rec.get("hits"))},
            {str(m): _forward(str(m), f) for m, f in _items(rec.get("forward"))},
            tuple(str(u) for u in rec.get("unavailable") or ()))

    def mine(self, patch: str) -> list[str]:
        """The targets this process had for `patch` (`name:sha12`)."""
        return [t for t, ps in self.targets.items() if patch in ps]

    def served(self, path: str) -> list[Forward]:
        """Forward passes of the target model that ran code of `path`."""
        return [f for f in self.forwards.values()
                if f.count > 0 and f.mode in PATH_MODES.get(path, ())]


@dataclass(frozen=True)
class Observation:
    patch: str                       # name:sha12
    ran: tuple[dict, ...]            # {pid, title, target, first, via, modes}: returned
    not_run: tuple[dict, ...]        # {pid, title, forwards}: processes that show it
    none: str                        # why neither (empty when ran or not_run)
    entered: tuple[dict, ...] = ()   # entered, never returned: no evidence either way
    processes: int = 0
    weak: tuple[dict, ...] = ()      # returned, but runs with the behaviour off too

    @property
    def observed_not_run(self) -> bool:
        return bool(self.not_run) and not self.ran


def records(server: Server) -> list[dict]:
    return list(server.trace.value or []) if server.trace.known else []


def parsed(server: Server) -> list[ProcessRecord]:
    return [ProcessRecord.of(r) for r in records(server) if r.get("pid") is not None]


def word_for(server: Server, name: str) -> str | None:
    """The `name:sha12` this server's processes started with for patch `name`: from
    PATCHSET_PATCHES, else from the targets its records watch."""
    words = loaded(server) or []
    found = next((w for w in words if w.split(":")[0] == name), None)
    if found:
        return found
    for rec in parsed(server):
        for patches in rec.targets.values():
            found = next((p for p in patches if p.split(":")[0] == name), None)
            if found:
                return found
    return None


def observe(server: Server, patch: str, paths: Iterable[str],
            gated: bool = False) -> Observation | None:
    """`patch` is `name:sha12`; `paths` the paths it would run in here (prefill, decode);
    `gated`: the patch has an env gate (its changed upstream functions run either way).
    None when the server has no trace records at all."""
    recs = parsed(server)
    if not recs:
        return None
    ran: list[dict] = []
    weak: list[dict] = []
    entered: list[dict] = []
    for rec in (r for r in recs if r.format >= FORMAT):
        for target in rec.mine(patch):
            hit = rec.hits.get(target)
            if hit is None:
                continue
            if not _counts(rec, patch, target, hit):
                entered.append(_entry(rec, target, hit))
            else:
                (ran if proves(target, gated) else weak).append(_entry(rec, target, hit))
    need = sorted(set(paths))
    not_run: list[dict] = []
    why: list[str] = []
    for rec in recs:
        shown, reason = _not_run_in(rec, patch, need, gated)
        if shown:
            not_run.append(shown)
        else:
            why.append(reason)
    if any(e["target"] in map(name, _judged(rec.mine(patch), gated)) for rec in recs
           for e in entered if e["pid"] == rec.pid):
        not_run = []                     # its code was entered somewhere: not "not run"
    none = "" if ran or not_run else _none(entered + weak, why)
    return Observation(patch, tuple(ran), tuple(x for x in not_run if x), none,
                       tuple(entered), len(recs), tuple(weak))


def name(target: str) -> str:
    """A record key as people read it: `module:qualname`, without its evidence flag."""
    return target[len(split_flag(target)[0]):]


def proves(target: str, gated: bool) -> bool:
    """Does a returned call of this target show the patch's code ran (FLAGS)?"""
    flag = split_flag(target)[0]
    return flag == "+" or (flag == "=" and not gated) or target.endswith(":" + MODULE)


def _counts(rec: ProcessRecord, patch: str, target: str, hit: Hit) -> bool:
    """Does this hit show the patch's code ran? A module import counts only for a patch
    whose every target is module-level (loading is all such a patch does)."""
    if target.endswith(":" + MODULE):
        return all(t.endswith(":" + MODULE) for t in rec.mine(patch)) and hit.first is not None
    return hit.ran


def _not_run_in(rec: ProcessRecord, patch: str, need: list[str],
                gated: bool = False) -> tuple[dict | None, str]:
    """The not-run rule in one process: (evidence, "") or (None, why not). Judged on the
    targets that prove the patch's code ran (its own functions, unconditional changes of
    an ungated patch), else on all its function targets; a module import is loading, not
    running; a compiled kernel cannot be watched, so a patch with one is never shown not
    to run (upstream code could launch it)."""
    pid = f"pid {rec.pid}"
    if rec.format < FORMAT:
        return None, f"{pid}: a record of tracer format {rec.format} (restart to update)"
    targets = rec.mine(patch)
    if not targets:
        return None, f"{pid}: watches none of its code"
    kernels = [t for t in targets if split_flag(t)[0] == KERNEL]
    if kernels:
        return None, (f"{pid}: {name(kernels[0])} is a compiled kernel: its "
                      "launches cannot be watched")
    judged = _judged(targets, gated)
    if not judged:
        return None, f"{pid}: only module-level code, which ran when imported or not at all"
    for t in judged:
        w = rec.watched.get(t)
        if w is None or w.how is None:
            return None, f"{pid}: {name(t)} not watched ({w.why if w else 'no entry'})"
        if t in rec.hits:
            return None, f"{pid}: {name(t)} was entered"
    if not need:
        return None, f"{pid}: no path of the patch is served here"
    since = max(rec.watched[t].at or 0.0 for t in judged)
    seen = []
    for path in need:
        after = [f for f in rec.served(path) if (f.last or 0.0) >= since]
        if not after:
            return None, f"{pid}: no {path} forward pass after its code was watched"
        seen.append(f"{sum(f.count for f in after)} {'/'.join(f.mode for f in after)} "
                    "forward pass(es)")
    return {"pid": rec.pid, "title": rec.title, "forwards": "; ".join(seen)}, ""


def _judged(targets: list[str], gated: bool) -> list[str]:
    """The targets the not-run rule is judged on (see _not_run_in)."""
    functions = [t for t in targets if not t.endswith(":" + MODULE)]
    return [t for t in functions if proves(t, gated)] or functions


def _none(entered: list[dict], why: list[str]) -> str:
    if entered:
        return "; ".join(_unclear(e) for e in entered[:3])
    return "; ".join(dict.fromkeys(why[:4])) or "no process records"


def _unclear(entry: dict) -> str:
    """A hit that shows neither outcome, said as what it is."""
    where = f"in pid {entry['pid']} ({entry.get('title')})"
    if entry["target"].endswith(":" + MODULE):
        return f"{entry['target']} was imported {where} (loading shows no function ran)"
    if entry.get("returned") and not entry.get("via"):
        return (f"its changed upstream function {entry['target']} ran {where}, which it does "
                "with the patch's behaviour off too (a dispatcher, a branch or a gate): "
                "that shows nothing about the patch")
    if entry.get("via"):
        return (f"its enclosing {entry['via']} ran {where}; whether {entry['target']} ran "
                "is unknown (a nested function is watched through its enclosing one "
                "before Python 3.12)")
    raised = f" (raised {entry['raised']})" if entry.get("raised") else ""
    return f"{entry['target']} was entered {where} and never returned{raised}"


def _entry(rec: ProcessRecord, target: str, hit: Hit) -> dict:
    return {"pid": rec.pid, "title": rec.title, "target": name(target), "first": hit.first,
            "via": hit.via, "raised": hit.raised, "modes": sorted(hit.modes),
            "returned": hit.returned}


def modes_ran(server: Server, patch: str, gated: bool = False) -> dict[str, list[int]]:
    """Forward mode (`-`: outside any forward) -> pids where a target of `patch` that
    proves its code ran was called in it (entered: being called in a mode is the fact)."""
    out: dict[str, list[int]] = {}
    for rec in parsed(server):
        for target in rec.mine(patch):
            hit = rec.hits.get(target)
            if hit is None or hit.via is not None or target.endswith(":" + MODULE) or \
                    not proves(target, gated):
                continue
            for mode in hit.modes:
                out.setdefault(mode, [])
                if rec.pid is not None and rec.pid not in out[mode]:
                    out[mode].append(rec.pid)
    return out


def path_disagreement(path: str | None, modes: dict[str, list[int]]) -> str | None:
    """A patch tagged prefill (decode) whose code ran in a decode (extend) forward."""
    if path not in PATH_MODES:
        return None
    other = "decode" if path == "prefill" else "prefill"
    wrong = sorted(m for m in modes if m in PATH_MODES[other] - PATH_MODES[path])
    if not wrong:
        return None
    pids = sorted({p for m in wrong for p in modes[m]})
    return (f"tagged path {path}, but its code ran in {'/'.join(wrong)} forward passes "
            f"(pid {', '.join(map(str, pids))}): it serves {other} too")


def loaded(server: Server) -> list[str] | None:
    """The patches (`name:sha12`) the server's processes loaded at start: its main
    process's PATCHSET_PATCHES (what deploy started it with); None when unknown."""
    env = server.main.environ
    if env.known and env.value.get(PATCHES_VAR) is not None:
        return env.value[PATCHES_VAR].split()
    for rec in records(server):
        if rec.get("started_with"):
            return str(rec["started_with"]).split()
    return None


def unavailable(server: Server) -> list[tuple[int | None, str]]:
    """(pid, why) for every note of a record that tracing failed somewhere."""
    return [(rec.get("pid"), why) for rec in records(server)
            for why in rec.get("unavailable") or []]


def describe(entry: dict) -> str:
    via = f" (via {entry['via']})" if entry.get("via") else ""
    modes = [m for m in entry.get("modes") or () if m != OUTSIDE]
    where = f" in {'/'.join(modes)} forward passes" if modes else ""
    return f"{entry['target']}{via} ran{where} in pid {entry['pid']} ({entry.get('title')})"


def is_marker(patches: Iterable[str]) -> bool:
    return FORWARD in set(patches)


def _items(value: Any) -> list[tuple[Any, Any]]:
    return list(value.items()) if isinstance(value, dict) else []


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _watch(value: Any) -> Watch:
    if isinstance(value, str):                      # format 1: how only
        return Watch(value, None)
    if not isinstance(value, dict):
        return Watch(None, None, "no watch entry")
    how = value.get("how")
    return Watch(str(how) if how else None, _num(value.get("at")),
                 str(value["why"])[:200] if value.get("why") else None)


def _hit(value: Any) -> Hit:
    v = value if isinstance(value, dict) else {}
    modes = {str(m): t for m, t in _items(v.get("modes")) if _num(t) is not None}
    return Hit(_num(v.get("first")), _num(v.get("returned")),
               str(v["raised"])[:64] if v.get("raised") else None,
               str(v["via"]) if v.get("via") else None, modes)


def _forward(mode: str, value: Any) -> Forward:
    v = value if isinstance(value, dict) else {}
    count = v.get("count")
    return Forward(mode, _num(v.get("first")), _num(v.get("last")),
                   count if isinstance(count, int) and not isinstance(count, bool) else 0)
