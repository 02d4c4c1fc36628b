"""hosts.yaml validation and HOST argument parsing: hostile values are refused up front."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchset.connect.inventory import Host, load, parse_spec
from patchset.errors import ManifestError, UsageError

GOOD = """\
version: 1
default: gpu1
hosts:
  gpu1:
    address: 10.0.0.5
    user: root
    port: 2222
    tree: /opt/sglang
    python: /opt/venv/bin/python
    identity_file: ~/.ssh/id_ed25519
    proxy_jump: admin@bastion:22
    roles:
      prefill: {gpus: "0,1,2,3", port: 30000}
      decode: {gpus: "4,5,6,7", port: 30001}
  gpu2: {}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def test_good_inventory(tmp_path: Path) -> None:
    inv = load(write(tmp_path, GOOD))
    assert inv.default == "gpu1"
    gpu1 = inv.resolve("gpu1")
    assert (gpu1.address, gpu1.user, gpu1.port, gpu1.tree) == ("10.0.0.5", "root", 2222,
                                                               "/opt/sglang")
    assert gpu1.roles["decode"]["gpus"] == "4,5,6,7"
    assert inv.resolve("gpu2").address == "gpu2" and inv.resolve("gpu2").python == "python3"
    assert inv.resolve("ops@gpu9:2200") == Host(name="ops@gpu9:2200", address="gpu9",
                                                user="ops", port=2200)
    assert inv.resolve("localhost").local


HOSTILE = [
    ("address", "a b", "hosts.gpu1.address"),
    ("address", "'h;id'", "hosts.gpu1.address"),
    ("address", "'$(reboot)'", "hosts.gpu1.address"),
    ("user", "'root;id'", "hosts.gpu1.user"),
    ("tree", "'/opt/x y'", "hosts.gpu1.tree"),
    ("tree", "'/opt/`id`'", "hosts.gpu1.tree"),
    ("tree", "\"/opt/a\\nb\"", "hosts.gpu1.tree"),
    ("tree", "relative/path", "hosts.gpu1.tree"),
    ("python", "'/usr/bin/python3; rm -rf /'", "hosts.gpu1.python"),
    ("port", "'22'", "hosts.gpu1.port"),
    ("proxy_jump", "'b;id'", "hosts.gpu1.proxy_jump"),
]


@pytest.mark.parametrize("key,value,field", HOSTILE)
def test_hostile_values_rejected_with_file_line_field(tmp_path: Path, key: str, value: str,
                                                      field: str) -> None:
    text = f"hosts:\n  gpu1:\n    address: h\n    {key}: {value}\n"
    text = text.replace("    address: h\n    address:", "    address:")
    path = write(tmp_path, text)
    with pytest.raises(ManifestError) as info:
        load(path)
    assert info.value.field == field
    assert info.value.line == 4 or (key == "address" and info.value.line == 3)
    assert "\n" not in str(info.value)


def test_role_values_with_newlines_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, 'hosts:\n  g:\n    roles:\n      decode: {extra_args: "a\\nb"}\n')
    with pytest.raises(ManifestError, match=r"hosts\.g\.roles\.decode\.extra_args: must not "
                                            r"contain a newline"):
        load(path)


def test_unknown_keys_and_bad_default(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"hosts\.g\.colour: unknown key"):
        load(write(tmp_path, "hosts:\n  g:\n    colour: red\n"))
    with pytest.raises(ManifestError, match=r"default: 'nope' is not a host"):
        load(write(tmp_path, "default: nope\nhosts:\n  g: {}\n"))
    with pytest.raises(ManifestError, match=r"hosts\.g;x: host name"):
        load(write(tmp_path, "hosts:\n  'g;x': {}\n"))


@pytest.mark.parametrize("version", ["true", "1.0", "'1'", "2"])
def test_a_version_other_than_the_integer_1_is_refused(tmp_path: Path, version: str) -> None:
    """`true` and `1.0` equal 1 in Python; a file that says so was not written for us."""
    with pytest.raises(ManifestError, match=r"hosts\.yaml:1: version: unsupported inventory "
                                            r"version"):
        load(write(tmp_path, f"version: {version}\nhosts:\n  g: {{}}\n"))


@pytest.mark.parametrize("spec", ["root@h;id", "a$(id)@h", "h:22;x", "bad host", "h:99999",
                                  "h:`id`", "@h", "u@"])
def test_host_specs_rejected(spec: str) -> None:
    with pytest.raises(UsageError, match="host "):
        parse_spec(spec)


def test_missing_default_inventory_is_empty(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    inv = load()
    assert inv.hosts == {} and inv.default is None
    with pytest.raises(ManifestError, match="not found"):
        load(tmp_path / "missing.yaml")


def test_a_host_builds_its_own_ssh_command_line() -> None:
    assert parse_spec("10.0.0.7").ssh_argv() == ["ssh", "10.0.0.7"]
    assert parse_spec("root@[::1]:2222").ssh_argv() == ["ssh", "-p", "2222", "root@::1"]
    jump = Host(name="gpu1", address="10.0.0.5", user="ops", port=22, proxy_jump="bastion")
    assert jump.ssh_argv() == ["ssh", "-p", "22", "-J", "bastion", "ops@10.0.0.5"]
