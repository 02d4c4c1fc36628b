"""The nspawn test hosts' base rootfs build (tests/hosts/nspawn.py) with debootstrap faked:
one build under concurrent builders, rebuilt when the recipe changes, nothing left behind
by a failed one (the real rootfs and hosts: tests/system/test_hosts_infra.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.hosts import nspawn
from tests.hosts.nspawn import base_is_current, build_base


def _fake_debootstrap(calls: list[Path]):
    def fake(target: Path, mirror: str, timeout: float) -> None:
        calls.append(target)
        (target / "etc").mkdir(parents=True)
        (target / "etc/os-release").write_text("fake\n")

    return fake


def test_build_base_is_atomic_locked_and_rebuilds_on_recipe_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(nspawn, "_debootstrap", _fake_debootstrap(calls))
    monkeypatch.setattr(nspawn, "_customize", lambda root: None)
    target = tmp_path / "rootfs"

    threads = [threading.Thread(target=build_base, args=(target,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(calls) == 1, "concurrent builders must wait for one build"
    assert base_is_current(target)

    monkeypatch.setattr(nspawn, "RECIPE_DIGEST", "changed-recipe")
    assert not base_is_current(target)
    build_base(target)
    assert len(calls) == 2 and base_is_current(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".rootfs.lock", "rootfs"]


def test_failed_build_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(target: Path, mirror: str, timeout: float) -> None:
        (target / "half").write_text("x")
        raise nspawn.HostError("mirror unreachable")

    monkeypatch.setattr(nspawn, "_debootstrap", broken)
    with pytest.raises(nspawn.HostError, match="mirror unreachable"):
        build_base(tmp_path / "rootfs")
    assert [p.name for p in tmp_path.iterdir()] == [".rootfs.lock"]
