"""JUnit XML: one <testsuite> per host, one <testcase> per check finding.

Failures and errors are exactly what makes the exit code 1 (model.counted), so a CI that
reads the XML and one that reads the exit code agree:
fail -> <failure type=SEVERITY>; warn -> <failure type="warning"> (a warning counts in the
exit code, so it is a failure); unknown -> <error type="unknown"> (not decided: the reason);
an unreachable host, or one whose facts could not be gathered -> a single <error> testcase.
What does not count is <skipped>: a waived finding (`waived: JUSTIFICATION`, the waiver in
<system-out>) and an `info` note that did not pass (`info: ...`). A pass is a bare
testcase. Evidence goes to <system-out>. A probe finding (probe[recall], probe[needle]) is
a testcase like a check, timed by its request.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ..model import counted
from . import view

# What XML 1.0 cannot hold (C0 controls but tab, newline and CR; surrogates; U+FFFE,
# U+FFFF) plus DEL and C1 (legal, but terminal escapes when a CI log shows the file). A
# waiver's justification may carry U+FFFE, a host's evidence anything: ElementTree writes
# them as they are, and the file would not parse.
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def render(data: dict) -> str:
    findings = view.findings_by_host(data)
    root = ET.Element("testsuites", name="patchset audit")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for host in data["hosts"]:
        suite = ET.SubElement(root, "testsuite", name=host["host"],
                              timestamp=data["generated"],
                              time=f"{(host.get('gather_ms') or 0) / 1000:.3f}")
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if not host["reachable"] or host["error"]:
            case = ET.SubElement(suite, "testcase", classname="host", name="reachable")
            ET.SubElement(case, "error", message=host["error"] or "unreachable",
                          type="unreachable" if not host["reachable"] else "gather")
            counts["tests"] += 1
            counts["errors"] += 1
        for f in findings.get(host["host"], []):
            counts["tests"] += 1
            case = ET.SubElement(suite, "testcase", classname=f["id"], name=f["subject"])
            probe = view.probe_of(f)
            if probe is not None:
                case.set("time", f"{probe['latency_ms'] / 1000:.3f}")
            text = (f"expected {view.short(f['expected'], 200)}, found "
                    f"{view.short(f['found'], 200)}" + (f": {f['message']}" if f["message"]
                                                        else ""))
            out = [view.evidence_line(ev) for ev in f["evidence"]]
            if f["status"] == "waived":
                ET.SubElement(case, "skipped",
                              message=f"waived: {f['waiver']['justification']}")
                counts["skipped"] += 1
                out.insert(0, f"{view.waiver_line(f['waiver'])}: {text}")
            elif f["status"] != "pass" and not counted(f["status"], f["severity"]):
                ET.SubElement(case, "skipped", message=f"info: {f['message'] or text}")
                counts["skipped"] += 1
            elif f["status"] == "fail":
                ET.SubElement(case, "failure", message=text, type=f["severity"]).text = text
                counts["failures"] += 1
            elif f["status"] == "warn":
                ET.SubElement(case, "failure", message=text, type="warning").text = text
                counts["failures"] += 1
            elif f["status"] == "unknown":
                ET.SubElement(case, "error", message=f"unknown: {f['message'] or text}",
                              type="unknown").text = text
                counts["errors"] += 1
            if out:
                ET.SubElement(case, "system-out").text = "\n".join(out)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    _clean(root)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") \
        + "\n"


def _xml_text(text: str) -> str:
    """`text` with each character XML cannot hold written as its escape (`\\ufffe`)."""
    return NOT_XML.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _clean(root: ET.Element) -> None:
    """Every attribute and text of the tree made XML-safe, so the file always parses."""
    for element in root.iter():
        if element.text:
            element.text = _xml_text(element.text)
        for key, value in element.attrib.items():
            element.set(key, _xml_text(value))
