"""An Ansible inventory as patchset's inventory: INI, YAML and `ansible-inventory --list`
JSON give the same hosts; each host's variables are resolved as the real
`ansible-inventory` resolves them (precedence: all, parent groups, child groups, host);
only hosts with patchset settings are taken; hostile values meet hosts.yaml's checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from patchset.connect import ansible
from patchset.connect.inventory import Host, load
from patchset.errors import ManifestError

INI = """\
# the fleet
[gpu]
gpu1 ansible_host=10.0.0.5 ansible_port=2222 patchset_python=/opt/venv1/bin/python
gpu2 ansible_host=10.0.0.6

[gpu:vars]
ansible_user=root
patchset_tree=/opt/sglang
patchset_python=/opt/venv/bin/python

[canary]
gpu2

[canary:vars]
patchset_tree=/opt/sglang-canary

[fleet:children]
gpu

[fleet:vars]
patchset_tree=/opt/fleet-default

[web]
www1 ansible_host=10.0.0.9

[all:vars]
ansible_user=deploy
"""

YAML = """\
all:
  vars:
    ansible_user: deploy
  children:
    fleet:
      vars: {patchset_tree: /opt/fleet-default}
      children:
        gpu:
          hosts:
            gpu1: {ansible_host: 10.0.0.5, ansible_port: 2222,
                   patchset_python: /opt/venv1/bin/python}
            gpu2: {ansible_host: 10.0.0.6}
          vars: {ansible_user: root, patchset_tree: /opt/sglang,
                 patchset_python: /opt/venv/bin/python}
    canary:
      hosts:
        gpu2:
      vars: {patchset_tree: /opt/sglang-canary}
    web:
      hosts:
        www1: {ansible_host: 10.0.0.9}
"""

WANT = {
    "gpu1": Host(name="gpu1", address="10.0.0.5", user="root", port=2222, tree="/opt/sglang",
                 python="/opt/venv1/bin/python"),
    # all -> fleet -> gpu is deeper than all -> canary: gpu's tree wins (Ansible's rule),
    # and gpu's over its parent fleet's
    "gpu2": Host(name="gpu2", address="10.0.0.6", user="root", tree="/opt/sglang",
                 python="/opt/venv/bin/python"),
}


def ansible_list(inventory: Path, tmp_path: Path) -> str:
    """The real `ansible-inventory --list` (ansible-core, a test dependency)."""
    tool = Path(sys.executable).with_name("ansible-inventory")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP":
           str(tmp_path / "ansible-tmp"), "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
           "LC_ALL": "C.UTF-8"}
    proc = subprocess.run([str(tool), "-i", str(inventory), "--list"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("name, text", [("fleet.ini", INI), ("fleet.yml", YAML)])
def test_ini_yaml_and_the_listed_json_give_the_same_hosts(name, text, tmp_path: Path) -> None:
    source = tmp_path / name
    source.write_text(text)
    assert load(source).hosts == WANT                   # web hosts have no patchset setting
    listed = tmp_path / "listed.json"
    listed.write_text(ansible_list(source, tmp_path))   # Ansible's own resolution
    assert load(listed).hosts == WANT


def test_the_precedence_is_ansibles_own_for_every_variable(tmp_path: Path) -> None:
    """Every variable of every host, as this reader resolves it from the INI, is what the
    real ansible-inventory resolves (a child group's vars over its parent's, the host's
    over all)."""
    source = tmp_path / "fleet.ini"
    source.write_text(INI)
    real = json.loads(ansible_list(source, tmp_path))["_meta"]["hostvars"]
    groups, _ = ansible._ini(INI, str(source))
    ours = ansible._resolved(groups)
    for host, host_vars in real.items():
        assert {k: v for k, v in ours[host].items()} == {
            k: (int(v) if isinstance(v, str) and v.isdigit() else v)
            for k, v in host_vars.items()}, host


def test_the_namespace_mapping_carries_roles_and_serving(tmp_path: Path) -> None:
    source = tmp_path / "fleet.yml"
    source.write_text("""\
all:
  hosts:
    gpu1:
      ansible_host: 10.0.0.5
      patchset:
        tree: /opt/sglang
        serving: {model_path: /models/DeepSeek-V4}
        roles:
          prefill: {gpus: "0,1,2,3", port: 30000}
          decode: {gpus: "4,5,6,7", port: 30001}
""")
    host = load(source).hosts["gpu1"]
    assert host.roles["prefill"]["port"] == 30000 and host.serving["model_path"] == \
        "/models/DeepSeek-V4" and host.tree == "/opt/sglang"


@pytest.mark.parametrize("text, where, words", [
    ("[gpu]\ngpu1 ansible_host='10.0.0.5;reboot' patchset_tree=/opt/s\n", ":2:",
     "is not a host name or address"),
    ("[gpu]\ngpu1 patchset_tree=relative/path\n", ":2:", "is not an absolute path"),
    ("[gpu]\ngpu[01:04] patchset_tree=/opt/s\n", ":2:", "host ranges are not supported"),
    ("[gpu]\ngpu1 patchset_tree=/opt/s ansible_port=99999\n", ":2:", "is not a TCP port"),
    ("all:\n  hosts:\n    gpu1:\n      patchset: /opt/s\n", ":", "must be a mapping"),
    ("[gpu]\ngpu1 patchset_tree=/opt/s patchset_roles='{\"prefill\": {\"port\": \"x\"}}'\n",
     ":2:", "port"),
])
def test_hostile_values_meet_the_same_checks_naming_file_and_line(text, where, words,
                                                                  tmp_path: Path) -> None:
    source = tmp_path / ("inv.yml" if text.startswith("all:") else "inv.ini")
    source.write_text(text)
    with pytest.raises(ManifestError) as err:
        load(source)
    message = str(err.value)
    assert f"{source}{where}" in message and words in message, message
    assert "\n" not in message


def test_hosts_yaml_is_still_hosts_yaml(tmp_path: Path) -> None:
    source = tmp_path / "hosts.yaml"
    source.write_text("version: 1\nhosts:\n  gpu1: {address: 10.0.0.5, tree: /opt/s}\n")
    assert not ansible.is_ansible(source.read_text(), str(source))
    assert load(source).hosts["gpu1"].tree == "/opt/s"
