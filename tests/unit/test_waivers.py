"""Waivers (waivers.yaml, --waivers FILE): strict loading, matching, expiry, what counts
in the exit code, every format, the ranking, and the seed deployment auditing clean with
the one shipped waiver (waivers.example.yaml)."""

from __future__ import annotations

import ast
import copy
import datetime
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from tests.audit_facts import synth
from tests.unit.test_audit_probe import Replay

from patchset.auditor import api, report, waivers
from patchset.auditor.checks import CHECKS
from patchset.auditor.model import Finding
from patchset.auditor.policy import load as load_policy
from patchset.auditor.render import render
from patchset.connect.resolve import Hosts
from patchset import escaping
from patchset.cli import main
from patchset.errors import ManifestError, UsageError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "waivers.example.yaml"
NARROWED = "checkpoint-dtypes[narrowed]"
SUBJECT = "/models/DeepSeek-V4-Flash-NVFP4 *hc_attn_fn, *hc_ffn_fn for mhc-bf16"
JUSTIFICATION = ("mhc-bf16 narrows the F32 hyper-connection weights to bf16 on purpose "
                 "(2.6e-3 relative error, 1.2-1.3x faster hc_pre); revisit if decode quality "
                 "drops")
SEED_DAY = datetime.date(2026, 11, 29)           # seed.yaml `now`
EXPIRES = datetime.date(2027, 6, 30)             # the example waiver's last day


def day(value: datetime.date):
    return lambda: value


def healthy_seed() -> dict:
    """The seed deployment running the whole series: the swiglu clamp applied clears the
    NVFP4 hazard, so what is left is mhc-bf16 narrowing the F32 hyper-connection tensors."""
    desc = copy.deepcopy(synth.load("seed.yaml"))
    desc["tree"]["applied"].insert(1, "nvfp4-cutlass-swiglu-clamp")
    return desc


def waiver_text(*entries: dict) -> str:
    lines = ["version: 1", "waivers:"] if entries else ["version: 1", "waivers: []"]
    for e in entries:
        for i, (key, value) in enumerate(e.items()):
            shown = json.dumps(value) if isinstance(value, str) else value
            lines.append(f"  {'  ' if i else '- '}{key}: {shown}")
    return "\n".join(lines) + "\n"


def entry(**changes) -> dict:
    out = {"id": NARROWED, "host": "gpu1", "subject": SUBJECT,
           "justification": "accepted", "who": "ops", "expires": "2027-06-30"}
    out.update(changes)
    return {k: v for k, v in out.items() if v is not None}


def load_file(path: Path) -> waivers.WaiverFile:
    return waivers.load(path, load_policy())


def audit(series, desc: dict, file: waivers.WaiverFile | None, today=SEED_DAY,
          symptom: str | None = None, hosts: tuple[str, ...] = ("gpu1",)):
    facts = [synth.facts(desc, series, host=h) for h in hosts]
    rep = api.evaluate(series, facts, symptom, waivers=file, clock=day(today))
    data = report.to_dict(rep)
    assert report.validate(data) == []
    return rep, data


def counted(data: dict) -> list[tuple[str, str]]:
    return sorted((f["id"], f["status"]) for f in data["findings"]
                  if f["status"] in ("fail", "warn", "unknown") and f["severity"] != "info")


def notes(data: dict) -> int:
    """Findings that did not pass but are `info` notes (they never count)."""
    return sum(f["severity"] == "info" and f["status"] in ("fail", "warn", "unknown")
               for f in data["findings"])


# ---------------------------------------------------------------- the seed deployment

def test_seed_audits_exit_0_with_the_one_shipped_waiver(series) -> None:
    file = load_file(EXAMPLE)
    assert [(w.id, w.host, w.subject, w.expires) for w in file.waivers] == [
        (NARROWED, "gpu1", SUBJECT, EXPIRES)]
    rep, data = audit(series, healthy_seed(), file)
    assert api.exit_code(rep) == 0 and data["summary"]["exit_code"] == 0
    assert counted(data) == [] and data["summary"]["checks"]["fail"] == 0
    assert data["summary"]["waived"] == 1 and data["summary"]["notes"] == notes(data)
    _, plain = audit(series, healthy_seed(), None)
    assert data["summary"]["checks"]["warn"] == plain["summary"]["checks"]["warn"] - 1
    [waived] = [f for f in data["findings"] if f["status"] == "waived"]
    assert (waived["id"], waived["subject"], waived["found"]) == (NARROWED, SUBJECT,
                                                                  "4 tensor(s) F32")
    assert waived["waiver"] == {"status": "warn", "justification": JUSTIFICATION,
                                "who": "Jane Operator <jane@example.com>",
                                "expires": "2027-06-30", "file": str(EXAMPLE), "line": 19}
    section = data["waivers"]
    assert section["file"] == str(EXAMPLE) and section["expired"] == section["unused"] == []
    assert [(w["id"], w["findings"]) for w in section["applied"]] == [
        (NARROWED, [{"host": "gpu1", "id": NARROWED, "subject": SUBJECT}])]


def test_seed_without_the_waiver_exits_1_on_the_narrowing_alone(series) -> None:
    rep, data = audit(series, healthy_seed(), None)
    assert api.exit_code(rep) == 1
    assert counted(data) == [(NARROWED, "warn")]
    assert data["waivers"] is None and data["summary"]["waived"] == 0
    assert all(f["waiver"] is None for f in data["findings"])


def test_an_expired_waiver_brings_the_finding_back(series) -> None:
    file = load_file(EXAMPLE)
    rep, _ = audit(series, healthy_seed(), file, today=EXPIRES)     # its last day: valid
    assert api.exit_code(rep) == 0
    rep, data = audit(series, healthy_seed(), file, today=EXPIRES + datetime.timedelta(1))
    assert api.exit_code(rep) == 1
    assert counted(data) == [(NARROWED, "warn"), ("waiver[expired]", "warn")]
    back = next(f for f in data["findings"] if f["id"] == NARROWED)
    assert back["waiver"] is None and back["subject"] == SUBJECT
    expired = next(f for f in data["findings"] if f["id"] == "waiver[expired]")
    assert expired["severity"] == "low" and expired["host"] == "gpu1"
    assert expired["subject"] == f"{EXAMPLE}:19 {NARROWED}"
    assert (expired["expected"], expired["found"]) == ("expires on or after 2027-07-01",
                                                       "expired 2027-06-30")
    assert "the 1 finding(s) it matched here count again" in expired["message"]
    assert [(w["id"], len(w["findings"])) for w in data["waivers"]["expired"]] == [
        (NARROWED, 1)]
    assert data["waivers"]["applied"] == []


def test_an_unused_waiver_is_reported_and_does_not_count(series, tmp_path: Path) -> None:
    path = tmp_path / "waivers.yaml"
    path.write_text(waiver_text(entry(), entry(id="gate-env[process]", subject="*",
                                               expires="2027-01-01")))
    rep, data = audit(series, healthy_seed(), load_file(path))
    assert api.exit_code(rep) == 0
    unused = [f for f in data["findings"] if f["id"] == "waiver[unused]"]
    assert [(f["status"], f["severity"], f["subject"]) for f in unused] == [
        ("warn", "info", f"{path}:9 gate-env[process]")]
    assert unused[0]["message"].startswith("no non-passing gate-env[process] finding on "
                                           "gpu1 matches subject '*'")
    _, alone = audit(series, healthy_seed(), load_file(EXAMPLE))
    assert data["summary"]["notes"] == alone["summary"]["notes"] + 1 == notes(data)
    assert data["summary"]["waived"] == 1
    assert [(w["id"], w["line"], w["findings"]) for w in data["waivers"]["unused"]] == [
        ("gate-env[process]", 9, [])]


def test_the_raw_seed_keeps_its_hazard_failure(series) -> None:
    """A waiver waives what it matches and nothing else: the seed without the clamp still
    fails on the hazard the clamp patch fixes."""
    rep, data = audit(series, synth.load("seed.yaml"), load_file(EXAMPLE))
    assert api.exit_code(rep) == 1
    assert counted(data) == [("hazard[nvfp4-cutlass-no-swiglu-clamp]", "fail")] * 2
    assert data["summary"]["waived"] == 1


# ---------------------------------------------------------------- matching

def finding(**changes) -> Finding:
    base = {"id": NARROWED, "host": "gpu1", "subject": SUBJECT, "expected": "<= BF16",
            "found": "4 tensor(s) F32", "status": "warn", "severity": "medium"}
    base.update(changes)
    return Finding(**base)


def waiver(**changes) -> waivers.Waiver:
    base = {"id": NARROWED, "host": "gpu1", "subject": SUBJECT, "justification": "j",
            "who": "w", "expires": EXPIRES, "line": 3}
    base.update(changes)
    return waivers.Waiver(**base)


@pytest.mark.parametrize("changes,matches", [
    ({}, True),
    ({"id": "checkpoint-dtypes"}, False),                 # the id is exact, sub-tag included
    ({"id": "checkpoint-dtypes[nvfp4-experts]"}, False),
    ({"host": "gpu*"}, True), ({"host": "gpu[12]"}, True), ({"host": "gpu2"}, False),
    ({"host": "GPU1"}, False),                            # case-sensitive
    ({"subject": "*"}, True), ({"subject": "/models/* for mhc-bf16"}, True),
    ({"subject": "/models/other *"}, False),
    ({"subject": SUBJECT + " "}, False),                  # exact means exact
])
def test_id_is_exact_host_and_subject_exact_or_glob(changes: dict, matches: bool) -> None:
    assert waiver(**changes).matches(finding()) is matches


def test_a_subject_with_brackets_matches_itself_exactly() -> None:
    subject = "gpu1/a -> gpu1/b page_size [x]"        # as a glob, [x] is the class of x
    assert waiver(subject=subject).matches(finding(subject=subject))
    assert waiver(subject=subject).matches(finding(subject=subject[:-3] + "x"))   # the glob
    assert not waiver(subject=subject).matches(finding(subject=subject[:-3] + "y"))


def test_only_non_passing_findings_are_waived_the_first_valid_waiver_wins(series,
                                                                          tmp_path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(waiver_text(
        entry(host="gpu*", subject="*", justification="first", expires="2020-01-01"),
        entry(host="gpu*", subject="*/DeepSeek-*", justification="second"),
        entry(host="gpu1", justification="third"),
        entry(id="checkpoint-dtypes[nvfp4-experts]", host="*", subject="*",
              justification="passes")))
    rep, data = audit(series, healthy_seed(), load_file(path), hosts=("gpu1", "gpu2"))
    waived = {(f["host"], f["waiver"]["justification"]) for f in data["findings"]
              if f["status"] == "waived"}
    assert waived == {("gpu1", "second"), ("gpu2", "second")}
    experts = [f for f in data["findings"] if f["id"] == "checkpoint-dtypes[nvfp4-experts]"]
    assert experts and all(f["status"] == "pass" for f in experts)
    section = data["waivers"]
    assert [w["justification"] for w in section["applied"]] == ["second"]
    assert [w["justification"] for w in section["expired"]] == ["first"]
    assert section["expired"][0]["findings"] == []       # the valid one waived them
    assert [w["justification"] for w in section["unused"]] == ["third", "passes"]
    notes = sorted((f["id"], f["host"]) for f in data["findings"]
                   if f["id"].startswith("waiver["))
    assert notes == [("waiver[expired]", "gpu1"), ("waiver[expired]", "gpu2"),
                     ("waiver[unused]", "gpu1"),     # "third" names gpu1 only,
                     ("waiver[unused]", "gpu1"), ("waiver[unused]", "gpu2")]   # "passes" both
    assert api.exit_code(rep) == 1                      # the expired waiver counts


def test_a_waived_finding_implicates_no_patch(series) -> None:
    def mhc(data: dict) -> dict:
        return next(s for s in data["symptom"]["suspects"] if s["name"] == "mhc-bf16")
    _, plain = audit(series, healthy_seed(), None, symptom="context-loss")
    _, waived = audit(series, healthy_seed(), load_file(EXAMPLE), symptom="context-loss")
    assert any(r.startswith(f"{NARROWED}:") for r in mhc(plain)["reasons"])
    assert not any(NARROWED in r for r in mhc(waived)["reasons"])
    policy = load_policy()
    assert mhc(plain)["score"] == pytest.approx(mhc(waived)["score"] * policy.implicated)
    assert not any(s["kind"] == "check" and s["name"].startswith("checkpoint-dtypes")
                   for s in waived["symptom"]["suspects"])


# ---------------------------------------------------------------- every format

def test_every_format_shows_the_waiver_and_its_justification(series) -> None:
    _, data = audit(series, healthy_seed(), load_file(EXAMPLE))
    texts = {fmt: render(data, fmt, width=400) if fmt == "terminal" else render(data, fmt)
             for fmt in ("json", "md", "html", "terminal", "junit")}
    shown = json.loads(texts["json"])
    assert [f["id"] for f in shown["findings"] if f["status"] == "waived"] == [NARROWED]
    assert shown == data
    md = texts["md"]
    assert f"| waived (was warn) | medium | {escaping.for_markdown(NARROWED)} |" in md
    md_ = escaping.for_markdown          # data in Markdown is escaped (issue 25, class 11)
    assert f"#### WAIVED {md_(NARROWED)}: {md_(SUBJECT)}" in md
    assert f"**Waived:** {md_(JUSTIFICATION)} (" + md_(
        f"waived by Jane Operator <jane@example.com> until 2027-06-30 (was warn; "
        f"{EXAMPLE}:19)") + ")" in md
    assert "passed, 1 waived** on 1 host(s) (exit code 0)" in md
    assert f"| applied (line 19) | {md_(NARROWED)} | gpu1 |" in md
    html = texts["html"]
    assert '<tr class="finding waived"><td><span class="badge waived">waived</span>' in html
    assert f'<span class="waiver"><strong>Waived:</strong> {JUSTIFICATION} ' in html
    assert '<span class="badge waived">1 waived</span>' in html
    assert '<tr class="waiver-row applied">' in html
    terminal = texts["terminal"]
    assert re.search(r"  pass \d+  waived 1  .*exit 0$", terminal.splitlines()[0])
    row = next(line for line in terminal.splitlines() if NARROWED in line and "warn" in line)
    assert "waived" in row and JUSTIFICATION[:40] in row
    assert re.search(r"\d+ check\(s\) passed, 1 waived", terminal)
    case = ET.fromstring(texts["junit"]).find(f"testsuite/testcase[@classname='{NARROWED}']")
    assert case.find("skipped").get("message") == f"waived: {JUSTIFICATION}"
    assert case.find("system-out").text.startswith(
        f"waived by Jane Operator <jane@example.com> until 2027-06-30 (was warn; {EXAMPLE}:19)")


def test_junit_stays_well_formed_whatever_a_justification_holds(series,
                                                                tmp_path: Path) -> None:
    """U+FFFE and U+FFFF pass the loader (not control characters) but XML 1.0 cannot hold
    them: written as escapes, the file parses."""
    path = tmp_path / "w.yaml"
    path.write_text(waiver_text(entry(subject="*", justification="odd \ufffe\uffff text")))
    _, data = audit(series, healthy_seed(), load_file(path))
    case = ET.fromstring(render(data, "junit")).find(
        f"testsuite/testcase[@classname='{NARROWED}']")
    assert case.find("skipped").get("message") == "waived: odd \\ufffe\\uffff text"


def _no_server_info(desc: dict) -> dict:
    for server in desc["servers"]:
        server["server_info"] = None
        argv = server["argv"]
        del argv[argv.index("--moe-runner-backend"):argv.index("--moe-runner-backend") + 2]
    return desc


@pytest.mark.parametrize("name", ["waived", "plain", "expired", "unused-note", "unknown",
                                  "unreachable"])
def test_junit_failures_and_errors_agree_with_the_exit_code(series, tmp_path, name) -> None:
    """JUnit failures + errors > 0 exactly when the exit code is not 0, and the terminal's
    first line ends with the same exit code."""
    path = tmp_path / "w.yaml"
    path.write_text(waiver_text(entry(), entry(id="gate-env[process]", subject="*")))
    desc, file, today = healthy_seed(), load_file(EXAMPLE), SEED_DAY
    if name == "plain":
        file = None
    elif name == "expired":
        today = EXPIRES + datetime.timedelta(1)
    elif name == "unused-note":
        file = load_file(path)
    elif name == "unknown":
        desc = _no_server_info(desc)
    facts = [synth.facts(desc, series)]
    if name == "unreachable":
        down = synth.facts(desc, series, host="gpu2")
        down.reachable, down.error = False, "gpu2: unreachable (Connection refused)"
        facts.append(down)
    rep = api.evaluate(series, facts, waivers=file, clock=day(today))
    data = report.to_dict(rep)
    code = api.exit_code(rep)
    root = ET.fromstring(render(data, "junit"))
    bad = int(root.get("failures")) + int(root.get("errors"))
    assert (bad > 0) == (code != 0), (name, code, bad)
    assert render(data, "terminal").splitlines()[0].endswith(f"exit {code}")
    expected = {"waived": 0, "plain": 1, "expired": 1, "unused-note": 0, "unknown": 1,
                "unreachable": 3}
    assert code == expected[name]
    if name == "unknown":
        errors = root.findall("testsuite/testcase/error")
        assert errors and all(e.get("type") == "unknown" for e in errors)
        assert int(root.get("failures")) == 0
    if name == "unused-note":
        note = root.find("testsuite/testcase[@classname='waiver[unused]']/skipped")
        assert note.get("message").startswith("info: no non-passing gate-env[process]")


# ---------------------------------------------------------------- strict loading

CASES = [
    (waiver_text(entry(id="checkpoint-dtypes[hc-f32]")), 3, "waivers[0].id",
     "'checkpoint-dtypes[hc-f32]': checkpoint-dtypes reports no sub-tag 'hc-f32' (known: "
     "narrowed, nvfp4-experts)"),
    (waiver_text(entry(id="no-such-check")), 3, "waivers[0].id",
     "'no-such-check': no check 'no-such-check' (known: "),
    (waiver_text(entry(id="gpu-arch[x]")), 3, "waivers[0].id",
     "'gpu-arch[x]': gpu-arch reports no sub-tag 'x' (known: device-order, patches)"),
    (waiver_text(entry(id="Gate-Env")), 3, "waivers[0].id",
     "'Gate-Env' is not a finding id like checkpoint-dtypes[narrowed]"),
    (waiver_text(entry(why="x")), 9, "waivers[0].why",
     "unknown key (known: id, host, subject, justification, who, expires)"),
    (waiver_text(entry(justification=None)), 3, "waivers[0].justification",
     "missing (why the finding is accepted)"),
    (waiver_text(entry(who=None)), 3, "waivers[0].who", "missing (who accepted it)"),
    (waiver_text(entry(expires=None)), 3, "waivers[0].expires",
     "missing (the last day it holds, YYYY-MM-DD)"),
    (waiver_text(entry(justification="  ")), 6, "waivers[0].justification", "empty: say it"),
    (waiver_text(entry(host="")), 4, "waivers[0].host",
     'empty: use "*" to match every one'),
    (waiver_text(entry(subject="")), 5, "waivers[0].subject",
     'empty: use "*" to match every one'),
    (waiver_text(entry(host="gpu 1")), 4, "waivers[0].host",
     "a host name or glob has no spaces"),
    (waiver_text(entry(expires="2027-13-01")), 8, "waivers[0].expires",
     "'2027-13-01' is not a date (YYYY-MM-DD)"),
    (waiver_text(entry(expires="next june")), 8, "waivers[0].expires",
     "'next june' is not a date (YYYY-MM-DD)"),
    (waiver_text(entry()).replace('"2027-06-30"', "2027-06-30T10:00:00Z"), 8,
     "waivers[0].expires", "a date (YYYY-MM-DD), not a time"),
    (waiver_text(entry()).replace('"2027-06-30"', "2027-02-30"), 8, "(yaml)",
     "invalid YAML: '2027-02-30' is not a valid date (quote it to mean text)"),
    (waiver_text(entry(who=7)), 7, "waivers[0].who", "must be text, not int"),
    (waiver_text(entry(justification="line one\nline two")), 6, "waivers[0].justification",
     "contains a newline (one line of text; fold a long one with >-)"),
    (waiver_text(entry(justification="ok \u202e(deretsiger ton)")), 6,
     "waivers[0].justification", "contains control character \\u202e"),   # Trojan Source
    (waiver_text(entry(), entry(justification="again")), 9, "waivers[1]",
     "the same id, host and subject as the waiver at line 3"),
    ("version: 1\nwaivers:\n  - 3\n", 3, "waivers[0]",
     "a mapping with id, host, subject, justification, who, expires"),
    ("version: 2\nwaivers: []\n", 1, "version", "must be 1"),
    ("version: true\nwaivers: []\n", 1, "version", "must be 1"),     # True == 1 in Python
    ("version: 1.0\nwaivers: []\n", 1, "version", "must be 1"),
    ("waivers: []\n", 1, "version", "must be 1"),
    ("version: 1\n", 1, "waivers", "a list of waivers (it may be empty: `waivers: []`)"),
    ("version: 1\nwaivers: []\nowner: me\n", 3, "owner", "unknown key (known: version, "
     "waivers)"),
    ("", 1, "(document)", "a mapping with `version: 1` and `waivers:` (a list)"),
]


@pytest.mark.parametrize("text,line,field,message", CASES,
                         ids=[f"{c[2]}:{c[3][:30]}" for c in CASES])
def test_bad_waivers_are_one_line_errors_naming_file_line_field(tmp_path: Path, text: str,
                                                                line: int, field: str,
                                                                message: str) -> None:
    path = tmp_path / "waivers.yaml"
    path.write_text(text)
    with pytest.raises(ManifestError) as exc:
        load_file(path)
    assert (exc.value.file, exc.value.line, exc.value.field) == (str(path), line, field)
    assert exc.value.message.startswith(message)
    assert "\n" not in str(exc.value)


SECRET = "hf_" + "abcdefghijklmnopqrstuvwxyz0123"


@pytest.mark.parametrize("changes,field,message", [
    ({"expires": SECRET}, "expires", "'<redacted>' is not a date (YYYY-MM-DD)"),
    ({"expires": f"Bearer {SECRET}"}, "expires", "'Bearer <redacted>' is not a date"),
    ({"id": "sk-" + "abcdefghijklmnopqrstuvwx1234"}, "id", "'<redacted>': no check '<redacted>'"),
    ({"expires": "x" * 5000}, "expires", "'" + "x" * 76 + "... is not a date"),
])
def test_a_bad_value_is_quoted_redacted_and_cut(tmp_path: Path, changes: dict, field: str,
                                                message: str) -> None:
    """A token pasted into the wrong field is not echoed to stderr (or a CI log), and a
    huge value is not either."""
    path = tmp_path / "waivers.yaml"
    path.write_text(waiver_text(entry(**changes)))
    with pytest.raises(ManifestError) as exc:
        load_file(path)
    assert exc.value.field == f"waivers[0].{field}" and exc.value.message.startswith(message)
    assert SECRET[3:] not in str(exc.value) and len(str(exc.value)) < 400


def test_a_duplicate_at_the_end_of_a_full_file_names_both_lines(tmp_path: Path) -> None:
    """~7600 waivers (about the 1 MiB limit): the last repeats the one before it. The
    duplicate check is a dictionary now (it compared each waiver with all before it: ~5 s
    for this file; time is not asserted here)."""
    line = ("- {id: '%s', host: gpu%d, subject: '*', justification: j, who: w, "
            "expires: 2027-06-30}\n")
    path = tmp_path / "waivers.yaml"
    path.write_text("version: 1\nwaivers:\n" + "".join(line % (NARROWED, i)
                                                       for i in (*range(7600), 7599)))
    with pytest.raises(ManifestError, match=r":7603: waivers\[7600\]: the same id, host "
                       r"and subject as the waiver at line 7602"):
        load_file(path)


def test_an_empty_list_is_no_waivers(tmp_path: Path) -> None:
    path = tmp_path / "waivers.yaml"
    path.write_text(waiver_text())
    assert load_file(path) == waivers.WaiverFile(str(path), ())


def test_known_ids_cover_the_policy_and_the_checks() -> None:
    ids = waivers.finding_ids(load_policy())
    assert set(ids) == {m.ID for m in CHECKS} | {"probe"}
    assert ids["hazard"] == ("nvfp4-cutlass-no-swiglu-clamp",)
    assert ids["checkpoint-dtypes"] == ("narrowed", "nvfp4-experts")
    assert "kv_cache_dtype" in ids["pd-consistency"] and ids["probe"] == (
        "recall", "needle", "drift")


def test_each_check_declares_the_sub_tags_its_source_reports() -> None:
    """Every `sub="..."` a check passes is in its module's SUB_TAGS, and every sub-tag it
    declares is a string the module holds (pd-consistency's: the name of a FIELDS fact),
    so a declaration is neither short nor stale; waivers know exactly those."""
    ids = waivers.finding_ids(load_policy())
    for module in CHECKS:
        tree = ast.parse(Path(module.__file__).read_text())
        literal = {kw.value.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                   for kw in node.keywords if kw.arg == "sub"
                   and isinstance(kw.value, ast.Constant)}
        strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                   and isinstance(node.value, str)}
        strings |= {s.partition(".")[2] for s in strings}
        table = set(module.SUB_TAGS)
        assert isinstance(module.SUB_TAGS, tuple), module.ID
        assert literal <= table, (module.ID, literal - table)
        assert table <= strings, (module.ID, table - strings)
        assert table <= set(ids[module.ID]), module.ID
    assert not hasattr(waivers, "SUB_TAGS")       # declared in the checks, nowhere else
    api_source = (ROOT / "auditor" / "api.py").read_text()
    assert 'f"{PROBE_CHECK}[{r.probe}]"' in api_source     # probe[KIND], KIND from ProbeResult


# ---------------------------------------------------------------- which file, the CLI

def test_which_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert waivers.locate(None, False) is None
    (tmp_path / "waivers.yaml").write_text(waiver_text())
    assert waivers.locate(None, False) == Path("waivers.yaml")
    assert waivers.locate("other.yaml", False) == Path("other.yaml")
    assert waivers.locate(None, True) is None
    with pytest.raises(UsageError, match="--waivers and --no-waivers: give one of them"):
        waivers.locate("other.yaml", True)


@pytest.fixture()
def cli_env(series, tmp_path: Path, monkeypatch) -> dict:
    """cwd = an empty directory (the series given by --series); the audit's transport
    replays the healthy seed's facts instead of ssh, counting gatherings."""
    monkeypatch.setenv("PATCHSET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATCHSET_INVENTORY", str(tmp_path / "none.yaml"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    env = {"hosts": [], "work": work, "series": series.manifest}

    def transport(resolver, spec: str) -> Replay:
        host = Replay(healthy_seed(), series, spec)
        env["hosts"].append(host)
        return host
    monkeypatch.setattr(Hosts, "audit_transport", transport)
    return env


def cli(capsys, env: dict, *argv: str) -> tuple[int, str, str]:
    code = main(["audit", "gpu1", "--series", str(env["series"]), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_reads_waivers_yaml_by_default_and_the_options_override(cli_env: dict,
                                                                    capsys) -> None:
    work = cli_env["work"]
    code, out, _ = cli(capsys, cli_env, "--format", "json")
    assert code == 1 and json.loads(out)["waivers"] is None        # no file here
    (work / "waivers.yaml").write_text(waiver_text(entry(expires="2999-12-31")))
    code, out, _ = cli(capsys, cli_env, "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["waivers"]["file"] == "waivers.yaml"
    assert data["summary"]["waived"] == 1 and report.validate(data) == []
    code, out, _ = cli(capsys, cli_env, "--format", "json", "--no-waivers")
    assert code == 1 and json.loads(out)["waivers"] is None
    old = work / "old.yaml"
    old.write_text(waiver_text(entry(expires="2001-01-01")))
    code, out, _ = cli(capsys, cli_env, "--format", "json", "--waivers", str(old))
    data = json.loads(out)
    assert code == 1 and data["waivers"]["file"] == str(old)
    assert counted(data) == [(NARROWED, "warn"), ("waiver[expired]", "warn")]
    code, out, err = cli(capsys, cli_env, "--format", "junit", "-o", str(work / "r.xml"))
    assert code == 0 and out == ""
    assert re.fullmatch(r"1 host\(s\): 0 failed, \d+ warnings, \d+ unknown, \d+ passed, "
                        r"1 waived(; \d+ info note\(s\), not counted)?; report written to "
                        + re.escape(str(work / "r.xml")) + "\n", err), err
    root = ET.parse(work / "r.xml").getroot()
    assert (root.get("failures"), root.get("errors")) == ("0", "0")
    assert root.find(f"testsuite/testcase[@classname='{NARROWED}']/skipped") is not None
    code, out, _ = cli(capsys, cli_env)                              # terminal
    assert code == 0 and out.splitlines()[0].endswith("exit 0") and " waived 1 " in \
        out.splitlines()[0]


@pytest.mark.parametrize("argv,message", [
    (("--waivers", "missing.yaml"), "patchset: error: missing.yaml: (file): not found\n"),
    (("--waivers", "bad.yaml"), "patchset: error: bad.yaml:3: waivers[0].id: "
                                "'checkpoint-dtypes[hc-f32]': checkpoint-dtypes reports no "
                                "sub-tag 'hc-f32' (known: narrowed, nvfp4-experts)\n"),
    (("--waivers", "bad.yaml", "--no-waivers"),
     "patchset: error: --waivers and --no-waivers: give one of them\n"),
    ((), "patchset: error: waivers.yaml:6: waivers[0].justification: empty: say it\n"),
])
def test_cli_bad_waivers_exit_2_before_any_host(cli_env: dict, capsys, argv, message) -> None:
    work = cli_env["work"]
    (work / "bad.yaml").write_text(waiver_text(entry(id="checkpoint-dtypes[hc-f32]")))
    (work / "waivers.yaml").write_text(waiver_text(entry(justification="")))
    code, out, err = cli(capsys, cli_env, "--format", "json", *argv)
    assert (code, out, err) == (2, "", message)
    assert cli_env["hosts"] == []                                   # nothing was contacted


# ---------------------------------------------------------------- serve: hosts gathered apart

def _comparable(data: dict) -> tuple:
    findings = sorted(json.dumps(f, sort_keys=True) for f in data["findings"])
    section = {k: sorted(json.dumps(w, sort_keys=True) for w in v) if isinstance(v, list)
               else v for k, v in data["waivers"].items()}
    return data["summary"], findings, section


def test_serve_reports_what_one_audit_of_all_the_hosts_reports(series, tmp_path) -> None:
    """`patchset serve` gathers each host on its own schedule and evaluates them together:
    its /report.json is the report of one audit of every host (summary, findings, the
    waivers section), pd-consistency pairs servers across hosts, a waiver used on one
    host only is not unused, and one that matches nothing is unused on every host."""
    from patchset.auditor.exporter import Exporter
    path = tmp_path / "w.yaml"
    path.write_text(waiver_text(
        entry(host="gpu*", subject="*", justification="first", expires="2020-01-01"),
        entry(host="gpu1", subject="*/DeepSeek-*", justification="gpu1 only"),
        entry(id="gate-env[process]", host="*", subject="*", justification="nothing")))
    file, hosts = load_file(path), ("gpu1", "gpu2")
    _, whole = audit(series, healthy_seed(), file, hosts=hosts)
    facts = {h: synth.facts(healthy_seed(), series, host=h) for h in hosts}
    ex = Exporter(list(hosts), lambda h: api.Gathered(facts[h]),
                  lambda gathered: report.to_dict(api.evaluate_gathered(
                      series, gathered, waivers=file, clock=day(SEED_DAY))), interval=60)
    for h in hosts:
        ex.audit_once(h)
    served = json.loads(ex.report_json())
    assert report.validate(served) == []
    assert _comparable(served) == _comparable(whole)
    assert any(f["id"].startswith("pd-consistency[") and "gpu1/" in f["subject"]
               and "gpu2/" in f["subject"] for f in served["findings"])
    assert [w["justification"] for w in served["waivers"]["unused"]] == ["nothing"]
    assert served["summary"]["waived"] == 1 and served["summary"]["checks"]["fail"] == 0


def test_a_waiver_whose_hosts_were_all_unreachable_is_not_called_unused(series) -> None:
    from patchset.auditor.model import HostFacts
    down = HostFacts(host="gpu9", reachable=False, error="ssh: connection refused")
    rep = api.evaluate(series, [synth.facts(healthy_seed(), series, host="gpu1"), down],
                       None, waivers=waivers.WaiverFile("w.yaml", (waiver(host="gpu9"),)),
                       clock=day(SEED_DAY))
    data = report.to_dict(rep)
    assert data["waivers"]["unused"] == [] and data["waivers"]["applied"] == []
    assert not any(f["id"].startswith("waiver[") for f in data["findings"])
