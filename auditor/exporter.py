"""`patchset serve`: the audit as a Prometheus exporter (the way goss `serve` is one).

One worker thread per host re-audits it on a schedule, so hosts run in parallel and a
host never has two audits in flight. After a successful audit the next starts `interval`
after this one started; after a failed one (unreachable, facts not gathered, the audit
raised) the wait doubles with every consecutive failure, from `interval` up to
`max_backoff` (8 intervals by default), and the first success resets it.

A scrape never waits for an audit: each finished audit rebuilds, under a lock of its own,
the report of every host (`/report.json`) and its metric families (auditor/metrics.py);
a scrape takes the latest of both under a lock held only to copy two references and the
workers' counters, then serializes them. `/healthz` says whether every worker is alive.

A worker gathers its host (`gather(host) -> Gathered`: facts, and probe records with
--probe); the report is evaluated from every host's latest gathering together
(`evaluate(list of Gathered) -> report dict`), so it is the report `patchset audit` of all
the hosts gives: pd-consistency pairs servers across hosts, a waiver is unused only when
no host used it, and the summary and the exit code follow the one rule. Until every host
has finished its first audit (reachable or not) nothing is published: /report.json answers
503 naming the hosts still pending, and /metrics has the exporter's own series (and the
last success of the hosts audited). Both are passed in: the CLI builds them on the
transports and probes it holds (cli/serve.py), tests and bench feed fixture facts,
and this read-only package never imports the code that reaches hosts.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Callable

from patchset.errors import PatchsetError, UsageError

from . import httpd, metrics
from .api import Gathered
from .model import HostFacts

DEFAULT_LISTEN = "127.0.0.1:9808"
DEFAULT_INTERVAL = 300.0
BACKOFF_CAP = 8                       # max_backoff, in intervals, unless given
MIN_INTERVAL, MAX_INTERVAL = 0.5, 7 * 24 * 3600.0
ERROR_REASONS = ("unreachable", "gather", "error")   # audit_errors_total's reason label
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

Gather = Callable[[str], Gathered]
Evaluate = Callable[[list[Gathered]], dict]


def parse_duration(text: str, flag: str = "--interval") -> float:
    """`300`, `30s`, `5m`, `1h`, `500ms` -> seconds, within MIN_INTERVAL..MAX_INTERVAL.
    ASCII digits only: `\\d` and float() take `５m` and `٥m` too."""
    found = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)?", text.strip())
    seconds = float(found.group(1)) * UNITS[found.group(2) or "s"] if found else None
    if seconds is None or not MIN_INTERVAL <= seconds <= MAX_INTERVAL:
        raise UsageError(f"{flag} {text!r}: use a duration like 30s, 5m or 1h "
                         f"({MIN_INTERVAL:g}s to one week)")
    return seconds


def base_url(address: str, port: int) -> str:
    """Where the exporter answers, as a URL (an IPv6 address in brackets, as --listen
    takes it)."""
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def parse_listen(text: str, public: bool = False) -> tuple[str, int]:
    """`ADDRESS:PORT` (`[::1]:9808` for IPv6). Only a loopback address unless `public`:
    the report names hosts, paths and patches to whoever can connect. The port in ASCII
    digits (int() would read `٩٨٠٨` as 9808)."""
    found = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:([0-9]{1,5})|([^\s:\[\]]+):([0-9]{1,5})",
                         text)
    if not found:
        raise UsageError(f"--listen {text!r}: use ADDRESS:PORT, e.g. {DEFAULT_LISTEN}")
    address = found.group(1) or found.group(3)
    port = int(found.group(2) or found.group(4))
    if not 0 < port < 65536:
        raise UsageError(f"--listen {text!r}: port {port} is not 1-65535")
    if address != "localhost":
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            raise UsageError(f"--listen {text!r}: use an IP address or localhost") from None
        if not ip.is_loopback and not public:
            raise UsageError(f"--listen {text!r} is not a loopback address: the report and "
                             "metrics name hosts, paths and patches; add --public to "
                             "serve them beyond this machine")
    return address, port


def backoff(interval: float, failures: int, cap: float) -> float:
    """The wait after `failures` consecutive failed audits: interval, 2x, 4x, ... <= cap."""
    if failures <= 0:
        return interval
    return min(cap, interval * 2.0 ** min(failures - 1, 30))


@dataclasses.dataclass
class HostState:
    gathered: Gathered | None = None     # the latest audit's gathering of this host
    last_success: float | None = None
    last_duration: float = 0.0
    audits: int = 0
    errors: Counter = dataclasses.field(default_factory=Counter)
    failures: int = 0                    # consecutive
    in_progress: bool = False
    next_at: float | None = None
    # (server id) -> ((pid, started), {patch: state}): the first audit of its process
    deployed: dict = dataclasses.field(default_factory=dict)


class Exporter:
    """The schedule, the last reports and what a scrape reads; `serve` adds HTTP."""

    def __init__(self, hosts: list[str], gather: Gather, evaluate: Evaluate,
                 interval: float = DEFAULT_INTERVAL, max_backoff: float | None = None,
                 clock: Callable[[], float] = time.time,
                 log: Callable[[str], None] | None = None) -> None:
        self.hosts = list(dict.fromkeys(hosts))
        self.gather, self.evaluate = gather, evaluate
        self.interval = interval
        self.max_backoff = max(interval, max_backoff if max_backoff is not None
                               else BACKOFF_CAP * interval)
        self.clock, self.log = clock, log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.started = clock()
        self.state = {h: HostState() for h in self.hosts}
        self._lock = threading.Lock()           # the state and the published snapshot
        self._rebuild_lock = threading.Lock()   # one rebuild at a time (never a scrape)
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._server: httpd.Server | None = None
        self._report: dict | None = None
        self._report_json = b""
        self._families: list = []

    # ------------------------------------------------------------ auditing

    def audit_once(self, host: str) -> float:
        """One audit of `host` (its state, the published report and families updated);
        returns the seconds to wait before the next one."""
        st = self.state[host]
        with self._lock:
            st.in_progress = True
        start = self.clock()
        try:
            got = self.gather(host)
            reason = None if got.facts.reachable and not got.facts.error else (
                "unreachable" if not got.facts.reachable else "gather")
        except Exception as exc:  # noqa: BLE001 - a failed audit is a metric, not a crash
            message = self._failure(host, "audit", exc)
            got, reason = Gathered(HostFacts(host=host, error=f"audit failed: {message}")), \
                "error"
        end = self.clock()
        with self._lock:
            st.gathered, st.in_progress = got, False
            st.audits += 1
            st.last_duration = end - start
            if reason is None:
                st.failures, st.last_success = 0, end
            else:
                st.failures += 1
                st.errors[reason] += 1
            period = backoff(self.interval, st.failures, self.max_backoff)
            wait = max(0.0, start + period - end)
            st.next_at = end + wait
        if reason is not None:
            self.log(f"{host}: {reason}; next audit in {wait:.0f}s "
                     f"({st.failures} failure(s) in a row)")
        self.publish(host if reason is None else None)
        return wait

    def _failure(self, host: str, what: str, exc: Exception) -> str:
        """Log a failure (its trace too when it is a bug), secrets redacted; the message."""
        from patchset.agent.lib.redact import redact_text
        message = redact_text(" ".join(str(exc).split()) or type(exc).__name__)
        self.log(f"{host}: {what} failed: {message}")
        if not isinstance(exc, PatchsetError):
            self.log(redact_text(traceback.format_exc()).rstrip())
        return message

    def publish(self, succeeded: str | None = None) -> None:
        """Evaluate every host's latest gathering as one audit and swap the report and its
        families in (a scrape in between serves the previous ones, whole). Nothing is
        published until every host has finished its first audit: a report of some hosts
        would call a waiver of the others unused and pair servers across half the hosts.
        `succeeded`: the host whose audit just succeeded, for the failure log."""
        with self._rebuild_lock:
            with self._lock:
                parts = [self.state[h].gathered for h in self.hosts]
            ready = [p for p in parts if p is not None]
            if len(ready) < len(parts):
                return
            try:
                data = self.evaluate(ready)
            except Exception as exc:  # noqa: BLE001 - keep serving the last good report
                self._failure(succeeded or "report", "evaluation", exc)
                return
            with self._lock:
                entries = {h["host"]: h for h in data["hosts"]}
                for host, st in self.state.items():
                    if st.failures == 0 and st.last_success is not None and host in entries:
                        _track_deployed(st, entries[host])
                success = {h: st.last_success for h, st in self.state.items()
                           if st.last_success is not None}
                deployed = {(h, sid): dict(states) for h, st in self.state.items()
                            for sid, (_, states) in st.deployed.items()}
            families = list(metrics.report_families(data, success, deployed))
            body = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
            with self._lock:
                self._report, self._report_json, self._families = data, body, families

    def pending(self) -> list[str]:
        """The hosts whose first audit has not finished (no report until it has)."""
        with self._lock:
            return [h for h in self.hosts if self.state[h].gathered is None]

    def _work(self, host: str) -> None:
        while not self._stop.is_set():
            wait = self.audit_once(host)
            if self._stop.wait(wait):
                return

    def start(self) -> None:
        for host in self.hosts:
            worker = threading.Thread(target=self._work, args=(host,), daemon=True,
                                      name=f"patchset-serve {host}")
            worker.start()
            self._workers.append(worker)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        deadline = time.monotonic() + timeout
        for worker in self._workers:           # an audit in flight finishes or is left
            worker.join(max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------ what a scrape reads

    def families(self) -> list:
        """The published report families plus the exporter's own (schedule, counters)."""
        with self._lock:
            published = list(self._families)
            live = {h: dataclasses.replace(st, errors=Counter(st.errors), gathered=None,
                                           deployed={})
                    for h, st in self.state.items()}
        fam = metrics.Families()
        if not published:       # a host still in its first audit holds the report back:
            for h, st in live.items():      # the others' successes are still shown
                if st.last_success is not None:
                    metrics.last_success_gauge(fam, h, st.last_success)
        fam.gauge("audit_interval_seconds", "seconds between the audits of a host "
                  "(--interval)", (), (), self.interval)
        fam.gauge("exporter_start_time_seconds", "when `patchset serve` started", (), (),
                  self.started)
        for h, st in live.items():
            fam.counter("audits", "audits of the host finished (successful or not)",
                        ("host",), (h,), st.audits)
            for reason in ERROR_REASONS:
                fam.counter("audit_errors", "audits that did not succeed, by why: "
                            "unreachable, gather (the agent gave no facts), error (the "
                            "audit raised)", ("host", "reason"), (h, reason),
                            st.errors.get(reason, 0))
            fam.gauge("audit_in_progress", "1 while an audit of the host runs", ("host",),
                      (h,), st.in_progress)
            fam.gauge("audit_duration_seconds", "how long the host's last audit took "
                      "(gather, checks and probes)", ("host",), (h,), st.last_duration)
            fam.gauge("audit_consecutive_failures", "failed audits of the host since its "
                      "last success (the backoff doubles with each)", ("host",), (h,),
                      st.failures)
            if st.next_at is not None:
                fam.gauge("audit_next_timestamp_seconds", "when the host's next audit "
                          "starts", ("host",), (h,), st.next_at)
        return published + list(fam)

    def metrics_text(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type) of /metrics, in the format the scraper asks for."""
        from prometheus_client import CollectorRegistry
        from prometheus_client.exposition import choose_encoder
        registry = CollectorRegistry(auto_describe=False)
        registry.register(metrics.collector(self.families()))
        try:
            encoder, content_type = choose_encoder(accept or "")
        except (TypeError, ValueError, LookupError):   # `version=abc` is a TypeError there
            # RFC 9110 12.5.1: an Accept the server cannot honour may be disregarded; a
            # scraper is better served the default format than a 406 or nothing
            encoder, content_type = choose_encoder("")
        return encoder(registry), content_type

    def report_json(self) -> bytes:
        with self._lock:
            return self._report_json

    def health(self) -> tuple[int, dict]:
        with self._lock:
            hosts = {h: {"audits": st.audits, "in_progress": st.in_progress,
                         "consecutive_failures": st.failures,
                         "last_success": st.last_success} for h, st in self.state.items()}
        dead = [w.name for w in self._workers if not w.is_alive()]
        ok = not dead and not self._stop.is_set()
        return (200 if ok else 503), {"status": "ok" if ok else "stopping" if not dead
                                      else "worker stopped", "hosts": hosts}

    # ------------------------------------------------------------ HTTP

    def serve(self, address: str, port: int, client_timeout: float = httpd.CLIENT_TIMEOUT,
              max_connections: int = httpd.MAX_CONNECTIONS) -> tuple[str, int]:
        """Listen on (address, port) in a thread of its own (auditor/httpd.py: a deadline
        per connection, a connection cap, 4xx for what it cannot serve); returns where it
        listens (port 0: a free one). A bind that fails is a UsageError naming the
        address."""
        routes: dict[str, httpd.Route] = {
            "/metrics": self._metrics_route, "/report.json": self._report_route,
            "/healthz": self._health_route,
            "/": lambda _: (200, b"patchset serve: /metrics /report.json /healthz\n",
                            httpd.TEXT)}
        try:
            self._server = httpd.start(address, port, routes, client_timeout=client_timeout,
                                       max_connections=max_connections, log=self.log)
        except OSError as exc:
            raise UsageError(f"--listen {address}:{port}: cannot listen there: "
                             f"{exc.strerror or exc}") from None
        listening, bound = self._server.server_address[:2]
        assert isinstance(listening, str)           # an IP address: a TCP server's
        return listening, bound

    def _metrics_route(self, accept: str | None) -> tuple[int, bytes, str]:
        body, ctype = self.metrics_text(accept)
        return 200, body, ctype

    def _report_route(self, _accept: str | None) -> tuple[int, bytes, str]:
        body = self.report_json()
        if body:
            return 200, body, "application/json"
        doc = {"error": "waiting for the first audit of every host", "pending": self.pending()}
        return 503, (json.dumps(doc) + "\n").encode(), "application/json"

    def _health_route(self, _accept: str | None) -> tuple[int, bytes, str]:
        code, doc = self.health()
        return code, (json.dumps(doc, sort_keys=True) + "\n").encode(), "application/json"


def _track_deployed(st: HostState, host: dict) -> None:
    """Record each server's patch states at the first audit of its current process
    (pid and start time): deploy and every restart start a new one. Servers gone from the
    host are forgotten, so the record stays as large as the host."""
    states: dict[str, dict[str, str]] = {}
    for s in host.get("states", []):
        states.setdefault(s.get("server") or "", {})[s["patch"]] = s["state"]
    procs = {s["id"]: (s.get("pid"), s.get("started"))
             for s in (host.get("facts") or {}).get("servers") or []}
    current = {}
    for sid, patches in states.items():
        proc = procs.get(sid)
        held = st.deployed.get(sid)
        current[sid] = held if held is not None and held[0] == proc else (proc, patches)
    st.deployed = current
