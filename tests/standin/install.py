"""Install the SGLang stand-in into a venv, next to a real SGLang source tree.

Layout made in ``VENV`` (``python3 -m venv --without-pip``, stdlib only):

* ``site-packages/sglang_tree.pth``: ``TREE/python``, so the venv imports
  the SGLang source patchset manages (``find_spec('sglang').origin`` is
  ``TREE/python/sglang/__init__.py``, which the audit checks);
* ``site-packages/sglang_standin/`` (the stand-in) and
  ``site-packages/_sglang_standin_hook.py`` with ``sglang_standin.pth``
  (``import _sglang_standin_hook``): inside a ``python -m
  sglang.launch_server`` process only, the hook serves the stand-in instead of
  the real (torch-importing) module;
* ``site-packages/sglang_router/``: ``python -m sglang_router.launch_router``
  is the router stand-in.

``install_standin(host)`` does this on a :class:`tests.hosts.nspawn.TestHost`
(commands via ``host.exec``, files through ``host.live_root``);
``install_standin_local(venv, tree)`` on this machine.  Both are idempotent and
return the venv's python.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

PAYLOAD = Path(__file__).resolve().parent / "payload"
TREE_PTH = "sglang_tree.pth"
HOOK_PTH = "sglang_standin.pth"

__all__ = ["install_standin", "install_standin_local", "payload_files", "PAYLOAD"]


def payload_files() -> dict[str, bytes]:
    """Relative path -> content of everything copied into site-packages."""
    out: dict[str, bytes] = {}
    for path in sorted(PAYLOAD.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        out[path.relative_to(PAYLOAD).as_posix()] = path.read_bytes()
    out[HOOK_PTH] = b"import _sglang_standin_hook\n"
    return out


def _install(
    run: Callable[[list[str]], str],
    write: Callable[[str, bytes], None],
    exists: Callable[[str], bool],
    *,
    python: str,
    venv: str,
    tree: str,
) -> str:
    venv = venv.rstrip("/")
    tree = tree.rstrip("/")
    vpy = f"{venv}/bin/python"
    if not exists(vpy):
        run([python, "-m", "venv", "--without-pip", venv])
    purelib = run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    for rel, data in payload_files().items():
        write(f"{purelib}/{rel}", data)
    write(f"{purelib}/{TREE_PTH}", f"{tree}/python\n".encode())
    if exists(f"{tree}/python/sglang/__init__.py"):
        origin = run([vpy, "-c", "import importlib.util; print(importlib.util.find_spec('sglang').origin)"]).strip()
        expected = f"{tree}/python/sglang/__init__.py"
        if os.path.realpath(origin) != os.path.realpath(expected) and origin != expected:
            raise RuntimeError(f"{vpy} resolves sglang to {origin}, not {expected}")
    return vpy


def install_standin(host, *, venv: str = "/opt/venv", tree: str = "/opt/sglang") -> str:  # noqa: ANN001
    """Install the stand-in on a test host; returns the venv python path (e.g. /opt/venv/bin/python).

    *tree* is where the real SGLang source lives (``TREE/python/sglang``,
    e.g. provisioned by ``patchset apply ... HOST --target TREE``); it may be
    created later: the ``.pth`` only names it.
    """
    root = host.live_root

    def run(argv: list[str]) -> str:
        res = host.exec(argv, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"{host.name}: {' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
        return res.stdout

    def write(path: str, data: bytes) -> None:
        dest = root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".standin-tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o644)
        os.replace(tmp, dest)

    def exists(path: str) -> bool:
        return (root / path.lstrip("/")).exists()

    return _install(run, write, exists, python="python3", venv=venv, tree=tree)


def install_standin_local(venv: Path | str, tree: Path | str, *, python: str = sys.executable) -> str:
    """The same install on this machine (for local tests); returns the venv python."""

    def run(argv: list[str]) -> str:
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout

    def write(path: str, data: bytes) -> None:
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)

    return _install(run, write, lambda p: Path(p).exists(), python=python, venv=str(venv), tree=str(tree))
