"""Read an Ansible inventory as patchset's inventory: the hosts users already list.

Why: operators who run a fleet keep it in Ansible, and copying every GPU host into
hosts.yaml by hand is how two lists start to disagree. Accepted: the JSON that
`ansible-inventory --list` prints, an INI inventory file and a YAML inventory file.

What is taken, per host, after Ansible's variable precedence (the `all` group, then
parent groups before their children, then the host's own):
- `ansible_host`, `ansible_user`, `ansible_port`, `ansible_ssh_private_key_file`: how to
  reach it (address, user, port, identity_file);
- patchset's own settings, in its namespace: a `patchset` mapping with the keys of a
  hosts.yaml host (`tree`, `python`, `roles`, `serving`, `proxy_jump`, `cohort`), or flat
  `patchset_tree`, `patchset_python`, ... (INI values that start with `{` are JSON).
Only hosts with a patchset setting are taken: an inventory lists much else. The result
is the document hosts.yaml would be, with the inventory's file and lines, and goes
through exactly the same checks (connect/inventory.py): nothing from Ansible reaches a
command line or a unit file unchecked.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from patchset import yamlsrc
from patchset.errors import ManifestError
from patchset.yamlsrc import Located

CONNECTION = {"ansible_host": "address", "ansible_user": "user", "ansible_port": "port",
              "ansible_ssh_private_key_file": "identity_file"}
NAMESPACE = "patchset"
SETTINGS = ("tree", "python", "roles", "serving", "proxy_jump", "cohort")


def is_ansible(text: str, file: str) -> bool:
    """Whether `text` is an Ansible inventory rather than hosts.yaml: INI (a `[group]`
    header first), the JSON of `ansible-inventory --list` (`_meta`), or YAML under `all:`."""
    first = next((ln.strip() for ln in text.splitlines()
                  if ln.strip() and not ln.lstrip().startswith(("#", ";"))), "")
    if file.endswith((".ini", ".cfg")) or re.fullmatch(r"\[[^\]]+\]", first):
        return True
    return bool(re.search(r'^\s*"_meta"\s*:|^all\s*:', text, re.M))


def load(text: str, file: str) -> Located:
    """The inventory as the document hosts.yaml would be (version 1, hosts, no default)."""
    if file.endswith((".ini", ".cfg")) or text.lstrip().startswith("["):
        groups, lines = _ini(text, file)
    else:
        doc = yamlsrc.load(text, file)
        groups, lines = (_listed(doc) if isinstance(doc.data, dict) and "_meta" in doc.data
                         else _yaml(doc))
    return _hosts(groups, lines, file)


# ---------------------------------------------------------------- formats -> groups
#
# Every format becomes {group: {"hosts": {name: vars}, "vars": {...}, "children": [...]}}
# and lines {(host,) or (host, var): line} for errors.

Groups = dict[str, dict[str, Any]]


def _group(groups: Groups, name: str) -> dict[str, Any]:
    return groups.setdefault(name, {"hosts": {}, "vars": {}, "children": []})


def _ini(text: str, file: str) -> tuple[Groups, dict]:
    groups: Groups = {}
    lines: dict[tuple, int] = {}
    section, kind = "ungrouped", "hosts"
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        header = re.fullmatch(r"\[([A-Za-z0-9_.-]+)(?::(vars|children))?\]", line)
        if header:
            section, kind = header.group(1), header.group(2) or "hosts"
            _group(groups, section)
            continue
        if line.startswith("["):
            raise ManifestError(file, number, "(group)", f"{line!r} is not a [group] header")
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ManifestError(file, number, section, f"cannot read the line: {exc}") from None
        if kind == "children":
            _group(groups, section)["children"].append(words[0])
            _group(groups, words[0])
        elif kind == "vars":
            key, _, value = line.partition("=")
            _group(groups, section)["vars"][key.strip()] = _ini_value(value.strip())
            lines[(section, key.strip())] = number
        else:
            name = words[0]
            if re.search(r"\[[^\]]*:[^\]]*\]", name):
                raise ManifestError(file, number, name, "host ranges are not supported: "
                                    "list each host")
            host_vars = {}
            for word in words[1:]:
                key, eq, value = word.partition("=")
                if not eq:
                    raise ManifestError(file, number, name, f"{word!r} is not key=value")
                host_vars[key] = _ini_value(value)
                lines[(name, key)] = number
            _group(groups, section)["hosts"].setdefault(name, {}).update(host_vars)
            lines.setdefault((name,), number)
    return groups, lines


def _ini_value(value: str) -> Any:
    """An INI value as Ansible reads the ones patchset uses: JSON for a mapping, an
    integer for digits, else the string (quotes removed)."""
    if value.startswith("{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if re.fullmatch(r"[0-9]{1,5}", value):
        return int(value)
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _yaml(doc: Located) -> tuple[Groups, dict]:
    groups: Groups = {}
    lines: dict[tuple, int] = {}

    def walk(name: str, node: Any, where: tuple) -> None:
        group = _group(groups, name)
        if node is None:
            return
        if not isinstance(node, dict):
            raise doc.error(where, "must be a mapping (hosts, vars, children)")
        for host, host_vars in (node.get("hosts") or {}).items():
            group["hosts"].setdefault(str(host), {}).update(host_vars or {})
            lines.setdefault((str(host),), doc.line(where + ("hosts", host)))
            for key in host_vars or {}:
                lines[(str(host), key)] = doc.line(where + ("hosts", host, key))
        group["vars"].update(node.get("vars") or {})
        for child, sub in (node.get("children") or {}).items():
            group["children"].append(str(child))
            walk(str(child), sub, where + ("children", child))

    data = doc.data if isinstance(doc.data, dict) else {}
    for top, node in data.items():
        walk(str(top), node, (top,))
    return groups, lines


def _listed(doc: Located) -> tuple[Groups, dict]:
    """`ansible-inventory --list`: its hostvars already hold every group's vars."""
    meta = doc.data.get("_meta") or {}
    groups: Groups = {}
    lines: dict[tuple, int] = {}
    for host, host_vars in (meta.get("hostvars") or {}).items():
        _group(groups, "all")["hosts"][str(host)] = dict(host_vars or {})
        lines[(str(host),)] = doc.line(("_meta", "hostvars", host))
    return groups, lines


# ---------------------------------------------------------------- groups -> hosts.yaml

def _resolved(groups: Groups) -> dict[str, dict[str, Any]]:
    """Each host's variables by Ansible's precedence: `all`, then each group from the
    top of the tree down (a child's vars after its parent's), then the host's own."""
    parents: dict[str, set[str]] = {}
    for name, group in groups.items():
        for child in group["children"]:
            parents.setdefault(child, set()).add(name)

    def depth(name: str, seen: frozenset = frozenset()) -> int:
        if name in seen:
            return 0
        return 1 + max((depth(p, seen | {name}) for p in parents.get(name, ())), default=0)

    order = sorted(groups, key=lambda g: (g != "all", depth(g), g))
    members: dict[str, list[str]] = {}

    def hosts_of(name: str, seen: frozenset = frozenset()) -> set[str]:
        if name in seen:
            return set()
        group = groups.get(name, {"hosts": {}, "children": []})
        found = set(group["hosts"])
        for child in group["children"]:
            found |= hosts_of(child, seen | {name})
        return found

    every = set().union(*(hosts_of(g) for g in groups)) if groups else set()
    for g in order:
        for host in (every if g == "all" else hosts_of(g)):
            members.setdefault(host, []).append(g)
    out: dict[str, dict[str, Any]] = {}
    for host, in_groups in members.items():
        merged: dict[str, Any] = {}
        for g in in_groups:
            merged.update(groups[g]["vars"])
        for g in in_groups:
            merged.update(groups[g]["hosts"].get(host, {}))
        out[host] = merged
    return out


def _hosts(groups: Groups, lines: dict, file: str) -> Located:
    hosts: dict[str, dict[str, Any]] = {}
    out_lines: dict[tuple, int] = {}
    for name, host_vars in sorted(_resolved(groups).items()):
        if NAMESPACE in host_vars and not isinstance(host_vars[NAMESPACE], dict):
            raise ManifestError(file, lines.get((name, NAMESPACE), lines.get((name,))),
                                f"{name}.{NAMESPACE}", "must be a mapping of patchset's "
                                f"host settings ({', '.join(SETTINGS)})")
        ours = _settings(host_vars)
        if not ours:
            continue                                   # not a host patchset manages
        entry = {key: host_vars[var] for var, key in CONNECTION.items() if var in host_vars}
        entry.update(ours)
        hosts[name] = entry
        line = lines.get((name,), 1)
        out_lines[("hosts", name)] = line
        for key in entry:
            var = next((v for v, k in CONNECTION.items() if k == key), f"{NAMESPACE}_{key}")
            out_lines[("hosts", name, key)] = lines.get((name, var), line)
    return Located(file, {"version": 1, "hosts": hosts}, out_lines)


def _settings(host_vars: dict[str, Any]) -> dict[str, Any]:
    """patchset's settings from its namespace: the `patchset` mapping, then flat
    `patchset_KEY` variables (which win, as the more specific)."""
    ours: dict[str, Any] = dict(host_vars.get(NAMESPACE) or {})
    for key in SETTINGS:
        if f"{NAMESPACE}_{key}" in host_vars:
            ours[key] = host_vars[f"{NAMESPACE}_{key}"]
    return ours
