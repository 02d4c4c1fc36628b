import os, stat, pytest
from pathlib import Path
import yaml
from seriesfactory import header, PIN_YAML, git
from patchset.upstream import materialize
from patchset.manifest import load_series
from patchset.selection import Selection, plan
from patchset import api
from deploy.local import LocalTransport

EXE = "python/sglang/srt/layers/amx_utils.py"
EMPTY = "python/sglang/cli/__init__.py"
NEWX = "python/sglang/newexe.py"
NEWE = "python/sglang/newempty/__init__.py"

def disk(t, p):
    return t / p if (t / "python").is_dir() else t / p[len("python/"):]

@pytest.mark.parametrize("layout", ["git", "wheel"])
def test_del(pinned_base, tmp_path, layout):
    work = tmp_path / "authoring"
    materialize(pinned_base, work, layout="git")
    root = tmp_path / "series"; (root / "patches").mkdir(parents=True)
    (work / NEWX).write_text("x = 1\n"); os.chmod(work / NEWX, 0o755)
    (work / NEWE).parent.mkdir(); (work / NEWE).write_text("")
    (work / EXE).unlink(); (work / EMPTY).unlink()
    git(work, "add", "-A")
    diff = git(work, "diff", "--cached", "--full-index", "--no-color", "--no-renames", "--stat", "--patch")
    (root / "patches/del.patch").write_text(header("del") + diff[diff.index("diff --git"):])
    (root / "patches.yaml").write_text(yaml.safe_dump({"version": 1, "upstream": PIN_YAML, "series": [
        {"name": "del", "file": "patches/del.patch", "summary": "s", "tier": "safe", "path": "both",
         "gate": None, "requires": [], "depends": [], "conflicts": [], "upstream_status": "pending"}]}, sort_keys=False))
    s = load_series(root / "patches.yaml")
    print([ (c.path, c.pre, c.post) for c in s.patches[0].files])
    t = materialize(pinned_base, tmp_path / "t", layout=layout)
    before = {p: (disk(t,p).read_bytes(), stat.S_IMODE(disk(t,p).stat().st_mode)) for p in (EXE, EMPTY)}
    [r] = api.apply(s, plan(s, Selection()), [LocalTransport(t)])
    print("apply", r.ok, r.error)
    print({p: disk(t,p).exists() for p in (EXE, EMPTY, NEWX, NEWE)})
    print("newx mode", oct(disk(t,NEWX).stat().st_mode) if disk(t,NEWX).exists() else None)
    st = api.status(s, LocalTransport(t))
    print("status", st)
    rv = api.revert(s, ["del"], LocalTransport(t))
    print("revert", rv.ok, rv.error)
    print({p: disk(t,p).exists() for p in (EXE, EMPTY, NEWX, NEWE)}, disk(t, NEWE).parent.exists())
    after = {p: (disk(t,p).read_bytes(), stat.S_IMODE(disk(t,p).stat().st_mode)) for p in (EXE, EMPTY) if disk(t,p).exists()}
    print("modes", {p: (before[p][1], after.get(p, (0,0))[1], before[p][0]==after.get(p,(0,))[0]) for p in before})
    st = api.status(s, LocalTransport(t))
    print("status", st)
    if layout == "git": print(git(t, "status", "--porcelain"))
    assert 0
