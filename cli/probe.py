"""`patchset probe`: context-fidelity probes against a live endpoint (multi-turn recall,
long-context needle), or the drift measurement (`--kind drift`; the library:
isolate/measure/probe.py, drift.py)."""

from pathlib import Path
from typing import Optional

import typer

from ..errors import Exit, UsageError
from .app import app, output_file
from .options import (ApiKeyEnvOpt, BudgetOpt, ConfidenceOpt, InventoryOpt, JsonOpt,
                      OutputTokensOpt, RepeatsOpt, RequestSecondsOpt, SigmasOpt, SizesOpt,
                      ToleranceOpt, UrlOpt)
from .render import emit_json, say, term


@app.command()
def probe(host: Optional[str] = typer.Argument(None, help="inventory host (its router, else "
                                               "decode, role port) [or use --url]"),
          url: Optional[str] = UrlOpt,
          kind: Optional[str] = typer.Option(None, "--kind", help="recall | needle | drift "
                                             "[default: recall and needle]"),
          sizes: Optional[str] = SizesOpt("--sizes"),
          api_key_env: Optional[str] = ApiKeyEnvOpt,
          timeout: float = RequestSecondsOpt(600.0, "--timeout", help="seconds per "
                                             "request, all of it (connect to last byte)"),
          save: Optional[Path] = typer.Option(None, "--save", help="drift: keep this run's "
                                              "tokens and logprobs in FILE (for --against)",
                                              callback=output_file),
          against: Optional[Path] = typer.Option(None, "--against", help="drift: replay the "
                                                 "tokens of a saved run and report the drift "
                                                 "between the two server states"),
          repeats: int = RepeatsOpt("each sequence"),
          output_tokens: int = OutputTokensOpt,
          sigmas: float = SigmasOpt,
          tolerance: float = ToleranceOpt,
          confidence: float = ConfidenceOpt,
          budget: int = BudgetOpt,
          fmt: str = typer.Option("table", "--format", help="table | json | html"),
          inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """Context-fidelity probes (multi-turn recall with tools, long-context needle per
    size), or `--kind drift`: the server's numerics in logprobs (prefill vs decode, or A/B
    against a saved run), decided as above the noise, bounded below the tolerance or
    inconclusive. Exit 0 all pass / drift bounded, 1 a probe failed or a drift above the
    noise, 3 the endpoint could not be reached, 5 a probe could not judge (no text to
    judge by) or the drift is inconclusive at the sequences measured (it says what it
    would take)."""
    if bool(host) == bool(url):
        raise UsageError("probe: give exactly one of HOST or --url")
    if fmt not in ("table", "json", "html"):
        raise UsageError(f"--format {fmt!r}: expected table, json or html")
    fmt = "json" if as_json else fmt
    if kind == "drift":
        _probe_drift(host, url, sizes, api_key_env, timeout, save, against, repeats,
                     output_tokens, sigmas, fmt, inventory, (tolerance, confidence, budget))
        return
    if save or against:
        raise UsageError("--save and --against go with --kind drift")
    from patchset.isolate.measure.probe import (FidelitySpec, fidelity, parse_kinds,
                                                parse_sizes, parse_url)
    spec = FidelitySpec(url=parse_url(url) if url else None, host=host,
                        inventory=str(inventory) if inventory else None,
                        kinds=parse_kinds(kind), sizes=parse_sizes(sizes),
                        api_key_env=api_key_env, timeout=timeout)
    report = fidelity(spec)
    if fmt == "json":
        emit_json(report.to_json())
    else:
        _render_probe(report)
    if report.exit_code:
        raise typer.Exit(report.exit_code)


def _probe_drift(host, url, sizes, api_key_env, timeout, save, against, repeats,
                 output_tokens, sigmas, fmt, inventory, decision) -> None:
    from patchset.isolate.measure import driftview
    from patchset.isolate.measure.drift import DriftSpec, probe_drift
    from patchset.isolate.measure.probe import client_for
    from patchset.isolate.measure.probe import parse_sizes
    tolerance, confidence, budget = decision
    spec = DriftSpec(sizes=parse_sizes(sizes), output_tokens=output_tokens, repeats=repeats,
                     timeout=timeout, k=sigmas, tolerance=tolerance, confidence=confidence,
                     budget=budget)
    client = client_for(host, url, str(inventory) if inventory else None, api_key_env)
    try:
        outcome = probe_drift(client, spec, save=save, against=against, say=say)
    finally:
        client.close()
    if fmt == "json":
        emit_json(outcome.to_json())
    elif fmt == "html":
        import sys
        sys.stdout.write(driftview.html(outcome))
    else:
        for line in driftview.table(outcome):
            term().print(line, markup=False)
    if outcome.unreachable:
        raise typer.Exit(Exit.UNREACHABLE)
    code = {"above": Exit.FINDINGS, "bounded": Exit.OK}.get(
        outcome.report.verdict.outcome if outcome.report else "", Exit.INCONCLUSIVE)
    if code:
        raise typer.Exit(code)


def _render_probe(report) -> None:
    console = term()
    console.print(f"{report.host or report.url}: {report.url}", markup=False)
    for r in report.results:
        mark = "pass" if r.ok else "UNKNOWN" if r.unreachable or r.inconclusive else "FAIL"
        seen = "-" if r.prompt_tokens is None else str(r.prompt_tokens)
        console.print(f"  {mark} {r.name:<12} sent {r.words_sent} words, server saw {seen} "
                      f"tokens, {r.latency_ms:.0f} ms, answer {r.answer[:40]!r}: {r.reason}",
                      markup=False)
    unjudged = sum(r.unreachable or r.inconclusive for r in report.results)
    say(f"{sum(r.ok for r in report.results)}/{len(report.results)} probes passed"
        + (f", {unjudged} could not judge" if unjudged else ""))
