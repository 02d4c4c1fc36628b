"""Load and strictly validate patches.yaml and the patch files it names.

Everything is checked before anything touches a tree: bad input must change nothing.
Each error is one line naming file, line and field (ManifestError).
"""

from __future__ import annotations

import hashlib
from datetime import date
from pathlib import Path
from typing import Any

from patchset.series import factnames, patchfile
from patchset import inputfile, validate, yamlsrc
from patchset.pin import pinrules
from patchset.errors import ManifestError
from patchset.series.model import (PATHS, REQUIRE_OPS, TIERS, UPSTREAM_STATUSES, Gate, Patch,
                                   Requirement, Series, TraceSpec)
from patchset.pin.model import GitPin, PypiPin, UpstreamPin
from patchset.yamlsrc import Located

NAME = validate.PATCH_NAME
ENV_NAME = validate.ENV_NAME
SHA256 = validate.SHA256
TOP_KEYS = {"version": False, "upstream": True, "series": True, "upstreamed": False}
UPSTREAM_KEYS = {"name": True, "version": True, "git": False, "pypi": False, "layout": False}
GIT_KEYS = {"url": True, "ref": True}
PYPI_KEYS = {"requirement": True, "file": True, "sha256": True, "python_version": True,
             "platform": True}
LAYOUT_KEYS = {"git_prefix": True}
PATCH_KEYS = {"name": True, "file": True, "summary": True, "tier": True, "path": True,
              "gate": False, "requires": False, "depends": False, "conflicts": False,
              "upstream_status": True, "evidence": False, "trace": False,
              "trace_mode": False, "wire": False, "parity": False}
# `parity` (auditor check cohort-parity): strict, servers of a cohort must agree on the
# patch; any, a mismatch is declared compatible (a patch only one role needs).
PARITY = ("strict", "any")
TRACE_KEYS = {"module": True, "qualname": True, "file": False}
TRACE_MODES = ("add", "replace")
MAX_TRACE = 64
GATE_KEYS = {"env": True, "on": True}
REQUIRE_KEYS = {"fact": True, "op": True, "value": True, "why": False}
# Patches upstream took (`patchset rebase` moves them here): a record, no longer carried.
UPSTREAMED_KEYS = {"name": True, "summary": True, "upstream_status": True, "since": True}
MANIFEST_VERSION = 1


def load_series(manifest: str | Path) -> Series:
    path = Path(manifest)
    if not path.exists() and not path.is_symlink():
        raise ManifestError(str(path), None, "(file)", "not found (run from the series "
                            "directory or pass --series PATH)")
    text = inputfile.read_text(path, inputfile.MANIFEST_LIMIT, "manifest")
    doc = yamlsrc.load(text, str(path))
    _keys(doc, (), doc.data, TOP_KEYS)
    doc.version(MANIFEST_VERSION, MANIFEST_VERSION, f"unsupported manifest version "
                f"{doc.data.get('version')!r} (this patchset reads version "
                f"{MANIFEST_VERSION})")
    upstream = _upstream(doc)
    pinrules.remember(doc, upstream)
    _check_cached_wheel(upstream)
    patches = _patches(doc, path.parent, upstream.git_prefix)
    _check_references(doc, patches)
    _check_upstreamed(doc, patches)
    return Series(manifest=str(path), root=str(path.parent), upstream=upstream,
                  patches=tuple(patches))


def _check_cached_wheel(pin: UpstreamPin) -> None:
    """A pin whose sha256 the cached wheel disagrees with is refused here, at load, by
    every command (not only by the ones that provision, `check` among them): the pin is
    what is in doubt, and `list` or `export` must not pass a series `check` refuses.
    Read-only; a cache without the wheel says nothing."""
    from patchset.pin.upstream import verify_cached_wheel  # its imports are for provisioning
    verify_cached_wheel(pin)


def _keys(doc: Located, where: tuple, value: Any, allowed: dict[str, bool]) -> dict:
    if not isinstance(value, dict):
        raise doc.error(where, f"must be a mapping, got {type(value).__name__}")
    for key in value:
        if key not in allowed:
            raise doc.error(where + (key,), f"unknown key (allowed: {', '.join(allowed)})")
    for key, required in allowed.items():
        if required and key not in value:
            raise doc.error(where, f"missing required key {key!r}")
    return value


def _string(doc: Located, where: tuple, value: Any, pattern: validate.Rule | None = None,
            choices: tuple[str, ...] | None = None) -> str:
    """A one-line string: never a control character (it would reach a message, an env
    file or a command line), matched whole against `pattern`."""
    if not isinstance(value, str) or not value:
        raise doc.error(where, f"must be a non-empty string, got {_shown(value)}")
    bad = validate.control_char(value)
    if bad:
        raise doc.error(where, f"{value!r} contains {validate.describe(bad)}")
    if choices and value not in choices:
        raise doc.error(where, f"{value!r} is not one of {', '.join(choices)}")
    if pattern and not pattern.ok(value):
        raise doc.error(where, f"{value!r} is not {pattern.what}")
    return value


def _scalar_text(doc: Located, where: tuple, value: Any, pattern: validate.Rule) -> str:
    """A field YAML may type as a number or a date (`version: 0.5`, `since: 2026-01-02`):
    only plain scalars are read as their text; mappings, lists and floats are refused."""
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return _string(doc, where, str(value), pattern)
    if isinstance(value, date):
        return _string(doc, where, value.isoformat(), pattern)
    raise doc.error(where, f"must be a string (quote it in YAML), got {_shown(value)}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _upstream(doc: Located) -> UpstreamPin:
    where = ("upstream",)
    up = _keys(doc, where, doc.data["upstream"], UPSTREAM_KEYS)
    git = pypi = None
    if up.get("git") is not None:
        g = _keys(doc, where + ("git",), up["git"], GIT_KEYS)
        git = GitPin(url=_string(doc, where + ("git", "url"), g["url"]),
                     ref=_string(doc, where + ("git", "ref"), g["ref"]))
        pinrules.check_git(doc, where + ("git",), git)  # never a git option, see pinrules
    if up.get("pypi") is not None:
        p = _keys(doc, where + ("pypi",), up["pypi"], PYPI_KEYS)
        w = where + ("pypi",)
        pypi = PypiPin(requirement=_string(doc, w + ("requirement",), p["requirement"]),
                       file=_string(doc, w + ("file",), p["file"]),
                       sha256=_string(doc, w + ("sha256",), p["sha256"], SHA256),
                       python_version=_scalar_text(doc, w + ("python_version",),
                                                   p["python_version"],
                                                   validate.PYTHON_VERSION),
                       platform=_string(doc, w + ("platform",), p["platform"],
                                        validate.PLATFORM))
        if not validate.WHEEL_FILE.ok(pypi.file) or pypi.file.startswith("."):
            raise doc.error(w + ("file",), f"{pypi.file!r} must be a bare wheel file name")
        pinrules.check_pypi(doc, w, pypi)  # never a pip option, see pinrules
    if git is None and pypi is None:
        raise doc.error(where, "needs `git` or `pypi` (or both) to provision the base")
    prefix = "python/"
    if up.get("layout") is not None:
        layout = _keys(doc, where + ("layout",), up["layout"], LAYOUT_KEYS)
        prefix = _string(doc, where + ("layout", "git_prefix"), layout["git_prefix"])
        if not prefix.endswith("/") or ".." in prefix.split("/") or prefix.startswith("/"):
            raise doc.error(where + ("layout", "git_prefix"),
                            f"{prefix!r} must be a relative directory ending in '/'")
    return UpstreamPin(name=_string(doc, where + ("name",), up["name"], NAME),
                       version=_scalar_text(doc, where + ("version",), up["version"],
                                            validate.VERSION),
                       git=git, pypi=pypi, git_prefix=prefix)


def _patches(doc: Located, root: Path, git_prefix: str) -> list[Patch]:
    entries = doc.data["series"]
    if not isinstance(entries, list):
        raise doc.error(("series",), "must be a list of patches")
    patches: list[Patch] = []
    seen: dict[str, int] = {}
    total = 0
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and name in seen:
            raise doc.error(("series", index, "name"),
                            f"duplicate patch name {name!r} (first at line {seen[name]})")
        patch = _patch(doc, ("series", index), entry, root, git_prefix)
        seen[patch.name] = patch.line
        patches.append(patch)
        total += (root / patch.file).stat().st_size
        if total > inputfile.SERIES_LIMIT:
            raise doc.error(("series", index, "file"), "the series' patch files together are "
                            f"larger than {inputfile.size_text(inputfile.SERIES_LIMIT)}")
    return patches


def _patch(doc: Located, where: tuple, entry: Any, root: Path, git_prefix: str) -> Patch:
    e = _keys(doc, where, entry, PATCH_KEYS)
    name = _string(doc, where + ("name",), e["name"], NAME)
    file = _patch_file_name(doc, where + ("file",), e["file"])
    gate = _gate(doc, where + ("gate",), e.get("gate"))
    data = _read_patch(doc, where + ("file",), root / file)
    parsed = patchfile.parse(data.decode("utf-8"), str(root / file), git_prefix)
    header_name = parsed.header.get("Patchset-Name")
    if header_name != name:
        raise ManifestError(str(root / file), 1, "header.Patchset-Name",
                            f"{header_name!r} does not match the series name {name!r}")
    evidence = e.get("evidence") or {}
    if not isinstance(evidence, dict):
        raise doc.error(where + ("evidence",), "must be a mapping")
    return Patch(
        name=name, file=file,
        summary=_string(doc, where + ("summary",), e["summary"]),
        tier=_string(doc, where + ("tier",), e["tier"], choices=TIERS),
        path=_string(doc, where + ("path",), e["path"], choices=PATHS),
        gate=gate,
        requires=_requires(doc, where + ("requires",), e.get("requires")),
        depends=_names(doc, where + ("depends",), e.get("depends")),
        conflicts=_names(doc, where + ("conflicts",), e.get("conflicts")),
        upstream_status=_string(doc, where + ("upstream_status",), e["upstream_status"],
                                choices=UPSTREAM_STATUSES),
        evidence=evidence, header=parsed.header, files=parsed.files,
        sha256=hashlib.sha256(data).hexdigest(), line=doc.line(where) or 0,
        trace=_trace(doc, where + ("trace",), e.get("trace")),
        trace_mode=_string(doc, where + ("trace_mode",), e.get("trace_mode", "add"),
                           choices=TRACE_MODES),
        wire=_flag(doc, where + ("wire",), e.get("wire", False)),
        parity=_string(doc, where + ("parity",), e.get("parity", "strict"), choices=PARITY),
    )


def _flag(doc: Located, where: tuple, value: Any) -> bool:
    """A yes/no field (`wire`): only a YAML boolean, so `"false"` is not read as true."""
    if not isinstance(value, bool):
        raise doc.error(where, f"{value!r} is not true or false")
    return value


def _trace(doc: Located, where: tuple, value: Any) -> tuple[TraceSpec, ...]:
    """`trace: [{module, qualname[, file]}]`: functions the tracer watches for the patch
    besides (or, with `trace_mode: replace`, instead of) the ones derived from it."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_TRACE:
        raise doc.error(where, f"must be a list of at most {MAX_TRACE} "
                        "{module, qualname[, file]} mappings")
    out = []
    for i, item in enumerate(value):
        t = _keys(doc, where + (i,), item, TRACE_KEYS)
        out.append(TraceSpec(
            module=_string(doc, where + (i, "module"), t["module"], validate.MODULE_NAME),
            qualname=_string(doc, where + (i, "qualname"), t["qualname"], validate.QUALNAME),
            file=_string(doc, where + (i, "file"), t.get("file", ""), None) if t.get("file")
            else ""))
    return tuple(out)


def _patch_file_name(doc: Located, where: tuple, value: Any) -> str:
    file = _string(doc, where, value)
    parts = file.split("/")
    if file.startswith("/") or ".." in parts or "\\" in file:
        raise doc.error(where, f"{file!r} must be a relative path inside the series directory")
    if parts[0] != "patches" or len(parts) != 2 or not file.endswith(".patch"):
        raise doc.error(where, f"{file!r} must be patches/<name>.patch")
    return file


def _read_patch(doc: Located, where: tuple, path: Path) -> bytes:
    if not path.exists() and not path.is_symlink():
        raise doc.error(where, f"{path} does not exist")
    if path.is_symlink() and not path.resolve().is_relative_to(path.parent.parent.resolve()):
        raise doc.error(where, f"{path} is a link to {path.resolve()}, outside the series "
                        "directory (a shared series must not read files of the machine "
                        "it is checked on)")
    try:
        text = inputfile.read_text(path, inputfile.PATCH_LIMIT, "patch file")
    except ManifestError as exc:
        raise doc.error(where, f"{path}: {exc.message}") from None
    return text.encode("utf-8")


def _gate(doc: Located, where: tuple, value: Any) -> Gate | None:
    if value is None:
        return None
    if isinstance(value, dict) and True in value and "on" not in value:
        value = {("on" if k is True else k): v for k, v in value.items()}  # YAML 1.1: on == true
    g = _keys(doc, where, value, GATE_KEYS)
    on = g["on"]
    if not isinstance(on, str):
        raise doc.error(where + ("on",), f"must be a quoted string (e.g. \"1\"), got "
                        f"{_shown(on)}")
    env = _string(doc, where + ("env",), g["env"], ENV_NAME)
    if validate.reserved_env(env):
        raise doc.error(where + ("env",), f"{env} is not a gate: it changes how the process "
                        "loads code or is set by deploy (gates are the patch's own switch, "
                        "e.g. MMA_FLASHMLA)")
    return Gate(env=env, on=_string(doc, where + ("on",), on, validate.GATE_VALUE))


def _names(doc: Located, where: tuple, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise doc.error(where, "must be a list of patch names")
    return tuple(_string(doc, where + (i,), v, NAME) for i, v in enumerate(value))


def _requires(doc: Located, where: tuple, value: Any) -> tuple[Requirement, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise doc.error(where, "must be a list of {fact, op, value, why}")
    return tuple(_requirement(doc, where + (i,), item) for i, item in enumerate(value))


def _requirement(doc: Located, where: tuple, item: Any) -> Requirement:
    r = _keys(doc, where, item, REQUIRE_KEYS)
    fact = _string(doc, where + ("fact",), r["fact"])
    bad = factnames.problem(fact)
    if bad:
        raise doc.error(where + ("fact",), bad)
    op = _string(doc, where + ("op",), r["op"], choices=REQUIRE_OPS)
    value = r["value"]
    if op in ("in", "not_in"):
        if not isinstance(value, list) or not all(_scalar(v) for v in value):
            raise doc.error(where + ("value",), f"op {op} needs a list of scalars")
        value = tuple(value)
    elif not _scalar(value):
        raise doc.error(where + ("value",), f"op {op} needs a scalar value, got "
                        f"{_shown(value)}")
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if isinstance(item, str) and (char := validate.control_char(item)):
            raise doc.error(where + ("value",), f"{item!r} contains "
                            f"{validate.describe(char)}")
    bad = factnames.value_problem(fact, items)
    if bad:
        raise doc.error(where + ("value",), bad)
    why = r.get("why", "")
    if why != "":
        why = _string(doc, where + ("why",), why)
    return Requirement(fact=fact, op=op, value=value, why=why)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _check_references(doc: Located, patches: list[Patch]) -> None:
    position = {p.name: i for i, p in enumerate(patches)}
    for i, patch in enumerate(patches):
        where = ("series", i)
        for kind in ("depends", "conflicts"):
            for j, other in enumerate(getattr(patch, kind)):
                if other not in position:
                    raise doc.error(where + (kind, j), f"unknown patch {other!r}")
                if other == patch.name:
                    raise doc.error(where + (kind, j), "a patch cannot name itself")
        for j, req in enumerate(patch.requires):
            target = req.fact.partition(".")[2]
            if req.fact.startswith("patch.") and target not in position:
                raise doc.error(where + ("requires", j, "fact"), f"unknown patch {target!r}")
    _check_cycles(doc, patches)
    for i, patch in enumerate(patches):
        for j, dep in enumerate(patch.depends):
            if position[dep] > i:
                raise doc.error(("series", i, "depends", j),
                                f"{dep!r} comes later in the series; dependencies must be below "
                                "the patch that needs them")
    _check_selectable(doc, patches)


def _check_selectable(doc: Located, patches: list[Patch]) -> None:
    """Refuse a patch no selection can take: one that conflicts with a patch it needs
    (directly or through its dependencies), or whose dependencies conflict with each other.
    Every command loads the series here, so `check` cannot pass a series that `list`,
    `plan` or `apply` would then refuse as a selection error."""
    known = {p.name: p for p in patches}
    index = {p.name: i for i, p in enumerate(patches)}
    for patch in patches:
        needed = _closure(known, patch.name)
        for holder in sorted(needed, key=index.__getitem__):
            for j, other in enumerate(known[holder].conflicts):
                if other in needed:
                    needs = (f"conflicts with {other!r}, which it needs" if holder == patch.name
                             else f"needs both {holder!r} and {other!r}, which conflict")
                    raise doc.error(("series", index[holder], "conflicts", j),
                                    f"{patch.name!r} {needs}: no selection can take it")


def _closure(known: dict[str, Patch], name: str) -> set[str]:
    """`name` and every patch it depends on, transitively."""
    seen, stack = set(), [name]
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(known[current].depends)
    return seen


def _check_upstreamed(doc: Located, patches: list[Patch]) -> None:
    """`upstreamed:` records patches that are no longer carried: each is a name the series
    no longer uses, with why it went (`accepted`) and the release that has it."""
    value = doc.data.get("upstreamed")
    if value is None:
        return
    if not isinstance(value, list):
        raise doc.error(("upstreamed",), "must be a list of {name, summary, upstream_status, "
                        "since}")
    taken = {p.name for p in patches}
    for i, item in enumerate(value):
        where = ("upstreamed", i)
        entry = _keys(doc, where, item, UPSTREAMED_KEYS)
        name = _string(doc, where + ("name",), entry["name"], NAME)
        if name in taken:
            raise doc.error(where + ("name",), f"{name!r} is in series: too (or twice here); "
                            "a patch is either carried or upstreamed")
        taken.add(name)
        _string(doc, where + ("summary",), entry["summary"])
        _string(doc, where + ("upstream_status",), entry["upstream_status"],
                choices=("accepted",))
        _scalar_text(doc, where + ("since",), entry["since"], validate.VERSION)


def _check_cycles(doc: Located, patches: list[Patch]) -> None:
    graph = {p.name: p.depends for p in patches}
    index = {p.name: i for i, p in enumerate(patches)}
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = trail[trail.index(name):] + [name]
            raise doc.error(("series", index[cycle[0]], "depends"),
                            f"dependency cycle: {' -> '.join(cycle)}")
        state[name] = 1
        for dep in graph[name]:
            visit(dep, trail + [name])
        state[name] = 2

    for patch in patches:
        visit(patch.name, [])
