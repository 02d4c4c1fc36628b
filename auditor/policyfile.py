"""What every auditor data file shares: the bounded YAML read (version 1) and one `when`
requirement's validation. Below policy.py and resolved.py, which both use it (policy.py
loads resolved_args.yaml through resolved.py: no import loop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchset.series import factnames
from patchset import inputfile, yamlsrc
from patchset.errors import Exit, ManifestError, PatchsetError
from patchset.series.model import REQUIRE_OPS, Requirement


class AuditDataError(PatchsetError):
    """An auditor data file (or one passed in) is invalid."""

    exit_code = Exit.BAD_INPUT


def _load(path: Path) -> dict:
    """Through the same bounded reader and positioned YAML loader as the manifest."""
    text = inputfile.read_text(path, inputfile.DATA_LIMIT, "policy file")
    doc = yamlsrc.load(text, str(path))
    try:
        doc.version(1, None, "must be 1")     # also refuses a document that is no mapping
    except ManifestError as exc:
        raise AuditDataError(str(exc)) from None
    return doc.data


def _req(path: Path, where: str, item: Any) -> Requirement:
    if not isinstance(item, dict) or not {"fact", "op", "value"} <= set(item):
        raise AuditDataError(f"{path}: {where}: needs fact, op, value")
    if item["op"] not in REQUIRE_OPS:
        raise AuditDataError(f"{path}: {where}.op: {item['op']!r} is not one of "
                             f"{', '.join(REQUIRE_OPS)}")
    bad = factnames.problem(str(item["fact"]))
    value = tuple(item["value"]) if isinstance(item["value"], list) else item["value"]
    bad = bad or factnames.value_problem(str(item["fact"]), value if isinstance(value, tuple)
                                         else (value,))
    if bad:
        raise AuditDataError(f"{path}: {where}.fact: {bad}")
    return Requirement(str(item["fact"]), item["op"], value, str(item.get("why", "")))
