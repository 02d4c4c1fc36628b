"""Moving a series in and out, and starting one: `patchset export` (a quilt series for
other tools), `import` (quilt or a git range, re-diffed against the pin), `init` (a
manifest and an empty series for a pinned upstream); the library: patchset/authoring/
interop.py, newseries.py."""

from pathlib import Path
from typing import Optional

import typer

from .app import app, load
from .options import JsonOpt, NewPathOpt, NewTierOpt, OfflineOpt, SeriesOpt
from .render import RichProgress, emit_json, say, term


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
               tier: str = NewTierOpt("the new patches"), path: str = NewPathOpt("the new patches"),
               author: Optional[str] = typer.Option(None, "--author", help="Author: for "
                                                    "patches that name none"),
               offline: bool = OfflineOpt(),
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
             offline: bool = OfflineOpt("a release from the cache"),
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
