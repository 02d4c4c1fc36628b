"""`patchset adopt`: an unmanaged fork (a git checkout with local commits, installed into a
site-packages with a hand edit) -> a proposed series with its base and evidence; --write
puts the tree under management without changing a served byte; bad input is one line,
exit 2, nothing changed. Local trees only (the nspawn host:
tests/system/test_adopt_hosts.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from patchset.authoring.adopt import proposed_gate
from patchset.cli import main
from patchset.errors import Exit
from patchset.series.manifest import load_series

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
    result = adoption.serve(request(moved), site)
    assert isinstance(result, adoption.Failure) and "changed since the plan" in result.message
    assert not (site / ".patchset").exists()
    real = adoption._record

    def meddle(target, *args) -> None:
        real(target, *args)
        (site / "sglang" / "srt" / "foo.py").write_text("meddled\n")
    monkeypatch.setattr(adoption, "_record", meddle)
    result = adoption.serve(request(served), site)
    assert isinstance(result, adoption.Failure) and "changed while adopting" in result.message
    assert not (site / ".patchset").exists()
    (site / ".patchset").mkdir()                 # what a killed adopt leaves: no state
    monkeypatch.setattr(adoption, "_record", real)
    served = adoption.served_files(adoption.engine.Target(str(site), "python/", "sglang"))[0]
    result = adoption.serve(request(served), site)
    assert isinstance(result, adoption.AdoptResult)
    assert (site / ".patchset" / "state.json").is_file()


# ---------------------------------------------------------------- every served entry accounted for

def plan_of(capsys, *argv: str) -> dict:
    code, out, err = adopt(capsys, "localhost", *argv, "--json")
    assert code == Exit.OK, err
    return json.loads(out)


def refused(capsys, fork, *argv: str) -> str:
    """--write refused: exit 2, one line, the manifest and the served tree untouched."""
    manifest = (fork["series"] / "patches.yaml").read_bytes()
    served = tree_hashes(fork["site"])
    code, _, err = adopt(capsys, "localhost", *argv, "--write", "--author", "Op <op@x.org>")
    assert code == Exit.BAD_INPUT and len(err.strip().splitlines()) == 1, err
    assert (fork["series"] / "patches.yaml").read_bytes() == manifest
    assert sorted(p.name for p in (fork["series"] / "patches").iterdir()) == [] \
        if (fork["series"] / "patches").is_dir() else True
    assert tree_hashes(fork["site"]) == served and not (fork["site"] / ".patchset").exists()
    return err


def status_of(target: Path, capsys) -> dict:
    code = main(["status", "localhost", "--target", str(target), "--json"])
    out, err = capsys.readouterr()
    assert code == Exit.OK, out + err
    record = json.loads(out)
    return record[0] if isinstance(record, list) else record


def test_a_hand_deletion_is_a_deletion_the_series_reproduces(fork, capsys) -> None:
    """A file the pin has and the served tree lacks is an edit too (it was never looked
    at): the series deletes it, so the pin + series is the whole served map."""
    (fork["site"] / "sglang" / "version.py").unlink()
    plan = plan_of(capsys, "--target", str(fork["site"]))
    [hand] = plan["patches"]
    assert "python/sglang/version.py" in hand["files"] and plan["blockers"] == []
    assert plan["reproduced"] == 3
    assert adopt(capsys, "localhost", "--target", str(fork["site"]), "--write", "--author",
                 "Op <op@x.org>")[0] == Exit.OK
    series = load_series(fork["series"] / "patches.yaml")
    deleted = [c for c in series.patches[0].files if c.path == "python/sglang/version.py"]
    assert deleted and deleted[0].post is None
    assert status_of(fork["site"], capsys)["drift"] == []


def test_a_linked_module_is_named_not_compared_and_write_refuses(fork, capsys,
                                                                  tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere.py"
    foo = fork["site"] / "sglang" / "srt" / "foo.py"
    shutil.move(foo, elsewhere)
    foo.symlink_to(elsewhere)
    plan = plan_of(capsys, "--target", str(fork["site"]))
    assert {"what": "python/sglang/srt/foo.py",
            "why": "a symbolic link: not compared (adopt compares regular files only)"} \
        in plan["blockers"]
    assert all("python/sglang/srt/foo.py" not in p["files"] for p in plan["patches"])
    err = refused(capsys, fork, "--target", str(fork["site"]))
    assert "srt/foo.py: a symbolic link" in err


def test_a_merge_base_that_is_not_the_pin_is_not_the_pin(fork, capsys, tmp_path,
                                                         monkeypatch) -> None:
    """The fork sits on an older upstream commit than the pin: the base is that commit,
    not the pin, counted against its own files or unknown; --write refuses."""
    up = fork["up"]
    edit(up / "python" / "sglang" / "version.py", "0.5.14", "0.5.15")
    git(up, "commit", "-qam", "release 0.5.15")
    series = tmp_path / "series2"
    assert main(["init", str(series), "--git", f"file://{up}", "--ref",
                 git(up, "rev-parse", "HEAD")]) == Exit.OK
    capsys.readouterr()
    git(fork["fork"], "fetch", "-q", "origin")
    monkeypatch.chdir(series)
    plan = plan_of(capsys, "--target", str(fork["fork"]))
    assert plan["base"]["source"] == "merge-base" and plan["base"]["commit"] == fork["pin"]
    assert plan["base"]["is_pin"] is False
    assert plan["base"]["matching"] in (None, 3)      # its own tree's count, or unknown
    assert any(b["what"] == "base" for b in plan["blockers"])
    manifest = (series / "patches.yaml").read_bytes()
    code, _, err = adopt(capsys, "localhost", "--target", str(fork["fork"]), "--write")
    assert code == Exit.BAD_INPUT and "not the pin" in err
    assert (series / "patches.yaml").read_bytes() == manifest
    assert not (fork["fork"] / ".patchset").exists()


def test_every_edited_file_is_read_however_many_and_a_huge_one_is_refused(
        fork, capsys, monkeypatch) -> None:
    from patchset.authoring import adopt as adopt_mod
    from patchset.agent import adoption
    monkeypatch.setattr(adoption, "READ_LIMIT", 2)        # the agent returns 2 per request
    monkeypatch.setattr(adopt_mod, "READ_BATCH", 3)
    for i in range(6):
        (fork["site"] / "sglang" / "srt" / f"m{i}.py").write_text(f"X = {i}\n")
    plan = plan_of(capsys, "--target", str(fork["site"]), "--split")
    files = sorted(f for p in plan["patches"] for f in p["files"])
    assert files == sorted([f"python/sglang/srt/m{i}.py" for i in range(6)]
                           + ["python/sglang/srt/foo.py", "python/sglang/version.py"])
    assert plan["blockers"] == [] and plan["reproduced"] == 10
    monkeypatch.setattr(adoption, "FILE_LIMIT", 30)
    plan = plan_of(capsys, "--target", str(fork["site"]))
    [blocker] = plan["blockers"]
    assert blocker["what"] == "python/sglang/srt/foo.py" and "not read" in blocker["why"]
    assert "python/sglang/srt/foo.py" not in plan["patches"][0]["files"]
    assert "srt/foo.py: not read" in refused(capsys, fork, "--target", str(fork["site"]))


def test_force_replaces_the_old_series_whole(fork, capsys) -> None:
    site, series = fork["site"], fork["series"]
    assert adopt(capsys, "localhost", "--target", str(site), "--split", "--write",
                 "--author", "Op <op@x.org>")[0] == Exit.OK
    old = sorted(p.name for p in (series / "patches").iterdir())
    assert old == ["hand-edits-foo.patch", "hand-edits-version.patch"]
    shutil.rmtree(site / ".patchset")
    code, out, err = adopt(capsys, "localhost", "--target", str(site), "--write", "--force",
                           "--author", "Op <op@x.org>", "--json")
    assert code == Exit.OK, err
    assert json.loads(out)["written"] == ["hand-edits"]
    assert sorted(p.name for p in (series / "patches").iterdir()) == ["hand-edits.patch"]
    assert [p.name for p in load_series(series / "patches.yaml").patches] == ["hand-edits"]


def test_a_write_killed_before_the_host_took_it_is_resumed_by_the_next(
        fork, capsys, monkeypatch) -> None:
    """A kill after the manifest, before the host's state: the next `adopt --write` finds
    its own series there and puts the host under management (no --force needed)."""
    from patchset.authoring import adopt as adopt_mod

    def killed(*args):
        raise SystemExit(137)
    real = adopt_mod._put_under_management, adopt_mod._restore
    monkeypatch.setattr(adopt_mod, "_put_under_management", killed)
    monkeypatch.setattr(adopt_mod, "_restore", lambda root, kept: "")   # no cleanup: a kill
    with pytest.raises(SystemExit):
        main(["adopt", "localhost", "--target", str(fork["site"]), "--write", "--author",
              "Op <op@x.org>"])
    capsys.readouterr()
    assert load_series(fork["series"] / "patches.yaml").patches
    assert not (fork["site"] / ".patchset").exists()
    monkeypatch.setattr(adopt_mod, "_put_under_management", real[0])
    monkeypatch.setattr(adopt_mod, "_restore", real[1])
    code, _, err = adopt(capsys, "localhost", "--target", str(fork["site"]), "--write",
                         "--author", "Op <op@x.org>")
    assert code == Exit.OK, err
    assert status_of(fork["site"], capsys)["managed"] is True


def test_a_host_refusal_puts_every_local_file_back(fork, capsys, monkeypatch) -> None:
    from patchset.authoring import adopt as adopt_mod
    from patchset.errors import UsageError
    site, series = fork["site"], fork["series"]
    assert adopt(capsys, "localhost", "--target", str(site), "--split", "--write",
                 "--author", "Op <op@x.org>")[0] == Exit.OK
    shutil.rmtree(site / ".patchset")
    before = {p.name: p.read_bytes() for p in [series / "patches.yaml",
                                               *(series / "patches").iterdir()]}

    def refuse(*args):
        raise UsageError("host said no")
    monkeypatch.setattr(adopt_mod, "_put_under_management", refuse)
    code, _, err = adopt(capsys, "localhost", "--target", str(site), "--write", "--force",
                         "--author", "Op <op@x.org>")
    assert code == Exit.BAD_INPUT and "host said no" in err
    after = {p.name: p.read_bytes() for p in [series / "patches.yaml",
                                              *(series / "patches").iterdir()]}
    assert after == before


def test_package_commits_past_the_limit_refuse_write(fork, capsys, monkeypatch) -> None:
    """The limit counts commits that change package files (the readme commit between
    does not use one up); past it, the unlisted ones are named and --write refuses."""
    from patchset.agent import adoption
    monkeypatch.setattr(adoption, "COMMIT_LIMIT", 2)
    plan = plan_of(capsys, "--target", str(fork["fork"]))
    assert [p["name"] for p in plan["patches"]] == ["fast-forward-for-deepseek",
                                                    "other-triples"]
    assert plan["blockers"] == []
    monkeypatch.setattr(adoption, "COMMIT_LIMIT", 1)
    plan = plan_of(capsys, "--target", str(fork["fork"]))
    assert [b["what"] for b in plan["blockers"]][:1] == ["commits"]
    code, _, err = adopt(capsys, "localhost", "--target", str(fork["fork"]), "--write")
    assert code == Exit.BAD_INPUT and "1 more commit" in err
    assert not (fork["fork"] / ".patchset").exists()


def test_two_commits_of_one_subject_get_two_names_and_their_own_targets(fork, capsys) -> None:
    f = fork["fork"]
    edit(f / "python" / "sglang" / "srt" / "foo.py", "    return x + 1\n", "    return x + 7\n")
    git(f, "commit", "-qam", "other triples")
    plan = plan_of(capsys, "--target", str(f))
    named = {p["name"]: p["trace_targets"] for p in plan["patches"]}
    assert named == {"fast-forward-for-deepseek": ["sglang.srt.foo:forward"],
                     "other-triples": ["sglang.srt.foo:other"],
                     "other-triples-2": ["sglang.srt.foo:forward"]}


def test_split_names_are_unique_too(fork, capsys) -> None:
    (fork["site"] / "sglang" / "__init__.py").write_text(
        "import os\nA = os.environ.get('SGLANG_A')\n")
    (fork["site"] / "sglang" / "srt" / "__init__.py").write_text("B = 2\n")
    plan = plan_of(capsys, "--target", str(fork["site"]), "--split")
    gates = {p["name"]: p["gate"] for p in plan["patches"]}
    assert gates["hand-edits-init"] == {"env": "SGLANG_A", "on": "1"}
    assert gates["hand-edits-init-2"] is None


def test_a_git_tree_whose_history_lacks_the_pin(fork, capsys, tmp_path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(fork["fork"], copy, ignore=shutil.ignore_patterns(".git"))
    git(copy, "init", "-q", "-b", "main")
    git(copy, "add", "-A")
    git(copy, "commit", "-qm", "vendored")
    plan = plan_of(capsys, "--target", str(copy))
    assert plan["base"]["commit"] == fork["pin"]          # the pin's commit, never None
    assert any("not in" in b["why"] for b in plan["blockers"])
    code, _, err = adopt(capsys, "localhost", "--target", str(copy), "--write", "--author",
                         "Op <op@x.org>")
    assert code == Exit.BAD_INPUT and "not in" in err and "malformed" not in err
    assert not (copy / ".patchset").exists()
    assert "refs/patchset" not in git(copy, "show-ref")


def adopt_request(site: Path, base_commit, expected: dict):
    from patchset.agent import adoption
    state = {"format": 2, "updated": "", "kind": "plain", "layout": "wheel", "upstream": None,
             "base": {"commit": base_commit, "files": {}}, "applied": [], "files": {}}
    return adoption.AdoptRequest(target=str(site), state=state, expected=expected)


def test_the_agent_checks_the_base_commit_and_its_meta_before_writing(fork, tmp_path) -> None:
    from patchset.agent import adoption
    site = fork["site"]
    target = adoption.engine.Target(str(site), "python/", "sglang")
    served = adoption.served_files(target)[0]
    result = adoption.serve(adopt_request(site, None, served), site)
    assert isinstance(result, adoption.Failure) and result.kind == "usage"
    assert "state.base.commit" in result.message and not (site / ".patchset").exists()
    notes = tmp_path / "notes"
    notes.mkdir()
    (site / ".patchset").symlink_to(notes)
    result = adoption.serve(adopt_request(site, fork["pin"], served), site)
    assert isinstance(result, adoption.Failure) and "symbolic link" in result.message
    assert list(notes.iterdir()) == []
    (site / ".patchset").unlink()
    (site / ".patchset").mkdir()
    (site / ".patchset" / "state.json").symlink_to(tmp_path / "nowhere.json")
    result = adoption.serve(adopt_request(site, fork["pin"], served), site)
    assert isinstance(result, adoption.Failure) and "not a state record" in result.message
    assert sorted(p.name for p in (site / ".patchset").iterdir()) == ["state.json"]


def test_a_failed_adopt_on_a_git_tree_removes_exactly_what_it_made(fork, monkeypatch) -> None:
    """The ref, the exclude line, objects/ and patches/ go; what was there stays."""
    from patchset.agent import adoption
    f = fork["fork"]
    exclude = f / ".git" / "info" / "exclude"
    before = exclude.read_bytes() if exclude.exists() else None
    target = adoption.engine.Target(str(f), "python/", "sglang")
    served = adoption.served_files(target)[0]
    real = adoption._record

    def fail(*args) -> None:
        real(*args)
        raise adoption.engine.EngineError("injected", "target")
    monkeypatch.setattr(adoption, "_record", fail)
    req = adopt_request(f, fork["pin"], served)
    req.state["kind"], req.state["layout"] = "git", "git"
    result = adoption.serve(req, f)
    assert isinstance(result, adoption.Failure) and result.message == "injected"
    assert not (f / ".patchset").exists()
    assert "refs/patchset/base" not in git(f, "show-ref")
    assert (exclude.read_bytes() if exclude.exists() else None) == before


def test_what_cannot_be_a_patch_is_named_in_the_dry_run_and_refused(fork, capsys) -> None:
    srt = fork["site"] / "sglang" / "srt"
    (srt / "data.bin").write_bytes(b"\x00\x01\xff")
    (srt / "my file.py").write_text("x = 1\n")
    (srt / "ünï.py").write_text("x = 1\n")
    (srt / "tool.py").write_text("x = 1\n")
    (srt / "tool.py").chmod(0o755)
    plan = plan_of(capsys, "--target", str(fork["site"]))
    why = {b["what"]: b["why"] for b in plan["blockers"]}
    assert why["python/sglang/srt/data.bin"].startswith("binary or not UTF-8")
    assert "characters a patch cannot carry" in why["python/sglang/srt/my file.py"]
    assert "characters a patch cannot carry" in why["python/sglang/srt/ünï.py"]
    assert "executable" in why["python/sglang/srt/tool.py"]
    assert plan["patches"][0]["files"] == ["python/sglang/srt/foo.py",
                                           "python/sglang/version.py"]
    assert "data.bin: binary" in refused(capsys, fork, "--target", str(fork["site"]))


def test_a_name_that_is_not_utf8_is_named_not_a_crash(fork, capsys) -> None:
    import os
    srt = fork["site"] / "sglang" / "srt"
    (srt / os.fsdecode(b"l\xe9.py")).write_text("x = 1\n")
    plan = plan_of(capsys, "--target", str(fork["site"]))
    assert any(b["what"] == "python/sglang/srt/l\\udce9.py" for b in plan["blockers"])
    assert "cannot carry" in refused(capsys, fork, "--target", str(fork["site"]))


def test_a_commit_with_a_spaced_name_or_a_mode_change_is_flagged(fork, capsys) -> None:
    f = fork["fork"]
    (f / "python" / "sglang" / "srt" / "my file.py").write_text("x = 1\n")
    git(f, "add", "-A")
    git(f, "commit", "-qm", "a spaced file")
    (f / "python" / "sglang" / "version.py").chmod(0o755)
    git(f, "commit", "-qam", "executable version")
    plan = plan_of(capsys, "--target", str(f))
    by_name = {p["name"]: p for p in plan["patches"]}
    assert by_name["a-spaced-file"]["files"] == ["python/sglang/srt/my file.py"]
    why = {b["what"]: b["why"] for b in plan["blockers"]}
    assert "cannot carry" in why["a-spaced-file"]
    assert "mode" in why["executable-version"]


def test_the_base_line_names_the_base_it_counted(fork, capsys, tmp_path) -> None:
    import zipfile
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels / "sglang-0.5.13-py3-none-any.whl", "w") as z:
        for p in (fork["site"] / "sglang").rglob("*"):
            if p.is_file():
                z.write(p, str(p.relative_to(fork["site"])))
    code, out, err = adopt(capsys, "localhost", "--target", str(fork["site"]))
    assert code == Exit.OK, err
    assert "base: sglang-0.5.13-py3-none-any.whl: 4 of 4 served files match it" in out
    assert "match the pin" not in out
    assert "--write refuses: base: the base is sglang-0.5.13" in out


def test_force_over_a_manifest_whose_series_key_is_quoted(fork, capsys) -> None:
    site, manifest = fork["site"], fork["series"] / "patches.yaml"
    assert adopt(capsys, "localhost", "--target", str(site), "--write", "--author",
                 "Op <op@x.org>")[0] == Exit.OK
    shutil.rmtree(site / ".patchset")
    manifest.write_text(manifest.read_text().replace("\nseries:", '\n"series":') +
                        "# kept\n")
    load_series(manifest)
    code, _, err = adopt(capsys, "localhost", "--target", str(site), "--write", "--force",
                         "--author", "Op <op@x.org>")
    assert code == Exit.OK, err
    text = manifest.read_text()
    assert "# kept" in text and text.count("name: hand-edits") == 1
    assert [p.name for p in load_series(manifest).patches] == ["hand-edits"]


@pytest.mark.parametrize("author", ["-x <a@b>", "A" * 100_000, "Op <op@x.org> <x@y>", "op"])
def test_a_bad_author_is_refused_before_any_host_is_read(fork, capsys, author) -> None:
    code, _, err = adopt(capsys, "localhost", "--target", str(fork["site"]), "--write",
                         "--author", author)
    assert code == Exit.BAD_INPUT and "--author" in err and len(err.splitlines()) == 1
    assert len(err) < 400 and not (fork["site"] / ".patchset").exists()
