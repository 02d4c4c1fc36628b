"""Import hook of the SGLang stand-in, imported by ``sglang_standin.pth`` at startup.

Only in a process started as ``python [opts] -m sglang.launch_server ...`` (read
from ``/proc/self/cmdline``), and in the multiprocessing "spawn" children such a
process starts (they re-import ``sglang.launch_server`` as ``__mp_main__``, as
the real engine's children do), it puts a finder first on ``sys.meta_path``:

* ``sglang`` becomes an empty package whose ``__file__``/``__path__`` are the
  real tree's (its ``__init__`` is not executed: it imports torch);
* ``sglang.launch_server`` runs ``sglang_standin/_launch_server_main.py``;
* ``sglang.srt.managers.tokenizer_manager`` is ``sglang_standin/tokenizer_manager.py``
  (the per-request entry point, running the tree's real ``SamplingParams``);
* ``sglang.srt.model_executor.model_runner`` and ``...forward_batch_info`` are
  ``sglang_standin/model_runner.py`` and ``forward_batch_info.py`` (``ModelRunner.forward``,
  run by the scheduler children for every model step, and its ``ForwardBatch``/``ForwardMode``).

Served modules get a source loader (``exec_module``), so a finder that wraps the loaders of
the modules it watches (patchset's tracer) wraps these too.

Every other process (``python -c 'import importlib.util; ...find_spec("sglang")'``,
the audit, patchset itself) sees the unmodified tree: ``find_spec('sglang').origin``
is ``TREE/python/sglang/__init__.py``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_TARGET = "sglang.launch_server"


def _module_from_cmdline() -> str | None:
    """The ``-m`` module of this interpreter's command line, if any."""
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            raw = fh.read().split(b"\0")[:-1]
    except OSError:
        return None
    argv = [a.decode("utf-8", "surrogateescape") for a in raw]
    i = 1
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("--"):
            return None  # a script, stdin, "--" or a long option (--version, ...)
        flags = arg[1:]
        for j, ch in enumerate(flags):
            if ch == "m":
                rest = flags[j + 1:]
                return rest or (argv[i + 1] if i + 1 < len(argv) else None)
            if ch == "c":
                return None
            if ch in "XWQ":  # takes a value: attached (-Xdev) or the next argument
                if not flags[j + 1:]:
                    i += 1
                break
        i += 1
    return None


class _PackageLoader(importlib.abc.Loader):
    """Creates ``sglang`` without running its ``__init__.py``."""

    def create_module(self, spec):  # noqa: ANN001
        return None

    def exec_module(self, module) -> None:  # noqa: ANN001
        module.__file__ = module.__spec__.origin


class StandinFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001
        if fullname == "sglang":
            real = importlib.machinery.PathFinder.find_spec("sglang")
            if real is None or real.submodule_search_locations is None:
                return None
            spec = importlib.machinery.ModuleSpec("sglang", _PackageLoader(), origin=real.origin, is_package=True)
            spec.submodule_search_locations = list(real.submodule_search_locations)
            spec.has_location = True
            return spec
        if fullname == _TARGET:
            main = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_standin", "_launch_server_main.py")
            return importlib.util.spec_from_file_location(_TARGET, main)
        if fullname in _SERVED:
            here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_standin", _SERVED[fullname])
            return importlib.util.spec_from_file_location(fullname, here)
        return None


# Modules of the real server that import torch: served by stand-in files under their real
# names (so patchset's tracer, which watches by module and qualname, sees them imported).
_SERVED = {
    "sglang.srt.managers.tokenizer_manager": "tokenizer_manager.py",
    "sglang.srt.model_executor.model_runner": "model_runner.py",
    "sglang.srt.model_executor.forward_batch_info": "forward_batch_info.py",
}


def install() -> None:
    if not any(isinstance(f, StandinFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, StandinFinder())


def _is_spawned_child() -> bool:
    """A multiprocessing "spawn" child (``python -c 'from multiprocessing.spawn import
    spawn_main; ...' --multiprocessing-fork``): it re-imports the parent's main module,
    ``sglang.launch_server``, as ``__mp_main__``."""
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")[:-1]
    except OSError:
        return False
    return (len(argv) >= 4 and argv[-1] == b"--multiprocessing-fork" and argv[-3] == b"-c"
            and argv[-2].startswith(b"from multiprocessing.spawn import spawn_main"))


if _module_from_cmdline() == _TARGET or _is_spawned_child():
    install()
