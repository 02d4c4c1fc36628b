"""Installed by `patchset deploy` as TRACE_DIR/sitecustomize.py, first on the unit's
PYTHONPATH: starts patchset's tracer (patchset_tracer.py beside it) in every Python
process of the unit, then runs the next sitecustomize on the path (Debian ships one), so
nothing the interpreter did before changes. Never raises."""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

try:
    _spec = importlib.util.spec_from_file_location(
        "patchset_tracer", os.path.join(_HERE, "patchset_tracer.py"))
    if _spec is None or _spec.loader is None:       # caught below, like any other failure
        raise ImportError("no patchset_tracer.py beside this file")
    _tracer = importlib.util.module_from_spec(_spec)
    sys.modules["patchset_tracer"] = _tracer
    _spec.loader.exec_module(_tracer)
    _tracer.install()
except BaseException:  # noqa: BLE001 - tracing must never stop a server from starting
    pass

try:
    _rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
except BaseException:  # noqa: BLE001
    pass
