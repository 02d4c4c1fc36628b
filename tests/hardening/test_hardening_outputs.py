"""Hostile output paths (issue 25, class 4): every file patchset writes goes through
patchset/agent/lib/safewrite.py. Only a regular file is replaced; a character device or FIFO
given as an output is written into, never replaced; a directory, a link (to anything but
a stream) or a socket is refused with exit 2; nothing is written through a link planted
in a directory being written (an export, a target tree); a failed or killed write leaves
no temporary file.

A character device of our own (mknod of /dev/null's numbers in a scratch directory)
stands in for /dev/null: a test that regressed must not replace the machine's /dev/null.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from patchset.connect.local import LocalTransport
from tests.hostutil import cli
from patchset import api
from patchset.agent.lib import safewrite
from patchset.cli.app import write_output
from patchset.series.manifest import load_series
from patchset.series.selection import Selection, plan
from patchset.pin.upstream import materialize
from tests.seriesfactory import CHAT

ROOT = Path(__file__).resolve().parents[2]


def char_device(where: Path) -> Path:
    """A character device with /dev/null's numbers (root), else /dev/null itself."""
    dev = where / "null"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        return dev
    except PermissionError:
        return Path("/dev/null")


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


# ---------------------------------------------------------------- -o FILE

def test_output_into_a_char_device_writes_into_it(tmp_path: Path) -> None:
    dev = char_device(tmp_path)
    write_output(dev, "a report\n")
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    assert os.stat(dev).st_rdev == os.makedev(1, 3)
    if dev.parent == tmp_path:                            # nothing beside it
        assert listing(tmp_path) == ["null"]


def test_audit_output_to_a_char_device_passes_the_option_check(tmp_path: Path,
                                                                capsys) -> None:
    """`-o DEVICE` is accepted (the check would refuse it before contacting a host): the
    refusal seen is the unknown host's, never the output's."""
    dev = char_device(tmp_path)
    code, out, err = cli(capsys, "audit", "no-such-host.invalid", "-o", str(dev))
    assert "not a regular file" not in err
    assert stat.S_ISCHR(os.lstat(dev).st_mode)


def test_output_into_a_fifo_is_read_by_its_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def reader() -> None:
        with open(fifo, "rb") as handle:
            got.append(handle.read())
    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for _ in range(200):            # the reader is waiting in open()
            try:
                write_output(fifo, "through the pipe\n")
                break
            except safewrite.RefusedPath:
                threading.Event().wait(0.01)
    finally:
        thread.join(10)                 # a daemon: a reader left waiting cannot hang pytest
    assert got == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and listing(tmp_path) == ["pipe"]


def test_output_into_a_fifo_nobody_reads_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(safewrite.RefusedPath, match="FIFO that nobody reads"):
        write_output(fifo, "x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and listing(tmp_path) == ["pipe"]


@pytest.mark.parametrize("kind", ["directory", "link-to-file", "dangling-link", "socket"])
def test_output_that_is_not_a_file_is_refused_before_any_host(kind: str, tmp_path: Path,
                                                              capsys) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out_path = tmp_path / "out"
    if kind == "directory":
        out_path.mkdir()
    elif kind == "link-to-file":
        out_path.symlink_to(victim)
    elif kind == "dangling-link":
        out_path.symlink_to(tmp_path / "elsewhere")
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(out_path))
        sock.close()
    before = (listing(tmp_path), os.lstat(out_path).st_mode)
    code, out, err = cli(capsys, "audit", "no-such-host.invalid", "-o", str(out_path))
    assert code == 2, err
    assert "not a regular file" in err and "Traceback" not in err
    assert (listing(tmp_path), os.lstat(out_path).st_mode) == before
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("kind", ["link-to-file", "directory"])
def test_writer_refuses_what_is_not_a_file(kind: str, tmp_path: Path) -> None:
    """The writer itself refuses (a path that changed after the option was checked)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out_path = tmp_path / "out"
    out_path.symlink_to(victim) if kind == "link-to-file" else out_path.mkdir()
    with pytest.raises(safewrite.RefusedPath, match="not a regular file"):
        write_output(out_path, "x")
    assert victim.read_text() == "precious\n" and listing(tmp_path) == ["out", "victim"]


def test_output_replaces_a_regular_file_whole(tmp_path: Path) -> None:
    out_path = tmp_path / "report.md"
    out_path.write_text("old\n")
    write_output(out_path, "new\n")
    assert out_path.read_text() == "new\n" and listing(tmp_path) == ["report.md"]


# ---------------------------------------------------------------- failed and killed writes

@pytest.mark.parametrize("unnamed", [True, False], ids=["o_tmpfile", "named-temp"])
def test_a_failed_write_leaves_no_temporary_file(unnamed: bool, tmp_path: Path,
                                                 monkeypatch) -> None:
    out_path = tmp_path / "report.md"
    out_path.write_text("old\n")
    if not unnamed:
        monkeypatch.delattr(os, "O_TMPFILE")
    real_write = os.write
    calls = []

    def full_disk(fd: int, data) -> int:
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, bytes(data[:4]))
    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_output(out_path, "a much longer new report\n")
    monkeypatch.undo()
    assert listing(tmp_path) == ["report.md"] and out_path.read_text() == "old\n"


KILLED = """
import os, signal, sys
sys.path[:0] = [{root!r}]
from patchset.agent.lib import safewrite
real = os.write
def write_then_die(fd, data):
    real(fd, bytes(data[:3]))
    os.kill(os.getpid(), signal.SIGKILL)
os.write = write_then_die
safewrite.write_file({path!r}, b"the new content", root={root_dir!r})
"""


def test_a_killed_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    out_path = tmp_path / "tree" / "state.json"
    out_path.parent.mkdir()
    out_path.write_text("old\n")
    code = KILLED.format(root=str(ROOT), path=str(out_path), root_dir=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert listing(out_path.parent) == ["state.json"] and out_path.read_text() == "old\n"


# ---------------------------------------------------------------- export --force

def test_export_force_never_writes_through_planted_links(series_dir: Path, tmp_path: Path,
                                                         monkeypatch, capsys) -> None:
    monkeypatch.chdir(series_dir)
    dest = tmp_path / "quilt"
    dest.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("precious\n")
    (dest / "chat-a.patch").symlink_to(outside / "victim")
    (dest / "series").symlink_to(outside / "created-by-link")
    before = listing(dest)
    code, out, err = cli(capsys, "export", "--quilt", str(dest), "--force")
    assert code == 2, err
    assert "symbolic link" in err and "Traceback" not in err
    assert (outside / "victim").read_text() == "precious\n"
    assert listing(outside) == ["victim"] and listing(dest) == before


def test_export_force_replaces_regular_files(series_dir: Path, tmp_path: Path,
                                             monkeypatch, capsys) -> None:
    monkeypatch.chdir(series_dir)
    dest = tmp_path / "quilt"
    dest.mkdir()
    (dest / "chat-a.patch").write_text("stale\n")
    code, out, err = cli(capsys, "export", "--quilt", str(dest), "--force")
    assert code == 0, err
    assert (dest / "chat-a.patch").read_bytes() == (series_dir / "patches/chat-a.patch").read_bytes()
    assert not [n for n in listing(dest) if n.startswith(".")]


# ---------------------------------------------------------------- apply into a tree

def test_apply_refuses_a_tree_with_a_linked_directory_inside(series_dir: Path,
                                                             pinned_base, tmp_path: Path) -> None:
    """The linked directory holds the very files of the pin, so the base checks pass:
    only the link rule stops the patch from being written outside the tree."""
    tree = materialize(pinned_base, tmp_path / "plain", layout="wheel")
    inner = tree / Path(CHAT[len("python/"):]).parent
    outside = tmp_path / "outside-entrypoints"
    inner.rename(outside)
    inner.symlink_to(outside)
    chat = outside / Path(CHAT).name
    before = chat.read_bytes()
    series = load_series(series_dir / "patches.yaml")
    [result] = api.apply(series, plan(series, Selection(tier="safe")), [LocalTransport(tree)])
    assert not result.ok and result.exit_code == 2, result.error
    assert "link" in result.error and "nothing was changed" in result.error
    assert chat.read_bytes() == before
    assert not (tree / ".patchset" / "state.json").exists()
    assert not [n for n in listing(outside) if n.startswith(".")]


def test_apply_refuses_a_linked_state_directory(series_dir: Path, pinned_base,
                                                tmp_path: Path) -> None:
    tree = materialize(pinned_base, tmp_path / "plain", layout="wheel")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tree / ".patchset").symlink_to(elsewhere)
    chat = tree / CHAT[len("python/"):]
    before = chat.read_bytes()
    series = load_series(series_dir / "patches.yaml")
    [result] = api.apply(series, plan(series, Selection(tier="safe")), [LocalTransport(tree)])
    assert not result.ok and result.exit_code == 2, result.error
    assert chat.read_bytes() == before and not (elsewhere / "state.json").exists()


def test_a_link_planted_at_the_lock_file_is_never_followed(series_dir: Path, pinned_base,
                                                           tmp_path: Path) -> None:
    """The engine's lock file is opened without following a link: a link planted at
    .patchset/lock would otherwise create (or take) a file wherever it points."""
    tree = materialize(pinned_base, tmp_path / "plain", layout="wheel")
    (tree / ".patchset").mkdir()
    target = tmp_path / "created-through-the-link"
    (tree / ".patchset" / "lock").symlink_to(target)
    chat = tree / CHAT[len("python/"):]
    before = chat.read_bytes()
    series = load_series(series_dir / "patches.yaml")
    [result] = api.apply(series, plan(series, Selection(tier="safe")), [LocalTransport(tree)])
    assert not result.ok and "lock file" in result.error, result.error
    assert not target.exists() and chat.read_bytes() == before


def test_staged_writes_refuse_links_and_leave_nothing(tmp_path: Path) -> None:
    """The rebase's several files: staged beside their targets, a planted link refused,
    the staged ones discarded without a trace, nothing in place before the commits."""
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "a.patch").write_text("old a\n")
    (tmp_path / "outside").write_text("precious\n")
    (tmp_path / "patches" / "b.patch").symlink_to(tmp_path / "outside")
    first = safewrite.stage(tmp_path / "patches" / "a.patch", b"new a\n", tmp_path)
    assert (tmp_path / "patches" / "a.patch").read_text() == "old a\n"
    with pytest.raises(safewrite.RefusedPath, match="symbolic link"):
        safewrite.stage(tmp_path / "patches" / "b.patch", b"new b\n", tmp_path)
    safewrite.discard(first)
    assert listing(tmp_path / "patches") == ["a.patch", "b.patch"]
    assert (tmp_path / "outside").read_text() == "precious\n"
    safewrite.commit(safewrite.stage(tmp_path / "patches" / "a.patch", b"new a\n", tmp_path))
    assert (tmp_path / "patches" / "a.patch").read_text() == "new a\n"
    assert listing(tmp_path / "patches") == ["a.patch", "b.patch"]
