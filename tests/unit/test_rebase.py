"""`patchset rebase --onto`: the real series and synthetic ones moved from SGLang 0.5.14 to
the real 0.5.15 from PyPI.

0.5.15 is the release used throughout: it is the next one after the pin, and of all the
later releases (0.5.15 ... 0.5.23, each tried) it exercises the most: four of the six real
patches merge 3-way and two conflict, one of them next to a file that still applies clean
and the other next to a file that merges; from 0.5.16 on, the two sm120 FlashMLA files
mma-splitk-decode changes are gone, and more patches conflict. No release takes a real
patch, so `clean` and `upstream` are exercised by synthetic patches on files 0.5.15 left
alone or changed in exactly the patch's way.

The 0.5.15 wheel is fetched once per machine into the shared cache (like the 0.5.14 one).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from tests.hostutil import cli
from tests.seriesfactory import CHAT, DSV4, PatchDef, append_line, build_series

from patchset.errors import ManifestError
from patchset.series.manifest import load_series
from patchset.authoring.rebase import _edit_manifest, rebase
from patchset.pin.upstream import pin_for_version, provision

ROOT = Path(__file__).resolve().parents[2]
NEW = "0.5.15"
NEW_SHA = "21492759b4b99e117bd81610f633422f3fdae2896c2cde6931eab886deccc44f"
SRT = "python/sglang/srt/"
CUTLASS = SRT + "layers/moe/cutlass_moe.py"
MODELOPT = SRT + "layers/quantization/modelopt_quant.py"
MLA = SRT + "layers/attention/flash_mla_sm120.py"
MLA_TRITON = SRT + "layers/attention/flash_mla_sm120_triton.py"   # same in 0.5.15
ENGINE_BASE = SRT + "entrypoints/EngineBase.py"       # 0.5.15 adds exactly one line
REAL_OUTCOMES = {"default-thinking-reasoning": "3way", "nvfp4-cutlass-swiglu-clamp": "conflict",
                 "triton-dsa-indexer": "3way", "indexer-bf16-gemm": "3way",
                 "mma-splitk-decode": "conflict", "mhc-bf16": "3way"}
CONFLICTING = ("nvfp4-cutlass-swiglu-clamp", "mma-splitk-decode")


@pytest.fixture(autouse=True)
def _home(patchset_home: Path) -> Path:
    """Keep debug.log and targets out of the real home."""
    return patchset_home


@pytest.fixture(scope="session")
def new_base(pinned_pin, pinned_base):
    """0.5.15 in the shared cache: its wheel learnt once (TOFU), then provisioned."""
    pin = pin_for_version(pinned_pin, NEW)
    assert (pin.version, pin.git.ref, pin.pypi.requirement, pin.pypi.sha256) == (
        NEW, "v0.5.15", "sglang==0.5.15", NEW_SHA)
    return provision(pin)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "authoring" not in p.relative_to(root).parts}


def real_copy(dest: Path, drop: tuple[str, ...] = ()) -> Path:
    """The project's patches.yaml and patch files, minus the entries `drop` (cut as text,
    so the file's comments and layout stay those of the real manifest)."""
    dest.mkdir(parents=True)
    head, *entries = re.split(r"(?m)^(?=  - name: )", (ROOT / "patches.yaml").read_text())
    kept = [e for e in entries if e.split("\n", 1)[0][len("  - name: "):] not in drop]
    (dest / "patches.yaml").write_text(head + "".join(kept))
    (dest / "patches").mkdir()
    for entry in yaml.safe_load((dest / "patches.yaml").read_text())["series"]:
        shutil.copyfile(ROOT / entry["file"], dest / entry["file"])
    return dest / "patches.yaml"


def run(capsys, manifest: Path, *flags: str) -> tuple[int, dict, str]:
    code, out, err = cli(capsys, "rebase", *flags, "--json", "--series", str(manifest))
    return code, json.loads(out) if out else {}, err


def outcomes(result: dict) -> dict[str, str]:
    return {p["name"]: p["outcome"] for p in result["patches"]}


def body(text: str) -> str:
    return text[text.index("diff --git "):]


# ---------------------------------------------------------------- the real series

def test_real_series_onto_0_5_15_conflicts_and_writes_nothing(new_base, tmp_path, capsys):
    manifest = real_copy(tmp_path / "real")
    before = snapshot(manifest.parent)
    code, result, err = run(capsys, manifest, "--onto", NEW)
    assert code == 1, err
    assert outcomes(result) == REAL_OUTCOMES
    assert (result["ok"], result["changed"], result["written"], result["removed"]) == (
        False, False, [], [])
    assert snapshot(manifest.parent) == before
    by_name = {p["name"]: p for p in result["patches"]}
    nvfp4, mma = by_name["nvfp4-cutlass-swiglu-clamp"], by_name["mma-splitk-decode"]
    assert nvfp4["notes"] == [f"{CUTLASS}: 1 conflicting hunk(s)", f"{MODELOPT}: 3way"]
    assert mma["notes"] == [f"{MLA}: 1 conflicting hunk(s)", f"{MLA_TRITON}: clean"]
    [cut] = nvfp4["hunks"]
    [mla] = mma["hunks"]
    assert (cut["path"], cut["upstream"], mla["path"], mla["upstream"]) == (
        CUTLASS, [472, 3], MLA, [200, 3])
    assert cut["text"].startswith("<<<<<<< sglang 0.5.15\n    # fused: SiLU + mul then FP4")
    assert "silu_and_mul_clamp(c1, intermediate, swiglu_limit)" in cut["text"]
    assert cut["text"].endswith(">>>>>>> nvfp4-cutlass-swiglu-clamp\n")
    assert "envs.SGLANG_SM120_FLASHMLA_BACKEND.get()\n=======\n" in mla["text"]
    assert '_sm120_splitk_mma = os.environ.get("MMA_FLASHMLA") == "1"' in mla["text"]


def test_real_series_without_the_conflicting_patches_moves(new_base, tmp_path, capsys):
    manifest = real_copy(tmp_path / "a", drop=CONFLICTING)
    old = snapshot(manifest.parent)
    code, result, err = run(capsys, manifest, "--onto", "v0.5.15")      # the tag form
    assert code == 0, err
    assert outcomes(result) == {n: o for n, o in REAL_OUTCOMES.items() if n not in CONFLICTING}
    names = [n for n in REAL_OUTCOMES if n not in CONFLICTING]
    assert result["written"] == sorted(["patches.yaml"] + [f"patches/{n}.patch" for n in names])
    new = snapshot(manifest.parent)
    for name in names:        # header kept; the diff re-made on 0.5.15 with full index lines
        rel = f"patches/{name}.patch"
        assert new[rel].decode().split("\ndiff --git ")[0] == old[rel].decode().split(
            "\ndiff --git ")[0]
        assert body(new[rel].decode()) != body(old[rel].decode())
    changed = [(a, b) for a, b in zip(old["patches.yaml"].decode().split("\n"),
                                      new["patches.yaml"].decode().split("\n")) if a != b]
    old_sha = "4fe16056b45c8aca00f5f90ceb174dc3a62a3f5dccf159c791370795cd00fc99"
    assert changed == [("  version: 0.5.14", "  version: 0.5.15"),
                       ("    ref: v0.5.14", "    ref: v0.5.15"),
                       ("    requirement: sglang==0.5.14", "    requirement: sglang==0.5.15"),
                       ("    file: sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl",
                        "    file: sglang-0.5.15-cp311-cp311-manylinux_2_34_x86_64.whl"),
                       (f"    sha256: {old_sha}", f"    sha256: {NEW_SHA}")]
    code, out, err = cli(capsys, "check", "--offline", "--series", str(manifest))
    assert code == 0, out + err

    twin = real_copy(tmp_path / "b", drop=CONFLICTING)       # same inputs, same bytes
    assert rebase(load_series(twin), NEW).ok
    assert snapshot(twin.parent) == new

    code, again, err = run(capsys, manifest, "--onto", NEW, "--offline")
    assert code == 0, err
    assert set(outcomes(again).values()) == {"clean"} and again["changed"] is False
    assert snapshot(manifest.parent) == new


def test_onto_the_pinned_release_is_all_clean(new_base, tmp_path, capsys):
    manifest = real_copy(tmp_path / "real")
    before = snapshot(manifest.parent)
    code, out, err = cli(capsys, "rebase", "--onto", "0.5.14", "--series", str(manifest))
    assert code == 0, err
    assert out.count(" clean ") == 6 and "sglang 0.5.14 -> sglang 0.5.14" in out
    assert "6 clean: already on sglang 0.5.14, nothing to change" in err
    assert snapshot(manifest.parent) == before


# ---------------------------------------------------------------- each outcome

def replace(old: str, new: str):
    def edit(source: str) -> str:
        assert old in source
        return source.replace(old, new, 1)
    return edit


@pytest.fixture()
def outcome_series(pinned_base, new_base, tmp_path) -> Path:
    """One patch per outcome that carries, against files 0.5.15 changed or kept."""
    return build_series(pinned_base, tmp_path / "s", [
        PatchDef("triton-note", {MLA_TRITON: append_line("import ", "# local note")}),
        PatchDef("dsv4-note", {DSV4: append_line("import ", "# local dsv4 note")}),
        # exactly 0.5.15's change to the file: its post-image is the new file
        PatchDef("engine-session", {ENGINE_BASE: append_line(
            "priority: Optional[int] = None,", "session_id: Optional[str] = None,")}),
        # one of 0.5.15's changes among others: the merge leaves the new file as it is
        PatchDef("chat-tokens-details", {CHAT: append_line(
            "MessageProcessingResult,", "PromptTokensDetails,")}),
        # stacked on an upstreamed patch: its pre-image is now upstream's own file
        PatchDef("engine-doc", {ENGINE_BASE: append_line('"""Generate outputs',
                                                         "# local engine note")},
                 depends=["engine-session"],
                 requires=[{"fact": "patch.chat-tokens-details", "op": "ne",
                            "value": "active", "why": "test"}]),
    ])


def test_each_outcome_is_classified_and_written(outcome_series: Path, capsys):
    root = outcome_series.parent
    before = snapshot(root)
    code, result, err = run(capsys, outcome_series, "--onto", NEW, "--dry-run")
    assert code == 0, err
    expected = {"triton-note": "clean", "dsv4-note": "3way", "engine-session": "upstream",
                "chat-tokens-details": "upstream", "engine-doc": "clean"}
    assert outcomes(result) == expected
    assert result["dry_run"] and result["changed"] and snapshot(root) == before
    notes = {p["name"]: p["notes"] for p in result["patches"]}
    assert notes["engine-session"] == [f"{ENGINE_BASE}: already in sglang 0.5.15"]
    assert notes["chat-tokens-details"] == [f"{CHAT}: the merge changes nothing in sglang 0.5.15"]
    assert notes["engine-doc"] == ["depends: dropped engine-session (upstream)",
                                   "requires: dropped chat-tokens-details (upstream)"]

    code, written, err = run(capsys, outcome_series, "--onto", NEW)
    assert code == 0, err
    assert outcomes(written) == expected
    assert written["written"] == ["patches.yaml", "patches/dsv4-note.patch"]
    assert written["removed"] == ["patches/chat-tokens-details.patch",
                                  "patches/engine-session.patch"]
    after = snapshot(root)
    for name in ("triton-note", "engine-doc"):                   # clean: byte for byte
        assert after[f"patches/{name}.patch"] == before[f"patches/{name}.patch"]
    series = load_series(outcome_series)
    assert [p.name for p in series.patches] == ["triton-note", "dsv4-note", "engine-doc"]
    doc = series.by_name()["engine-doc"]
    assert (doc.depends, doc.requires) == ((), ())
    assert series.upstream.version == NEW and series.upstream.pypi.sha256 == NEW_SHA
    assert yaml.safe_load(outcome_series.read_text())["upstreamed"] == [
        {"name": "engine-session", "summary": "test engine-session",
         "upstream_status": "accepted", "since": NEW},
        {"name": "chat-tokens-details", "summary": "test chat-tokens-details",
         "upstream_status": "accepted", "since": NEW}]
    code, out, err = cli(capsys, "check", "--offline", "--series", str(outcome_series))
    assert code == 0, out + err


def test_a_result_that_does_not_check_writes_nothing(outcome_series: Path, capsys,
                                                     monkeypatch):
    from patchset import api

    def failing(series, read, label, *args, **kwargs):
        return api.CheckReport(series.manifest, label, (), (api.SelectionCheck(
            ("dsv4-note",), False, "does not apply"),))
    monkeypatch.setattr(api, "check", failing)
    before = snapshot(outcome_series.parent)
    code, out, err = cli(capsys, "rebase", "--onto", NEW, "--series", str(outcome_series))
    assert (code, out) == (4, "")
    assert err.splitlines()[-1] == ("patchset: error: rebase: the rebased series does not "
                                    "check on sglang 0.5.15 (dsv4-note: does not apply); "
                                    "nothing was written")
    assert snapshot(outcome_series.parent) == before


def test_conflict_writes_nothing_and_shows_the_hunks(pinned_base, new_base, tmp_path, capsys):
    manifest = build_series(pinned_base, tmp_path / "s", [
        PatchDef("mla-import", {MLA: replace("import os\n", "import os  # local\n")}),
        PatchDef("chat-note", {CHAT: append_line("import ", "# local chat note")}),
        PatchDef("mla-later", {MLA: append_line("import torch", "# later")},
                 depends=["mla-import"]),
    ])
    before = snapshot(manifest.parent)
    code, out, err = cli(capsys, "rebase", "--onto", NEW, "--series", str(manifest))
    assert code == 1
    assert snapshot(manifest.parent) == before
    rows = {line.split()[1]: line.split()[3] for line in out.splitlines()
            if re.match(r"^│ [a-z]", line) and line.split()[1] != "patch"}
    assert rows == {"mla-import": "conflict", "chat-note": "3way", "mla-later": "blocked"}
    assert "not tried: mla-import left a file it changes unresolved" in out
    assert (f"mla-import: {MLA}: conflict at lines 15-15 of sglang 0.5.15 (lines 15-19 of "
            "the merge)\n<<<<<<< sglang 0.5.15\nimport math\n=======\nimport os  # local\n"
            ">>>>>>> mla-import\n") in out
    assert "1 conflict, 1 3way, 1 blocked: conflicts, nothing written" in err


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize(("ref", "message"), [
    ("ba nana", ("patchset: error: --onto 'ba nana': expected a release like 0.5.15, or an "
                 "upstream commit, branch or tag ('ba nana' is not a git ref: use letters, "
                 "digits and . _ / + - @ (a tag, branch, refs/... name or a 40-hex commit "
                 "id))\n")),
    ("0.5.99", ("patchset: error: sglang 0.5.99: no such release with a wheel for python 3.11 "
                "on manylinux_2_34_x86_64 on the package index\n")),
])
def test_bad_ref_is_one_line_exit_2(ref, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    manifest = real_copy(tmp_path / "real")
    code, out, err = cli(capsys, "rebase", "--onto", ref, "--series", str(manifest))
    assert (code, out, err.splitlines(keepends=True)[-1]) == (2, "", message)
    assert err.count("patchset: error:") == 1


def test_unreachable_index_is_exit_3(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    for key, value in {"PIP_CONFIG_FILE": "/dev/null", "PIP_RETRIES": "0", "PIP_TIMEOUT": "5",
                       "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}.items():
        monkeypatch.setenv(key, value)
    manifest = real_copy(tmp_path / "real")
    code, out, err = cli(capsys, "rebase", "--onto", NEW, "--series", str(manifest))
    assert (code, out) == (3, "")
    assert err.splitlines()[-1] == (
        "patchset: error: cannot reach the package index for sglang==0.5.15 (no sglang "
        "release listed at all); check the network and the index (pip config list)")


# ---------------------------------------------------------------- patches.yaml edits

def test_manifest_edits_keep_layout_and_the_loader_takes_upstreamed(pinned_pin, tmp_path):
    text = (ROOT / "patches.yaml").read_text()
    dropped = load_series(ROOT / "patches.yaml").by_name()
    moved = pin_for_version(pinned_pin, NEW)
    # flow list in the real manifest: `depends: [triton-dsa-indexer]` loses its item
    new, notes = _edit_manifest(text, moved, {"triton-dsa-indexer": dropped["triton-dsa-indexer"]})
    assert "    depends: []\n" in new and text.count("\n") - new.count("\n") == 31 - 1
    assert notes == {"indexer-bf16-gemm": ("depends: dropped triton-dsa-indexer (upstream)",
                                           "requires: dropped triton-dsa-indexer (upstream)")}
    assert new.startswith(text.split("\n", 2)[0] + "\n")            # comments kept
    assert new.endswith("upstreamed:  # patches upstream took (patchset rebase); no longer "
                        "carried\n  - {name: triton-dsa-indexer, summary: 'Triton sm_120 "
                        "indexer logits whose cost follows seq_len, not the page-table width',"
                        " upstream_status: accepted, since: 0.5.15}\n")
    # a second drop appends to the list that is there now
    newer, _ = _edit_manifest(new, moved, {"mhc-bf16": dropped["mhc-bf16"]})
    assert [u["name"] for u in yaml.safe_load(newer)["upstreamed"]] == [
        "triton-dsa-indexer", "mhc-bf16"]
    assert "\n  - name: mhc-bf16\n" not in newer

    data = yaml.safe_load(newer)
    data["upstreamed"].append({"name": "default-thinking-reasoning", "summary": "x",
                               "upstream_status": "accepted", "since": NEW})
    (tmp_path / "patches").mkdir()
    for entry in data["series"]:
        shutil.copyfile(ROOT / entry["file"], tmp_path / entry["file"])
    (tmp_path / "patches.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ManifestError, match=r"upstreamed\[2\]\.name: 'default-thinking-"
                                            r"reasoning' is in series: too"):
        load_series(tmp_path / "patches.yaml")


def test_the_carried_patches_guards_are_derived_again_on_the_new_release(new_base, tmp_path,
                                                                          capsys):
    """0.5.15 moves hc_pre's tests up 77 lines and adds an MoE all-to-all test on its
    path; the indexer's and the chat's tests move; nothing vanishes."""
    manifest = real_copy(tmp_path / "real", drop=CONFLICTING)
    result = rebase(load_series(manifest), NEW, dry_run=True)
    changes = {c.patch: c for c in result.guards}
    assert set(changes) == {"default-thinking-reasoning", "triton-dsa-indexer",
                            "indexer-bf16-gemm", "mhc-bf16"}
    assert not any(c.vanished for c in changes.values())
    mhc = changes["mhc-bf16"]
    assert {(a.fact, a.line, b.line) for a, b in mhc.moved} == {
        ("env.SGLANG_OPT_USE_TILELANG_MHC_PRE", 1326, 1249),
        ("env.SGLANG_OPT_USE_AITER_MHC_PRE", 1348, 1271),
        ("env.SGLANG_OPT_DEEPGEMM_HC_PRENORM", 1364, 1287)}
    assert {(g.fact, g.where.rsplit("/", 1)[1]) for g in mhc.appeared} == {
        ("server.moe_a2a_backend", "operations_strategy.py:187"),
        ("server.speculative_moe_a2a_backend", "operations_strategy.py:187")}
    indexer = {(a.fact, a.line, b.line) for a, b in changes["triton-dsa-indexer"].moved}
    assert ("env.SGLANG_OPT_USE_TILELANG_INDEXER", 636, 779) in indexer
    assert not changes["triton-dsa-indexer"].appeared
    code, out, err = cli(capsys, "rebase", "--onto", NEW, "--dry-run", "--series",
                         str(manifest))
    assert code == 0, err
    dsv4 = "python/sglang/srt/models/deepseek_v4.py"
    assert (f"mhc-bf16: guard moved: env.SGLANG_OPT_USE_TILELANG_MHC_PRE in "
            f"DeepseekV4DecoderLayer.hc_pre {dsv4}:1326 -> {dsv4}:1249") in out
    assert "mhc-bf16: guard appeared: server.moe_a2a_backend at python/sglang/srt/" in out
