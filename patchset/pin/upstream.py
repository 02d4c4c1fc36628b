"""Provision the pinned upstream into a local cache, and lay it out as trees.

One pin must give one base commit on every machine, online or not. So the base comes
from git at the pinned ref where that is reachable (upstream's real commit), otherwise
from the pinned PyPI wheel, verified by sha256 and imported with `git fast-import` in a
hermetic environment (fixed identity, dates from the wheel, modes from the zip, no user
or system git config), which makes the commit id a pure function of the wheel bytes.

Cache layout (root: `cache_root()`):
    wheels/<file>                  verified wheels, written by rename only
    repos/<name>-<version>-<key>/  one non-bare repo per pin; `.git/patchset-base.json`
    locks/<...>.lock               flock per pin, so concurrent runs build once
    tmp/                           builds in progress; renamed into place when complete

git runs through subprocess, not GitPython: GitPython's `execute()` always merges
`os.environ`, so inherited GIT_DIR/GIT_INDEX_FILE/GIT_CONFIG_* (e.g. when run from a git
hook) could not be removed, and determinism needs a fully controlled environment.
"""

from __future__ import annotations

import calendar
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from patchset.pin import pinrules
from patchset.agent.lib import bounded, gitenv
from patchset.errors import Unreachable, UpstreamError, UsageError
from patchset.pin.model import GitPin, PypiPin, UpstreamPin
from patchset.progress import Advance, NullProgress, Progress

__all__ = ["BaseTree", "MissingRef", "Range", "blob_ids", "cache_root", "fetch_wheel", "materialize", "pin_for_version",
           "provision"]

IDENTITY = "patchset <patchset@invalid>"
USER_NAME, USER_EMAIL = "patchset", "patchset@invalid"
GIT_PROBE_TIMEOUT_S = 15  # fail fast when the git host is unreachable, then use PyPI
GIT_FETCH_TIMEOUT_S = 900
PIP_TIMEOUT_S = 900
PIP: tuple[str, ...] = (sys.executable, "-m", "pip")  # a tuple so tests can swap it
META_FILE = "patchset-base.json"  # inside <repo>/.git
LAYOUTS = ("git", "wheel")
_META_VERSION = 1
RECORD_LIMIT = bounded.MIB        # a cache record or wheel record: a few hundred bytes

# Settings that could change checked-out bytes or objects; forced on every git call.
_GIT_CONFIG = (
    "core.autocrlf=false core.eol=lf core.safecrlf=false gc.auto=0 tar.umask=022"
    " init.defaultBranch=main advice.detachedHead=false"
).split()
_GIT_OPTS = tuple(arg for setting in _GIT_CONFIG for arg in ("-c", setting))
# The transports a pinned git url may use (GIT_ALLOW_PROTOCOL, for every network call).
_PROTOCOLS = "https:http:ssh:git:file"
# Local config of a materialized clone: commits work without a global identity.
_CLONE_CONFIG = {"user.name": USER_NAME, "user.email": USER_EMAIL, "core.autocrlf": "false"}
_PIP_FLAGS = (
    "download --no-deps --only-binary=:all: --no-input --disable-pip-version-check"
    " --progress-bar off"
).split()
# What pip prints when it could not talk to the index at all (as opposed to "no such version").
_PIP_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|ConnectTimeout|ReadTimeout"
    r"|Could not fetch URL|Temporary failure in name resolution|Name or service not known"
    r"|ProxyError|SSLError|Network is unreachable|Connection refused|connection broken",
    re.IGNORECASE,
)
# What git prints when it could not talk to the repository at all (no answer, no such
# host or repository, refused), as opposed to "it answered: no such ref".
_GIT_UNREACHABLE = re.compile(
    r"Could not resolve host|Could not resolve hostname|Temporary failure in name resolution"
    r"|Name or service not known|Connection refused|Connection timed out|Connection reset"
    r"|Operation timed out|Network is unreachable|No route to host|Failed to connect"
    r"|unable to access|Could not read from remote repository"
    r"|does not appear to be a git repository|repository '[^']*' not found"
    r"|Repository not found|the remote end hung up unexpectedly",
    re.IGNORECASE,
)
_HEX40 = re.compile(r"[0-9a-fA-F]{40}")
# What git prints when the repository answered but has no such ref (or commit).
_GIT_NO_REF = re.compile(r"couldn't find remote ref|not our ref|no such remote ref",
                         re.IGNORECASE)


class MissingRef(UsageError):
    """The repository answered, and it has no such branch, tag or commit: bad input
    (exit 2), not a network failure. `ref`, `url` and `why` for callers that name the
    option the ref came from."""

    def __init__(self, ref: str, url: str) -> None:
        self.ref, self.url = ref, url
        self.why = (f"no such commit at {url} (or the server does not serve commits by id)"
                    if _HEX40.fullmatch(ref) else f"no such branch, tag or commit at {url}")
        super().__init__(f"{ref!r}: {self.why}")


@dataclass(frozen=True)
class BaseTree:
    """The pinned upstream as a commit in a cached repo."""

    repo: Path  # non-bare git repo in the cache, checked out at `commit`
    commit: str  # 40-hex
    source: str  # "git" or "pypi"
    ref: str  # branch in `repo` at `commit`, e.g. "patchset/base/sglang-0.5.14"


def cache_root() -> Path:
    """$PATCHSET_CACHE, else $XDG_CACHE_HOME/patchset, else ~/.cache/patchset."""
    explicit = os.environ.get("PATCHSET_CACHE")
    if explicit:
        return Path(explicit).expanduser().absolute()  # absolute: never a `-...` argument
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"  # XDG: relative = unset
    return (base / "patchset").absolute()


def provision(
    pin: UpstreamPin,
    cache: Path | None = None,
    progress: Progress | None = None,
    offline: bool = False,
) -> BaseTree:
    """Return the pin as a cached commit, fetching and building it on first use.

    Touches no network when the cache already holds the pin; `offline=True` never does
    and fails if the cache cannot provide the pin.

    A pin is checked against everything the cache holds for it before anything is used
    or written: a git url/ref or requirement that could become an option is refused, a
    cached wheel whose sha256 is not the pin's is refused (and kept: exit 2, the cache
    unchanged), and a cached base is used only when its recorded pin is this whole pin.
    """
    cache = (Path(cache) if cache is not None else cache_root()).absolute()
    progress = progress or NullProgress()
    if pin.git is None and pin.pypi is None:
        raise UpstreamError(
            "upstream has neither git nor pypi; add one to upstream: in patches.yaml"
        )
    pinrules.runtime_check(pin)
    key = _pin_key(pin)
    repo = cache / "repos" / key
    try:
        verify_cached_wheel(pin, cache)
        found = _cached(repo, key, pin)
        if found:
            return found
        with _locked(cache / "locks" / f"{key}.lock", progress):
            return _cached(repo, key, pin) or _build(pin, cache, key, progress, offline)
    except OSError as e:
        raise UpstreamError(
            f"cannot use the patchset cache {cache}: {e.strerror or e}"
            f"{f' ({e.filename})' if e.filename else ''}; free disk space, fix permissions"
            " or set PATCHSET_CACHE"
        ) from e


def fetch_wheel(
    pin: UpstreamPin,
    cache: Path | None = None,
    progress: Progress | None = None,
    offline: bool = False,
) -> Path:
    """The pin's verified wheel in the cache (downloaded on first use): for tools and tests
    that need the wheel's own bytes, e.g. to compare a site-packages target with it."""
    if pin.pypi is None:
        raise UpstreamError("the pin has no pypi entry; add upstream.pypi to patches.yaml")
    cache = (Path(cache) if cache is not None else cache_root()).absolute()
    pinrules.runtime_check(pin)
    try:
        verify_cached_wheel(pin, cache)
        return _wheel(pin, cache, progress or NullProgress(), offline)
    except OSError as e:
        raise UpstreamError(
            f"cannot use the patchset cache {cache}: {e.strerror or e};"
            " free disk space, fix permissions or set PATCHSET_CACHE"
        ) from e


def materialize(
    base: BaseTree, dest: Path, layout: str = "git", progress: Progress | None = None
) -> Path:
    """Create `dest` holding the base tree, built aside and renamed in so it is all-or-nothing.

    layout "git": a clone at base.commit (git paths, e.g. python/sglang/...), with a local
    user.name/email so commits work. layout "wheel": plain files as the wheel lays them
    out (the pin's git_prefix stripped, sglang/... at the top), no .git.
    """
    if layout not in LAYOUTS:
        raise UpstreamError(f"unknown layout {layout!r}; use one of: {', '.join(LAYOUTS)}")
    progress = progress or NullProgress()
    dest = Path(dest).absolute()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UpstreamError(f"{dest} exists and is not empty; pick a new directory or remove it")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            with progress.task(f"materialize {base.ref} ({layout}) at {dest}", None):
                (_clone if layout == "git" else _export)(base, tmp)
            if dest.exists():
                dest.rmdir()
            os.rename(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        raise UpstreamError(
            f"cannot create {dest}: {e.strerror or e}; check space and permissions"
        ) from e
    return dest


def blob_ids(base: BaseTree, paths: Iterable[str]) -> dict[str, str | None]:
    """Git blob ids at the base commit for git paths (None where absent): the pre-image
    hashes that say whether a target holds the pinned file, whatever its layout."""
    wanted = list(paths)
    found: dict[str, str | None] = dict.fromkeys(wanted)
    if not wanted:
        return found
    out = _git(
        ["--literal-pathspecs", "ls-tree", "-z", "--full-tree", base.commit, "--", *wanted],
        base.repo,
        strip=False,
    )
    for record in filter(None, out.split("\0")):
        meta, path = record.split("\t", 1)
        _mode, kind, oid = meta.split()
        if kind == "blob" and path in found:
            found[path] = oid
    return found


def blob_reader(base: BaseTree) -> Callable[[str], bytes | None]:
    """read(path) -> the base commit's bytes of a git path, or None when it has none:
    api.check's view of the pin (`git cat-file blob COMMIT:PATH` in the cached repo)."""
    def read(path: str) -> bytes | None:
        proc = gitenv.run_git([*_GIT_OPTS, "cat-file", "blob", f"{base.commit}:{path}"],
                              base.repo, mode=gitenv.LOCAL)
        return proc.stdout if proc.returncode == 0 else None
    return read


def tree_files(base: BaseTree, prefix: str, suffix: str = ".py") -> dict[str, bytes]:
    """Every file under `prefix` whose name ends in `suffix`, git path -> bytes, at the
    base commit: one `ls-tree` and one `cat-file --batch` for all of them (the call-path
    guards read the whole package; one process per file would cost seconds)."""
    listing = _git(["--literal-pathspecs", "ls-tree", "-r", "-z", "--full-tree", base.commit,
                    "--", prefix], base.repo, strip=False)
    wanted: list[tuple[str, str]] = []
    for record in filter(None, listing.split("\0")):
        meta, path = record.split("\t", 1)
        _mode, kind, oid = meta.split()
        if kind == "blob" and path.endswith(suffix):
            wanted.append((oid, path))
    proc = gitenv.run_git([*_GIT_OPTS, "cat-file", "--batch"], base.repo, mode=gitenv.LOCAL,
                          input="".join(f"{oid}\n" for oid, _ in wanted).encode())
    if proc.returncode:
        raise UpstreamError(f"git cat-file failed: {_last_line(proc.stderr)}")
    out, at = {}, 0
    data = proc.stdout
    for _oid, path in wanted:
        end = data.index(b"\n", at)
        size = int(data[at:end].split()[2])
        out[path] = data[end + 1:end + 1 + size]
        at = end + 1 + size + 1
    return out


def pin_for_version(
    pin: UpstreamPin,
    version: str,
    cache: Path | None = None,
    progress: Progress | None = None,
    offline: bool = False,
) -> UpstreamPin:
    """`pin` moved to another release of the same package (for `patchset rebase`).

    Same git url and wheel python_version/platform; the git ref and requirement follow the
    version. The wheel's file name and sha256 cannot be known in advance, so they are
    learnt by downloading it through pip over HTTPS (trust on first use); the manifest
    then records them, and every later provision verifies the sha256 like the current
    pin's. What was learnt is kept in the cache, so a second run needs no network.
    Exit 2 for a release the index does not have, 3 when the index cannot be reached.
    """
    if version == pin.version:
        return pin
    if pin.pypi is None:
        raise UsageError(
            "moving the pin needs upstream.pypi in patches.yaml (the new release's wheel"
            " is what gives its sha256)"
        )
    git = pin.git and GitPin(url=pin.git.url, ref=_moved_ref(pin.git.ref, pin.version, version))
    return wheel_pin(dataclasses.replace(pin, version=version, git=git), cache, progress, offline)


def wheel_pin(
    pin: UpstreamPin,
    cache: Path | None = None,
    progress: Progress | None = None,
    offline: bool = False,
) -> UpstreamPin:
    """`pin` with its wheel's file name and sha256 for `pin.version` (for the pin's
    python_version and platform), learnt once through pip (trust on first use) and kept in
    the cache; offline, from what the cache holds: the record of an earlier run, else a
    cached wheel of that release (hashed here). For `rebase` and `init`."""
    cache = Path(cache) if cache is not None else cache_root()
    progress = progress or NullProgress()
    want = dataclasses.replace(_pypi(pin), requirement=f"{pin.name}=={pin.version}", file="",
                               sha256="")
    record = cache / "tofu" / "-".join(
        _safe(part) for part in (pin.name, pin.version, want.python_version, want.platform)
    )
    record = record.with_name(record.name + ".json")
    try:
        with _locked(cache / "locks" / f"{record.stem}.lock", progress):
            found = (_recorded_wheel(record) or _cached_wheel(pin, want, record, cache, progress)
                     or _learn_wheel(pin, pin.version, want, record, cache, progress, offline))
    except OSError as e:
        raise UpstreamError(
            f"cannot use the patchset cache {cache}: {e.strerror or e};"
            " free disk space, fix permissions or set PATCHSET_CACHE"
        ) from e
    return dataclasses.replace(pin, pypi=found)


def _cached_wheel(pin: UpstreamPin, want: PypiPin, record: Path, cache: Path,
                  progress: Progress) -> PypiPin | None:
    """The release's wheel already in the cache (an earlier provision or download) for
    the wanted Python and platform, hashed and recorded; None when there is none."""
    found = [w for w in sorted((cache / "wheels").glob("*.whl"))
             if _wheel_fits(w.name, pin.name, pin.version, want)
             and w.is_file() and not w.is_symlink()]
    if len(found) != 1:
        return None
    got = dataclasses.replace(want, file=found[0].name, sha256=_sha256(found[0], progress))
    _record(record, got)
    return got


def _wheel_fits(file: str, name: str, version: str, want: PypiPin) -> bool:
    """Whether a wheel file name is `name` `version` for the wanted Python and platform,
    by its tags (NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl, each tag a `.`-separated set),
    compared whole: `x86_64` is not `manylinux_2_34_x86_64`. A pure wheel (`any`) fits
    every platform, as pip takes it."""
    parts = file[:-len(".whl")].split("-") if file.endswith(".whl") else []
    if len(parts) not in (5, 6):
        return False
    dist = re.sub(r"[-_.]+", "_", name).lower()
    py_tags, platforms = parts[-3].split("."), parts[-1].split(".")
    return (parts[0].lower() == dist and parts[1] == version
            and ("cp" + want.python_version.replace(".", "") in py_tags or "py3" in py_tags)
            and (want.platform in platforms or "any" in platforms))


def _moved_ref(ref: str, old: str, new: str) -> str:
    """The git ref of the new release, written like the old one (`v0.5.14` -> `v0.5.15`)."""
    return ref.replace(old, new) if old in ref else f"v{new}"


def _recorded_wheel(record: Path) -> PypiPin | None:
    """The wheel learnt for this release by an earlier run, or None."""
    try:
        found = PypiPin(**bounded.read_json(record, RECORD_LIMIT, "wheel record"))
    except (OSError, ValueError, TypeError):
        return None
    return None if pinrules.pypi_problems(found) else found  # a damaged record: learn again


def _learn_wheel(
    pin: UpstreamPin,
    version: str,
    want: PypiPin,
    record: Path,
    cache: Path,
    progress: Progress,
    offline: bool,
) -> PypiPin:
    """Download the release's wheel into the cache, hash it, and record both (TOFU)."""
    if offline:
        raise UpstreamError(
            f"offline and {pin.name} {version} has not been fetched on this machine"
            f" (no {record}); run once with network access"
        )
    tmp_root = cache / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="learn.", dir=tmp_root) as tmp:
        with progress.task(f"download {want.requirement} (pip)", None):
            done = _run_pip(want, Path(tmp), "and retry", Unreachable)
        if done.returncode:
            _raise_for_pip(pin, version, want, done.stderr)
        got = _one_wheel(Path(tmp), pin.name, version)
        found = dataclasses.replace(want, file=got.name, sha256=_sha256(got, progress))
        final = cache / "wheels" / got.name
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(got, final)
    _record(record, found)
    return found


def _record(record: Path, found: PypiPin) -> None:
    """Keep what was learnt of a release's wheel, so the next run needs no network."""
    record.parent.mkdir(parents=True, exist_ok=True)
    staged = record.with_name(f".{record.name}.tmp")
    staged.write_text(json.dumps(dataclasses.asdict(found), indent=2, sort_keys=True) + "\n")
    os.replace(staged, record)


def _raise_for_pip(pin: UpstreamPin, version: str, want: PypiPin, stderr: bytes) -> None:
    """pip's failure as one line: unreachable index (3), no such release (2), else (4)."""
    text = stderr.decode("utf-8", "replace")
    why = _last_line(stderr)
    unreachable = _PIP_UNREACHABLE.search(text)
    if unreachable or "(from versions: none)" in text:
        seen = unreachable.group(0) if unreachable else f"no {pin.name} release listed at all"
        raise Unreachable(
            f"cannot reach the package index for {want.requirement} ({seen}); check the"
            " network and the index (pip config list)"
        )
    if "No matching distribution found" in text:
        raise UsageError(
            f"{pin.name} {version}: no such release with a wheel for python"
            f" {want.python_version} on {want.platform} on the package index"
        )
    raise UpstreamError(f"pip download {want.requirement} failed: {why}")


def _one_wheel(directory: Path, name: str, version: str) -> Path:
    """The single wheel pip downloaded, which must be the asked-for release."""
    wheels = sorted(directory.glob("*.whl"))
    dist = re.sub(r"[-_.]+", "_", name).lower()
    if len(wheels) != 1 or not wheels[0].name.lower().startswith(f"{dist}-{version}-"):
        names = ", ".join(p.name for p in sorted(directory.iterdir())) or "nothing"
        raise UpstreamError(f"pip downloaded {names}, not one {name} {version} wheel")
    return wheels[0]


# ---------------------------------------------------------------- cache bookkeeping


def _pin_key(pin: UpstreamPin) -> str:
    """Directory name for a pin: readable name-version plus a digest of every field, so
    editing any part of the pin (sha, ref, prefix) never reuses a stale build. The name
    is only a name: `_cached` compares the whole recorded pin, not this digest."""
    blob = json.dumps(dataclasses.asdict(pin), sort_keys=True).encode()
    return f"{_safe(pin.name)}-{_safe(pin.version)}-{hashlib.sha256(blob).hexdigest()[:12]}"


def _safe(text: str) -> str:
    """A file-name and ref-name safe rendering of a name or version."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", text).replace("..", "_").lstrip(".") or "_"


def _base_ref(pin: UpstreamPin) -> str:
    """The branch name the base commit gets in the cache repo (and in clones of it)."""
    return f"patchset/base/{_safe(pin.name)}-{_safe(pin.version)}"


def _cached(repo: Path, key: str, pin: UpstreamPin) -> BaseTree | None:
    """The BaseTree recorded in a complete cache repo, or None if absent, broken or built
    for another pin (the whole pin is compared, every field, not a digest of it)."""
    try:
        meta = bounded.read_json(repo / ".git" / META_FILE, RECORD_LIMIT, "cache record")
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("version") != _META_VERSION \
            or meta.get("key") != key or meta.get("pin") != dataclasses.asdict(pin):
        return None
    try:
        commit = _git(["rev-parse", "--verify", "-q", f"refs/heads/{meta['ref']}^{{commit}}"], repo)
    except UpstreamError:
        return None
    if commit != meta["commit"]:
        return None
    return BaseTree(repo=repo, commit=commit, source=meta["source"], ref=meta["ref"])


@contextmanager
def _locked(path: Path, progress: Progress) -> Iterator[None]:
    """Hold an exclusive flock on `path`, showing a wait task if another run holds it."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with progress.task(f"waiting for another patchset run ({path.name})", None):
                fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(pin: UpstreamPin, cache: Path, key: str, progress: Progress, offline: bool) -> BaseTree:
    """Build the pin's repo in cache/tmp and rename it into cache/repos (lock held)."""
    tmp_root = cache / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    for stale in tmp_root.glob(f"{key}.*"):  # left by a killed run; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=tmp_root))
    try:
        meta: dict[str, object] = {"version": _META_VERSION, "key": key, "ref": _base_ref(pin)}
        meta |= _populate(pin, cache, work, progress, offline)
        meta["pin"] = dataclasses.asdict(pin)
        (work / ".git" / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        repo = cache / "repos" / key
        _replace_dir(work, repo)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BaseTree(
        repo=repo, commit=str(meta["commit"]), source=str(meta["source"]), ref=_base_ref(pin)
    )


def _replace_dir(new: Path, final: Path) -> None:
    """Move a finished build into place, setting aside a broken old one first."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        old = new.with_name(new.name + ".old")
        os.rename(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.rename(new, final)


def _populate(
    pin: UpstreamPin, cache: Path, work: Path, progress: Progress, offline: bool
) -> dict[str, str]:
    """Fill `work` from git when reachable, else from the verified wheel."""
    reason = "offline" if offline else "no git pin"
    if pin.git is not None and not offline:
        try:
            return _from_git(pin, pin.git, work, progress)
        except (UpstreamError, Unreachable, MissingRef) as e:
            if pin.pypi is None and isinstance(e, MissingRef) and pinrules.located(pin):
                raise pinrules.pin_error(pin, ("git", "ref"), str(e)) from e      # exit 2
            if pin.pypi is None and isinstance(e, (Unreachable, MissingRef)):
                raise               # no fallback: no such ref is exit 2, no answer exit 3
            reason = str(e)
            shutil.rmtree(work)
            work.mkdir()
    if pin.pypi is None:
        if offline:
            raise UpstreamError(
                f"offline and {pin.name} {pin.version} is not in the cache {cache};"
                " run once with network access"
            )
        raise UpstreamError(
            f"{reason}; the pin has no pypi fallback: fix the network or add upstream.pypi"
        )
    wheel = _wheel(pin, cache, progress, offline)
    return _from_wheel(pin, pin.pypi, wheel, work, progress) | {"fallback_reason": reason}


# ---------------------------------------------------------------- a commit as the pin


def pin_for_commit(url: str, ref: str, git_prefix: str | None = None,
                   cache: Path | None = None, progress: Progress | None = None,
                   offline: bool = False) -> UpstreamPin:
    """A pin at upstream commit `ref` of `url` (a branch or tag is resolved to its commit,
    which is what gets pinned): its layout read from the tree unless given, its version
    the release its version.py names plus the commit (`0.5.14+g1234567890ab`). The tree
    is provisioned once under that pin, so what follows finds it in the cache."""
    for what, problem in (("git url", pinrules.git_url_problem(url)),
                          ("ref", pinrules.git_ref_problem(ref))):
        if problem:
            raise UsageError(f"{what} {ref if what == 'ref' else url!r}: {problem}")
    if not offline and not _HEX40.fullmatch(ref):
        ref = _remote_commit(url, ref, cache or cache_root())
    probe = UpstreamPin(name="sglang", version="0", git=GitPin(url, ref), pypi=None)
    base = provision(probe, cache, progress, offline)
    prefix = git_prefix if git_prefix is not None else _layout(base)
    version = f"{_release_of(base, prefix)}+g{base.commit[:12]}"
    return UpstreamPin(name="sglang", version=version, git=GitPin(url, base.commit), pypi=None,
                       git_prefix=prefix)


def _remote_commit(url: str, ref: str, cwd: Path) -> str:
    """The commit a branch or tag names upstream now. Asked every time online: the tree
    provisioned for a ref is cached under the ref, so without this a branch that moved
    since an earlier init or rebase would pin its old commit. Names are tried in git's
    own order (the ref itself, refs/, tags, heads); a tag is peeled to its commit."""
    cwd.mkdir(parents=True, exist_ok=True)
    out = _git(["ls-remote", "--exit-code", "--", url, ref], cwd, remote=(url, ref),
               timeout=GIT_PROBE_TIMEOUT_S)
    found = {name: commit for commit, name in
             (line.split("\t", 1) for line in out.splitlines() if "\t" in line)}
    for name in (ref, f"refs/{ref}", f"refs/tags/{ref}", f"refs/heads/{ref}"):
        for key in (f"{name}^{{}}", name):
            if _HEX40.fullmatch(found.get(key, "")):
                return found[key]
    raise MissingRef(ref, url)


def _release_of(base: BaseTree, prefix: str) -> str:
    """The release a tree says it is: `version = '0.5.14'` at the top level of the
    `_version.py` a wheel build writes, else of `version.py`; "0" when neither says
    (a git checkout computes its version at build time)."""
    read = blob_reader(base)
    for name in ("_version.py", "version.py"):
        text = (read(f"{prefix}sglang/{name}") or b"").decode("utf-8", "replace")
        found = re.search(r"^(?:__version__|version)\s*=\s*(?:(?:__version__|version)\s*=\s*)?"
                          r"[\"']([0-9][0-9A-Za-z._-]{0,39})[\"']", text, re.M)
        if found:
            return found.group(1)
    return "0"


def _layout(base: BaseTree) -> str:
    """Where the package sits in the tree: `python/` (SGLang's repository) or the top."""
    found = blob_ids(base, ["python/sglang/__init__.py", "sglang/__init__.py"])
    for prefix in ("python/", ""):
        if found[f"{prefix}sglang/__init__.py"]:
            return prefix
    raise UsageError(f"{base.commit[:12]}: no sglang/__init__.py at the top or under python/;"
                     " is this SGLang's repository?")


# ---------------------------------------------------------------- upstream history


@dataclass(frozen=True)
class Range:
    """START..END of upstream's history, resolved in the cached history clone."""

    repo: Path                       # the clone (non-bare), holding both ends' history
    start: str                       # START's commit
    end: str                         # END's commit
    commits: list[str]               # first-parent commits after START up to END, oldest first
    subjects: dict[str, str]         # commit -> subject line, START's included


def history(url: str, start: str, end: str, cache: Path | None = None,
            progress: Progress | None = None, offline: bool = False) -> Range:
    """Upstream's first-parent commits after `start` up to `end` (oldest first) and their
    subject lines, in a cached clone of `url` kept for that (`rebase --check`): pins are
    shallow, a range needs the history between two commits. Each end is fetched to a ref
    named after it (refs/patchset/fetched/<digest of the name>), so offline resolves
    exactly the START and END asked for, from what an earlier run fetched of them.
    START must be an ancestor of END. Exit 2 for an end the repository does not have (or,
    offline, that was never fetched) or a START that is not an ancestor of END; 3 when the
    repository cannot be reached."""
    ends = (("start", start), ("end", end))
    for what, problem in (("url", pinrules.git_url_problem(url)),
                          *((what, pinrules.git_ref_problem(ref)) for what, ref in ends)):
        if problem:
            raise UsageError(f"rebase --check: {what}: {problem}")
    cache = (Path(cache) if cache is not None else cache_root()).absolute()
    progress = progress or NullProgress()
    repo = cache / "history" / hashlib.sha256(url.encode()).hexdigest()[:16]
    with _locked(cache / "locks" / f"history-{repo.name}.lock", progress):
        if not (repo / ".git").is_dir():
            repo.mkdir(parents=True, exist_ok=True)
            _git(["init", "-q", "."], repo)
        if not offline:
            for what, ref in ends:
                with progress.task(f"git: fetching {ref} from {url} (history)", None):
                    try:
                        _git(["fetch", "-q", "--no-tags", "--", url, f"+{ref}:{_fetched(ref)}"],
                             repo, remote=(url, ref), timeout=GIT_FETCH_TIMEOUT_S)
                    except MissingRef as e:
                        raise UsageError(f"rebase --check: {what} {ref!r}: {e.why}") from e
        first, last = (_resolve_fetched(repo, url, what, ref, offline) for what, ref in ends)
        ancestor = gitenv.run_git([*_GIT_OPTS, "merge-base", "--is-ancestor", first, last],
                                  repo, mode=gitenv.LOCAL)
        if ancestor.returncode == 1:
            raise UsageError(f"rebase --check {start}..{end}: {start!r} is not an ancestor "
                             f"of {end!r} (START must be an earlier commit of END's history)")
        if ancestor.returncode:
            raise UpstreamError(f"git merge-base failed: {_last_line(ancestor.stderr)}")
        commits = _git(["rev-list", "--first-parent", "--reverse", f"{first}..{last}"],
                       repo).split()
        log = _git(["log", "--no-walk=unsorted", "--format=%H %s", first, *commits], repo)
    subjects = dict(line.partition(" ")[::2] for line in log.splitlines())
    return Range(repo, first, last, commits, subjects)


def _fetched(ref: str) -> str:
    """The ref a range end `ref` is fetched to: one per name, whatever the name."""
    return f"refs/patchset/fetched/{hashlib.sha256(ref.encode()).hexdigest()[:32]}"


def _resolve_fetched(repo: Path, url: str, what: str, ref: str, offline: bool) -> str:
    """The commit `ref` was fetched as (a commit id: itself, where the clone holds it)."""
    names = [f"{_fetched(ref)}^{{commit}}"] + ([f"{ref}^{{commit}}"] if _HEX40.fullmatch(ref)
                                               else [])
    for name in names:
        done = gitenv.run_git([*_GIT_OPTS, "rev-parse", "--verify", "-q", name], repo,
                              mode=gitenv.LOCAL)
        if done.returncode == 0:
            return done.stdout.decode().strip()
    raise UsageError(f"rebase --check: {what} {ref!r}: not fetched from {url} on this machine"
                     + ("; run it once without --offline" if offline else ""))


# ---------------------------------------------------------------- git


def _git(
    args: list[str],
    cwd: Path,
    *,
    network: bool = False,
    timeout: float | None = None,
    strip: bool = True,
    remote: tuple[str, str] | None = None,
) -> str:
    """Run git, returning stdout; any failure becomes a one-line UpstreamError. With
    `remote` (url, ref: a call that talks to the repository, network implied): no answer
    is Unreachable (exit 3), an answer without the ref MissingRef (exit 2)."""
    # Only real transports over the network: never a remote helper such as ext:: (runs a
    # command) or fd::.
    network = network or remote is not None
    mode, extra = ((gitenv.NETWORK, {"GIT_ALLOW_PROTOCOL": _PROTOCOLS}) if network
                   else (gitenv.LOCAL, None))
    try:
        done = gitenv.run_git([*_GIT_OPTS, *args], cwd, mode=mode, extra=extra,
                              timeout=timeout)
    except FileNotFoundError as e:
        raise UpstreamError("git is not installed or not on PATH; install git and retry") from e
    except subprocess.TimeoutExpired as e:
        if remote is not None:
            raise Unreachable(f"cannot reach {remote[0]}: git {_verb(args)} timed out after "
                              f"{timeout:.0f}s; check the network and the url") from e
        raise UpstreamError(f"git {_verb(args)} timed out after {timeout:.0f}s") from e
    if done.returncode:
        if remote is not None:
            _raise_for_remote(args, done, *remote)
        raise UpstreamError(f"git {_verb(args)} failed: {_last_line(done.stderr)}")
    out = done.stdout.decode("utf-8", "surrogateescape")
    return out.strip() if strip else out


def _raise_for_remote(args: list[str], done: subprocess.CompletedProcess, url: str,
                      ref: str) -> None:
    """A failed ls-remote/fetch as one line: the repository has no such ref (2: ls-remote
    --exit-code's own status 2, or fetch's "couldn't find remote ref"), it could not be
    reached (3), else the git failure as it is (4)."""
    text = done.stderr.decode("utf-8", "replace")
    if (_verb(args) == "ls-remote" and "--exit-code" in args and done.returncode == 2) \
            or _GIT_NO_REF.search(text):
        raise MissingRef(ref, url)
    if _GIT_UNREACHABLE.search(text):
        fatal = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("fatal:")]
        why = fatal[0] if fatal else _last_line(done.stderr)
        raise Unreachable(f"cannot reach {url} (git {_verb(args)}: {why}); check the url, "
                          "the network and your access")
    raise UpstreamError(f"git {_verb(args)} failed: {_last_line(done.stderr)}")


def _verb(args: list[str]) -> str:
    """The git subcommand of an argument list, for messages."""
    return next((a for a in args if not a.startswith("-")), "?")


def _last_line(stderr: bytes) -> str:
    """The last non-empty line of a tool's stderr: usually the actual reason."""
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "no error output"


def _from_git(pin: UpstreamPin, gp: GitPin, work: Path, progress: Progress) -> dict[str, str]:
    """Fetch the pinned ref shallowly into `work`; the commit is upstream's own.

    The url and ref come from the manifest: pinrules allows neither to start with `-`,
    and both sit after `--`, so git reads them as a repository and a refspec only."""
    is_sha = re.fullmatch(r"[0-9a-fA-F]{40}", gp.ref) is not None
    with progress.task(f"git: reaching {gp.url}", None):
        probe = (
            ["ls-remote", "--", gp.url, "HEAD"]
            if is_sha
            else ["ls-remote", "--exit-code", "--", gp.url, gp.ref]
        )
        _git(probe, work, remote=(gp.url, gp.ref), timeout=GIT_PROBE_TIMEOUT_S)
    _git(["init", "-q", "."], work)
    with progress.task(f"git: fetching {gp.ref} from {gp.url}", None):
        _git(
            ["fetch", "-q", "--depth", "1", "--no-tags", "--", gp.url, gp.ref],
            work,
            remote=(gp.url, gp.ref),
            timeout=GIT_FETCH_TIMEOUT_S,
        )
    commit = _git(["rev-parse", "--verify", "FETCH_HEAD^{commit}"], work)
    with progress.task(f"check out {gp.ref}", None):
        _checkout(work, _base_ref(pin), commit)
    return {"commit": commit, "source": "git", "url": gp.url, "git_ref": gp.ref}


# Highest-precedence attributes for the cache repo: its working tree and `git archive`
# output are the blobs' exact bytes, whatever .gitattributes upstream ships.
RAW_ATTRIBUTES = (
    "* -text -eol -ident -filter -working-tree-encoding -export-ignore -export-subst\n"
)


def _checkout(work: Path, ref: str, commit: str) -> None:
    """Point branch `ref` and HEAD at `commit` and fill the index and working tree."""
    info = work / ".git" / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "attributes").write_text(RAW_ATTRIBUTES)
    _git(["update-ref", f"refs/heads/{ref}", commit], work)
    _git(["symbolic-ref", "HEAD", f"refs/heads/{ref}"], work)
    _git(["reset", "-q", "--hard", commit], work)
    _git(["config", "core.autocrlf", "false"], work)


# ---------------------------------------------------------------- wheel


def verify_cached_wheel(pin: UpstreamPin, cache: Path | None = None) -> None:
    """Read-only: refuse a pin whose sha256 disagrees with the wheel the cache holds under
    its file name (PinError, exit 2, naming both hashes); the file is kept, since the pin
    is what is in doubt. Nothing is locked or written, so a wrong pin changes nothing."""
    if pin.pypi is None:
        return
    path = (Path(cache) if cache is not None else cache_root()) / "wheels" / pin.pypi.file
    if path.is_file():
        _verify(path, pin, NullProgress(), cached=True)


def _pypi(pin: UpstreamPin) -> PypiPin:
    """The pin's pypi entry: every wheel step is reached only with one (its callers check)."""
    assert pin.pypi is not None, f"{pin.name}: a wheel step without upstream.pypi"
    return pin.pypi


def _wheel(pin: UpstreamPin, cache: Path, progress: Progress, offline: bool) -> Path:
    """The verified wheel in cache/wheels, downloading it unless offline."""
    pp = _pypi(pin)
    with _locked(cache / "locks" / f"wheel-{_safe(pp.file)}.lock", progress):
        return _wheel_locked(pin, cache, progress, offline)


def _wheel_locked(pin: UpstreamPin, cache: Path, progress: Progress, offline: bool) -> Path:
    """_wheel's body, run while holding the wheel's lock."""
    pp = _pypi(pin)
    path = cache / "wheels" / pp.file
    if path.exists():
        _verify(path, pin, progress, cached=True)
    elif offline:
        raise UpstreamError(
            f"offline and {pp.file} is not in {path.parent}; run once with network"
            " access or copy the wheel there"
        )
    else:
        _download(pin, path, progress)
    return path


def _download(pin: UpstreamPin, final: Path, progress: Progress) -> None:
    """pip download the pinned file into a temp dir, verify it, rename it into the cache."""
    pp = _pypi(pin)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp_root = final.parent.parent / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="download.", dir=tmp_root) as tmp:
        with progress.task(f"download {pp.file} (pip)", None):
            _pip_download(pp, Path(tmp), final)
        got = Path(tmp) / pp.file
        if not got.exists():
            names = ", ".join(sorted(p.name for p in Path(tmp).iterdir())) or "nothing"
            raise UpstreamError(
                f"pip downloaded {names}, not the pinned {pp.file}; check"
                " upstream.pypi python_version/platform in patches.yaml"
            )
        _verify(got, pin, progress, cached=False)
        os.replace(got, final)


def _pip_download(pp: PypiPin, dest: Path, final: Path) -> None:
    """Run `pip download` for exactly the pinned wheel (no deps, binary only)."""
    fix = f"or copy the wheel to {final}"
    done = _run_pip(pp, dest, fix, UpstreamError)
    if done.returncode:
        why = _last_line(done.stderr)
        if "No module named pip" in why:
            raise UpstreamError(
                f"pip is not installed for {PIP[0]}; run `{PIP[0]} -m ensurepip` {fix}"
            )
        raise UpstreamError(
            f"pip download {pp.requirement} failed: {why}; check the network and"
            f" index (pip config list) {fix}"
        )


def _run_pip(
    pp: PypiPin, dest: Path, fix: str, timeout_error: type[Exception]
) -> subprocess.CompletedProcess:
    """`pip download` of pp.requirement for the pin's python/platform into `dest`; a pip
    that cannot run or hangs is one line (`timeout_error` for the hang).

    No value can be read as an option: the requirement is a plain NAME==VERSION
    (pinrules) after `--` (pip's optparse ends options there), the python version and
    platform are glued to their flags (`--platform=...`), and `dest` is absolute."""
    problem = pinrules.requirement_problem(pp.requirement)
    if problem:
        raise UsageError(f"upstream.pypi.requirement: {problem}")
    cmd = [*PIP, *_PIP_FLAGS, f"--python-version={pp.python_version}",
           f"--platform={pp.platform}"]
    cmd += ["-d", str(Path(dest).absolute()), "--", pp.requirement]
    try:
        return subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=PIP_TIMEOUT_S, check=False
        )
    except (FileNotFoundError, PermissionError) as e:
        raise UpstreamError(f"cannot run pip ({PIP[0]}): {e.strerror}; install pip {fix}") from e
    except subprocess.TimeoutExpired as e:
        raise timeout_error(
            f"pip download {pp.requirement} timed out after {PIP_TIMEOUT_S}s;"
            f" check the network {fix}"
        ) from e


def _verify(path: Path, pin: UpstreamPin, progress: Progress, cached: bool) -> None:
    """Check a wheel's sha256 against the pin (PinError, exit 2, both hashes). A cached
    file is never deleted for it: the pin is as likely wrong as the file (a shared
    manifest with a bad sha256 must not destroy the good wheel). A fresh download that
    disagrees stays in its temporary directory, which goes away."""
    expected = _pypi(pin).sha256
    actual = _sha256(path, progress)
    if actual == expected.lower():
        return
    if cached:
        raise pinrules.pin_error(pin, ("pypi", "sha256"), (
            f"sha256 mismatch for {path}: the pin says {expected}, the cached file is"
            f" {actual}; kept it and changed nothing - correct upstream.pypi.sha256 (or"
            " delete the file if it is damaged)"))
    raise pinrules.pin_error(pin, ("pypi", "sha256"), (
        f"sha256 mismatch for {path.name}: expected {expected}, got {actual} from the"
        " package index; not stored - check upstream.pypi.sha256 and the index it came from"))


def _sha256(path: Path, progress: Progress) -> str:
    """sha256 of a file, reporting bytes read."""
    digest = hashlib.sha256()
    with progress.task(f"verify {path.name}", path.stat().st_size) as advance, path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            advance(len(chunk))
    return digest.hexdigest()


def _from_wheel(
    pin: UpstreamPin, pp: PypiPin, wheel: Path, work: Path, progress: Progress
) -> dict[str, str]:
    """Import the wheel as one deterministic root commit under the pin's git_prefix."""
    ref = _base_ref(pin)
    _git(["init", "-q", "."], work)
    try:
        with zipfile.ZipFile(wheel) as zf:
            entries = _entries(zf, pin.git_prefix, wheel)
            when = _zip_epoch(zf)
            message = f"{pin.name} {pin.version} from {pp.file} sha256 {pp.sha256}\n"
            with progress.task(f"unpack {wheel.name}", len(entries)) as advance:
                _fast_import(work, ref, when, message, zf, entries, advance)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as e:
        raise UpstreamError(f"{wheel} is not a readable wheel: {e}; delete it and retry") from e
    commit = _git(["rev-parse", "--verify", f"refs/heads/{ref}^{{commit}}"], work)
    with progress.task(f"check out {ref}", None):
        _checkout(work, ref, commit)
    return {"commit": commit, "source": "pypi", "wheel": pp.file, "sha256": pp.sha256}


def _entries(zf: zipfile.ZipFile, prefix: str, wheel: Path) -> list[tuple[str, zipfile.ZipInfo]]:
    """(git path, zip entry) for every file to import, sorted by path.

    Skips directories and the install metadata (`*.dist-info`, `*.data`), which is not
    part of the source tree; refuses paths that could escape or confuse the tree.
    """
    prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
    out: dict[str, zipfile.ZipInfo] = {}
    for info in zf.infolist():
        name = info.filename
        if info.is_dir() or name.split("/", 1)[0].endswith((".dist-info", ".data")):
            continue
        parts = name.split("/")
        if (
            name.startswith("/")
            or "\\" in name
            or any(p in ("", ".", "..") or p.lower() == ".git" for p in parts)
        ):
            raise UpstreamError(
                f"{wheel.name} holds an unsafe path {name!r}; refusing to import it"
            )
        out[prefix + name] = info
    return sorted(out.items())


def _zip_epoch(zf: zipfile.ZipFile) -> int:
    """Commit time from the wheel itself: its newest entry time, read as UTC."""
    try:
        return calendar.timegm((*max(i.date_time for i in zf.infolist()), 0, 0, 0))
    except ValueError:
        return 315532800  # 1980-01-01, the zip epoch; a wheel with no entries or bad dates


def _mode(info: zipfile.ZipInfo) -> bytes:
    """Git file mode from the zip's unix bits: only the executable bit survives in git.
    Symlink entries stay regular files, as pip installs them."""
    return b"100755" if (info.external_attr >> 16) & 0o111 else b"100644"


def _quote(path: str) -> bytes:
    """A fast-import C-style quoted path, so no name can break the stream."""
    raw = path.encode("utf-8", "surrogateescape")
    body = re.sub(rb'[\\"\x00-\x1f\x7f]', lambda m: b"\\%03o" % m.group()[0], raw)
    return b'"' + body + b'"'


def _fast_import(
    work: Path,
    ref: str,
    when: int,
    message: str,
    zf: zipfile.ZipFile,
    entries: list[tuple[str, zipfile.ZipInfo]],
    advance: Advance,
) -> None:
    """Stream all entries into one root commit on `ref` with one `git fast-import`."""
    cmd = [*_GIT_OPTS, "fast-import", "--quiet", "--done", "--date-format=raw"]
    msg = message.encode()
    with tempfile.TemporaryFile() as err:
        proc = gitenv.popen_git(
            cmd,
            work,
            mode=gitenv.LOCAL,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        assert proc.stdin is not None                   # stdin=PIPE
        try:
            _write_stream(proc.stdin, ref, when, msg, zf, entries, advance)
        except BrokenPipeError:
            pass  # git died; its stderr says why
        finally:
            proc.stdin.close()
        if proc.wait():
            err.seek(0)
            raise UpstreamError(f"git fast-import failed: {_last_line(err.read())}")


def _write_stream(
    out: IO[bytes],
    ref: str,
    when: int,
    msg: bytes,
    zf: zipfile.ZipFile,
    entries: list[tuple[str, zipfile.ZipInfo]],
    advance: Advance,
) -> None:
    """Write the fast-import commands: commit header, then each file inline."""
    stamp = f"{IDENTITY} {when} +0000\n".encode()
    out.write(b"commit refs/heads/%s\nauthor %scommitter %s" % (ref.encode(), stamp, stamp))
    out.write(b"data %d\n%s\n" % (len(msg), msg))
    for path, info in entries:
        data = zf.read(info)  # also checks the entry's CRC
        out.write(b"M %s inline %s\ndata %d\n" % (_mode(info), _quote(path), len(data)))
        out.write(data)
        out.write(b"\n")
        advance(1)
    out.write(b"done\n")


# ---------------------------------------------------------------- materialize


def _clone(base: BaseTree, tmp: Path) -> None:
    """A local clone (hardlinked objects, self-contained) checked out at base.commit."""
    _git(["clone", "-q", "--", str(base.repo), str(tmp)], tmp.parent)
    head = _git(["rev-parse", "HEAD"], tmp)
    if head != base.commit:
        _git(["checkout", "-q", "-B", base.ref, base.commit], tmp)
    for key, value in _CLONE_CONFIG.items():
        _git(["config", key, value], tmp)


def _export(base: BaseTree, tmp: Path) -> None:
    """Plain files of the tree under the pin's git_prefix (the wheel layout), no .git."""
    prefix = _git_prefix(base)
    treeish = f"{base.commit}:{prefix}" if prefix else base.commit
    archive = gitenv.popen_git(
        [*_GIT_OPTS, "archive", "--format=tar", treeish],
        base.repo,
        mode=gitenv.LOCAL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert archive.stdout is not None and archive.stderr is not None     # both PIPE
    try:
        untar = subprocess.run(
            ["tar", "-x", "-f", "-", "--no-same-owner", "-C", str(tmp)],
            stdin=archive.stdout,
            capture_output=True,
        )
    except FileNotFoundError as e:
        archive.kill()
        raise UpstreamError("tar is not installed or not on PATH; install tar and retry") from e
    finally:
        archive.stdout.close()
    git_err = archive.stderr.read()
    archive.stderr.close()
    if archive.wait():
        raise UpstreamError(f"git archive {treeish} failed: {_last_line(git_err)}")
    if untar.returncode:
        raise UpstreamError(f"tar could not unpack {base.ref}: {_last_line(untar.stderr)}")


def _git_prefix(base: BaseTree) -> str:
    """The pin's git_prefix as recorded when the base was built ("python" by default)."""
    meta = bounded.read_json(base.repo / ".git" / META_FILE, RECORD_LIMIT, "cache record")
    return meta["pin"].get("git_prefix", "").strip("/")
