"""The SGLang tree: patchset's state on it, and which tree the server really imports."""

from __future__ import annotations

import json
from typing import Any

from ..bounded import loads
from .base import RawRecord, Command, Fact, Unavailable, ok_output

FIND_SPEC = ("import importlib.util as u, json, sys; s = u.find_spec(sys.argv[1]); "
             "print(json.dumps({'origin': s.origin if s else None, "
             "'python': sys.version.split()[0]}))")


class TreeStatus(Fact):
    """patchset's engine `status` on the tree: state.json (base, applied patches with
    hashes, gates, time of the last apply), drift, foreign commits, interrupted work."""

    def command(self, tree: str = "", **kwargs: Any) -> Command:
        return Command("engine", ("status",), target=tree)

    def process(self, raw: RawRecord) -> dict[str, Any]:
        ok_output(raw)
        result = raw.get("data")
        if not isinstance(result, dict):
            raise Unavailable("the engine returned no status")
        if not result.get("ok", True):
            raise Unavailable((result.get("error") or {}).get("message", "engine error"))
        return {k: v for k, v in result.items() if k != "ok"}


class ImportOrigin(Fact):
    """Where `import sglang` resolves for an interpreter, run as the server runs it (its
    working directory, its PYTHONPATH): `python -m` puts the cwd first on sys.path, so a
    checkout the server was started from shadows the venv. find_spec never imports."""

    def command(self, python: str = "python3", cwd: str = "", pythonpath: str | None = None,
                package: str = "sglang", **kwargs: Any) -> Command:
        env = (("PYTHONPATH", pythonpath),) if pythonpath else ()
        return Command("run", (python, "-c", FIND_SPEC, package), cwd=cwd, env=env)

    def process(self, raw: RawRecord) -> dict[str, Any]:
        out = ok_output(raw).strip().splitlines()
        if not out:
            raise Unavailable("the interpreter printed nothing")
        data = loads(out[-1], "find_spec")
        if not data.get("origin"):
            raise Unavailable("the interpreter cannot import sglang")
        return {"origin": data["origin"], "python": data.get("python")}
