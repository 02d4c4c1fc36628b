"""Waivers (`waivers.yaml`, `--waivers FILE`): findings an operator accepts on purpose.

A waiver names one finding id (with its sub-tag), a host and a subject (each exact or a
shell glob), why, who, and until when. Loading is strict and happens before any host is
contacted: an unknown key, a missing field, a bad date, an id that no check reports or an
empty match is one line naming file, line and field (exit 2).

Applying them (`apply`) is one pure step after the checks and probes and before the
summary, the ranking and the exit code:

- a non-passing finding (fail, warn, unknown) that a valid waiver matches becomes
  `waived` and carries the waiver (`Finding.waiver`): it counts neither in the summary's
  failures nor in the exit code, and implicates no patch (rank.SUSPECT_STATUSES);
- an expired waiver (its `expires` date before today, UTC) waives nothing: what it matched
  stays as it was, and a `waiver[expired]` finding (warn, low: it counts) names it;
- a valid waiver that waived nothing on any audited host is `unused`: a `waiver[unused]`
  note (warn, info: it does not count) on each audited host it names, so a stale waiver
  is seen and removed. A waiver whose hosts were all unreachable is not judged: it is in
  none of the lists.

Matching: the id exactly (`checkpoint-dtypes[narrowed]` matches only that id, never
`checkpoint-dtypes`); `host` and `subject` equal the finding's, or match it as an
fnmatch glob (case-sensitive: `*`, `?`, `[...]`). `host` is the HOST as the audit was given
it (an inventory name, `user@host[:port]`, `localhost`). The first valid waiver in the file
that matches a finding waives it. The waiver findings land on the audited hosts (facts
gathered) that the waiver's `host` matches; the report's `waivers` section lists every
waiver, applied, expired or unused, with the findings it matched.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from patchset import inputfile, yamlsrc
from patchset.agent.lib.redact import redact_text
from patchset.errors import UsageError
from patchset.validate import control_char, describe

from .checks import CHECKS
# the records live in model.py (a Finding carries its Waived): named here too, for callers
from .model import (PROBES, Evidence, Finding, HostReport, Waived, Waiver, WaiverReport,
                    WaiverUse, match)
from .policy import Policy

DEFAULT_FILE = Path("waivers.yaml")      # read from the current directory when it exists
LIMIT = inputfile.MIB                     # a waivers file, like the inventory
TOP_KEYS = ("version", "waivers")
WAIVABLE = ("fail", "warn", "unknown")    # the statuses a waiver turns into `waived`
WAIVER_CHECK = "waiver"                   # waiver[expired], waiver[unused]
EXPIRED_SEVERITY = "low"                  # counts: the finding it waived counts again too
UNUSED_SEVERITY = "info"                  # a note: never counts
ID = re.compile(r"([a-z0-9-]+)(?:\[([A-Za-z0-9_.-]+)\])?")
DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
MISSING = {"id": "the finding id, with its sub-tag", "host": 'the host, exact or a glob ("*")',
           "subject": 'the finding\'s subject, exact or a glob ("*")',
           "justification": "why the finding is accepted", "who": "who accepted it",
           "expires": "the last day it holds, YYYY-MM-DD"}
KEYS = tuple(MISSING)                     # every key of a waiver, each one required
Clock = Callable[[], datetime.date]       # gives today's date (tests inject one)
MAX_TEXT = {"host": 255, "subject": 1000, "justification": 2000, "who": 200}
SHOWN = 80                                # the most of a bad value an error message quotes


@dataclass(frozen=True)
class WaiverFile:
    file: str                        # as given (or the default `waivers.yaml`)
    waivers: tuple[Waiver, ...]


def utc_today() -> datetime.date:
    return datetime.datetime.now(datetime.timezone.utc).date()


# ---------------------------------------------------------------- which file

def locate(option: str | Path | None, disabled: bool) -> Path | None:
    """The waivers file of an audit: `--waivers FILE`, else ./waivers.yaml when it exists;
    none with `--no-waivers`."""
    if disabled and option is not None:
        raise UsageError("--waivers and --no-waivers: give one of them")
    if disabled:
        return None
    if option is not None:
        return Path(option)
    return DEFAULT_FILE if os.path.lexists(DEFAULT_FILE) else None


# ---------------------------------------------------------------- loading

def finding_ids(pol: Policy) -> dict[str, tuple[str, ...]]:
    """Every finding id the audit reports: check id -> its sub-tags (the bare id is a
    finding id too). Each check declares its own (`SUB_TAGS`, auditor/checks/*.py), the
    probes theirs (model.PROBES); the policy's hazards, tensor expectations and resolved
    flags name theirs."""
    out = {m.ID: tuple(m.SUB_TAGS) for m in CHECKS}
    out["probe"] = PROBES
    out["hazard"] = tuple(h.id for h in pol.hazards)
    out["checkpoint-dtypes"] += tuple(e.id for e in pol.expectations)
    if "resolved-args" in out:
        out["resolved-args"] = tuple(flag.name for flag in pol.resolved_args)
    return out


def load(path: str | Path, pol: Policy) -> WaiverFile:
    """The waivers of `path`, validated whole (ManifestError, exit 2, on the first error)."""
    name = str(path)
    text = inputfile.read_text(path, LIMIT, "waivers file")
    doc = yamlsrc.load(text, name)
    return parse(doc, finding_ids(pol))


def parse(doc: yamlsrc.Located, ids: dict[str, tuple[str, ...]]) -> WaiverFile:
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "a mapping with `version: 1` and `waivers:` (a list)")
    for key in data:
        if key not in TOP_KEYS:
            raise doc.error((key,), f"unknown key (known: {', '.join(TOP_KEYS)})")
    doc.version(1, None, "must be 1")
    items = data.get("waivers")
    if not isinstance(items, list):
        raise doc.error(("waivers",), "a list of waivers (it may be empty: `waivers: []`)")
    seen: dict[tuple[str, str, str], Waiver] = {}     # a 1 MiB file holds ~7000 waivers
    for i, item in enumerate(items):
        waiver = _waiver(doc, ("waivers", i), item, ids)
        twin = seen.setdefault((waiver.id, waiver.host, waiver.subject), waiver)
        if twin is not waiver:
            raise doc.error(("waivers", i), f"the same id, host and subject as the waiver "
                            f"at line {twin.line}")
    return WaiverFile(doc.file, tuple(seen.values()))


def _shown(value: Any) -> str:
    """A bad value as an error message quotes it: redacted (a token pasted into the wrong
    field must not reach stderr or a CI log) and cut to SHOWN characters."""
    text = redact_text(repr(value))
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def _waiver(doc: yamlsrc.Located, at: tuple, item: Any, ids: dict) -> Waiver:
    if not isinstance(item, dict):
        raise doc.error(at, f"a mapping with {', '.join(KEYS)}")
    for key in item:
        if key not in KEYS:
            raise doc.error(at + (key,), f"unknown key (known: {', '.join(KEYS)})")
    for key in KEYS:
        if key not in item:
            raise doc.error(at + (key,), f"missing ({MISSING[key]})")
    values = {key: _text(doc, at + (key,), item[key], key) for key in MAX_TEXT}
    return Waiver(id=_id(doc, at + ("id",), item["id"], ids), **values,
                  expires=_date(doc, at + ("expires",), item["expires"]),
                  line=doc.line(at) or 1)


def _text(doc: yamlsrc.Located, at: tuple, value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise doc.error(at, f"must be text, not {type(value).__name__}")
    text = value if key in ("host", "subject") else value.strip()
    if not text.strip():
        raise doc.error(at, 'empty: use "*" to match every one' if key in ("host", "subject")
                        else "empty: say it")
    bad = control_char(text)
    if bad:
        raise doc.error(at, f"contains {describe(bad)} (one line of text; fold a long one "
                        "with >-)")
    if len(text) > MAX_TEXT[key]:
        raise doc.error(at, f"longer than {MAX_TEXT[key]} characters")
    if key == "host" and any(c.isspace() for c in text):
        raise doc.error(at, "a host name or glob has no spaces")
    return text


def _id(doc: yamlsrc.Located, at: tuple, value: Any, ids: dict[str, tuple[str, ...]]) -> str:
    if not isinstance(value, str):
        raise doc.error(at, f"must be a finding id, not {type(value).__name__}")
    m = ID.fullmatch(value)
    if m is None:
        raise doc.error(at, f"{_shown(value)} is not a finding id like "
                        "checkpoint-dtypes[narrowed]")
    base, sub = m.group(1), m.group(2)
    if base not in ids:
        raise doc.error(at, f"{_shown(value)}: no check {_shown(base)} (known: "
                        f"{', '.join(sorted(ids))})")
    if sub is not None and sub not in ids[base]:
        raise doc.error(at, f"{_shown(value)}: {base} reports no sub-tag {_shown(sub)} "
                        f"(known: {', '.join(ids[base]) or 'none'})")
    return value


def _date(doc: yamlsrc.Located, at: tuple, value: Any) -> datetime.date:
    if isinstance(value, datetime.datetime):
        raise doc.error(at, "a date (YYYY-MM-DD), not a time")
    if isinstance(value, datetime.date):
        return value
    if isinstance(value, str) and DATE.fullmatch(value):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            pass
    raise doc.error(at, f"{_shown(value)} is not a date (YYYY-MM-DD)")


# ---------------------------------------------------------------- applying

def apply(hosts: list[HostReport], waivers: WaiverFile,
          clock: Clock | None = None) -> WaiverReport:
    """Waive what the valid waivers match, in place (each host's findings), and add the
    waiver[expired] and waiver[unused] findings. `clock` gives today (the UTC date);
    nothing else is read: no I/O."""
    day = (clock or utc_today)()
    valid = [w for w in waivers.waivers if not w.expired(day)]
    expired = [w for w in waivers.waivers if w.expired(day)]
    hits: dict[Waiver, list[tuple[str, str, str]]] = {w: [] for w in waivers.waivers}
    for host in hosts:
        out = []
        for f in host.findings:
            if f.status in WAIVABLE:
                by = next((w for w in valid if w.matches(f)), None)
                if by is not None:
                    hits[by].append((f.host, f.id, f.subject))
                    f = dataclasses.replace(f, status="waived", waiver=Waived(
                        f.status, by.justification, by.who, by.expires.isoformat(),
                        waivers.file, by.line))
                else:
                    for w in expired:
                        if w.matches(f):
                            hits[w].append((f.host, f.id, f.subject))
            out.append(f)
        host.findings = out
    audited = [h for h in hosts if h.facts.reachable and not h.facts.error]
    unused = [w for w in valid if not hits[w]
              and any(match(w.host, h.host) for h in audited)]
    for host in audited:
        host.findings += [_expired(w, waivers.file, host.host, day, hits[w])
                          for w in expired if match(w.host, host.host)]
        host.findings += [_unused(w, waivers.file, host.host)
                          for w in unused if match(w.host, host.host)]
    uses = {w: WaiverUse(w, tuple(hits[w])) for w in waivers.waivers}
    return WaiverReport(waivers.file, tuple(uses[w] for w in valid if hits[w]),
                        tuple(uses[w] for w in expired), tuple(uses[w] for w in unused))


def _subject(file: str, line: int, finding_id: str) -> str:
    """The subject of a waiver's own findings: where it is and what it waives."""
    return f"{file}:{line} {finding_id}"


def _record(w: Waiver, file: str) -> Evidence:
    return Evidence("waiver", f"{file}:{w.line}: {w.id} on {w.host} {w.subject!r}, by {w.who} "
                    f"until {w.expires.isoformat()}")


def _expired(w: Waiver, file: str, host: str, day: datetime.date,
             hits: list[tuple[str, str, str]]) -> Finding:
    mine = [h for h in hits if h[0] == host]
    return Finding(
        id=f"{WAIVER_CHECK}[expired]", host=host, subject=_subject(file, w.line, w.id),
        expected=f"expires on or after {day.isoformat()}",
        found=f"expired {w.expires.isoformat()}", status="warn", severity=EXPIRED_SEVERITY,
        message=(f"the waiver by {w.who} for {w.id} on {w.host} {w.subject!r} expired on "
                 f"{w.expires.isoformat()}: "
                 + (f"the {len(mine)} finding(s) it matched here count again"
                    if mine else "it matches no finding here any more")
                 + f"; renew it (a later expires) or remove it. It said: {w.justification}"),
        evidence=(_record(w, file),))


def _unused(w: Waiver, file: str, host: str) -> Finding:
    return Finding(
        id=f"{WAIVER_CHECK}[unused]", host=host, subject=_subject(file, w.line, w.id),
        expected="a non-passing finding to waive", found="none matched", status="warn",
        severity=UNUSED_SEVERITY,
        message=(f"no non-passing {w.id} finding on {host} matches subject {w.subject!r}: "
                 "fixed since, or the match is wrong; remove or correct the waiver"),
        evidence=(_record(w, file),))
