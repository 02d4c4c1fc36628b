"""A world for hostile-input tests: a series, an applied default tree, a cache, a home.

`World.refuse(argv, message)` runs one CLI command and asserts what every bad input must
give: exit 2, exactly one stderr line `patchset: error: <message...>`, nothing on stdout,
no traceback, and every byte of the series, the tree with its .patchset/ state and lock,
the cache and the home exactly as before. Each world has its own cache (private_cache), so
tests running in parallel cannot change it under a refusal.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from patchset.cli import main
from patchset.series.manifest import load_series
from patchset.pin.upstream import _pin_key

ERROR = re.compile(r"patchset: error: [^\n]+")


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every file, directory and link under `roots`: mode, size and content digest (a
    link: its target, a link to a directory included). One lstat per entry through
    scandir: the refusal tests take four snapshots of a world of ~16k files per case, and
    os.walk's lstat + islink per file was 90 of hardening_strings' 108 s."""
    out: dict[str, tuple] = {}
    for root in roots:
        if not root.exists():
            out[str(root)] = ("absent",)
            continue
        _walk(str(root), os.lstat(root).st_mode, out)
    return out


def _walk(folder: str, mode: int, out: dict[str, tuple]) -> None:
    out[folder] = ("dir", mode)
    with os.scandir(folder) as entries:
        listed = sorted(entries, key=lambda e: e.name)
    for entry in listed:
        if entry.is_symlink():
            out[entry.path] = ("link", os.readlink(entry.path))
            continue
        info = entry.stat(follow_symlinks=False)
        if entry.is_dir(follow_symlinks=False):
            _walk(entry.path, info.st_mode, out)
        else:
            out[entry.path] = (info.st_mode, info.st_size, _digest(entry.path, info))


_DIGESTS: dict[tuple, str] = {}


def _digest(path: str, info: os.stat_result) -> str:
    """Content digest, cached on (path, size, mtime, inode): a rewrite changes mtime."""
    key = (path, info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns)
    if key not in _DIGESTS:
        with open(path, "rb") as handle:
            _DIGESTS[key] = hashlib.sha256(handle.read()).hexdigest()
    return _DIGESTS[key]


@dataclass
class World:
    series: Path            # the series directory (patches.yaml + patches/)
    home: Path              # PATCHSET_HOME (holds the applied default tree)
    cache: Path             # PATCHSET_CACHE
    capsys: object

    @property
    def manifest(self) -> Path:
        return self.series / "patches.yaml"

    def data(self) -> dict:
        return yaml.safe_load(self.manifest.read_text())

    def run(self, *argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = self.capsys.readouterr()
        return code, out, err

    def state(self) -> dict:
        return snapshot(self.series, self.home, self.cache)

    def refuse(self, argv: tuple[str, ...], message: str | re.Pattern,
               before: dict | None = None) -> str:
        """Run argv; assert the refusal contract; return the error line."""
        before = self.state() if before is None else before
        code, out, err = self.run(*argv)
        assert code == 2, f"{argv}: exit {code}\n{err}"
        assert out == "", out
        assert "Traceback" not in err and "\x1b" not in err and "\r" not in err
        lines = err.splitlines()
        assert len(lines) == 1, err
        assert ERROR.fullmatch(lines[0]), lines[0]
        if isinstance(message, re.Pattern):
            assert message.search(lines[0]), lines[0]
        else:
            assert message in lines[0], lines[0]
        after = self.state()
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert not changed, f"{argv} changed files: {changed[:5]}"
        return lines[0]


def make_world(series_template: Path, root: Path, capsys, monkeypatch) -> World:
    """A series copy and a default tree with the safe tier applied, cwd = the series."""
    series = root / "series"
    if not series.exists():
        shutil.copytree(series_template, series, ignore=shutil.ignore_patterns("authoring"))
    home = root / "home"
    cache = root / "cache"
    if not cache.exists():
        pin = load_series(series_template / "patches.yaml").upstream
        private_cache(Path(os.environ["PATCHSET_CACHE"]), cache, repo=_pin_key(pin))
    monkeypatch.setenv("PATCHSET_HOME", str(home))
    monkeypatch.setenv("PATCHSET_CACHE", str(cache))
    monkeypatch.chdir(series)
    world = World(series=series, home=home, cache=cache, capsys=capsys)
    if not (home / "targets").exists():
        code, _, err = world.run("apply", "--tier", "safe", "localhost")
        assert code == 0, err
    return world


def private_cache(shared: Path, dest: Path, *, repo: str) -> None:
    """A copy of the shared test cache that only this world uses. Why: `refuse` asserts
    that not one byte of the cache changed, and other tests (another xdist worker, another
    run on the machine) write guards and temporary builds into the shared cache at any
    moment (the rare "changed files" failure of commit c3cb4ef). Content-addressed files
    (git objects, wheels, bundles: never rewritten in place) are hard links, so the copy is
    cheap; everything else is copied; leftovers in tmp/ are not taken.

    Of the built pins under repos/ only `repo` (the world's own pin) is taken: the shared
    cache collects one repository per pin any test used (28 on a developer machine, 100k
    files), and every refusal snapshots the whole cache twice, so the others made each case
    of a hostile module cost seconds (make test spent 20 minutes in one such module)."""
    def place(src: str, dst: str) -> None:
        immutable = "/objects/" in src or src.endswith((".whl", ".bundle", ".pack", ".idx"))
        (os.link if immutable else shutil.copy2)(src, dst)

    def skipped(folder: str, names: list[str]) -> list[str]:
        if Path(folder) == shared / "tmp":
            return names
        if Path(folder) == shared / "repos":
            return [name for name in names if name != repo]
        return []

    shutil.copytree(shared, dest, copy_function=place, symlinks=True, ignore=skipped)
