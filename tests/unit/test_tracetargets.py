"""Trace targets derived from the patches (patchset/agent/lib/tracetargets.py): unit cases on
small files, then the project's series on the real 0.5.14 tree, against docs/explanation/tracer.md."""

from __future__ import annotations

import re
from pathlib import Path

from patchset import api
from patchset.agent import engine
from patchset.agent.lib.tracetargets import changed_lines, for_patch, module_name
from patchset.series.manifest import load_series
from patchset.series.selection import Selection, plan
from patchset.pin.upstream import materialize

from patchset.connect.local import LocalTransport

ROOT = Path(__file__).resolve().parents[2]
BEFORE = b'''import os

LIMIT = 1


def free():
    return LIMIT + 1


class Layer:
    scale = 2

    def forward(self, x):
        def inner(y):
            return y * 2
        return inner(x)

    @staticmethod
    def other():
        return 0


@triton.jit
def kernel(x):
    pass
'''


def targets(after: bytes, before: bytes | None = BEFORE, **kw) -> dict[str, tuple[str, str]]:
    found = for_patch("p", [("python/sglang/srt/m.py", before, after)], "python/", **kw)
    return {t.qualname: (t.kind, t.why) for t in found}


def test_a_nested_function_is_its_own_target() -> None:
    after = BEFORE.replace(b"return y * 2", b"return y * 3")
    assert targets(after) == {"Layer.forward.<locals>.inner": ("function", "body changed "
                                                                          "(line 15)")}


def test_a_method_a_kernel_and_blank_or_comment_lines() -> None:
    after = BEFORE.replace(b"        return 0", b"        # why\n\n        return 1") \
        .replace(b"    pass", b"    x + 1")
    got = targets(after)
    assert got["Layer.other"][0] == "function" and got["kernel"][0] == "kernel"
    only_comments = BEFORE.replace(b"import os\n", b"import os\n# a comment\n\n")
    assert targets(only_comments) == {}


def test_a_module_level_change_names_the_module_and_its_users() -> None:
    after = BEFORE.replace(b"LIMIT = 1", b"LIMIT = 2")
    got = targets(after)
    assert got["<module>"][0] == "module"
    assert got["free"] == ("function", "uses LIMIT (changed at module level)")
    assert "Layer.forward" not in got


def test_a_new_file_and_manifest_entries() -> None:
    new = b"def added():\n    return 1\n"
    assert targets(new, before=None)["added"][0] == "function"
    extra = [{"module": "sglang.srt.x", "qualname": "A.f"}]
    assert set(targets(new, None, declared=extra)) == {"added", "A.f"}
    assert set(targets(new, None, declared=extra, mode="replace")) == {"A.f"}


def test_changed_lines_and_module_names() -> None:
    assert changed_lines(b"a\nb\nc\n", "a\nB\nc\n") == {2}
    assert changed_lines(b"a\nb\nc\n", "a\nc\n") == {2}              # deleted before line 2
    assert changed_lines(None, "x\ny\n") == {1, 2}
    assert module_name("python/sglang/srt/x/__init__.py", "python/") == "sglang.srt.x"
    assert module_name("sglang/srt/y.py", "python/") == "sglang.srt.y"


def readme_targets() -> dict[str, set[tuple[str, str]]]:
    text = (ROOT / "docs" / "explanation" / "tracer.md").read_text()
    section = text.split("<!-- trace-targets -->")[1].split("<!-- /trace-targets -->")[0]
    out: dict[str, set[tuple[str, str]]] = {}
    for m in re.finditer(r"^\| ([a-z0-9-]+) \| (\w+) \| `([^`]+)` \| (\w+) \|", section,
                         re.M):
        out.setdefault(m.group(1), set()).add((m.group(2), m.group(3), m.group(4)))
    return out


def test_every_shipped_patch_has_a_function_target_and_the_readme_lists_them(
        pinned_base, tmp_path: Path) -> None:
    """The project's series applied to the real pinned tree: each patch's targets, as the
    host derives them at deploy (engine.trace_targets), equal the table in docs/explanation/tracer.md, and each
    has at least one traceable function target."""
    series = load_series(ROOT / "patches.yaml")
    tree = materialize(pinned_base, tmp_path / "tree", layout="git")
    [result] = api.apply(series, plan(series, Selection()), [LocalTransport(tree)])
    assert result.ok, result.error
    target = engine.Target(str(tree), "python/", "sglang")
    derived = engine.trace_targets(target, target.state())
    assert [k.split(":")[0] for k in derived] == [p.name for p in series.patches]
    for word, found in derived.items():
        assert any(t["kind"] == "function" for t in found), word
    assert readme_targets() == {k.split(":")[0]: {(t["kind"], f"{t['module']}:{t['qualname']}",
                                                   t["evidence"])
                                                  for t in v} for k, v in derived.items()}


def test_manifest_trace_entries_are_read_and_checked(tmp_path: Path) -> None:
    """`trace:` in patches.yaml: validated whole (a module name, a qualified name), one
    line error naming file:line: field otherwise; carried to the engine with the spec."""
    import shutil

    import pytest

    from patchset.errors import ManifestError
    shutil.copytree(ROOT / "patches", tmp_path / "patches")
    text = (ROOT / "patches.yaml").read_text()
    good = text.replace("  - name: mhc-bf16\n", "  - name: mhc-bf16\n    trace: [{module: "
                        "sglang.srt.models.deepseek_v4, qualname: DeepseekV4DecoderLayer."
                        "hc_pre}]\n    trace_mode: add\n", 1)
    (tmp_path / "patches.yaml").write_text(good)
    series = load_series(tmp_path / "patches.yaml")
    patch = series.by_name()["mhc-bf16"]
    assert [(t.module, t.qualname) for t in patch.trace] == [
        ("sglang.srt.models.deepseek_v4", "DeepseekV4DecoderLayer.hc_pre")]
    spec = api.patch_spec(patch)
    assert spec.trace[0].qualname == "DeepseekV4DecoderLayer.hc_pre"
    assert spec.trace_mode == "add"
    for bad in ("{module: 'a b', qualname: f}", "{module: m, qualname: 'f(); x'}",
                "{module: m}", "{module: m, qualname: f, extra: 1}"):
        (tmp_path / "patches.yaml").write_text(text.replace(
            "  - name: mhc-bf16\n", f"  - name: mhc-bf16\n    trace: [{bad}]\n", 1))
        with pytest.raises(ManifestError, match=r"patches\.yaml:\d+: .*trace"):
            load_series(tmp_path / "patches.yaml")


def test_what_a_returned_call_of_each_target_shows() -> None:
    """new: a function the pre-image lacks; unconditional: every changed line runs on
    each call (a top-level statement no earlier one can return past, or the def line);
    conditional: a changed line in a branch, after an early return, or in a `x if c else
    y` (the dispatcher of a gated patch: it runs with the gate off too)."""
    before = (b"def plain(x):\n    y = x\n    return y\n"
              b"def branch(x, flag):\n    if flag:\n        return 1\n    return x\n"
              b"def early(x):\n    if x:\n        return 0\n    y = x\n    return y\n"
              b"def pick(x, flag):\n    return x if flag else -x\n"
              b"def sig(x):\n    return x\n")
    after = (b"def plain(x):\n    y = x + 1\n    return y\n"
             b"def branch(x, flag):\n    if flag:\n        return 2\n    return x\n"
             b"def early(x):\n    if x:\n        return 0\n    y = x + 1\n    return y\n"
             b"def pick(x, flag):\n    return x if flag else x * -1\n"
             b"def sig(x, scale=2):\n    return x\n"
             b"def helper():\n    return 3\n")
    got = {t.qualname: t.evidence for t in for_patch("p", [("python/sglang/m.py", before,
                                                             after)], "python/")}
    assert got == {"plain": "unconditional", "branch": "conditional", "early": "conditional",
                   "pick": "conditional", "sig": "unconditional", "helper": "new"}, got
    declared = for_patch("p", [], "python/", [{"module": "sglang.m", "qualname": "f"}])
    assert [t.evidence for t in declared] == ["declared"]
