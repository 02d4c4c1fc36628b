"""The serve command: the audit as a Prometheus exporter (auditor/exporter.py)."""

from pathlib import Path
from typing import List, Optional

import typer

from .app import app, audit_access, load, load_waivers, resolver_for
from .options import (AcceptNewOpt, ApiKeyEnvOpt, AuditProbeOpt, InventoryOpt, NoWaiversOpt,
                      ProbeTimeoutOpt, RequestSecondsOpt, SeriesOpt, SizesOpt, TargetOpt,
                      WaiversOpt)
from .render import say


@app.command()
def serve(hosts: List[str] = typer.Argument(..., help="inventory name, user@host[:port] or "
                                            "localhost; each is audited on its own schedule"),
          listen: str = typer.Option("127.0.0.1:9808", "--listen", help="ADDRESS:PORT to "
                                     "serve /metrics, /report.json and /healthz on (a "
                                     "loopback address unless --public)"),
          public: bool = typer.Option(False, "--public", help="allow a --listen address "
                                      "that is not loopback: whoever can connect reads host "
                                      "names, paths and patch names (never secrets)"),
          interval: str = typer.Option("5m", "--interval", help="time between the audits "
                                       "of a host (30s, 5m, 1h); an unreachable host waits "
                                       "twice as long after each failure, up to 8 intervals"),
          client_timeout: float = RequestSecondsOpt(10.0, "--client-timeout", help="seconds "
                                                    "a client's connection may take, "
                                                    "request and answer together; an "
                                                    "idle or slow one is closed then"),
          probe: Optional[str] = AuditProbeOpt,
          probe_sizes: Optional[str] = SizesOpt("--probe-sizes"),
          api_key_env: Optional[str] = ApiKeyEnvOpt, probe_timeout: float = ProbeTimeoutOpt,
          waivers: Optional[Path] = WaiversOpt, no_waivers: bool = NoWaiversOpt,
          target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
          accept_new: bool = AcceptNewOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Re-audit the hosts on a schedule (in parallel, one audit in flight per host) and
    serve the last report as Prometheus metrics on /metrics, the report itself on
    /report.json and the exporter's health on /healthz; a scrape never waits for an
    audit. The waivers file is read once, at start. Runs until SIGTERM or Ctrl-C."""
    import signal
    import threading

    from patchset.auditor import api, exporter, policy
    from patchset.auditor.cohorts import from_inventory as cohorts_from
    from patchset.auditor.report import to_dict
    from patchset.isolate.measure.probe import audit_probes
    s = load(series)
    period = exporter.parse_duration(interval)
    address, port = exporter.parse_listen(listen, public)
    waived = load_waivers(waivers, no_waivers)
    specs = list(dict.fromkeys(hosts))
    with resolver_for(s, inventory, target, accept_new) as resolver:    # bad input: exit 2
        for spec in specs:
            resolver.inventory.resolve(spec)
        audit_probes(probe, probe_sizes, api_key_env, probe_timeout, resolver.inventory,
                     specs, resolver.endpoint)
        steps = audit_access(resolver.inventory, specs, inventory, series)
        cohorts = cohorts_from(resolver.inventory, s)       # bad input: exit 2
    pol = policy.load()
    request = api.gather_request(s, pol)

    def gather(host: str) -> api.Gathered:
        with resolver_for(s, inventory, target, accept_new) as resolver:
            plan = audit_probes(probe, probe_sizes, api_key_env, probe_timeout,
                                resolver.inventory, [host], resolver.endpoint)
            return api.gather(resolver.audit_transport(host), request, plan)

    def evaluate(gathered: List[api.Gathered]) -> dict:
        return to_dict(api.evaluate_gathered(s, gathered, None, steps, pol, waived,
                                             cohorts=cohorts))

    server = exporter.Exporter(specs, gather, evaluate, period, log=say)
    where = server.serve(address, port, client_timeout)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    say(f"patchset serve: {exporter.base_url(*where)}/metrics, {len(specs)} host(s) "
        f"every {period:g}s")
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
    say("patchset serve: stopped")
