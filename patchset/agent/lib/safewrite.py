"""The one way patchset writes or removes a file, on the controller and on hosts alike.

Standard library only (part of the agent): the engine writes a target's files and state
with it on a host, the deployer its units, the CLI its reports, exports and saved runs.

Why one module: an atomic write (temp file + rename) replaces whatever is at the path,
so run as root `-o /dev/null` replaced the device, and a link planted where a file goes
was written through. The rules, for every caller:
  * only a regular file is replaced, always whole (temp file + rename, fsynced); a
    directory, a link, a block device or a socket at the path is refused (RefusedPath);
  * a stream, a character device (`-o /dev/null`, `/dev/stdout`) or a FIFO, is written
    into, never replaced, where the caller allows streams (a CLI output: writing into
    it is what the user means); a FIFO with no reader is refused at once, not waited on;
  * under `root` (a target tree, an export directory), every directory from `root` down
    is opened without following a link, so nothing is written outside `root`;
  * a write that fails leaves no temporary file: the data goes into an unnamed file
    (O_TMPFILE) that gets a name only once complete, for the instant before its rename;
    where the filesystem has no O_TMPFILE, a named one removed on any error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Iterator, NamedTuple

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
TMP_PREFIX = ".patchset-tmp-"


class RefusedPath(OSError):
    """A path patchset will not write or remove; the message names it and says why. An
    OSError, so each caller's handling of a write that failed covers it too."""


def write_file(path: str | Path, data: bytes, mode: int = 0o644, *,
               root: str | Path | None = None, streams: bool = False,
               owner_root: bool = False, durable: bool = True) -> None:
    """Put `data` at `path` by the rules above. `root`: `path` lies under it and is reached
    from it without links (missing directories are made); `streams`: a character device
    or FIFO at `path` is written into; `owner_root`: the file is root's (when we are);
    `durable=False`: no fsync (the engine's switch: its journal, fsynced, is what survives
    a crash, and two fsyncs per tree file were a third of an apply)."""
    path = Path(path)
    if streams and _write_stream(path, data):
        return
    dirfd = open_parent(path, root, make=True)
    try:
        _refuse_other(dirfd, path)
        _replace(dirfd, path.name, data, mode, owner_root, durable)
    finally:
        os.close(dirfd)


class Staged(NamedTuple):
    """A file's complete new content beside it under a temporary name (stage)."""
    path: Path
    dirfd: int
    temp: str


def stage(path: str | Path, data: bytes, root: str | Path, mode: int = 0o644) -> Staged:
    """write_file in two steps, for several files that change together (a rebase): stage
    each, then commit each, or discard them all if one cannot be staged; nothing is in
    place before the commits."""
    path = Path(path)
    dirfd = open_parent(path, root, make=True)
    try:
        _refuse_other(dirfd, path)
        return Staged(path, dirfd, _named_temp(dirfd, data, mode, False, True))
    except BaseException:
        os.close(dirfd)
        raise


def commit(staged: Staged) -> None:
    """Put a staged file in place (one rename)."""
    try:
        os.replace(staged.temp, staged.path.name, src_dir_fd=staged.dirfd,
                   dst_dir_fd=staged.dirfd)
        os.fsync(staged.dirfd)
    finally:
        os.close(staged.dirfd)


def discard(staged: Staged) -> None:
    _unlink_quietly(staged.temp, staged.dirfd)
    os.close(staged.dirfd)


def remove_file(path: str | Path, root: str | Path) -> None:
    """Remove the regular file `path` under `root` (absent is fine), then its directories
    that this leaves empty, up to `root` (as `git apply` does for a deleted file)."""
    path = Path(path)
    with _checked_parent(path, root) as dirfd:
        if dirfd is None:
            return
        try:
            os.unlink(path.name, dir_fd=dirfd)
        except FileNotFoundError:
            return
        os.fsync(dirfd)
    _remove_empty_dirs(path.parent, Path(root))


def check_beneath(path: str | Path, root: str | Path) -> None:
    """Refuse (RefusedPath) where `path` under `root` is reached through a link or is not
    a regular file; absent directories and an absent file are fine. Writes nothing: the
    engine asks it of every file before a transaction, so a refusal changes nothing."""
    with _checked_parent(Path(path), root):
        pass


@contextlib.contextmanager
def _checked_parent(path: Path, root: str | Path) -> Iterator[int | None]:
    """`path`'s directory under `root`, reached without links, once `path` is known to be
    a regular file or absent; None where the directory itself is absent."""
    try:
        dirfd = open_parent(path, root, make=False)
    except FileNotFoundError:
        yield None
        return
    try:
        _refuse_other(dirfd, path)
        yield dirfd
    finally:
        os.close(dirfd)


def check_output(path: str | Path) -> None:
    """What write_file(path, streams=True) will refuse, asked before the work that makes
    the output (an audit, a bisect): a directory, a link to anything but a stream, a block
    device or a socket. Writes nothing."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        if _is_stream(os.stat(path).st_mode):
            return
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise RefusedPath(f"{path.parent} is not an existing directory") from None
        return
    if not stat.S_ISREG(info.st_mode):
        raise refusal(path, info.st_mode)


def open_parent(path: Path, root: str | Path | None, make: bool) -> int:
    """A descriptor of `path`'s directory: opened as given (the user named it) without
    `root`; with `root`, walked down from it one component at a time, no link followed."""
    if root is None:
        return os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    root = Path(root)
    parts = _relative_parts(path, root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for at, part in enumerate(parts[:-1]):
            child = _step(fd, part, make, root.joinpath(*parts[:at + 1]))
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _relative_parts(path: Path, root: Path) -> list[str]:
    try:
        parts = list(path.relative_to(root).parts)
    except ValueError:
        raise RefusedPath(f"{path} is not inside {root}") from None
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise RefusedPath(f"{path} is not a file inside {root}")
    return parts


def _step(fd: int, name: str, make: bool, where: Path) -> int:
    """Open the directory `name` in `fd`, never through a link."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if not make:
            raise
        os.mkdir(name, 0o755, dir_fd=fd)
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise RefusedPath(f"{where} is a link or not a directory; patchset writes "
                              "only through real directories") from None
        raise


def _refuse_other(dirfd: int, path: Path) -> None:
    """Refuse anything but a regular file or nothing at `path` (a link is not followed)."""
    try:
        info = os.stat(path.name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise refusal(path, info.st_mode)


def refusal(path: Path, mode: int) -> RefusedPath:
    return RefusedPath(f"{path} is {describe(mode)}, not a regular file; patchset "
                       "replaces only regular files")


def describe(mode: int) -> str:
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def _write_stream(path: Path, data: bytes) -> bool:
    """Write into a character device or FIFO at `path` (links followed: `/dev/stdout` is
    one); False where `path` is not a stream. Never creates, truncates or replaces."""
    try:
        if not _is_stream(os.stat(path).st_mode):
            return False
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise RefusedPath(f"{path} is a FIFO that nobody reads") from None
        raise
    try:
        info = os.fstat(fd)
        if not _is_stream(info.st_mode):
            raise RefusedPath(f"{path} changed while it was opened")
        os.set_blocking(fd, True)
        _write_all(fd, data)
    finally:
        os.close(fd)
    return True


def _is_stream(mode: int) -> bool:
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _replace(dirfd: int, name: str, data: bytes, mode: int, owner_root: bool,
             durable: bool) -> None:
    """`data` under a fresh name beside `name`, renamed over it; nothing left behind on
    any error (a kill can leave the temp only between its naming and the rename)."""
    tmp = _named_temp(dirfd, data, mode, owner_root, durable)
    try:
        os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException:
        _unlink_quietly(tmp, dirfd)
        raise
    if durable:
        os.fsync(dirfd)


def _named_temp(dirfd: int, data: bytes, mode: int, owner_root: bool, durable: bool) -> str:
    """A complete file in `dirfd` under a fresh temporary name: written unnamed, named
    only once whole (or a named one, removed on any error, without O_TMPFILE)."""
    fd, tmp = _temp(dirfd)
    try:
        if owner_root and os.geteuid() == 0:
            os.fchown(fd, 0, 0)
        os.fchmod(fd, mode)
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
        return tmp if tmp is not None else _link_temp(fd, dirfd)
    except BaseException:
        if tmp is not None:
            _unlink_quietly(tmp, dirfd)
        raise
    finally:
        os.close(fd)


def _temp(dirfd: int) -> tuple[int, str | None]:
    """(fd, None) for an unnamed O_TMPFILE, else (fd, name) of a fresh private file."""
    flag = getattr(os, "O_TMPFILE", 0)
    if flag and os.path.isdir(f"/proc/self/fd/{dirfd}"):
        try:
            return os.open(".", flag | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=dirfd), None
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    name = TMP_PREFIX + os.urandom(8).hex()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, 0o600, dir_fd=dirfd), name


def _link_temp(fd: int, dirfd: int) -> str:
    """Give the complete unnamed file a fresh name in its directory (linkat through
    /proc/self/fd, which needs no privilege)."""
    name = TMP_PREFIX + os.urandom(8).hex()
    os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dirfd, follow_symlinks=True)
    return name


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _unlink_quietly(name: str, dirfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dirfd)
    except OSError:
        pass


def _remove_empty_dirs(directory: Path, top: Path) -> None:
    """Remove `directory` and its parents while empty, stopping at `top`."""
    while directory != top and top in directory.parents:
        try:
            os.rmdir(directory)
        except OSError:
            return
        directory = directory.parent
