"""What an upstream pin may say, so no part of it can ever become a git or pip option.

A manifest can come from someone else (a shared series, `patchset import`), and its
`upstream.git.url`, `upstream.git.ref` and `upstream.pypi.requirement` reach git and pip
command lines. Every value is matched whole (`re.fullmatch`; Python's `$` would accept a
trailing newline) against a closed form:

- git URL: `https://`, `http://`, `ssh://`, `git://` or `file://` URLs, scp-like
  `[user@]host:path`, or an absolute local path. No `<transport>::` helpers (`ext::` runs
  commands), no whitespace, quotes, backslashes, control characters or `%`-escapes of
  them, and no host, user or path that starts with `-`.
- git ref: a branch, tag, `refs/...` name or commit id by `git check-ref-format`'s rules,
  limited to `A-Z a-z 0-9 . _ / + - @`, never starting with `-` or `+`.
- pip requirement: exactly `NAME==VERSION` (a PEP 508 name, a PEP 440 version): no
  options, URLs, extras, markers or other operators.

The same rules run at load (`check_git`, `check_pypi`: `file:line: field` errors, exit 2)
and again where git and pip are invoked (`git_url_problem` etc.), so a pin built in code
or read from the cache is held to them too. Provisioning errors about a loaded pin name
the manifest line of the field (`pin_error`).

Standard library only.
"""

from __future__ import annotations

import re
from typing import Any

from patchset import validate
from patchset.errors import Exit, ManifestError, UpstreamError

CONTROL = validate.CONTROL
MAX_URL = 2048
MAX_REF = 255

_HOST = r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\])"
_USER = r"[A-Za-z0-9_][A-Za-z0-9_.+~-]{0,63}"
_PORT = r"[0-9]{1,5}"
_SEG = r"[A-Za-z0-9_.~%+,=@:-]*"              # one path segment (no quotes, spaces, `;`)
_PATH = rf"(?:/{_SEG})+"                          # one or more /segments
_GIT_URL = re.compile(
    rf"https?://(?:{_USER}@)?{_HOST}(?::{_PORT})?(?:/{_SEG})*"
    rf"|ssh://(?:{_USER}@)?{_HOST}(?::{_PORT})?{_PATH}"
    rf"|git://{_HOST}(?::{_PORT})?{_PATH}"
    rf"|file://{_PATH}"
    rf"|(?:{_USER}@)?{_HOST}:(?![-:]|//)[A-Za-z0-9_.~%+,=@:/-]+"   # scp-like
    rf"|{_PATH}"                                                     # an absolute path
)
# `<transport>::<address>`: git hands the address to git-remote-<transport> (`ext::` runs
# a command); git's own test, a URL-scheme-like word followed by `::`.
_HELPER = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*::")
# %-escapes git decodes in URLs: none may decode to a control character.
_BAD_ESCAPE = re.compile(r"%(?:[01][0-9A-Fa-f]|7[Ff])")
_REF = re.compile(r"[A-Za-z0-9_.@+/-]{1,255}")
_HEX40 = re.compile(r"[0-9a-fA-F]{40}")
PEP508_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?"
PEP440_VERSION = (r"(?:[0-9]{1,9}!)?[0-9]{1,9}(?:\.[0-9]{1,9}){0,9}"
                  r"(?:(?:a|b|rc)[0-9]{1,9})?(?:\.post[0-9]{1,9})?(?:\.dev[0-9]{1,9})?"
                  r"(?:\+[A-Za-z0-9]{1,32}(?:\.[A-Za-z0-9]{1,32}){0,9})?")
_REQUIREMENT = re.compile(rf"{PEP508_NAME}=={PEP440_VERSION}")

GIT_URL_FORMS = ("https://, http://, ssh://, git:// or file:// URL, [user@]host:path or an "
                 "absolute path")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _common(value: Any, limit: int) -> str | None:
    if not isinstance(value, str) or not value:
        return f"must be a non-empty string, got {_shown(value)}"
    bad = CONTROL.search(value)
    if bad:
        return f"{_shown(value)} contains a control character ({bad.group()!r})"
    if len(value) > limit:
        return f"{_shown(value)} is longer than {limit} characters"
    if value.startswith("-"):
        return f"{_shown(value)} starts with '-' (git or pip would read it as an option)"
    return None


def git_url_problem(url: Any) -> str | None:
    """Why `url` is not an allowed git URL, or None."""
    problem = _common(url, MAX_URL)
    if problem:
        return problem
    if _HELPER.match(url):
        return f"{_shown(url)}: `<transport>::` remote helpers are not allowed"
    if _BAD_ESCAPE.search(url):
        return f"{_shown(url)} holds a %-escaped control character"
    if not _GIT_URL.fullmatch(url):
        return (f"{_shown(url)} is not an allowed git URL: use a {GIT_URL_FORMS} (no "
                "spaces, quotes or shell characters; host, user and path never start "
                "with '-')")
    return None


def git_ref_problem(ref: Any) -> str | None:
    """Why `ref` is not an allowed git ref (git check-ref-format, plus no leading - or +)."""
    problem = _common(ref, MAX_REF)
    if problem:
        return problem
    if ref.startswith("+"):
        return f"{_shown(ref)} starts with '+' (a force refspec, not a ref)"
    if _HEX40.fullmatch(ref):
        return None
    if not _REF.fullmatch(ref):
        return (f"{_shown(ref)} is not a git ref: use letters, digits and . _ / + - @ "
                "(a tag, branch, refs/... name or a 40-hex commit id)")
    parts = ref.split("/")
    if (ref == "@" or "@{" in ref or ".." in ref or ref.endswith((".", "/"))
            or any(not p or p.startswith(".") or p.endswith(".lock") for p in parts)):
        return (f"{_shown(ref)} is not a valid git ref name (git check-ref-format: no '..', "
                "'@{', empty or dot-leading components, '.lock' or trailing '.' or '/')")
    return None


def requirement_problem(requirement: Any) -> str | None:
    """Why `requirement` is not a plain `name==version`, or None."""
    problem = _common(requirement, 200)
    if problem:
        return problem
    if not _REQUIREMENT.fullmatch(requirement):
        return (f"{_shown(requirement)} is not a plain NAME==VERSION requirement (a PEP 508 "
                "name and a PEP 440 version; no options, URLs, extras or markers)")
    return None


def wheel_file_problem(file: Any) -> str | None:
    problem = _common(file, 204)
    if problem:
        return problem
    if not validate.WHEEL_FILE.ok(file) or file.startswith("."):
        return f"{_shown(file)} is not a bare wheel file name (NAME-VERSION-...-PLATFORM.whl)"
    return None


def pypi_problems(pypi: Any) -> list[tuple[str, str]]:
    """(field, problem) for every part of a PypiPin that fails the rules."""
    checks = (("requirement", requirement_problem(getattr(pypi, "requirement", None))),
              ("file", wheel_file_problem(getattr(pypi, "file", None))),
              ("sha256", None if validate.SHA256.ok(str(getattr(pypi, "sha256", "")))
               else f"{_shown(str(getattr(pypi, 'sha256', '')))} is not a 64-hex sha256"))
    return [(name, problem) for name, problem in checks if problem]


# ---------------------------------------------------------------- at load

def check_git(doc, where: tuple, git) -> None:
    """Refuse a manifest's git pin that could reach git as an option (ManifestError)."""
    for key, problem in (("url", git_url_problem(git.url)), ("ref", git_ref_problem(git.ref))):
        if problem:
            raise doc.error(where + (key,), problem)


def check_pypi(doc, where: tuple, pypi) -> None:
    """Refuse a manifest's pypi pin that could reach pip as an option (ManifestError)."""
    problems = pypi_problems(pypi)
    if problems:
        key, problem = problems[0]
        raise doc.error(where + (key,), problem)


# ---------------------------------------------------------------- where a loaded pin came from

_ORIGINS: dict[Any, tuple[str, dict[tuple, int | None]]] = {}
_FIELDS = (("name",), ("version",), ("git",), ("pypi",), ("layout",), ("git", "url"),
           ("git", "ref"), ("pypi", "requirement"), ("pypi", "file"), ("pypi", "sha256"),
           ("pypi", "python_version"), ("pypi", "platform"), ("layout", "git_prefix"))


def remember(doc, pin) -> None:
    """Note the manifest lines of a loaded pin's fields, so a later provisioning error
    about one of them (a sha256 the cached wheel disagrees with) names `file:line: field`."""
    _ORIGINS[pin] = (doc.file, {f: doc.line(("upstream",) + f) for f in _FIELDS})


class PinError(UpstreamError):
    """A pin that disagrees with what it names (the cached wheel, the tree provisioned
    from it): bad input, exit 2, and nothing was changed."""

    exit_code = Exit.BAD_INPUT


def located(pin) -> bool:
    """Whether `pin` was read from a manifest (its errors can name file:line: field)."""
    return pin in _ORIGINS


def pin_error(pin, field: tuple[str, ...], message: str) -> PinError:
    """A one-line error about `upstream.<field>` of `pin`, at its manifest line if known."""
    name = "upstream." + ".".join(field)
    origin = _ORIGINS.get(pin)
    if origin is None:
        return PinError(f"{name}: {message}")
    file, lines = origin
    line = lines.get(field)
    return PinError(str(ManifestError(file, line, name, message)))


def runtime_check(pin) -> None:
    """The load rules again, where git and pip are about to run (a pin built in code or
    learnt from the cache never went through the loader)."""
    if pin.git is not None:
        for key, problem in (("url", git_url_problem(pin.git.url)),
                             ("ref", git_ref_problem(pin.git.ref))):
            if problem:
                raise pin_error(pin, ("git", key), problem)
    if pin.pypi is not None:
        problems = pypi_problems(pin.pypi)
        if problems:
            key, problem = problems[0]
            raise pin_error(pin, ("pypi", key), problem)
