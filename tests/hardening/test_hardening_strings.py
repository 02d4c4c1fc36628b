"""Hostile strings in patches.yaml, hosts.yaml and on the command line (issue: strings are
validated whole; facts and ops checked against the fact table; messages safe to print).

Every case: exit 2, one `patchset: error: file:line: field: ...` line, no traceback, no raw
control character on the terminal, and not a byte changed in the series, the applied
default tree, its state, the cache or the home.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.hostile import World
from patchset import validate


def mutate(world: World, change: Callable[[dict], Any]) -> bytes:
    """Rewrite patches.yaml with `change` applied; returns the original bytes."""
    original = world.manifest.read_bytes()
    data = yaml.safe_load(original)
    change(data)
    world.manifest.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return original


def entry(index: int, **fields: Any) -> Callable[[dict], None]:
    return lambda d: d["series"][index].update(fields)


def pin(path: tuple, value: Any) -> Callable[[dict], None]:
    def change(d: dict) -> None:
        node = d["upstream"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


def req(**fields: Any) -> Callable[[dict], None]:
    item = {"fact": "gpu.compute_cap", "op": "eq", "value": "12.0", **fields}
    return lambda d: d["series"][0].update(requires=[item])


MANIFEST_CASES = [
    ("name-trailing-newline", entry(0, name="chat-a\n"), "series[0].name", "a newline"),
    ("name-escape", entry(0, name="chat\x1b[2J"), "series[0].name", "escape character"),
    ("name-unicode", entry(0, name="chät-a"), "series[0].name", "is not a patch name"),
    ("name-64-chars", entry(0, name="a" * 64), "series[0].name", "is not a patch name"),
    ("name-leading-dash", entry(0, name="-rf"), "series[0].name", "is not a patch name"),
    ("gate-on-injection", entry(2, gate={"env": "TRITON_INDEXER",
                                         "on": "1\nLD_PRELOAD=/tmp/evil.so"}),
     "series[2].gate.on", "a newline"),
    ("gate-on-space", entry(2, gate={"env": "TRITON_INDEXER", "on": "1 2"}),
     "series[2].gate.on", "is not a plain gate value"),
    ("gate-on-dollar", entry(2, gate={"env": "TRITON_INDEXER", "on": "$(id)"}),
     "series[2].gate.on", "is not a plain gate value"),
    ("gate-on-quote", entry(2, gate={"env": "TRITON_INDEXER", "on": "1\""}),
     "series[2].gate.on", "is not a plain gate value"),
    ("gate-env-newline", entry(2, gate={"env": "TRITON_INDEXER\n", "on": "1"}),
     "series[2].gate.env", "a newline"),
    ("gate-env-ld-preload", entry(2, gate={"env": "LD_PRELOAD", "on": "libc.so.6"}),
     "series[2].gate.env", "LD_PRELOAD is not a gate"),
    ("gate-env-pythonpath", entry(2, gate={"env": "PYTHONSTARTUP", "on": "x"}),
     "series[2].gate.env", "is not a gate"),
    ("gate-env-managed", entry(2, gate={"env": "CUDA_VISIBLE_DEVICES", "on": "0"}),
     "series[2].gate.env", "is not a gate"),
    ("gate-env-equals", entry(2, gate={"env": "A=B", "on": "1"}),
     "series[2].gate.env", "is not an environment variable name"),
    ("summary-escape", entry(0, summary="fine\x1b]0;pwned\x07"), "series[0].summary",
     "escape character"),
    ("summary-cr", entry(0, summary="looks ok\rREWRITTEN"), "series[0].summary",
     "carriage return"),
    ("summary-line-separator", entry(0, summary="a\u2028b"), "series[0].summary",
     "\\u2028"),
    ("summary-multiline", entry(0, summary="one\ntwo\n"), "series[0].summary", "a newline"),
    ("summary-bidi", entry(0, summary="safe \u2067evil\u2069"), "series[0].summary",
     "\\u2067"),
    ("depends-newline", entry(4, depends=["chat-a\n"]), "series[4].depends[0]", "a newline"),
    ("conflicts-nul", entry(0, conflicts=["idx-c\x00"]), "series[0].conflicts[0]",
     "NUL byte"),
    ("why-newline", req(why="because\nLD_PRELOAD=x"), "series[0].requires[0].why",
     "a newline"),
    ("value-newline", req(value="12.0\n"), "series[0].requires[0].value", "a newline"),
    ("value-in-list-escape", req(op="in", value=["12.0", "\x1b[31m"]),
     "series[0].requires[0].value", "escape character"),
    ("fact-unknown-gpu", req(fact="gpu.no_such_fact"), "series[0].requires[0].fact",
     "no such fact 'gpu.no_such_fact'"),
    ("fact-newline", req(fact="gpu.compute_cap\n"), "series[0].requires[0].fact",
     "a newline"),
    ("fact-no-namespace", req(fact="compute_cap"), "series[0].requires[0].fact",
     "must be <namespace>.<name>"),
    ("fact-bad-namespace", req(fact="host.compute_cap"), "series[0].requires[0].fact",
     "must be <namespace>.<name>"),
    ("fact-empty-name", req(fact="server."), "series[0].requires[0].fact", "no such fact"),
    ("fact-server-shape", req(fact="server.Attention-Backend"), "series[0].requires[0].fact",
     "is not a ServerArgs field name"),
    ("fact-env-shape", req(fact="env.A B"), "series[0].requires[0].fact",
     "is not an environment variable name"),
    ("fact-unit-shape", req(fact="unit.active_state"), "series[0].requires[0].fact",
     "systemctl show property"),
    ("fact-unit-role-value", req(fact="unit.role", value="trainer"),
     "series[0].requires[0].value", "'trainer' is not a role"),
    ("fact-gpu-count-string", req(fact="gpu.count", value="8"),
     "series[0].requires[0].value", "is a whole number"),
    ("op-unknown", req(op="gt"), "series[0].requires[0].op", "is not one of"),
    ("op-newline", req(op="eq\n"), "series[0].requires[0].op", "a newline"),
    ("version-newline", pin(("version",), "0.5.14\n"), "upstream.version", "a newline"),
    ("version-float", pin(("version",), 0.5), "upstream.version", "quote it in YAML"),
    ("python-version-float", pin(("pypi", "python_version"), 3.11),
     "upstream.pypi.python_version", "quote it in YAML"),
    ("platform-space", pin(("pypi", "platform"), "linux x86"), "upstream.pypi.platform",
     "is not a wheel platform tag"),
    ("wheel-file-path", pin(("pypi", "file"), "../x.whl"), "upstream.pypi.file",
     "bare wheel file name"),
    ("wheel-file-newline", pin(("pypi", "file"), "x.whl\n"), "upstream.pypi.file",
     "a newline"),
    ("sha256-upper", pin(("pypi", "sha256"), "A" * 64), "upstream.pypi.sha256",
     "is not a 64-hex sha256"),
    ("sha256-newline", pin(("pypi", "sha256"), "a" * 64 + "\n"), "upstream.pypi.sha256",
     "a newline"),
    ("prefix-newline", pin(("layout", "git_prefix"), "python/\n"), "upstream.layout.git_prefix",
     "a newline"),
    ("upstream-name", pin(("name",), "sglang\n"), "upstream.name", "a newline"),
]


@pytest.mark.parametrize("case", MANIFEST_CASES, ids=[c[0] for c in MANIFEST_CASES])
@pytest.mark.parametrize("command", [("list",), ("check", "--offline"),
                                     ("apply", "--tier", "risky", "localhost")],
                         ids=["list", "check", "apply"])
def test_manifest_strings_refused(world: World, case: tuple, command: tuple) -> None:
    _, change, field, fragment = case
    before = world.state()
    original = mutate(world, change)
    mutated = world.state()
    try:
        line = world.refuse(command, fragment, before=mutated)
    finally:
        world.manifest.write_bytes(original)
    assert re.search(rf"patches\.yaml:\d+: {re.escape(field)}: ", line), line
    assert world.state() == before


HOSTS = """\
hosts:
  gpu1:
    address: 127.0.0.1
    user: root
    port: 2222
    tree: /opt/sglang
    roles:
      decode: {gpus: "0,1", port: 30001}
"""

INVENTORY_CASES = [
    ("hostname-newline", ("gpu1:", '"gpu1\\n":'), 'hosts.gpu1', "is not an inventory host"),
    ("address-newline", ("127.0.0.1", '"127.0.0.1\\n"'), "hosts.gpu1.address",
     "is not a host name or address"),
    ("address-option", ("127.0.0.1", '"-oProxyCommand=touch /tmp/x"'),
     "hosts.gpu1.address", "is not a host name or address"),
    ("address-semicolon", ("127.0.0.1", '"h;id"'), "hosts.gpu1.address", "is not a host"),
    ("user-newline", ("user: root", 'user: "root\\n"'), "hosts.gpu1.user",
     "is not a user name"),
    ("user-option", ("user: root", 'user: "-l"'), "hosts.gpu1.user", "is not a user name"),
    ("port-string", ("port: 2222", 'port: "2222"'), "hosts.gpu1.port", "is not a TCP port"),
    ("port-zero", ("port: 2222", "port: 0"), "hosts.gpu1.port", "is not a TCP port"),
    ("port-huge", ("port: 2222", "port: 99999999999999999999999999999999999"),
     "(yaml)", "digits"),
    ("port-bool", ("port: 2222", "port: true"), "hosts.gpu1.port", "is not a TCP port"),
    ("tree-newline", ("tree: /opt/sglang", 'tree: "/opt/sglang\\n"'), "hosts.gpu1.tree",
     "is not an absolute path"),
    ("tree-relative", ("tree: /opt/sglang", "tree: opt/sglang"), "hosts.gpu1.tree",
     "is not an absolute path"),
    ("tree-space", ("tree: /opt/sglang", 'tree: "/opt/sg lang"'), "hosts.gpu1.tree",
     "is not an absolute path"),
    ("gpus-newline", ('gpus: "0,1"', 'gpus: "0,1\\n"'), "hosts.gpu1.roles.decode.gpus",
     "a newline"),
    ("env-injection", ('gpus: "0,1"', 'gpus: "0,1", env: {A: "1\\nLD_PRELOAD=/x.so"}'),
     "hosts.gpu1.roles.decode.env", "a newline"),
    ("default-newline", ("hosts:", 'default: "gpu1\\n"\nhosts:'), "default",
     "is not a host in this inventory"),
    ("proxy-option", ("user: root", 'user: root\n    proxy_jump: "-oProxyCommand=id"'),
     "hosts.gpu1.proxy_jump", "is not a ProxyJump spec"),
    ("identity-newline", ("user: root", 'user: root\n    identity_file: "~/.ssh/k\\n"'),
     "hosts.gpu1.identity_file", "is not a key file path"),
]


@pytest.mark.parametrize("case", INVENTORY_CASES, ids=[c[0] for c in INVENTORY_CASES])
def test_inventory_strings_refused(world: World, case: tuple) -> None:
    _, (old, new), field, fragment = case
    hosts = world.series / "hosts.yaml"
    hosts.write_text(HOSTS.replace(old, new, 1))
    try:
        before = world.state()
        line = world.refuse(("status", "--inventory", str(hosts), "gpu1"), fragment, before)
        line_plan = world.refuse(("plan", "--tier", "safe", "--inventory", str(hosts), "gpu1"),
                                 fragment, before)
    finally:
        hosts.unlink()
    assert re.search(rf"hosts\.yaml:\d+: {re.escape(field)}", line), line
    assert line_plan == line


HOST_SPECS = [
    ("-oProxyCommand=touch /tmp/x", "is not a valid host name or address"),
    ("root@-oProxyCommand=x", "is not a valid host name or address"),
    ("ro ot@gpu1", "is not a valid user name"),
    ("root@gpu1:99999", "port 99999 is out of range"),
    ("root@gpu1:22x", "expected an inventory name"),
    ("a@b@c", "expected an inventory name"),
    ("gpu1;id", "is not a valid host name or address"),
    ("$(id)", "is not a valid host name or address"),
    ("[::1", "expected an inventory name"),
    ("gpu1\n", "contains a newline"),
    ("gpu1\t", "contains a tab"),
    ("gpu\x1b[2J", "contains an escape character"),
    ("gpu\u2029", "contains control character"),
]


@pytest.mark.parametrize("spec,fragment", HOST_SPECS, ids=[repr(s) for s, _ in HOST_SPECS])
def test_host_specs_refused_before_the_network(world: World, spec: str, fragment: str) -> None:
    line = world.refuse(("status", "--", spec), fragment)
    assert "\n" not in line and "\x1b" not in line


CLI_ARGS = [
    (("apply", "--only", "chat-a\n", "localhost"), "a newline"),
    (("plan", "--exclude", "chat-a\r"), "a carriage return"),
    (("show", "chat-a\x00"), "NUL byte"),
    (("apply", "--target", "/tmp/x\n", "localhost"), "a newline"),
    (("status", "--series", "patches.yaml\n"), "a newline"),
    (("list", "--tier", "safe\x1b[2J"), "an escape character"),
    (("revert", "chat-a\u2028"), "control character"),
    (("apply", "--only", "ghost", "localhost"), "--only 'ghost': no such patch"),
    (("show", "[bold]ghost[/bold]"), "no patch named '[bold]ghost[/bold]'"),
]


@pytest.mark.parametrize("argv,fragment", CLI_ARGS, ids=[repr(a) for a, _ in CLI_ARGS])
def test_command_line_strings_refused(world: World, argv: tuple, fragment: str) -> None:
    world.refuse(argv, fragment)


def test_printable_escapes_every_control_character() -> None:
    hostile = "".join(chr(c) for c in range(0x20)) + "\x7f\x85\x9b\u2028\u2029\u202e\u2066"
    shown = validate.printable(hostile)
    assert validate.control_char(shown) is None
    assert "\\x1b" in shown and "\\n" in shown and "\\r" in shown and "\\x00" in shown


def test_rules_match_whole_strings_only() -> None:
    for rule, good in ((validate.PATCH_NAME, "mhc-bf16"), (validate.ENV_NAME, "MMA_FLASHMLA"),
                       (validate.HOST_NAME, "gpu1"), (validate.USER, "root"),
                       (validate.ADDRESS, "10.0.0.7"), (validate.GATE_VALUE, "1"),
                       (validate.ABS_PATH, "/opt/sglang"), (validate.SHA256, "a" * 64)):
        assert rule.ok(good)
        for suffix in ("\n", "\r", "\x00", " x", "\n\n"):
            assert not rule.ok(good + suffix), (rule, suffix)
        assert not rule.ok(None) and not rule.ok(1)


def _product_modules():
    """Every module of the product: patchset's own folder and each layer's folder, walked
    one by one (patchset.__path__ also holds the checkout root, which is not a package)."""
    import patchset
    packages = [("patchset", Path(patchset.__file__).parent)]
    for layer in patchset.LAYERS:
        package = importlib.import_module(f"patchset.{layer}")
        packages.append((package.__name__, Path(package.__file__).parent))
    yield patchset
    for name, folder in packages:
        for info in pkgutil.walk_packages([str(folder)], name + "."):
            if info.name.endswith("__main__"):
                continue
            yield importlib.import_module(info.name)


def test_no_product_pattern_is_dollar_anchored() -> None:
    """`^...$` + re.match accepts a trailing newline: product patterns are used with
    fullmatch (validate.Rule) and carry no `$` anchor, unless they are MULTILINE scanners."""
    offenders = []
    for module in _product_modules():
        for name, value in vars(module).items():
            dollar = b"$" if isinstance(getattr(value, "pattern", None), bytes) else "$"
            if isinstance(value, re.Pattern) and not value.flags & re.MULTILINE \
                    and value.pattern.endswith(dollar):
                offenders.append(f"{module.__name__}.{name}")
        source = Path(module.__file__).read_text(encoding="utf-8")
        for match in re.finditer(r"re\.match\(r?[\"']\^[^\"']*\$[\"']", source):
            offenders.append(f"{module.__name__}: {match.group()}")
    assert offenders == []


def test_a_summary_is_printed_as_written_never_as_markup_or_emoji(world: World) -> None:
    """Rich would read `[bold]` as markup and `:fire:` as an emoji code: a patch's text is
    data, shown as it is in patches.yaml."""
    text = "narrows [bold]F32[/bold] weights :fire: to bf16 [/]"
    original = mutate(world, entry(0, summary=text))
    try:
        code, out, err = world.run("list")
    finally:
        world.manifest.write_bytes(original)
    assert code == 0, err
    assert text in out


# ---------------------------------------------------------------- digits from hosts

@pytest.mark.parametrize("text", ["²", "٥", "５"])
def test_a_non_ascii_digit_from_a_host_is_not_a_number(text: str) -> None:
    """str.isdigit() is true for '²' (a latin-1 header byte) and int() then raises, or for
    '٥', which int() reads as 5: host data is a number only in ASCII digits."""
    import io

    from patchset.auditor.facttable import _visible
    from patchset.connect.tunnel import EndpointError, _bounded
    from patchset.agent.lib.facts.systemd import main_started
    from patchset.agent.lib.staleness import epoch

    class Reply(io.BytesIO):
        def getheader(self, name: str) -> str:
            return text

    assert _bounded(Reply(b"{}"), 10, "srv") == b"{}"          # read, bounded, not a crash
    with pytest.raises(EndpointError):
        _bounded(Reply(b"x" * 11), 10, "srv")
    rows = [{"index": 5, "uuid": "GPU-a"}]
    picked, why = _visible(rows, text, None)
    assert picked is None and "not a list of indices" in why
    assert main_started({"MainPID": 7, "ExecMainStartTimestampMonotonic": text}, 0, 0) is None
    assert epoch(f"2026-12-01T14:00:00.{text}Z") is None
