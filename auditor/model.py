"""Plain dataclasses between the audit's stages: host facts -> patch states -> findings ->
suspects -> report. Nothing here does I/O; every stage can be printed as JSON."""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
from dataclasses import dataclass, field
from typing import Any

from patchset.agent.lib.facts.base import FactValue, Provenance

STATES = ("active", "inert", "gated-off", "not-applied", "drifted", "unknown")
SEVERITIES = ("high", "medium", "low", "info")
# A finding's status; `waived` (report 1.4): a non-passing one a waiver accepts.
STATUSES = ("fail", "warn", "unknown", "waived", "pass")
COUNTED = ("fail", "warn", "unknown")    # what makes exit code 1, unless severity info


def counted(status: str, severity: str) -> bool:
    """Whether a finding counts in the exit code (and as a JUnit failure or error): it did
    not pass, is not waived, and is not an `info` note."""
    return status in COUNTED and severity != "info"


# ---------------------------------------------------------------- facts of one host

@dataclass
class Proc:
    pid: int
    title: str                       # "sglang::scheduler_TP0", or the main command line
    started: float | None            # epoch seconds (from /proc/PID/stat and btime)
    environ: FactValue               # {NAME: value}
    cmdline: FactValue | None = None  # [argv] (main processes)


@dataclass
class Unit:
    name: str
    show: FactValue                  # systemctl show properties (+ environment, exec_argv)
    file: FactValue | None           # the fragment: {"sections": ..., "stat": ...}
    env_files: dict[str, FactValue] = field(default_factory=dict)

    def x(self, key: str) -> str | None:
        """An `X-Patchset-*` key deploy wrote into the unit's [Service] section."""
        if self.file is None or not self.file.known:
            return None
        values = self.file.value["sections"].get("Service", {}).get(key)
        return values[-1] if values else None


@dataclass
class Server:
    """One running SGLang process tree (a launch_server main + its scheduler children)."""

    id: str                          # the unit name, or "pid N" when not under systemd
    kind: str                        # server | router
    unit: str | None
    main: Proc
    children: list[Proc]
    exe: str | None = None
    cwd: str | None = None
    base_url: str | None = None
    server_info: FactValue = field(default_factory=lambda: FactValue.unknown("not gathered"))
    model_info: FactValue = field(default_factory=lambda: FactValue.unknown("not gathered"))
    health: FactValue = field(default_factory=lambda: FactValue.unknown("not gathered"))
    imports: FactValue = field(default_factory=lambda: FactValue.unknown("not gathered"))
    model: str | None = None
    config_file: FactValue | None = None   # `--config FILE`: {"keys", "stat"} (no values)
    trace: FactValue = field(default_factory=lambda: FactValue.unknown(
        "tracing off: no PATCHSET_TRACE_DIR in the server's environ"))   # tracer records
    server_args_log: FactValue = field(default_factory=lambda: FactValue.unknown(
        "not gathered"))   # the server_args= line it logged at startup (journal, redacted)

    @property
    def argv(self) -> list[str]:
        return list(self.main.cmdline.value) if self.main.cmdline and self.main.cmdline.known \
            else []

    @property
    def schedulers(self) -> list[Proc]:
        return [c for c in self.children if c.title.startswith("sglang::scheduler")]


@dataclass
class Checkpoint:
    model: str                       # as the server names it (path or hub id)
    path: str | None                 # the directory on the host
    how: str                         # how it was resolved, or why not
    config: FactValue
    hf_quant: FactValue
    index: FactValue
    tensors: FactValue               # {name: {dtype, shape, shard}}
    header_reads: list[dict] = field(default_factory=list)   # per shard: bytes read


@dataclass
class HostFacts:
    host: str
    reachable: bool = True
    error: str | None = None
    hostname: str | None = None
    clock: FactValue = field(default_factory=lambda: FactValue.unknown("not gathered"))
    gpus: FactValue = field(default_factory=lambda: FactValue.unknown("not gathered"))
    tree: FactValue = field(default_factory=lambda: FactValue.unknown("not gathered"))
    unit_list: FactValue = field(default_factory=lambda: FactValue.unknown("not gathered"))
    units: dict[str, Unit] = field(default_factory=dict)
    servers: list[Server] = field(default_factory=list)
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    duration_ms: float = 0.0

    def server(self, server_id: str) -> Server | None:
        return next((s for s in self.servers if s.id == server_id), None)

    @property
    def sglang_servers(self) -> list[Server]:
        return [s for s in self.servers if s.kind == "server"]


# ---------------------------------------------------------------- what the audit concludes

@dataclass(frozen=True)
class Condition:
    """One declared condition of a patch, evaluated: ok True / False / None (unknown)."""

    fact: str
    op: str
    value: Any
    found: Any
    ok: bool | None
    why: str = ""
    source: str = ""
    reason: str = ""                 # why `found` is unknown


EVIDENCE = ("observed", "declared")


@dataclass(frozen=True)
class PatchState:
    patch: str
    host: str
    server: str | None               # server id (unit), None for host-level states
    state: str                       # one of STATES
    reason: str
    conditions: tuple[Condition, ...] = ()
    # since report 1.2: how the state is known. observed: the tracer saw its code run
    # (or saw the server serve work without it running); declared: from `requires` only
    evidence: str = "declared"
    ran: tuple[dict, ...] = ()       # {pid, title, target, first, via} of its targets
    declared: str | None = None      # the declared state, when the observation overrode it
    contradiction: str | None = None  # declared-active-not-run | inert-but-ran
    # since 1.6: with tracing on, why there is no evidence either way (auditor/observed.py)
    observation: str | None = None
    modes: tuple[str, ...] = ()      # forward modes its code was seen running in


@dataclass(frozen=True)
class Evidence:
    what: str
    value: Any = None
    command: str | None = None
    exit_code: int | None = None
    duration_ms: float | None = None

    @classmethod
    def of(cls, what: str, fact: FactValue | None, value: Any = None) -> Evidence:
        prov: Provenance | None = fact.provenance if fact else None
        shown = value if value is not None or fact is None else \
            (fact.value if fact.known else f"unknown: {fact.reason}")
        return cls(what, shown, prov.command if prov else None,
                   prov.exit_code if prov else None, prov.duration_ms if prov else None)


@dataclass(frozen=True)
class Finding:
    """One check result (goss/InSpec style): the single record every renderer takes."""

    id: str                          # check id, with a sub-tag: "gate-env[process]"
    host: str
    subject: str                     # what it is about: "sglang-decode.service MMA_FLASHMLA"
    expected: Any
    found: Any
    status: str                      # pass | fail | warn | unknown | waived
    severity: str                    # high | medium | low | info
    message: str = ""
    evidence: tuple[Evidence, ...] = ()
    patches: tuple[str, ...] = ()    # patches this finding implicates (for ranking)
    waiver: Waived | None = None     # status waived: the waiver and the status it had


@dataclass(frozen=True)
class NextStep:
    """One isolation step the ranking suggests, cheapest first (a suspect's, the report's)."""

    cost: int                        # 1 toggle a gate, 2 revert a patch, 3 run a probe
    kind: str                        # toggle-gate | revert | probe | restart | fix
    title: str
    command: str
    why: str = ""


# ---------------------------------------------------------------- waivers (auditor/waivers.py)

@dataclass(frozen=True)
class Waiver:
    """One entry of a waivers file."""

    id: str                          # a finding id, with its sub-tag
    host: str                        # exact or glob, against Finding.host
    subject: str                     # exact or glob, against Finding.subject
    justification: str
    who: str
    expires: datetime.date           # valid through this day (UTC), expired after it
    line: int                        # where it starts in its file

    def matches(self, finding: Finding) -> bool:
        return finding.id == self.id and match(self.host, finding.host) \
            and match(self.subject, finding.subject)

    def expired(self, today: datetime.date) -> bool:
        return today > self.expires


@dataclass(frozen=True)
class Waived:
    """What a waived finding carries (Finding.waiver, report 1.4)."""

    status: str                      # the finding's status before the waiver
    justification: str
    who: str
    expires: str                     # YYYY-MM-DD
    file: str
    line: int


@dataclass(frozen=True)
class WaiverUse:
    """A waiver and the findings it matched (waived, or would have if not expired)."""

    waiver: Waiver
    findings: tuple[tuple[str, str, str], ...] = ()     # (host, id, subject)


@dataclass(frozen=True)
class WaiverReport:
    """The report's `waivers` section."""

    file: str
    applied: tuple[WaiverUse, ...]
    expired: tuple[WaiverUse, ...]
    unused: tuple[WaiverUse, ...]

    def to_dict(self) -> dict:
        def one(use: WaiverUse) -> dict:
            w = dataclasses.asdict(use.waiver)
            w["expires"] = use.waiver.expires.isoformat()
            w["findings"] = [{"host": h, "id": i, "subject": s} for h, i, s in use.findings]
            return w
        return {"file": self.file, "applied": [one(u) for u in self.applied],
                "expired": [one(u) for u in self.expired],
                "unused": [one(u) for u in self.unused]}


def match(pattern: str, value: str) -> bool:
    """Exact, or an fnmatch glob (case-sensitive)."""
    return pattern == value or fnmatch.fnmatchcase(value, pattern)


# ---------------------------------------------------------------- measured (--measured)

HOW_ATTRIBUTED = ("measured", "inferred")          # a contribution with a value
HOW_CLEARED = ("cleared-group", "not-needed")      # taken out with a group: no value
HOW_UNDECIDED = ("undecided",)      # neither told from the noise nor bounded: not cleared


@dataclass(frozen=True)
class Contribution:
    """One suspect's drift as a bisect by drift attributed it (isolate/search/driftsearch.py)."""

    suspect: str
    value: float | None              # the drift it carries; None: cleared with its group
    low: float                       # the interval (value +- k standard errors)
    high: float
    how: str                         # measured | inferred | cleared-group | not-needed
    above: bool = False              # told from the noise by the bisect: it carries drift


@dataclass(frozen=True)
class MeasuredStep:
    """One test state of that bisect: the change, its A/B drift against the start."""

    number: int
    change: str
    ab: float | None                 # mean A/B drift of the state's tokens vs the start's
    cleared: bool | None             # its own prefill-vs-decode drift bounded (older: not above)


@dataclass(frozen=True)
class Measured:
    """A `patchset bisect HOST --probe drift` report given to the audit (`--measured
    FILE`, parsed by auditor/measured.py): which suspects carry the drift, in numbers."""

    source: str                      # the file, as given
    host: str
    id: str                          # the bisect's id
    probe: str                       # drift
    symptom: str                     # the symptom the bisect ranked its candidates for
    threshold: float | None          # the search's noise threshold, when the report has it
    contributions: tuple[Contribution, ...]
    steps: tuple[MeasuredStep, ...]
    culprit: str | None
    verdict: str
    ranks: bool = True               # it orders the suspects (the symptom's measured_by)
    recorded: bool = True            # `above` as the search recorded it (else by threshold)

    def contribution(self, suspect: str) -> Contribution | None:
        return next((c for c in self.contributions if c.suspect == suspect), None)


@dataclass(frozen=True)
class MeasuredContribution:
    """A suspect's measured contribution on one host, as the suspect carries it."""

    host: str
    bisect: str                      # the bisect's id
    source: str                      # the file it came from
    value: float | None
    low: float
    high: float
    how: str
    threshold: float | None          # what judged it; None: its own error (k standard errors)
    above: bool                      # told from the noise: it carries drift


@dataclass(frozen=True)
class Suspect:
    rank: int
    kind: str                        # patch | hazard | check
    name: str
    score: float                     # the prior weights' product (symptoms.yaml)
    reasons: tuple[str, ...]
    steps: tuple[NextStep, ...] = ()
    measured: tuple[MeasuredContribution, ...] = ()   # --measured: per measured host


@dataclass(frozen=True)
class SymptomReport:
    name: str
    title: str
    suspects: tuple[Suspect, ...]
    next_steps: tuple[NextStep, ...]
    measured: tuple[Measured, ...] = ()   # the --measured bisect reports


# ---------------------------------------------------------------- fidelity probes (--probe)

PROBE_EVIDENCE = "fidelity probe"   # `what` of the evidence that carries a probe's record
PROBES = ("recall", "needle", "drift")   # ProbeResult.probe: the sub-tags of probe[...]


@dataclass
class ProbeResult:
    """One probe's verdict with the evidence it rests on (what was sent, what was seen).
    The audit carries these records (hosts[].probes, probe[...] findings); isolate.probe
    runs the probes and fills them, so this read-only package never sends a request."""

    probe: str                    # one of PROBES
    name: str                     # "recall", "needle@8k"
    ok: bool
    reason: str
    expected: str                 # the planted token
    answer: str = ""
    size_tokens: int | None = None   # the size asked for (needle)
    words_sent: int = 0           # words of every message's content
    prompt_tokens: int | None = None  # what the server says it saw (usage)
    latency_ms: float = 0.0
    turns: int = 0                # user turns sent
    tools: bool = False           # tool definitions were in the request
    error: str | None = None
    unreachable: bool = False
    url: str = ""                 # the endpoint it was sent to (audit reports mix hosts)
    drift: dict | None = None     # probe "drift": the figures (isolate.drift DriftReport)
    inconclusive: bool = False    # since 1.6: drift neither above nor bounded (status unknown)


def size_label(size: int) -> str:
    """8192 -> `8k`, as the sizes are written on the command line."""
    return f"{size // 1024}k" if size % 1024 == 0 else str(size)


@dataclass
class HostReport:
    host: str
    facts: HostFacts
    states: list[PatchState] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)


@dataclass(frozen=True)
class CohortMember:
    """Since report 1.7: one server of a cohort and the hash of what it runs (applied
    patches and hashes, tree, gates in its process, loaded patches; auditor/cohorts.py),
    `unknown` when one of those is; the exporter labels the server with both."""

    host: str
    server: str                      # unit or "pid N"; "-" when no server runs there
    role: str
    cohort: str
    hash: str


@dataclass
class Report:
    schema_version: str
    tool_version: str
    generated: str
    series: dict
    hosts: list[HostReport]
    symptom: SymptomReport | None = None
    waivers: WaiverReport | None = None     # the waivers file read (auditor/waivers.py)
    cohorts: list[CohortMember] = field(default_factory=list)   # since 1.7

    @property
    def findings(self) -> list[Finding]:
        return [f for h in self.hosts for f in h.findings]
