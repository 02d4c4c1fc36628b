"""The tracer (patchset/agent/lib/tracer.py) in real Python processes, installed exactly as
deploy installs it: sitecustomize.py + patchset_tracer.py first on PYTHONPATH, the
targets in PATCHSET_TRACE, the records in PATCHSET_TRACE_DIR."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from patchset.agent.lib import tracer

AGENT = Path(tracer.__file__).parent.parent   # patchset/agent (the tracer is lib/tracer.py)
MODULE = '''
TABLE = {}
def plain(x): return x + 1
def outer(x):
    def inner(y): return y * 2
    return inner(x)
class K:
    def meth(self, x): return x - 1
    @staticmethod
    def st(x): return x * 3
    @classmethod
    def cm(cls, x): return x * 4
def never(): return 0
DISPATCH = {"plain": plain}
'''
WORKLOAD = '''
import json, sys
import pkg.mod as m
out = [m.plain(1), m.outer(3), m.K().meth(5), m.K.st(2), m.K.cm(1), m.DISPATCH["plain"](7),
       m.plain.__name__, m.K.st.__name__]
for _ in range(3):
    out += [m.plain(2), m.DISPATCH["plain"](2)]
print(json.dumps(out))
'''
TARGETS = ("p1:aaaaaaaaaaaa=pkg.mod:plain,pkg.mod:outer.<locals>.inner,pkg.mod:K.meth,"
           "pkg.mod:<module> p2:bbbbbbbbbbbb=pkg.mod:K.st,pkg.mod:K.cm,pkg.mod:never,"
           "pkg.mod:gone")


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    """A trace dir as deploy writes it, a package to trace, a records dir (0700)."""
    trace = tmp_path / "trace"
    trace.mkdir()
    shutil.copy(AGENT / "lib" / "tracer.py", trace / "patchset_tracer.py")
    shutil.copy(AGENT / "sitecustomize.py", trace / "sitecustomize.py")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text(MODULE)
    (tmp_path / "work.py").write_text(WORKLOAD)
    (tmp_path / "records").mkdir(mode=0o700)
    return tmp_path


def run(site: Path, traced: bool, script: str = "work.py", spec: str = TARGETS,
        records: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHSET_TRACE")}
    env["PYTHONPATH"] = f"{site / 'trace'}:{site}"
    if traced:
        env.update(PATCHSET_TRACE=spec, PATCHSET_TRACE_DIR=str(records or site / "records"),
                   PATCHSET_PATCHES="p1:aaaaaaaaaaaa p2:bbbbbbbbbbbb")
    return subprocess.run([sys.executable, script], cwd=site, env=env, capture_output=True,
                          text=True, timeout=60)


def records(site: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((site / "records").glob("*.json"))]


def test_outputs_are_identical_with_tracing_on_and_off(site: Path) -> None:
    off, on = run(site, False), run(site, True)
    assert off.returncode == on.returncode == 0, on.stderr
    assert on.stdout == off.stdout and on.stderr == off.stderr == ""
    assert records(site), "tracing was on: a record must exist"
    assert not list((site / "records").glob("*.tmp"))


def test_records_what_ran_in_this_process(site: Path) -> None:
    proc = run(site, True)
    assert proc.returncode == 0, proc.stderr
    [rec] = records(site)
    assert rec["pid"] > 0 and rec["role"] == "records" and rec["format"] == tracer.FORMAT
    expect_mode = "sys.monitoring" if sys.version_info >= (3, 12) else "wrap"
    assert rec["mode"] == expect_mode
    ran = set(rec["hits"])
    assert ran == {"pkg.mod:plain", "pkg.mod:outer.<locals>.inner", "pkg.mod:K.meth",
                   "pkg.mod:<module>", "pkg.mod:K.st", "pkg.mod:K.cm"}
    assert "pkg.mod:never" in rec["watched"] and "pkg.mod:never" not in ran
    assert any("pkg.mod:gone" in why for why in rec["unavailable"])
    assert rec["targets"]["pkg.mod:K.st"] == ["p2:bbbbbbbbbbbb"]
    assert rec["started_with"] == "p1:aaaaaaaaaaaa p2:bbbbbbbbbbbb"
    if expect_mode == "wrap":
        assert rec["hits"]["pkg.mod:outer.<locals>.inner"]["via"] == "outer"
    text = json.dumps(rec)
    assert "PYTHONPATH" not in text and str(site) not in text.replace(
        rec["role"], "")                     # no argv values, no environment
    path = next((site / "records").glob("*.json"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_after_the_first_call_the_original_is_back(site: Path) -> None:
    (site / "check.py").write_text(
        "import pkg.mod as m\nm.plain(1)\nm.K.st(1)\n"
        "print(getattr(m.plain, '__patchset_traced__', False),"
        " getattr(m.K.st, '__patchset_traced__', False),"
        " getattr(m.never, '__patchset_traced__', False))\n")
    proc = run(site, True, "check.py")
    assert proc.returncode == 0, proc.stderr
    if sys.version_info < (3, 12):            # wrap mode: called ones are unwrapped
        assert proc.stdout.split() == ["False", "False", "True"]
    else:                                     # sys.monitoring never replaces a function
        assert proc.stdout.split() == ["False", "False", "False"]


def test_a_tracer_failure_never_reaches_the_program(site: Path, tmp_path: Path) -> None:
    baseline = run(site, False).stdout
    unwritable = tmp_path / "nowhere" / "records"          # does not exist: no record
    for spec in (TARGETS, "garbage words ::: =,,", "x" * 100_000):
        proc = run(site, True, spec=spec, records=unwritable)
        assert proc.returncode == 0 and proc.stdout == baseline and proc.stderr == ""
    (site / "pkg" / "bad.py").write_text("raise ValueError('the module itself fails')\n")
    (site / "bad.py").write_text("import pkg.bad\n")
    for traced in (False, True):
        proc = run(site, traced, "bad.py", spec="p:cccccccccccc=pkg.bad:f")
        assert proc.returncode == 1 and "ValueError: the module itself fails" in proc.stderr


def test_a_broken_tracer_file_is_swallowed_by_sitecustomize(site: Path) -> None:
    (site / "trace" / "patchset_tracer.py").write_text("raise RuntimeError('broken')\n")
    baseline = run(site, False).stdout
    proc = run(site, True)
    assert proc.returncode == 0 and proc.stdout == baseline and proc.stderr == ""


def test_children_get_their_own_records(site: Path) -> None:
    """A spawned child (SGLang's schedulers: mp spawn) runs sitecustomize again; a forked
    one gets a fresh record with events re-armed."""
    (site / "kids.py").write_text(
        "import multiprocessing as mp, os, pkg.mod as m\n"
        "def work():\n    import pkg.mod as m\n    m.K().meth(1)\n"
        "if __name__ == '__main__':\n"
        "    m.plain(1)\n"
        "    p = mp.get_context('spawn').Process(target=work); p.start(); p.join()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n        m.K.cm(1)\n        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n"
        "    assert p.exitcode == 0\n")
    proc = run(site, True, "kids.py")
    assert proc.returncode == 0, proc.stderr
    recs = {r["pid"]: r for r in records(site) if r["hits"]}   # (mp's resource tracker
    assert len(recs) == 3                                        # is traced too: no hits)
    parent = next(r for r in recs.values() if "pkg.mod:plain" in r["hits"])
    others = [r for r in recs.values() if r is not parent]
    assert {frozenset(r["hits"]) - {"pkg.mod:<module>"} for r in others} == {
        frozenset({"pkg.mod:K.meth"}), frozenset({"pkg.mod:K.cm"})}
    assert "pkg.mod:K.cm" not in parent["hits"]


def test_parse_is_bounded_and_tolerant() -> None:
    words = " ".join(f"p{i}:{'a' * 12}=m:f{i}" for i in range(tracer.MAX_TARGETS + 50))
    assert len(tracer.parse(words)) == tracer.MAX_TARGETS
    assert tracer.parse("no-equals a=b a=:x a=m:") == {}
    assert tracer.parse("p:x=m:A.f,m:<module>") == {("m", "A.f"): ["p:x"],
                                                      ("m", "<module>"): ["p:x"]}


RUNNER = '''
import enum
class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    MIXED = 3
class Batch:
    def __init__(self, mode): self.forward_mode = mode
def kern(x):
    def inner(y): return y * 2
    return inner(x)
def dec_only(x): return x + 1
def never(): return 0
def boom(): raise ValueError("no")
class ModelRunner:
    is_draft_worker = False
    def forward(self, forward_batch, fail=False):
        kern(1)
        if forward_batch.forward_mode == ForwardMode.DECODE:
            dec_only(2)
        if fail:
            raise RuntimeError("forward failed")
        return 7
'''
FORWARDS = '''
import json, os, sys
first = json.load(open(os.path.join(os.environ["PATCHSET_TRACE_DIR"], f"{os.getpid()}.json")))
import pkg.mr as m
r, draft = m.ModelRunner(), m.ModelRunner()
draft.is_draft_worker = True
out = [r.forward(m.Batch(m.ForwardMode.EXTEND)) for _ in range(3)]
out += [r.forward(forward_batch=m.Batch(m.ForwardMode.DECODE)) for _ in range(5)]
out.append(draft.forward(m.Batch(m.ForwardMode.DECODE)))
for call in (lambda: r.forward(m.Batch(m.ForwardMode.MIXED), fail=True), m.boom):
    try:
        call()
    except (RuntimeError, ValueError) as exc:
        out.append(type(exc).__name__)
print(json.dumps({"out": out, "first": first}))
'''
RUNNER_SPEC = ("p1:aaaaaaaaaaaa=pkg.mr:kern,pkg.mr:kern.<locals>.inner "
               "p2:bbbbbbbbbbbb=pkg.mr:dec_only,!pkg.mr:_kernel "
               "p3:cccccccccccc=pkg.mr:never,pkg.mr:boom ~forward=pkg.mr:ModelRunner.forward")


def _monitoring_python() -> list[str]:
    """A Python >= 3.12 on this machine (the sys.monitoring mode), where there is one
    beside the test's own (pyenv's on the CI machines)."""
    if sys.version_info >= (3, 12):
        return []
    import glob
    for candidate in sorted(glob.glob("/root/.pyenv/versions/3.1[2-9]*/bin/python3")) + \
            sorted(glob.glob("/usr/bin/python3.1[2-9]")):
        probe = subprocess.run([candidate, "-c", "import sys; sys.monitoring"],
                               capture_output=True, timeout=30)
        if probe.returncode == 0:
            return [candidate]
    return []


INTERPRETERS = [sys.executable] + _monitoring_python()


@pytest.mark.parametrize("python", INTERPRETERS)
def test_forward_passes_modes_returns_and_raises(site: Path, python: str) -> None:
    """Per process: the forward passes that returned, per mode (a draft worker's apart,
    a forward that raised not at all); per target, its first entry, first return, the
    modes it ran in; every target listed from the first write, kernels as unwatchable."""
    (site / "pkg" / "mr.py").write_text(RUNNER)
    (site / "fwd.py").write_text(FORWARDS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHSET_TRACE")}
    env.update(PYTHONPATH=f"{site / 'trace'}:{site}", PATCHSET_TRACE=RUNNER_SPEC,
               PATCHSET_TRACE_DIR=str(site / "records"))
    proc = subprocess.run([python, "fwd.py"], cwd=site, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["out"] == [7] * 9 + ["RuntimeError", "ValueError"]
    assert {t: w["how"] for t, w in got["first"]["watched"].items()} == {
        t: None for t in got["first"]["targets"]}                  # listed before import
    [rec] = records(site)
    assert rec["format"] == 2 and set(rec["forward"]) == {"extend", "decode", "draft:decode"}
    assert rec["forward"]["extend"]["count"] >= 2 and rec["forward"]["decode"]["count"] >= 4
    hits = rec["hits"]
    assert set(hits["pkg.mr:kern"]["modes"]) == {"extend", "decode", "draft:decode", "mixed"}
    assert set(hits["pkg.mr:dec_only"]["modes"]) == {"decode", "draft:decode"}
    assert hits["pkg.mr:kern"]["returned"] and hits["pkg.mr:dec_only"]["returned"]
    assert "pkg.mr:never" not in hits and rec["watched"]["pkg.mr:never"]["how"]
    assert hits["pkg.mr:boom"]["returned"] is None                 # entered, raised
    wrap = rec["mode"] == "wrap"
    assert hits["pkg.mr:boom"]["raised"] == ("ValueError" if wrap else None)
    assert (hits["pkg.mr:kern.<locals>.inner"]["via"] == "kern") is wrap
    assert rec["watched"]["!pkg.mr:_kernel"]["how"] is None and \
        "compiled kernel" in rec["watched"]["!pkg.mr:_kernel"]["why"]
    assert rec["watched"]["pkg.mr:ModelRunner.forward"]["how"] == "forward entry"
