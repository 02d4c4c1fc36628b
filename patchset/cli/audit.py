"""The audit command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from .app import (AcceptNewOpt, InventoryOpt, SecondsOpt, SeriesOpt, TargetOpt, app, load,
                  output_file, resolver_for, say, write_atomic)



# ---------------------------------------------------------------- audit (live facts, checks)

@app.command()
def audit(hosts: List[str] = typer.Argument(..., help="inventory name, user@host[:port] or "
                                            "localhost; several run in parallel"),
          symptom: Optional[str] = typer.Option(None, "--symptom", help="rank suspects for "
                                                "context-loss | decode-quality | throughput"),
          fmt: str = typer.Option("terminal", "--format", help="terminal | md | html | json "
                                  "| junit"),
          output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the "
                                                "report to FILE instead of stdout",
                                                callback=output_file),
          probe: Optional[str] = typer.Option(None, "--probe", help="also run context-"
                                              "fidelity probes against each host's endpoint: "
                                              "recall | needle | all"),
          probe_sizes: Optional[str] = typer.Option(None, "--probe-sizes", help="needle "
                                                    "prompt sizes in tokens [8k,16k,32k]"),
          api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="read the "
                                                    "endpoint's API key from this "
                                                    "environment variable"),
          probe_timeout: float = SecondsOpt(600.0, "--probe-timeout", help="seconds per "
                                              "probe request"),
          target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
          accept_new: bool = AcceptNewOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Gather live facts (one round trip per host), give every patch its effective state,
    run the checks (and with --probe the fidelity probes of `patchset probe`), rank
    suspects for a symptom. Exit 0 clean, 1 findings (a failed probe too), 3 unreachable."""
    from auditor import cli_support
    from auditor.render import render
    from isolate.probe import audit_probes
    s = load(series)
    cli_support.check_format(fmt)
    with resolver_for(s, inventory, target, accept_new) as resolver:
        plan = audit_probes(probe, probe_sizes, api_key_env, probe_timeout,
                            resolver.inventory, hosts)
        transports = [resolver.audit_transport(h) for h in hosts]
        report, data, code = cli_support.run(s, transports, symptom, resolver.inventory, hosts,
                                             plan)
    color = fmt == "terminal" and output is None and sys.stdout.isatty()
    text = render(data, fmt, color=color)
    if output is not None:
        write_atomic(output, text)
        say(f"{cli_support.summary_line(data)}; report written to {output}")
    else:
        sys.stdout.write(text)
    if code:
        raise typer.Exit(code)
