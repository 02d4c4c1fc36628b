"""CLI smoke tests of usage errors, run as users run the program (a subprocess).

These also run in the drift check (.ci/drift-check) at the newest allowed and the lowest
allowed dependency versions: typer 0.28 vendors click, older typer releases depend on it,
and a usage error must be one line and exit 2 on every version pyproject.toml allows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "PATCHSET_HOME": str(home / "ps"),
           "XDG_CACHE_HOME": str(home / "cache"), "NO_COLOR": "1", "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "patchset.cli", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


USAGE = [
    ((), "no command given (see `patchset --help` for the commands)"),
    (("--bogus",), "such option"),
    (("list", "--nope"), "--nope"),
    (("nosuchcommand",), "No such command 'nosuchcommand' (see `patchset --help`)"),
    (("list", "--tier"), "Option '--tier' requires an argument (see `patchset --help`)"),
    (("list", "--json=yes"), "Option '--json' does not take a value (see `patchset --help`)"),
    (("list", "extra", "words"), "unexpected extra argument"),
    (("show",), "Missing argument 'NAME' (see `patchset --help`)"),
    (("apply", "--lock-wait", "soon", "localhost"), "--lock-wait"),
    (("list", "--tier", "safe\n"), "argument 3 ('safe\\n') contains a newline"),
    (("show", "\x1b[2Jmhc"), "argument 2 ('\\x1b[2Jmhc') contains an escape character"),
    (("apply", "--only", "mhc-bf16\r", "localhost"), "contains a carriage return"),
    (("status", "gpu1\x07"), "contains control character \\x07"),
    (("plan", "--exclude", "a\u2028b"), "contains control character \\u2028"),
    (("list", "--tier", "unsafe"), "--tier 'unsafe': expected one of safe, moderate, risky"),
]


@pytest.mark.parametrize("argv,message", USAGE, ids=[" ".join(a) or "no-args"
                                                      for a, _ in USAGE])
def test_usage_errors_are_one_line_exit_2(tmp_path: Path, argv: tuple, message: str) -> None:
    proc = cli(tmp_path, *argv)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("patchset: error: ")
    assert message.lower() in lines[0].lower()
    assert "Traceback" not in proc.stderr and "\x1b" not in proc.stderr


def test_help_and_version_exit_0(tmp_path: Path) -> None:
    proc = cli(tmp_path, "--help")
    assert proc.returncode == 0 and "apply" in proc.stdout and proc.stderr == ""
    proc = cli(tmp_path, "apply", "--help")
    assert proc.returncode == 0 and "--tier" in proc.stdout


def test_help_works_with_the_installed_typer(tmp_path: Path) -> None:
    """Whatever typer resolved to, the error classes are found through typer itself."""
    from patchset.cli.app import _usage_error
    import typer
    assert _usage_error(typer.BadParameter("x")) is not None
    assert _usage_error(ValueError("x")) is None


NUMBERS_AND_URLS = [
    (("apply", "--lock-wait", "nan", "localhost"), "nan is not a number of seconds"),
    (("apply", "--lock-wait", "inf", "localhost"), "inf is not a number of seconds"),
    (("apply", "--lock-wait", "-1", "localhost"), "-1.0 is not a number of seconds"),
    (("apply", "--lock-wait", "1e400", "localhost"), "inf is not a number of seconds"),
    (("probe", "--url", "http://127.0.0.1:1", "--timeout", "nan"), "'--timeout'"),
    (("deploy", "localhost", "--health-timeout", "-5"), "'--health-timeout'"),
    (("probe", "--url", "http://127.0.0.1:1", "--kind", "drift", "--sigmas", "nan"),
     "nan is not a number of sigmas (0.5 to 10)"),
    (("bisect", "gpu1", "--probe", "drift", "--sigmas", "nan"), "nan is not a number of sigmas"),
    (("bisect", "gpu1", "--probe", "drift", "--sigmas", "11"), "11.0 is not a number of sigmas"),
    (("probe", "--url", "file:///etc/passwd"), "expected http(s)://HOST[:PORT][/PATH]"),
    (("probe", "--url", "ftp://example.org/"), "expected http(s)://HOST[:PORT][/PATH]"),
    (("probe", "--url", "http://x:99999"), "expected http(s)://HOST[:PORT][/PATH]"),
    (("probe", "--url", "http://-oProxyCommand=x"), "expected http(s)://HOST[:PORT][/PATH]"),
    (("probe", "--url", "http://a b/"), "expected http(s)://HOST[:PORT][/PATH]"),
    (("probe", "--url", "http://127.0.0.1:1", "--sizes", "999999999k"), "more than 2048k"),
    (("probe", "--url", "http://127.0.0.1:1", "--sizes", "٣k"), "is not a size"),
]


@pytest.mark.parametrize("argv,message", NUMBERS_AND_URLS, ids=[" ".join(a) for a, _ in
                                                                NUMBERS_AND_URLS])
def test_numbers_and_urls_are_bounded(tmp_path: Path, argv: tuple, message: str) -> None:
    proc = cli(tmp_path, *argv)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("patchset: error: "), proc.stderr
    assert message in lines[0] and proc.stdout == ""


def test_every_float_option_is_checked_for_a_finite_range() -> None:
    """typer's float parser takes nan, and a min/max lets nan through (every comparison
    with it is false): each float option carries a callback (cli/app.py within)
    that refuses it, so no command can take one unchecked."""
    import typer.main

    from patchset.cli.app import app
    root = typer.main.get_command(app)                 # click's classes: whichever typer ships
    commands = [root] + list(getattr(root, "commands", {}).values())
    floats = [(cmd.name, p.name, p.callback) for cmd in commands for p in cmd.params
              if type(p.type).__name__ in ("FloatParamType", "FloatRange")]
    assert {name for _, name, _ in floats} >= {"sigmas", "lock_wait", "probe_timeout"}
    assert [(c, n) for c, n, callback in floats if callback is None] == []


def test_an_option_several_commands_take_has_one_default_and_bound() -> None:
    """An option declared once (cli/options.py) has the same default and bounds in every
    command that takes it: --repeats is the drift decision's (two replays measure the
    noise) in probe, bisect and rollout alike, and rollout's options are exactly the
    ranges its log's validator holds (rolloutplan.BOUNDS)."""
    import typer.main

    from patchset.cli.app import app
    from patchset.isolate.measure.driftdecide import MAX_REPLAYS, MIN_REPLAYS
    from patchset.isolate.rollout.rolloutplan import BOUNDS
    commands = typer.main.get_command(app).commands

    for command in ("probe", "bisect", "rollout"):
        repeats = next(p for p in commands[command].params if "--repeats" in p.opts)
        assert (repeats.default, repeats.type.min, repeats.type.max) == (
            3, MIN_REPLAYS, MAX_REPLAYS), command
    rollout = commands["rollout"]
    for key, (kind, lo, hi, flag) in BOUNDS.items():
        for value in (lo, hi):
            rollout.make_context("rollout", [flag, str(value)])           # taken
        step = 1 if kind is int else None
        for value in (lo - (step or abs(lo) / 2 or 0.5), hi + (step or abs(hi) / 2 or 0.5)):
            with pytest.raises(Exception, match=r"is not|not in the range"):   # refused
                rollout.make_context("rollout", [flag, str(value)])


def test_an_internal_error_is_one_redacted_line_and_a_private_log(tmp_path: Path,
                                                                   monkeypatch, capsys) -> None:
    """A bug prints one line (exit 70) and logs the trace 0600; a token in the exception's
    message appears in neither."""
    import patchset.cli.queue as queue
    from patchset.cli import main
    token = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
    home = tmp_path / "home"
    monkeypatch.setenv("PATCHSET_HOME", str(home))

    def boom(*_a, **_k):
        raise RuntimeError(f"HF_TOKEN={token} leaked into a message")
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(queue, "load", boom)
    code = main(["list"])
    _, err = capsys.readouterr()
    assert code == 70
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("patchset: internal error: RuntimeError")
    log = home / "debug.log"
    assert token not in err and token not in log.read_text()
    assert "RuntimeError" in log.read_text() and (log.stat().st_mode & 0o777) == 0o600


def test_output_files_are_checked_before_anything_runs(tmp_path: Path) -> None:
    for argv, message in ((("audit", "localhost", "-o", str(tmp_path / "no" / "r.json")),
                           "is not an existing directory"),
                          (("audit", "localhost", "-o", str(tmp_path)), "is a directory"),
                          (("bisect", "localhost", "--probe", "recall", "-o",
                            str(tmp_path / "no" / "b.json")), "is not an existing directory")):
        proc = cli(tmp_path, *argv)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and "'--output'" in lines[0] and message in lines[0]


def test_a_full_disk_or_a_closed_pipe_is_not_a_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "PATCHSET_HOME": str(home / "ps")}
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "patchset.cli", "list", "--json"],
                              cwd=ROOT, env=env, stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    assert proc.returncode == 4
    assert proc.stderr.strip() == "patchset: error: cannot write output: No space left on device"
    reader = subprocess.Popen([sys.executable, "-m", "patchset.cli", "list", "--json"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    reader.stdout.read(10)
    reader.stdout.close()                      # the reader goes away mid-listing
    err = reader.stderr.read().decode()
    assert reader.wait(timeout=60) in (0, 1) and "Traceback" not in err


def test_version_option(tmp_path: Path) -> None:
    from patchset import __version__
    proc = cli(tmp_path, "--version")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{__version__}\n", "")
    assert cli(tmp_path, "version").stdout == proc.stdout          # the command stays


def _panels(text: str) -> dict[str, list[str]]:
    """The rows of each rich panel of a --help screen (`╭─ Options ─...╮` ... `╰...╯`)."""
    panels: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("╭─"):
            current = panels.setdefault(line.strip("╭─╮ ").split(" ─")[0], [])
        elif line.startswith("╰"):
            current = None
        elif current is not None and line.startswith("│"):
            current.append(line.strip("│ "))
    return panels

def test_help_texts_read_as_paragraphs(tmp_path: Path) -> None:
    """At a width nothing needs wrapping (COLUMNS=1000) every command, option and argument
    is one row and every description one line: a help text has no line break of its own
    mid-sentence (docstrings wrapped in the source are joined, cli/app.py)."""
    import typer.main
    from patchset.cli import app
    group = typer.main.get_command(app)
    names = list(group.commands)
    wide = {**os.environ, "COLUMNS": "1000"}
    for argv in [(), *((name,) for name in names)]:
        proc = subprocess.run([sys.executable, "-m", "patchset.cli", *argv, "--help"], cwd=ROOT,
                              env={**wide, "HOME": str(tmp_path)}, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        panels = _panels(proc.stdout)
        command = group.commands[argv[0]] if argv else group
        params = [p for p in command.params if not getattr(p, "hidden", False)]
        rows = panels.get("Options", []) + panels.get("Arguments", [])
        assert len(rows) == len(params) + 1, (argv, rows)         # + --help
        if not argv:
            assert [row.split()[0] for row in panels["Commands"]] == names
        head = proc.stdout.split("╭")[0].splitlines()
        description = [line.strip() for line in head[head.index(next(
            line for line in head if "Usage:" in line)) + 1:] if line.strip()]
        assert len(description) == 1, (argv, description)


def test_the_description_names_deploy_and_audit(tmp_path: Path) -> None:
    proc = cli(tmp_path, "--help")
    text = " ".join(proc.stdout.split("╭")[0].split())
    assert "patch queue for SGLang that also deploys and audits" in text
    assert "deploy the systemd prefill/decode/router units" in text and \
        "audit the live servers" in text
    for option in ("--version", "--install-completion", "--show-completion"):
        assert option in proc.stdout


def test_shell_completion_answers_from_the_whole_tree(tmp_path: Path) -> None:
    """What the installed completion script asks: the program with _PATCHSET_COMPLETE set
    and the words typed so far (no argument of its own)."""
    def complete(words: str, cword: int) -> list[str]:
        env = {**os.environ, "HOME": str(tmp_path), "_PATCHSET_COMPLETE": "complete_bash",
               "COMP_WORDS": words, "COMP_CWORD": str(cword)}
        proc = subprocess.run([sys.executable, "-m", "patchset.cli"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        return proc.stdout.split()
    assert complete("patchset au", 1) == ["audit"]
    assert complete("patchset st", 1) == ["status"]
    assert "--format" in complete("patchset audit gpu1 --fo", 3)
    assert complete("patchset --ver", 1) == ["--version"]


def test_install_completion_writes_a_working_bash_script_into_home(tmp_path: Path) -> None:
    """`patchset --install-completion` from bash (the shell is detected from the parents):
    the script lands in $HOME (a scratch one here), .bashrc sources it, and sourcing it
    completes `patchset st` to `status` through the real program."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    proc = subprocess.run(["bash", "-c", '"$0" -m patchset.cli --install-completion; exit $?',
                           sys.executable], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    script = home / ".bash_completions" / "patchset.sh"
    assert "bash completion installed in" in proc.stdout and script.is_file()
    assert f"source '{script}'" in (home / ".bashrc").read_text()
    wrapper = tmp_path / "bin" / "patchset"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\ncd {ROOT} && exec {sys.executable} -m patchset.cli "$@"\n')
    wrapper.chmod(0o755)
    done = subprocess.run(["bash", "-c", f"source '{script}'; COMP_WORDS=(patchset st); "
                           "COMP_CWORD=1; _patchset_completion patchset; "
                           'printf "%s\\n" "${COMPREPLY[@]}"'],
                          env={**env, "PATH": f"{wrapper.parent}:{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["status"], done.stderr
