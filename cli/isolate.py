"""Isolation tools: context-fidelity probes against a live endpoint, and quilt/git interop
(export the series for other tools, import patches authored elsewhere, capture hand edits
from a host)."""

from pathlib import Path
from typing import Optional

import typer

from ..errors import Exit, UsageError
from .app import (
    AcceptNewOpt,
    ApiKeyEnvOpt,
    InventoryOpt,
    JsonOpt,
    LockWaitOpt,
    BudgetOpt,
    ConfidenceOpt,
    OutputTokensOpt,
    RichProgress,
    RequestSecondsOpt,
    SeriesOpt,
    SigmasOpt,
    ToleranceOpt,
    TargetOpt,
    app,
    emit_json,
    load,
    output_file,
    resolver_for,
    say,
    term,
)

# ---------------------------------------------------------------- probe

@app.command()
def probe(host: Optional[str] = typer.Argument(None, help="inventory host (its router, else "
                                               "decode, role port) [or use --url]"),
          url: Optional[str] = typer.Option(None, "--url", help="any OpenAI-compatible "
                                            "server, e.g. http://127.0.0.1:30000"),
          kind: Optional[str] = typer.Option(None, "--kind", help="recall | needle | drift "
                                             "[default: recall and needle]"),
          sizes: Optional[str] = typer.Option(None, "--sizes", help="prompt sizes in tokens "
                                              "[8k,16k,32k]"),
          api_key_env: Optional[str] = ApiKeyEnvOpt,
          timeout: float = RequestSecondsOpt(600.0, "--timeout", help="seconds per "
                                             "request, all of it (connect to last byte)"),
          save: Optional[Path] = typer.Option(None, "--save", help="drift: keep this run's "
                                              "tokens and logprobs in FILE (for --against)",
                                              callback=output_file),
          against: Optional[Path] = typer.Option(None, "--against", help="drift: replay the "
                                                 "tokens of a saved run and report the drift "
                                                 "between the two server states"),
          repeats: int = typer.Option(3, "--repeats", min=3, max=50, help="drift: replays "
                                      "of each sequence (their spread is the noise)"),
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


# ---------------------------------------------------------------- export / import

@app.command("export")
def export_cmd(quilt: Path = typer.Option(..., "--quilt", help="directory for the quilt "
                                          "series (series file + patches)"),
               force: bool = typer.Option(False, "--force", help="write into a non-empty "
                                          "directory"),
               as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Write the series as a quilt series (DEP-3 headers kept), in series order."""
    from dataclasses import asdict

    from patchset.authoring.interop import export_quilt
    result = export_quilt(load(series), quilt, force=force)
    if as_json:
        emit_json(asdict(result))
    else:
        for name in result.patches:
            term().print(name, markup=False)
        say(f"wrote {len(result.patches)} patches and {result.series_file}")


@app.command("import")
def import_cmd(rev_range: Optional[str] = typer.Argument(None, help="BASE..HEAD with --git"),
               quilt: Optional[Path] = typer.Option(None, "--quilt", help="a quilt patches "
                                                    "directory (with its series file)"),
               git: Optional[Path] = typer.Option(None, "--git", help="a git repository in "
                                                  "git layout (python/sglang/...)"),
               split: bool = typer.Option(False, "--split", help="--git: one patch per file "
                                          "of each commit"),
               tier: str = typer.Option("risky", "--tier", help="tier of the new patches"),
               path: str = typer.Option("both", "--path", help="path of the new patches"),
               author: Optional[str] = typer.Option(None, "--author", help="Author: for "
                                                    "patches that name none"),
               offline: bool = typer.Option(False, "--offline", help="never touch the network"),
               as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Add a quilt series or a git range to the series, re-diffed against the pin; all
    patches are checked before any file is written."""
    from dataclasses import asdict

    from patchset.authoring.interop import ImportMeta, ImportSource, import_from
    source = ImportSource(quilt=quilt, git=git, rev_range=rev_range, split=split)
    meta = ImportMeta(tier=tier, path=path, author=author)
    result = import_from(load(series), source, meta, progress=RichProgress(), offline=offline)
    if as_json:
        emit_json(asdict(result))
    else:
        for p in result.patches:
            deps = f" (depends: {', '.join(p.depends)})" if p.depends else ""
            term().print(f"{p.name}  {p.file}  from {p.source}{deps}", markup=False)
        say(f"imported {len(result.patches)} patch(es) into {result.manifest}")


# ---------------------------------------------------------------- init

@app.command("init")
def init_cmd(directory: Path = typer.Argument(Path("."), help="where patches.yaml and "
                                              "patches/ go (created if missing)"),
             pin: Optional[str] = typer.Option(None, "--pin", help="a release, NAME==VERSION "
                                               "(e.g. sglang==0.5.14)"),
             git: Optional[str] = typer.Option(None, "--git", help="upstream's git URL, to "
                                               "pin a commit (with --ref)"),
             ref: Optional[str] = typer.Option(None, "--ref", help="the commit (or a branch or "
                                               "tag: its commit is pinned)"),
             python_version: str = typer.Option("3.11", "--python-version", help="the hosts' "
                                                "Python, for the wheel"),
             platform: str = typer.Option("manylinux_2_34_x86_64", "--platform",
                                          help="the hosts' wheel platform tag"),
             offline: bool = typer.Option(False, "--offline", help="never touch the network "
                                          "(a release from the cache)"),
             as_json: bool = JsonOpt) -> None:
    """Write a valid manifest and an empty series for a pinned upstream: a release (its
    wheel's file name and sha256 resolved from the package index, or the cache offline)
    or a git commit (its layout read from the tree). Never overwrites a manifest."""
    from dataclasses import asdict

    from patchset.authoring.newseries import InitRequest, init_series
    req = InitRequest(directory=directory, requirement=pin, git_url=git, ref=ref,
                      python_version=python_version, platform=platform, offline=offline)
    result = init_series(req, progress=RichProgress())
    if as_json:
        emit_json(asdict(result))
    else:
        say(f"wrote {result.manifest}: {result.pin.name} {result.pin.version} "
            f"({result.how}), an empty series")


# ---------------------------------------------------------------- adopt

@app.command("adopt")
def adopt_cmd(host: str = typer.Argument(..., help="inventory name, user@host[:port] or "
                                         "localhost (with --target)"),
              checkout: Optional[str] = typer.Option(None, "--checkout", help="on the host: "
                                                     "the git checkout the served "
                                                     "site-packages was installed from"),
              split: bool = typer.Option(False, "--split", help="hand edits: one patch per "
                                         "file"),
              tier: str = typer.Option("risky", "--tier", help="tier of every proposed patch"),
              path: str = typer.Option("both", "--path", help="path of every proposed patch"),
              write: bool = typer.Option(False, "--write", help="write patches.yaml + "
                                         "patches/ and put the host under management (no "
                                         "served byte changes)"),
              force: bool = typer.Option(False, "--force", help="--write over a manifest "
                                         "that already holds a series (replaces it)"),
              author: Optional[str] = typer.Option(None, "--author", help="DEP-3 Author of "
                                                   "the hand edits: 'Name <email>' (commits "
                                                   "name their own)"),
              offline: bool = typer.Option(False, "--offline", help="never touch the network"),
              target: Optional[Path] = TargetOpt, inventory: Optional[Path] = InventoryOpt,
              accept_new: bool = AcceptNewOpt, as_json: bool = JsonOpt,
              series: Optional[Path] = SeriesOpt) -> None:
    """Read the unmanaged tree a host's server imports, find its base (with the files
    compared and matching) and propose a series: one patch per local commit, one for the
    hand edits (--split: per file), each with a proposed gate, trace targets and
    call-path guards. Dry run unless --write; --write changes no served byte (hashed
    before and after)."""
    from patchset.authoring.adopt import AdoptOptions, plan, write as write_series
    from patchset.authoring.interop import ImportMeta
    ImportMeta(tier=tier, path=path)                     # bad flags before any host is read
    s = load(series)
    options = AdoptOptions(checkout=checkout, split=split, tier=tier, path=path,
                           offline=offline, author=author)
    with resolver_for(s, inventory, target, accept_new) as resolver:
        if host not in resolver.inventory.hosts and host not in ("localhost", "local") \
                and "@" not in host:
            raise UsageError(f"host {host!r}: not in the inventory; add it to hosts.yaml "
                             "or give user@host[:port]")
        transport = resolver.transport(host, provision_local=False)
        result = plan(s, transport, options, progress=RichProgress())
        if write:
            result = write_series(s, transport, result, force=force, author=author,
                                  progress=RichProgress())
    if as_json:
        emit_json(result.to_json())
    else:
        _render_adopt(result)


def _render_adopt(result) -> None:
    console = term()
    b = result.base
    shown = "unknown" if b.matching is None else str(b.matching)
    console.print(f"{result.host}:{result.target} ({result.layout} layout)", markup=False)
    console.print(f"base: {b.label}: {shown} of {b.compared} served files match it",
                  markup=False)
    for c in result.candidates:
        matching = "unknown" if c.matching is None else c.matching
        console.print(f"  candidate {c.label}: {matching}/{c.compared} files match",
                      markup=False)
    for p in result.patches:
        gate = f" gate {p.gate['env']}={p.gate['on']}" if p.gate else ""
        console.print(f"  {p.name}  [{p.source}] {p.tier}/{p.path}{gate}  "
                      f"{', '.join(p.files)}", markup=False)
        for t in p.trace_targets:
            console.print(f"      trace {t}", markup=False)
        if p.guards:
            console.print(f"      guards {', '.join(p.guards)}", markup=False)
    for c in result.left_out:
        console.print(f"  left out {c.commit[:12]} {c.subject}: {c.why}", markup=False)
    for blocker in result.blockers:
        console.print(f"  --write refuses: {blocker.what}: {blocker.why}", markup=False)
    if not result.blockers:
        console.print(f"checked: the pin + these patches give all {result.reproduced} served "
                      "files exactly", markup=False)
    for note in result.notes:
        say(note)
    if result.written:
        say(f"wrote {len(result.written)} patch(es); {result.host} is managed, "
            f"{result.files_hashed} served files identical before and after")
    else:
        say("dry run: nothing written (--write to adopt)")


# ---------------------------------------------------------------- capture

@app.command()
def capture(host: str = typer.Argument(..., help="inventory name, user@host[:port] or "
                                       "localhost"),
            name: str = typer.Argument(..., help="the new patch's name ([a-z0-9-], new)"),
            tier: str = typer.Option("risky", "--tier", help="tier of the new patch"),
            path: str = typer.Option("both", "--path", help="path of the new patch"),
            summary: Optional[str] = typer.Option(None, "--summary", help="one-line summary "
                                                  "(also the DEP-3 Description)"),
            author: Optional[str] = typer.Option(None, "--author", help="DEP-3 Author: "
                                                 "'Name <email>' (required)"),
            target: Optional[Path] = TargetOpt, lock_wait: float = LockWaitOpt,
            offline: bool = typer.Option(False, "--offline", help="never touch the network"),
            inventory: Optional[Path] = InventoryOpt, accept_new: bool = AcceptNewOpt,
            as_json: bool = JsonOpt, series: Optional[Path] = SeriesOpt) -> None:
    """Turn hand edits on a host's managed tree into a new patch at the end of the series;
    the host is only read. Checked on the pin + series before anything is written."""
    from dataclasses import asdict

    from patchset.authoring.capture import CaptureMeta, capture as do_capture, check_meta
    s = load(series)
    meta = CaptureMeta(name=name, tier=tier, path=path, summary=summary, author=author)
    check_meta(s, meta)
    with resolver_for(s, inventory, target, accept_new) as resolver:
        transport = resolver.transport(host, provision_local=False)
        result = do_capture(s, transport, meta, progress=RichProgress(), offline=offline,
                            lock_wait=lock_wait)
    if as_json:
        emit_json(asdict(result))
    else:
        deps = f" (depends: {', '.join(result.depends)})" if result.depends else ""
        term().print(f"{result.name}  {result.file}  from {result.host}:{result.target}{deps}",
                     markup=False)
        say(f"captured {len(result.files)} file(s) into {result.manifest}; {result.host} "
            "was not changed")
