"""connect/tunnel.py: HTTP to a host's servers through the host's own SSH connection, on a
real nspawn host with a real sshd (no mocks of paramiko).

The server under test is `python3 -m http.server` inside the host, bound to 127.0.0.2
only. Test hosts share this machine's network namespace (tests/hosts/nspawn.py), so no
address on a host is out of this machine's reach: what the tests show is that a request
goes to the role's address as the host sees it, not to the host's SSH address (a direct
connection there is refused), and that it travels inside sshd (an sshd that does not
forward refuses it, while the server still answers on the host). What needs no host:
tests/unit/test_tunnel_targets.py.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from tests.hostutil import free_port, on_host

from patchset.connect import inventory as inv
from patchset.connect.resolve import Hosts
from patchset.connect.ssh import HostKeyRefused
from patchset.connect.tunnel import DirectEndpoint, EndpointError, SshEndpoint, endpoint_for
from patchset.errors import Exit, Unreachable, UsageError
from tests.hosts.nspawn import TestHost

pytestmark = pytest.mark.hosts

BIND = "127.0.0.2"          # the server's loopback address on the host
SERVED = "/srv/tunnel"
LOG = "/var/log/tunnel-http.log"
UNIT = "tunnel-http"


@pytest.fixture(scope="module")
def server(host_factory) -> Iterator[dict]:
    """One host for the module, serving SERVED on BIND:PORT (a transient unit whose
    request log is LOG)."""
    [host] = host_factory.start(1, prefix="tunnel")
    port, token = free_port(), secrets.token_hex(8)
    on_host(host, f"mkdir -p {SERVED} && echo {token} > {SERVED}/hello.txt && "
            f"head -c 4096 /dev/zero > {SERVED}/big.bin && "
            f"systemd-run --unit={UNIT} -p Type=exec -p StandardError=append:{LOG} "
            f"python3 -u -m http.server --bind {BIND} --directory {SERVED} {port} && "
            f"for i in $(seq 100); do curl -sf http://{BIND}:{port}/hello.txt && exit 0; "
            "sleep 0.1; done; exit 1")
    yield {"host": host, "port": port, "token": token}
    host_factory.stop([host])


@pytest.fixture()
def env(server: dict, tmp_path: Path, monkeypatch, known_hosts_file) -> dict:
    """hosts.yaml naming the server as the host's decode role; the host's key known; no
    user ssh config."""
    host: TestHost = server["host"]
    (tmp_path / "ssh_config").write_text("")
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(tmp_path / "ssh_config"))
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(known_hosts_file([host])))
    spec = {"address": host.ip, "port": host.port, "user": "root",
            "identity_file": str(host.client_key),
            "roles": {"decode": {"port": server["port"], "host": BIND}}}
    path = write_inventory(tmp_path, {host.name: spec})
    return {**server, "inventory": path, "entry": inv.load(path).hosts[host.name]}


def write_inventory(directory: Path, hosts: dict) -> Path:
    path = directory / "hosts.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "hosts": hosts}, sort_keys=False))
    return path


def served_paths(host: TestHost) -> str:
    """The server's request log so far (one line per request it received)."""
    return on_host(host, f"cat {LOG}")


def logged_after_a_marker(env: dict) -> str:
    """The request log once a fresh request has reached it: whatever an earlier step sent
    is in it by then (the log is in request order)."""
    marker = f"/marker-{secrets.token_hex(4)}"
    with endpoint_for(env["entry"]) as endpoint:
        assert endpoint.request("GET", marker).status == 404
    for _ in range(50):
        log = served_paths(env["host"])
        if marker in log:
            return log
        time.sleep(0.1)
    raise AssertionError(f"{marker} never reached the server's log")


def test_a_loopback_server_is_reached_through_the_hosts_ssh_connection(env: dict) -> None:
    host, port = env["host"], env["port"]
    with endpoint_for(env["entry"]) as endpoint:
        assert isinstance(endpoint, SshEndpoint)
        assert endpoint.describe() == f"{host.name} {BIND}:{port} via ssh"
        reply = endpoint.request("GET", "/hello.txt", timeout=30)
        assert (reply.status, reply.body.decode().strip()) == (200, env["token"])
        assert reply.headers["content-length"] == str(len(env["token"]) + 1)
        again = endpoint.request("GET", "/hello.txt")      # a new channel, the same connection
        assert again.body == reply.body
        refused = endpoint.request("POST", "/hello.txt", b"{}",
                                   {"Content-Type": "application/json"})
        assert refused.status == 501          # an HTTP error is a response, judged by the caller
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host.ip, port), timeout=5).close()
    with pytest.raises(Unreachable) as direct:
        DirectEndpoint(f"http://{host.ip}:{port}").request("GET", "/hello.txt")
    assert str(direct.value) == f"http://{host.ip}:{port}: unreachable (Connection refused)"


def test_the_resolver_sends_http_over_the_connection_it_already_holds(env: dict,
                                                                     series) -> None:
    with Hosts(series, env["inventory"], None) as hosts:
        transport = hosts.audit_transport(env["host"].name)
        endpoint = hosts.endpoint(env["host"].name)
        assert endpoint.transport is transport and hosts.opened == [transport]
        assert endpoint.request("GET", "/hello.txt").status == 200
        connection = transport.connection()
        endpoint.close()                         # borrowed: the resolver's to close
        assert endpoint.request("GET", "/hello.txt").status == 200
        assert transport.connection() is connection        # one connection throughout


def test_a_host_known_only_by_an_ssh_config_alias(env: dict, tmp_path: Path,
                                                  monkeypatch) -> None:
    host = env["host"]
    config = tmp_path / "alias_config"
    config.write_text(f"Host gpu-alias\n  HostName {host.ip}\n  Port {host.port}\n"
                      f"  User root\n  IdentityFile {host.client_key}\n")
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(config))
    path = write_inventory(tmp_path, {"web": {"address": "gpu-alias", "roles": {
        "decode": {"port": env["port"], "host": BIND}}}})        # no user, port or key
    with endpoint_for(inv.load(path).hosts["web"]) as endpoint:
        assert endpoint.describe() == f"web {BIND}:{env['port']} via ssh"
        assert endpoint.request("GET", "/hello.txt").body.decode().strip() == env["token"]


def test_an_unknown_host_key_is_refused_and_no_request_is_sent(env: dict, tmp_path: Path,
                                                               monkeypatch) -> None:
    known = os.environ["PATCHSET_KNOWN_HOSTS"]
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(empty))
    never = f"/never-{secrets.token_hex(4)}"
    with endpoint_for(env["entry"]) as endpoint, pytest.raises(HostKeyRefused) as err:
        endpoint.request("GET", never)
    assert err.value.exit_code == Exit.UNREACHABLE
    assert "unknown host key" in str(err.value) and "--accept-new" in str(err.value)
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", known)
    assert never not in logged_after_a_marker(env)


def test_parallel_requests_share_the_one_connection(env: dict) -> None:
    """What the throughput probe does: many requests at once, one channel each."""
    with endpoint_for(env["entry"]) as endpoint, ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: endpoint.request("GET", "/hello.txt"), range(16)))
    assert {(r.status, r.body.decode().strip()) for r in replies} == {(200, env["token"])}


def test_a_server_that_does_not_answer_is_one_line_after_the_timeout(env: dict) -> None:
    mute = free_port()
    on_host(env["host"], f"systemd-run --unit=tunnel-mute -p Type=exec python3 -c "
            f"'import socket, time; s = socket.create_server((\"{BIND}\", {mute})); "
            "c = s.accept(); time.sleep(120)' && for i in $(seq 100); do "
            f"ss -ltn | grep -q {BIND}:{mute} && exit 0; sleep 0.1; done; exit 1")
    try:
        with endpoint_for(env["entry"], at=(BIND, mute)) as endpoint, \
                pytest.raises(Unreachable) as err:
            endpoint.request("GET", "/", timeout=1)
        assert str(err.value) == (f"{env['host'].name} {BIND}:{mute} via ssh: no answer to "
                                  "GET / within 1s")
    finally:
        on_host(env["host"], "systemctl stop tunnel-mute")


def test_a_closed_port_is_one_line_naming_host_and_port(env: dict) -> None:
    closed = free_port()
    with endpoint_for(env["entry"], at=(BIND, closed)) as endpoint, \
            pytest.raises(Unreachable) as err:
        endpoint.request("GET", "/")
    message = str(err.value)
    assert message == (f"{env['host'].name}: cannot reach {BIND}:{closed} from the host "
                       "through ssh (connect failed: nothing listens there, or the host "
                       "cannot reach it)")
    assert err.value.exit_code == Exit.UNREACHABLE and "\n" not in message


def test_cr_lf_in_the_path_or_a_header_is_refused_before_anything_is_sent(env: dict) -> None:
    bad = ["/hello.txt\r\nX-Injected: 1", "/hello.txt HTTP/1.1\r\n\r\nGET /x", "/a b",
           "hello.txt", "http://evil.example/", "/tab\there", "/caf\u00e9"]
    with endpoint_for(env["entry"]) as endpoint:
        for path in bad:
            with pytest.raises(UsageError) as err:
                endpoint.request("GET", path)
            assert err.value.exit_code == Exit.BAD_INPUT and "\n" not in str(err.value)
            assert "must start with / and be printable ASCII without spaces" in \
                str(err.value)
        with pytest.raises(UsageError):
            endpoint.request("GET", "/injected-header", headers={"X-A": "1\r\nX-B: 2"})
        with pytest.raises(UsageError):
            endpoint.request("GET", "/injected-header", headers={"X-A\r\nX-B": "2"})
        with pytest.raises(UsageError):
            endpoint.request("GET / HTTP/1.1\r\n", "/injected-method")
    log = logged_after_a_marker(env)
    assert "X-Injected" not in log and "/injected-" not in log and "evil" not in log


def test_a_response_body_over_the_cap_is_refused(env: dict) -> None:
    with endpoint_for(env["entry"], max_body=1024) as small, \
            pytest.raises(EndpointError) as err:
        small.request("GET", "/big.bin")
    assert str(err.value) == (f"{env['host'].name} {BIND}:{env['port']} via ssh: response "
                              "body larger than 1024 bytes; refused")
    assert err.value.exit_code == Exit.FAILED
    with endpoint_for(env["entry"], max_body=4096) as exact:
        assert exact.request("GET", "/big.bin").body == b"\0" * 4096


def test_an_sshd_that_does_not_forward_refuses_the_request(fresh_host: TestHost,
                                                           tmp_path: Path, monkeypatch,
                                                           known_hosts_file) -> None:
    """The request is inside sshd: forwarding off there, the server on the host still
    answers (curl on the host), and the endpoint is refused with sshd's reason."""
    port = free_port()
    on_host(fresh_host, f"systemd-run --unit={UNIT} -p Type=exec python3 -m http.server "
            f"--bind {BIND} {port} && echo 'AllowTcpForwarding no' > "
            "/etc/ssh/sshd_config.d/00-no-forwarding.conf && systemctl reload ssh && "
            f"for i in $(seq 100); do curl -s -o /dev/null http://{BIND}:{port}/ && exit 0; "
            "sleep 0.1; done; exit 1")
    (tmp_path / "ssh_config").write_text("")
    monkeypatch.setenv("PATCHSET_SSH_CONFIG", str(tmp_path / "ssh_config"))
    monkeypatch.setenv("PATCHSET_KNOWN_HOSTS", str(known_hosts_file([fresh_host])))
    path = write_inventory(tmp_path, {fresh_host.name: {
        "address": fresh_host.ip, "port": fresh_host.port, "user": "root",
        "identity_file": str(fresh_host.client_key),
        "roles": {"router": {"port": port, "host": BIND}}}})
    with endpoint_for(inv.load(path).hosts[fresh_host.name]) as endpoint, \
            pytest.raises(Unreachable) as err:
        endpoint.request("GET", "/")
    assert str(err.value) == (f"{fresh_host.name}: cannot reach {BIND}:{port} from the host "
                              "through ssh (the host's sshd does not forward there "
                              "(AllowTcpForwarding, PermitOpen))")
