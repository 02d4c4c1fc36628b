"""`patchset init`: a valid manifest and an empty series for a pinned upstream.

Why: a first manifest written by hand needs the pin's wheel file name, sha256, Python
version and platform, which nobody knows by heart; users arrive with a server running a
release or an upstream commit. The pin is resolved the way `rebase` moves it (the wheel
learnt through pip once, trust on first use, then verified on every provision; offline
from the cache), or, for a git commit, provisioned once so the tree's layout (where the
package sits: `python/sglang/` in SGLang's repository) is read, not guessed. The manifest
is checked by the same loader every command uses before it is put in place, and an
existing one is never overwritten.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from patchset.pin import upstream
from patchset.errors import UsageError
from patchset.series.manifest import load_series
from patchset.pin.model import GitPin, PypiPin, UpstreamPin
from patchset.pin.pinrules import git_ref_problem, git_url_problem, requirement_problem
from patchset.progress import NullProgress, Progress
from patchset.validate import PLATFORM, PYTHON_VERSION

SGLANG_GIT = "https://github.com/sgl-project/sglang.git"
DEFAULT_PYTHON = "3.11"
DEFAULT_PLATFORM = "manylinux_2_34_x86_64"


@dataclass(frozen=True)
class InitRequest:
    """What to pin: a release (`requirement`, e.g. sglang==0.5.14) or a git commit."""

    directory: Path
    requirement: str | None = None
    git_url: str | None = None
    ref: str | None = None
    python_version: str = DEFAULT_PYTHON
    platform: str = DEFAULT_PLATFORM
    offline: bool = False


@dataclass(frozen=True)
class InitResult:
    manifest: str
    pin: UpstreamPin
    how: str                 # "release" or "git commit"


def init_series(req: InitRequest, cache: Path | None = None,
                progress: Progress | None = None) -> InitResult:
    """Write DIR/patches.yaml and DIR/patches/ for the pin; nothing when one exists."""
    progress = progress or NullProgress()
    manifest = req.directory / "patches.yaml"
    if os.path.lexists(manifest):
        raise UsageError(f"{manifest}: already exists; init never overwrites a manifest")
    for flag, value, rule in (("--python-version", req.python_version, PYTHON_VERSION),
                              ("--platform", req.platform, PLATFORM)):
        if not rule.ok(value):                  # before the network: a pip option is none
            raise UsageError(f"{flag} {value!r}: not {rule.what}")
    _check_directory(req.directory)
    _check_patches_dir(req.directory / "patches")
    pin, how = (_release(req, cache, progress) if req.requirement is not None
                else _commit(req, cache, progress))
    text = render(pin)
    _write_new(req.directory, text)
    return InitResult(str(manifest), pin, how)


def _check_directory(directory: Path) -> None:
    """Bad input before any work: the nearest existing ancestor must be a directory."""
    at = directory.absolute()
    while not os.path.lexists(at) and at != at.parent:
        at = at.parent
    if not at.is_dir():
        raise UsageError(f"{directory}: cannot write the new series there: {at} is not a "
                         "directory")


def _check_patches_dir(patches: Path) -> None:
    """DIR/patches must be absent (init makes it) or a real directory: a file, FIFO or
    link there would be found only after the manifest was written."""
    try:
        mode = os.lstat(patches).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise UsageError(f"{patches}: cannot check it: {e.strerror or e}") from e
    if not stat.S_ISDIR(mode):
        raise UsageError(f"{patches}: exists and is not a directory (a file, link or "
                         "other); init puts the patch files there: move it away")


def _release(req: InitRequest, cache: Path | None, progress: Progress) -> tuple[UpstreamPin, str]:
    if req.git_url is not None or req.ref is not None:
        raise UsageError("--pin takes a release; --git/--ref pin a commit: give one or the other")
    problem = requirement_problem(req.requirement)
    match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9A-Za-z][0-9A-Za-z.+_-]*)",
                         req.requirement or "")
    if problem or not match:
        raise UsageError(f"--pin {req.requirement!r}: {problem or 'must be NAME==VERSION'}")
    name, version = match.groups()
    git = GitPin(SGLANG_GIT, f"v{version}") if name.lower() == "sglang" else None
    pypi = PypiPin(match[0], "", "", req.python_version, req.platform)   # req.requirement
    pin = UpstreamPin(name=name, version=version, git=git, pypi=pypi)
    return upstream.wheel_pin(pin, cache, progress, req.offline), "release"


def _commit(req: InitRequest, cache: Path | None, progress: Progress) -> tuple[UpstreamPin, str]:
    if req.git_url is None or req.ref is None:
        raise UsageError("give --pin NAME==VERSION, or --git URL with --ref COMMIT")
    for what, problem in (("--git", git_url_problem(req.git_url)),
                          ("--ref", git_ref_problem(req.ref))):
        if problem:
            raise UsageError(f"{what}: {problem}")    # named as the user typed it
    try:
        return upstream.pin_for_commit(req.git_url, req.ref, None, cache, progress,
                                       req.offline), "git commit"
    except upstream.MissingRef as e:
        raise UsageError(f"--ref {req.ref!r}: {e.why}") from e


def render(pin: UpstreamPin) -> str:
    """The manifest's text: the pin, an empty series, comments saying what goes where."""
    lines = ["# The series: the pinned upstream and the ordered patches on top of it.",
             "# Format: docs/reference/manifest.md. Validate with `patchset check`; add",
             "# patches with `patchset import`, `patchset capture` or `patchset adopt`.",
             "version: 1", "upstream:", f"  name: {pin.name}", f'  version: "{pin.version}"']
    if pin.git is not None:
        lines += ["  git:", f"    url: {pin.git.url}", f'    ref: "{pin.git.ref}"']
    if pin.pypi is not None:
        p = pin.pypi
        lines += ["  pypi:", f'    requirement: "{p.requirement}"', f"    file: {p.file}",
                  f"    sha256: {p.sha256}", f'    python_version: "{p.python_version}"',
                  f"    platform: {p.platform}"]
    lines += ["  layout:", f'    git_prefix: "{pin.git_prefix}"', "series: []", ""]
    return "\n".join(lines)


def _write_new(directory: Path, text: str) -> None:
    """patches/ made, then patches.yaml checked by the one loader and put in place by a
    link (which fails if a manifest, or a link, appeared at its name meanwhile: never
    replaced). Any failure removes what this call made (the staged file, patches/, the
    directories it created), so a failed init leaves nothing behind."""
    missing: list[Path] = []
    at = directory.absolute()
    while not os.path.lexists(at) and at != at.parent:
        missing.insert(0, at)
        at = at.parent
    made: list[Path] = []                      # directories this call created, in order
    staged: Path | None = None
    done = False
    try:
        for d in (*missing, directory.absolute() / "patches"):
            try:
                d.mkdir()
                made.append(d)
            except FileExistsError:            # appeared meanwhile: not ours to remove
                if not d.is_dir():
                    raise UsageError(f"{d}: exists and is not a directory; init cannot "
                                     "put the series there") from None
        _check_patches_dir(directory / "patches")    # still a real directory
        fd, name = tempfile.mkstemp(prefix=".patches.yaml.", suffix=".init", dir=directory)
        staged = Path(name)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        load_series(staged)
        os.link(staged, directory / "patches.yaml")
        done = True
    except FileExistsError as e:
        raise UsageError(f"{directory / 'patches.yaml'}: already exists; init never "
                         "overwrites a manifest") from e
    except OSError as e:
        raise UsageError(f"{directory}: cannot write the new series there: "
                         f"{e.strerror or e}") from e
    finally:
        if staged is not None:
            with contextlib.suppress(OSError):
                staged.unlink()
        if not done:
            for d in reversed(made):           # only what this call made, and only empty
                with contextlib.suppress(OSError):
                    d.rmdir()


__all__ = ["InitRequest", "InitResult", "init_series", "render"]
