"""`patchset audit --measured FILE`: a bisect by drift's report, read and checked.

The file is what `patchset bisect HOST --probe drift` saves (isolate/search/bisect.py,
BisectReport.to_json, strategy `group-testing`): the host, the bisect's id, per suspect
its contribution `{suspect, value, low, high, how}`, and the steps, each with its probes
`[A/B drift report, prefill-vs-decode report]` (isolate/measure/drift.py DriftReport.to_json), and
the culprit. Only the fields the audit uses are read, each checked; a bad file is one line
naming the file and the field (exit 2), before any host is contacted. The ranking
(auditor/rank.py) reads the typed record, model.Measured.

Which contributions are above the noise: a report records it per contribution (`above`,
decided by the search against the contribution's own standard error: driftsearch.search).
An older report without it is judged as the search then judged: a suspect got a value only
once its drift exceeded the search's threshold (a group above it is split, a group within
it is cleared whole), except the lone suspect of a one-candidate bisect, whose value is
measured either way: that one is above when it is the culprit; a report that records the
threshold (`threshold`, a number) is judged by it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Sequence

from patchset import inputfile
from patchset.errors import ManifestError, UsageError
from patchset.series.model import Series

from .model import (HOW_ATTRIBUTED, HOW_CLEARED, HOW_UNDECIDED, Contribution, Measured,
                    MeasuredStep)
from .policy import AuditDataError

STRATEGY = "group-testing"
LOCAL = {"local": "localhost"}          # host specs that name the same host


class MeasuredError(AuditDataError):
    """A --measured file is not a bisect-by-drift report of this audit (exit 2)."""


def load_all(paths: Sequence[str | Path], hosts: Sequence[str], series: Series,
             symptom: str | None) -> tuple[Measured, ...]:
    """Every `--measured FILE`, checked against the audited hosts and the series; one
    report per host."""
    if paths and not symptom:
        raise UsageError("--measured needs --symptom: the measured contributions rank "
                         "that symptom's suspects")
    out: list[Measured] = []
    for path in paths:
        run = load(path, hosts, series)
        twin = next((m for m in out if m.host == run.host), None)
        if twin is not None:
            raise MeasuredError(f"--measured {path}: host: {run.host} is measured by "
                                f"{twin.source} too (give one bisect report per host)")
        out.append(run)
    return tuple(out)


def load(path: str | Path, hosts: Sequence[str], series: Series) -> Measured:
    where = f"--measured {path}"
    try:
        data = inputfile.read_json(path, inputfile.DATA_LIMIT, "bisect report")
    except ManifestError as exc:
        raise MeasuredError(f"--measured {exc}") from None
    return parse(data, str(path), hosts, series)


def parse(data: Any, source: str, hosts: Sequence[str], series: Series) -> Measured:
    where = f"--measured {source}"
    if not isinstance(data, dict) or "strategy" not in data:
        raise MeasuredError(f"{where}: not a bisect report (the JSON `patchset bisect HOST "
                            "--probe drift` saves)")
    f = _Fields(where)
    strategy = f.text(data, "strategy")
    if strategy != STRATEGY:
        raise MeasuredError(f"{where}: strategy: {strategy!r}, not {STRATEGY!r} (a bisect "
                            "by drift: `patchset bisect HOST --probe drift`)")
    host = f.text(data, "host")
    audited = {LOCAL.get(h, h) for h in hosts}
    if LOCAL.get(host, host) not in audited:
        raise MeasuredError(f"{where}: host: {host!r} is not among the audited hosts "
                            f"({', '.join(hosts)})")
    patches = set(series.by_name())
    contributions = []
    for i, item in enumerate(f.items(data, "contributions")):
        at = f"contributions[{i}]"
        c = Contribution(suspect=f.text(item, "suspect", at), value=f.number(item, "value", at,
                                                                              null=True),
                         low=f.number(item, "low", at), high=f.number(item, "high", at),
                         how=f.text(item, "how", at))
        if c.suspect not in patches:
            raise MeasuredError(f"{where}: {at}.suspect: {c.suspect!r} is not a patch of the "
                                f"series ({series.manifest})")
        if c.how not in HOW_ATTRIBUTED + HOW_CLEARED + HOW_UNDECIDED:
            raise MeasuredError(f"{where}: {at}.how: {c.how!r} is not one of "
                                f"{', '.join(HOW_ATTRIBUTED + HOW_CLEARED + HOW_UNDECIDED)}")
        if not c.low <= (c.value if c.value is not None else c.low) <= c.high:
            shown = "null" if c.value is None else f"{c.value:g}"
            raise MeasuredError(f"{where}: {at}: low {c.low:g}, value {shown}, high "
                                f"{c.high:g}: not an interval around the value (a bisect "
                                "writes low <= value <= high; was the file edited?)")
        contributions.append((c, f.flag(item, "above", at)))
    flags = [flag for _, flag in contributions]
    if None in flags and any(flag is not None for flag in flags):
        raise MeasuredError(f"{where}: contributions[{flags.index(None)}].above: missing, "
                            "while other contributions have it (a bisect writes it on "
                            "every one, or on none in a report older than the field)")
    steps = []
    for i, step in enumerate(f.items(data, "steps")):
        at = f"steps[{i}]"
        action = f.text(step, "action", at)
        probes = f.items(step, "probes", at)
        if action == "group":
            ab = None
            if probes:
                overall = f.mapping(f.mapping(probes[0], "overall", f"{at}.probes[0]"),
                                    "overall", f"{at}.probes[0].overall")
                ab = f.number(overall, "mean", f"{at}.probes[0].overall.overall", null=True)
            ok = step.get("probe_ok")
            steps.append(MeasuredStep(int(f.number(step, "number", at)),
                                      f.text(step, "change", at), ab,
                                      ok if isinstance(ok, bool) else None))
    culprit = data.get("culprit")
    if culprit is not None and not (isinstance(culprit, dict) and
                                    isinstance(culprit.get("patch"), str)):
        raise MeasuredError(f"{where}: culprit: expected null or an object with a patch")
    culprit = culprit["patch"] if culprit else None
    threshold = f.number(data, "threshold", null=True) if "threshold" in data else None
    return Measured(source=source, host=LOCAL.get(host, host), id=f.text(data, "id"),
                    probe=str(data.get("probe") or "drift"),
                    symptom=str(data.get("symptom") or ""), threshold=threshold,
                    contributions=tuple(_judged([c for c, _ in contributions], flags,
                                                threshold, culprit)),
                    steps=tuple(steps), culprit=culprit,
                    verdict=str(data.get("verdict") or ""),
                    recorded=None not in flags)


def _judged(contributions: list[Contribution], flags: list[bool | None],
            threshold: float | None, culprit: str | None) -> list[Contribution]:
    """Each contribution with `above` set: the recorded flag in a report that has them
    (all or none, checked), else the older report's rule (the module's docstring)."""
    out = []
    for c, recorded in zip(contributions, flags):
        if recorded is not None:
            above = recorded and c.value is not None
        elif c.value is None:
            above = False
        elif threshold is not None:
            above = c.value > threshold
        else:
            above = len(contributions) > 1 or c.suspect == culprit
        out.append(dataclasses.replace(c, above=above))
    return out


class _Fields:
    """Typed reads of a JSON object's fields; a wrong one is a MeasuredError naming it."""

    def __init__(self, where: str) -> None:
        self.where = where

    def _get(self, obj: Any, key: str, at: str) -> Any:
        name = f"{at}.{key}" if at else key
        if not isinstance(obj, dict):
            raise MeasuredError(f"{self.where}: {at or '(top)'}: expected an object")
        if key not in obj:
            raise MeasuredError(f"{self.where}: {name}: missing")
        return obj[key], name

    def text(self, obj: Any, key: str, at: str = "") -> str:
        value, name = self._get(obj, key, at)
        if not isinstance(value, str) or not value:
            raise MeasuredError(f"{self.where}: {name}: expected a non-empty string, got "
                                f"{_shown(value)}")
        return value

    def number(self, obj: Any, key: str, at: str = "", null: bool = False) -> Any:
        """A finite number >= 0, as a float (None where `null` allows it)."""
        value, name = self._get(obj, key, at)
        if value is None and null:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise MeasuredError(f"{self.where}: {name}: expected a number >= 0"
                                f"{' or null' if null else ''}, got {_shown(value)}")
        return float(value)

    def flag(self, obj: Any, key: str, at: str = "") -> bool | None:
        """An optional true/false (None when absent: a report older than the field)."""
        if not isinstance(obj, dict) or key not in obj:
            return None
        value, name = self._get(obj, key, at)
        if not isinstance(value, bool):
            raise MeasuredError(f"{self.where}: {name}: expected true or false, got "
                                f"{_shown(value)}")
        return value

    def items(self, obj: Any, key: str, at: str = "") -> list:
        value, name = self._get(obj, key, at)
        if not isinstance(value, list):
            raise MeasuredError(f"{self.where}: {name}: expected a list, got {_shown(value)}")
        return value

    def mapping(self, obj: Any, key: str, at: str = "") -> dict:
        value, name = self._get(obj, key, at)
        if not isinstance(value, dict):
            raise MeasuredError(f"{self.where}: {name}: expected an object, got "
                                f"{_shown(value)}")
        return value


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "\u2026"
