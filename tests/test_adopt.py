"""`patchset adopt`: an unmanaged fork (a git checkout with local commits, installed into a
site-packages with a hand edit) -> a proposed series with its base and evidence; --write
puts the tree under management without changing a served byte; bad input is one line,
exit 2, nothing changed. Local trees only (the nspawn host: tests/test_adopt_hosts.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from patchset.adopt import proposed_gate
from patchset.cli import main
from patchset.errors import Exit
from patchset.manifest import load_series

GIT_ENV = {"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x", "GIT_COMMITTER_NAME": "u",
           "GIT_COMMITTER_EMAIL": "u@x", "PATH": "/usr/bin:/bin"}
FOO = '''import os


def forward(x):
    return x + 1


def other(y):
    return y * 2
'''


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env={**GIT_ENV, "HOME": str(cwd)},
                          check=True, capture_output=True, text=True).stdout.strip()


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".patchset" not in p.parts}


@pytest.fixture
def fork(tmp_path: Path, monkeypatch) -> dict:
    """Upstream (pinned by `init --git`), a fork with two local commits and one commit
    outside the package, and a site-packages install of the fork with one hand edit."""
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    up = tmp_path / "upstream"
    pkg = up / "python" / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text('__version__ = "0.5.14"\n')
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "foo.py").write_text(FOO)
    (up / "README.md").write_text("upstream\n")
    git(up, "init", "-q", "-b", "main")
    git(up, "add", "-A")
    git(up, "commit", "-qm", "base")
    pin = git(up, "rev-parse", "HEAD")
    series = tmp_path / "series"
    assert main(["init", str(series), "--git", f"file://{up}", "--ref", "main"]) == Exit.OK
    fork = tmp_path / "fork"
    git(tmp_path, "clone", "-q", str(up), str(fork))
    foo = fork / "python" / "sglang" / "srt" / "foo.py"
    edit(foo, "    return x + 1\n", "    if os.environ.get(\"SGLANG_FAST_FORWARD\") == \"1\":\n"
         "        return x + 2\n    return x + 1\n")
    git(fork, "commit", "-qam", "Fast forward for DeepSeek")
    (fork / "README.md").write_text("our fork\n")
    git(fork, "commit", "-qam", "readme of the fork")
    edit(foo, "    return y * 2\n", "    return y * 3\n")
    git(fork, "commit", "-qam", "other triples")
    site = tmp_path / "site-packages"
    shutil.copytree(fork / "python" / "sglang", site / "sglang")
    edit(site / "sglang" / "version.py", '"0.5.14"', '"0.5.14+local"')
    monkeypatch.chdir(series)
    return {"up": up, "pin": pin, "fork": fork, "site": site, "series": series}


def adopt(capsys, *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and the error lines of stderr (progress lines left out)."""
    code = main(["adopt", *argv])
    out, err = capsys.readouterr()
    return code, out, "\n".join(line for line in err.splitlines() if "error" in line
                                 or not line.endswith("..."))


def test_dry_run_proposes_the_commits_and_the_hand_edit_on_the_merge_base(fork, capsys) -> None:
    before = (fork["series"] / "patches.yaml").read_bytes()
    code, out, err = adopt(capsys, "localhost", "--target", str(fork["site"]), "--checkout",
                           str(fork["fork"]), "--json")
    assert code == Exit.OK, err
    plan = json.loads(out)
    assert plan["base"]["source"] == "merge-base" and plan["base"]["commit"] == fork["pin"]
    assert plan["base"]["is_pin"] and plan["base"]["compared"] == 4
    assert plan["candidates"][0]["matching"] == 2          # foo.py and version.py differ
    names = [p["name"] for p in plan["patches"]]
    assert names == ["fast-forward-for-deepseek", "other-triples", "hand-edits"]
    fast, other, hand = plan["patches"]
    assert fast["gate"] == {"env": "SGLANG_FAST_FORWARD", "on": "1"} and other["gate"] is None
    assert fast["trace_targets"] == ["sglang.srt.foo:forward"]
    assert other["trace_targets"] == ["sglang.srt.foo:other"]
    assert hand["files"] == ["python/sglang/version.py"] and hand["source"] == "hand edit"
    assert all(p["tier"] == "risky" and p["path"] == "both" for p in plan["patches"])
    assert [c["subject"] for c in plan["left_out"]] == ["readme of the fork"]
    assert (fork["series"] / "patches.yaml").read_bytes() == before
    assert not (fork["site"] / ".patchset").exists()


def test_write_adopts_without_changing_a_served_byte_and_status_is_clean(fork, capsys) -> None:
    served = tree_hashes(fork["site"])
    code, out, err = adopt(capsys, "localhost", "--target", str(fork["site"]), "--checkout",
                           str(fork["fork"]), "--write", "--json",
                           "--author", "Op <op@example.com>")
    assert code == Exit.OK, err
    result = json.loads(out)
    assert result["written"] == ["fast-forward-for-deepseek", "other-triples", "hand-edits"]
    assert result["files_hashed"] == 4
    assert tree_hashes(fork["site"]) == served
    series = load_series(fork["series"] / "patches.yaml")
    assert [p.name for p in series.patches] == result["written"]
    assert series.patches[0].gate is not None and series.patches[0].gate.env == \
        "SGLANG_FAST_FORWARD"
    assert main(["check"]) == Exit.OK
    capsys.readouterr()
    code = main(["status", "localhost", "--target", str(fork["site"]), "--json"])
    out, err = capsys.readouterr()
    status = json.loads(out)
    record = status[0] if isinstance(status, list) else status
    text = json.dumps(record)
    assert code == Exit.OK, out + err
    assert '"managed": true' in text and '"drift": []' in text
    code, _, err = adopt(capsys, "localhost", "--target", str(fork["site"]))
    assert code == Exit.BAD_INPUT and "already managed" in err


def test_split_gives_one_patch_per_hand_edited_file(fork, capsys) -> None:
    edit(fork["site"] / "sglang" / "srt" / "__init__.py", "", "X = 1\n")
    code, out, err = adopt(capsys, "localhost", "--target", str(fork["site"]), "--checkout",
                           str(fork["fork"]), "--split", "--json")
    assert code == Exit.OK, err
    hand = [p for p in json.loads(out)["patches"] if p["source"] == "hand edit"]
    assert [p["files"] for p in hand] == [["python/sglang/srt/__init__.py"],
                                          ["python/sglang/version.py"]]


def test_the_checkout_is_found_where_pip_recorded_it(fork, capsys) -> None:
    """pip's direct_url.json (PEP 610) names the directory it installed from: python/."""
    record = fork["site"] / "sglang-0.5.14.dist-info" / "direct_url.json"
    record.parent.mkdir()
    record.write_text(json.dumps({"url": f"file://{fork['fork']}/python", "dir_info": {}}))
    code, out, err = adopt(capsys, "localhost", "--target", str(fork["site"]), "--json")
    assert code == Exit.OK, err
    plan = json.loads(out)
    assert plan["base"]["source"] == "merge-base" and len(plan["patches"]) == 3


def test_a_git_checkout_served_as_it_is(fork, capsys) -> None:
    """The served tree is the checkout itself (git layout): its commits, no hand edit."""
    code, out, err = adopt(capsys, "localhost", "--target", str(fork["fork"]), "--json")
    assert code == Exit.OK, err
    plan = json.loads(out)
    assert plan["layout"] == "git" and plan["base"]["commit"] == fork["pin"]
    assert [p["source"].split()[0] for p in plan["patches"]] == ["commit", "commit"]


def test_without_a_checkout_the_base_is_the_best_matching_release(fork, capsys) -> None:
    code, out, err = adopt(capsys, "localhost", "--target", str(fork["site"]), "--json")
    assert code == Exit.OK, err
    plan = json.loads(out)
    assert plan["base"]["source"] == "pin" and plan["base"]["matching"] == 2
    [hand] = plan["patches"]
    assert hand["files"] == ["python/sglang/srt/foo.py", "python/sglang/version.py"]
    assert hand["gate"] == {"env": "SGLANG_FAST_FORWARD", "on": "1"}


def test_bad_input_is_one_line_exit_2_and_nothing_changed(fork, capsys, tmp_path) -> None:
    not_sglang = tmp_path / "other"
    (not_sglang / "numpy").mkdir(parents=True)
    manifest = (fork["series"] / "patches.yaml").read_bytes()
    served = tree_hashes(fork["site"])
    for argv, words in [(["localhost", "--target", str(not_sglang)], "no sglang tree"),
                        (["no host!"], "host"),
                        (["nosuchhost"], "not in the inventory"),
                        (["localhost", "--target", str(fork["site"]), "--tier", "x"], "--tier")]:
        code, _, err = adopt(capsys, *argv)
        assert code == Exit.BAD_INPUT and words in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert adopt(capsys, "localhost", "--target", str(fork["site"]), "--checkout",
                 str(fork["fork"]), "--write", "--author", "Op <op@x.org>")[0] == Exit.OK
    written = (fork["series"] / "patches.yaml").read_bytes()
    assert written != manifest
    shutil.rmtree(fork["site"] / ".patchset")
    code, _, err = adopt(capsys, "localhost", "--target", str(fork["site"]), "--write")
    assert code == Exit.BAD_INPUT and "--force" in err and len(err.strip().splitlines()) == 1
    assert (fork["series"] / "patches.yaml").read_bytes() == written
    assert tree_hashes(fork["site"]) == served and not (fork["site"] / ".patchset").exists()


def test_a_gate_is_proposed_only_for_a_name_the_base_never_reads() -> None:
    diff = '+    if os.getenv("SGLANG_NEW"):\n+    os.environ["SGLANG_OLD"]\n'
    assert proposed_gate(diff, "SGLANG_OLD") == {"env": "SGLANG_NEW", "on": "1"}
    assert proposed_gate(diff, "SGLANG_OLD SGLANG_NEW") is None
    assert proposed_gate('-    os.getenv("SGLANG_GONE")\n', "") is None


def test_the_agent_refuses_a_tree_that_moved_and_undoes_a_change_while_adopting(
        fork, capsys, monkeypatch) -> None:
    """The adopt op hashes the served files before (against the plan) and after: a
    difference either way leaves no state behind."""
    from patchset.agent import adoption
    site = fork["site"]
    served = adoption.served_files(adoption.engine.Target(str(site), "python/", "sglang"))[0]
    state = {"format": 2, "updated": "", "kind": "plain", "layout": "wheel", "upstream": None,
             "base": {"commit": fork["pin"], "files": {}}, "applied": [], "files": {}}
    moved = dict(served, **{"python/sglang/version.py": "0" * 40})
    def request(expected: dict):
        return adoption.AdoptRequest(target=str(site), state=state, expected=expected)
    result = adoption.run(request(moved), site)
    assert isinstance(result, adoption.Failure) and "changed since the plan" in result.message
    assert not (site / ".patchset").exists()
    real = adoption._record

    def meddle(target, *args) -> None:
        real(target, *args)
        (site / "sglang" / "srt" / "foo.py").write_text("meddled\n")
    monkeypatch.setattr(adoption, "_record", meddle)
    result = adoption.run(request(served), site)
    assert isinstance(result, adoption.Failure) and "changed while adopting" in result.message
    assert not (site / ".patchset").exists()
    (site / ".patchset").mkdir()                 # what a killed adopt leaves: no state
    monkeypatch.setattr(adoption, "_record", real)
    served = adoption.served_files(adoption.engine.Target(str(site), "python/", "sglang"))[0]
    result = adoption.run(request(served), site)
    assert isinstance(result, adoption.AdoptResult)
    assert (site / ".patchset" / "state.json").is_file()
