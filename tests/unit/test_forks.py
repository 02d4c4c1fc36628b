"""`--forks N`: how many hosts apply, status and audit work on at once."""

from __future__ import annotations

import threading
import time

import pytest

from patchset import api
from patchset.cli import main
from patchset.errors import UsageError


class Host:
    def __init__(self, name: str) -> None:
        self.host = name


def peak(forks: int, hosts: int = 8) -> tuple[int, list[str]]:
    """The most hosts worked on at once, and the results' order."""
    lock, busy, most = threading.Lock(), [0], [0]

    def work(t: Host) -> str:
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.05)
        with lock:
            busy[0] -= 1
        return t.host

    order = api.on_hosts([Host(f"h{i}") for i in range(hosts)], work, forks)
    return most[0], order


@pytest.mark.parametrize("forks, expected", [(1, 1), (3, 3), (16, 8)])
def test_forks_caps_the_hosts_at_once(forks: int, expected: int) -> None:
    most, order = peak(forks)
    assert most == expected
    assert order == [f"h{i}" for i in range(8)]


@pytest.mark.parametrize("forks", [0, -1, 257, True, 2.5])
def test_bad_forks_are_bad_input(forks) -> None:
    with pytest.raises(UsageError, match="--forks"):
        api.check_forks(forks)


@pytest.mark.parametrize("command", [["apply", "gpu1"], ["status"], ["audit", "gpu1"]])
def test_cli_refuses_forks_zero(command: list[str], capsys) -> None:
    code = main(command + ["--forks", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "--forks" in err
