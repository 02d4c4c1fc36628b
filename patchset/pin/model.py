"""The pin as typed records: the one upstream release or commit a series applies to, and
where its source comes from (PyPI's wheel, git). No I/O; the rules that check a pin's
values are pinrules.py, the loader is patchset/series/manifest.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GitPin:
    """The pin's git source: the repository and the ref (tag, branch or commit id)."""

    url: str
    ref: str


@dataclass(frozen=True)
class PypiPin:
    """The pin's PyPI source: the one wheel file, by name and sha256."""

    requirement: str       # e.g. "sglang==0.5.14"
    file: str              # exact wheel file name
    sha256: str
    python_version: str    # for `pip download --python-version`
    platform: str          # for `pip download --platform`


@dataclass(frozen=True)
class UpstreamPin:
    """The manifest's `upstream:`: the pinned SGLang release the series applies to."""

    name: str
    version: str
    git: GitPin | None
    pypi: PypiPin | None
    git_prefix: str = "python/"   # where the wheel's top level sits in the git tree
