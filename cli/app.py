"""The `patchset` CLI: the app, the plumbing the commands share, the one error handler.

Results go to stdout (a table, or JSON with --json, never both); progress, messages and
errors go to stderr, so `--json | jq` is never polluted. The command modules (queue,
deploy, ...) register their commands on `app` when cli/__init__.py imports them; the
options they share are cli/options.py's, what they print with cli/render.py's.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol, runtime_checkable

import typer
import typer.main

from .. import validate
from patchset.agent.lib import safewrite
from ..errors import Exit, PatchsetError, UsageError
from .render import RichProgress, emit_json, printable_block, say

if TYPE_CHECKING:
    from patchset.auditor.rank import Access
    from patchset.auditor.waivers import WaiverFile
    from patchset.connect.inventory import Inventory
    from patchset.series.model import Series


HELP = ("A quilt-style patch queue for SGLang that also deploys and audits what it "
        "serves: keep local patches as a strict series (risk tier, path, env gate), apply "
        "and revert them atomically on local and SSH hosts, deploy the systemd "
        "prefill/decode/router units that run the patched tree, and audit the live servers: "
        "which patches really run, what drifted, and which ones are the suspects for a "
        "symptom.")
COMPLETE_VAR = "_PATCHSET_COMPLETE"     # set by the shell's completion script (click's rule)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__
        print(__version__)
        raise typer.Exit()


def _root(version: bool = typer.Option(False, "--version", callback=_print_version,
                                       is_eager=True, help="Print patchset's version and "
                                       "exit.")) -> None:
    """The options before the command (`patchset --version`)."""


# `add_completion` gives the tree typer's --install-completion and --show-completion.
app = typer.Typer(add_completion=True, no_args_is_help=False, pretty_exceptions_enable=False,
                  help=HELP)
app.callback()(_root)


# ---------------------------------------------------------------- shared plumbing

def load(path: Optional[Path]) -> Series:
    from patchset.series.manifest import load_series
    from patchset.pin.paths import default_series
    return load_series(path or default_series())


def selection(tier, path, only, exclude):
    from patchset.series.selection import Selection, parse_names
    return Selection(tier=tier, path=path, only=parse_names(only, "--only"),
                     exclude=parse_names(exclude, "--exclude"))


def resolver_for(series: Series, inventory: Optional[Path], target: Optional[Path],
          accept_new: bool = False):
    """The host resolver for one command, with progress shown here."""
    from patchset.connect.resolve import Hosts
    return Hosts(series, inventory, target, accept_new, progress=RichProgress())


def ship_base(series: Series):
    from patchset.connect.resolve import base_provider
    return base_provider(series, RichProgress())


def audit_access(inventory: Inventory, specs: list[str], inventory_file: Optional[Path] = None,
                 series_file: Optional[Path] = None) -> Access:
    """How an audit report's suggested commands reach each host (its ssh command line, its
    address for URLs; `patchset probe HOST` for a host whose inventory roles give a probe
    a port), and the --inventory/--series they carry: the files the audit was given on
    its command line (None: it used the default, which the suggested command finds again
    the same way)."""
    from patchset.auditor.rank import Access
    from patchset.connect.tunnel import role_target
    out = Access(inventory=str(inventory_file) if inventory_file else None,
                 series=str(series_file) if series_file else None)
    for spec in specs:
        host = inventory.resolve(spec)
        if spec in inventory.hosts and role_target(host) is not None:
            out.probe_hosts += (spec,)
        if not host.local:
            out.ssh[spec] = host.ssh_argv()
            out.addresses[spec] = host.address
    return out


def load_waivers(option: Optional[Path], disabled: bool) -> WaiverFile | None:
    """`--waivers FILE`, else ./waivers.yaml when it exists, none with `--no-waivers`;
    validated whole (exit 2) before any host is contacted."""
    from patchset.auditor import policy, waivers
    path = waivers.locate(option, disabled)
    return waivers.load(path, policy.load()) if path is not None else None


def finish(results, as_json: bool, verb: str) -> None:
    if as_json:
        emit_json([asdict(r) for r in results])
    for r in results:
        say(result_line(r, verb))
        if r.details and not as_json:
            say(r.details)
    if len(results) > 1:
        say(summary(results))
    code = Exit.combine(r.exit_code for r in results)
    if code:
        raise typer.Exit(code)


def summary(results) -> str:
    ok = [r.host for r in results if r.ok]
    down = [r.host for r in results if r.exit_code == Exit.UNREACHABLE]
    failed = [r.host for r in results if not r.ok and r.host not in down]
    parts = [f"{len(ok)} ok"]
    if down:
        parts.append(f"{len(down)} unreachable ({', '.join(down)})")
    if failed:
        parts.append(f"{len(failed)} failed ({', '.join(failed)})")
    return f"{len(results)} hosts: " + ", ".join(parts)


def result_line(r, verb: str) -> str:
    if not r.ok:
        return f"{r.host}: {verb} FAILED: {r.error}"
    recovered = " (finished an interrupted transaction first)" if r.recovered else ""
    if r.dry_run:
        return f"{r.host}: would change {r.before} -> {r.after}"
    if not r.changed:
        return f"{r.host}: unchanged, applied: {', '.join(r.after) or 'none'}{recovered}"
    head = f" head {r.head[:12]}" if r.head else ""
    return (f"{r.host}: {verb} done, applied: {', '.join(r.after) or 'none'}{head}"
            f"{recovered}")


# ---------------------------------------------------------------- entry point

def run() -> int:
    """The `patchset` executable (console script and `python -m patchset.cli`)."""
    return main()


def main(argv: list[str] | None = None) -> int:
    """One top-level handler: expected errors are one line; others a short trace + log."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        check_arguments(args)
        if not args and not os.environ.get(COMPLETE_VAR):     # a completion request has none
            raise UsageError("no command given (see `patchset --help` for the commands)")
        code = command_tree()(args=args, prog_name="patchset", standalone_mode=False)
        return code if isinstance(code, int) else Exit.OK
    except PatchsetError as exc:
        error_line(str(exc))
        details = exc.details
        if details:
            print(printable_block(details), file=sys.stderr)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("patchset: aborted", file=sys.stderr)
        return Exit.INTERRUPTED
    except KeyboardInterrupt:
        print("patchset: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except BrokenPipeError:          # `patchset list | head`: the reader has what it wanted
        _quiet_stdout()
        return Exit.OK
    except safewrite.RefusedPath as exc:   # an output path patchset will not write
        error_line(str(exc))
        return Exit.BAD_INPUT
    except OSError as exc:   # the machine refused: stdout not writable, a file unreadable
        where = "cannot write output" if exc.filename is None else str(exc.filename)
        error_line(f"{where}: {exc.strerror or exc}")
        return Exit.FAILED
    except Exception as exc:  # noqa: BLE001 - the one place that catches everything
        usage = _usage_error(exc)
        if usage is not None:
            error_line(usage)
            return Exit.BAD_INPUT
        return _unexpected(exc)


def command_tree() -> typer.core.TyperGroup:
    """The click group typer builds from `app` (its click: typer's own), every help text
    made paragraphs first."""
    for info in app.registered_commands:
        info.help = paragraphs(info.help or info.callback.__doc__ or "")
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)     # app has commands: a group
    return group


def paragraphs(text: str) -> str:
    """A help text as paragraphs, each on one line: typer's rich help keeps a docstring's
    line breaks (the command list does), so a sentence wrapped in the source would be
    broken mid-sentence on the screen; rich wraps the joined lines to the terminal."""
    import inspect
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def _quiet_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def output_file(value: Optional[Path]) -> Optional[Path]:
    """An `-o FILE` option: a regular file (or none yet) in an existing directory, or a
    stream (/dev/null, a FIFO) to write into, checked before any host is contacted (a typo
    in the path must not cost a whole audit or bisect); safewrite's rules."""
    if value is None:
        return None
    try:
        safewrite.check_output(value)
    except safewrite.RefusedPath as exc:
        raise typer.BadParameter(validate.printable(str(exc))) from None
    return value


def write_output(path: Path, text: str) -> None:
    """A report file appears whole or not at all (a reader never sees half of it); a
    stream is written into (safewrite)."""
    safewrite.write_file(path, text.encode("utf-8"), 0o644, streams=True)


def check_arguments(args: list[str]) -> None:
    """No argument may carry a control character (a newline in a host name, an ESC in a
    patch name) into a command line, an env file or a message: refused before parsing."""
    for index, arg in enumerate(args, start=1):
        bad = validate.control_char(arg)
        if bad:
            raise UsageError(f"argument {index} ({validate.printable(repr(arg))[:80]}) "
                             f"contains {validate.describe(bad)}")


def error_line(message: str) -> None:
    """The one-line error format: `patchset: error: ...`, control characters escaped."""
    print(f"patchset: error: {validate.printable(' '.join(message.splitlines()))}",
          file=sys.stderr)


@runtime_checkable
class _ClickException(Protocol):
    """What a ClickException of either click has (the classes are found by name below)."""

    def format_message(self) -> str: ...


def _usage_error(exc: BaseException) -> str | None:
    """The one line of a click usage error, whichever click typer ships: older typer
    releases depend on click, 0.2x vendors it as `typer._click` (same class names)."""
    by_name = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
    if not isinstance(exc, by_name["ClickException"]) or not isinstance(exc, _ClickException):
        return None
    if exc.__class__.__name__ == "NoArgsIsHelpError" or (
            isinstance(exc, by_name["UsageError"]) and not str(exc.format_message())):
        return "no command given (try `patchset --help`)"
    message = " ".join(str(exc.format_message()).split()).rstrip(".")
    return message + ("" if not isinstance(exc, by_name["UsageError"])
                                        else " (see `patchset --help`)")


def _unexpected(exc: BaseException) -> int:
    """A bug: a short line here, the trace in a 0600 log; both redacted (an exception's
    message or a local in the trace may hold an API key or a token)."""
    from patchset.agent.lib.redact import redact_text

    from patchset.pin.paths import data_home
    log = data_home() / "debug.log"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(redact_text(traceback.format_exc()))
    except OSError:
        pass
    short = redact_text(traceback.format_exception_only(type(exc), exc)[-1].strip())
    print(f"patchset: internal error: {validate.printable(short)} (full trace in {log})",
          file=sys.stderr)
    return Exit.INTERNAL
