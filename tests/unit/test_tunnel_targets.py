"""connect/tunnel.py without a host: where a role is reached from the host (role_target,
endpoint_for) and what a direct --url keeps (the tunnel itself, on a real nspawn host:
tests/system/test_tunnel.py)."""

from __future__ import annotations

import pytest

from patchset.connect import inventory as inv
from patchset.connect.tunnel import DirectEndpoint, endpoint_for, role_target
from patchset.errors import UsageError


def test_where_a_role_is_reached_from_the_host() -> None:
    def host(roles: dict, serving: dict | None = None, address: str = "gpu1") -> inv.Host:
        return inv.Host(name=address, address=address, roles=roles, serving=serving or {})

    both = host({"router": {"port": 8000}, "decode": {"port": 30001, "host": "10.0.0.5"}})
    assert role_target(both) == role_target(both, ("router",))
    assert (role_target(both).role, role_target(both).address, role_target(both).port) == \
        ("router", "127.0.0.1", 8000)                   # router first; unset bind: loopback
    decode = role_target(both, ("decode",))
    assert (decode.address, decode.port) == ("10.0.0.5", 30001)  # a specific bind, as written
    for bind in ("0.0.0.0", "::", "localhost", "127.0.0.1"):
        assert role_target(host({"decode": {"port": 1, "host": bind}})).address == "127.0.0.1"
    assert role_target(host({"decode": {"port": 1}}, {"host": "10.1.1.1"})).address == \
        "10.1.1.1"                                      # serving.host is every role's
    assert role_target(host({"prefill": {"port": 30000}})) is None
    with pytest.raises(UsageError) as err:
        endpoint_for(host({"prefill": {"port": 30000}}))
    assert str(err.value) == ("gpu1: hosts.gpu1.roles has no router or decode port; add one "
                              "or use --url")
    local = endpoint_for(inv.Host(name="localhost", address="localhost",
                                  roles={"decode": {"port": 30001}}))
    assert isinstance(local, DirectEndpoint) and local.describe() == "http://127.0.0.1:30001"
    with pytest.raises(UsageError):
        endpoint_for(both, at=("bad host; rm -rf /", 80))


def test_a_direct_url_keeps_its_path_and_never_shows_a_credential() -> None:
    assert DirectEndpoint("https://api.example.com/v1base/").describe() == \
        "https://api.example.com:443/v1base"
    assert DirectEndpoint("http://[::1]:8080").describe() == "http://[::1]:8080"
    with pytest.raises(UsageError) as err:
        DirectEndpoint("http://admin:hunter2@10.0.0.5:30000")
    assert "hunter2" not in str(err.value) and "admin" not in str(err.value)
    for url in ("file:///etc/passwd", "http://h:0/", "http://h:99999/", "http://h/?q=1",
                "http://h/a b", "ftp://h/"):
        with pytest.raises(UsageError):
            DirectEndpoint(url)
