"""The local transport: the same engine, run in this process on a tree on this machine."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from patchset import engine


class LocalTransport:
    """Runs the engine on `target`; the bundle is staged exactly as a remote one would be."""

    def __init__(self, target: Path, host: str = "localhost") -> None:
        self.host = host
        self.target = Path(target)

    def run_engine(self, request: dict, files: dict[str, Path]) -> dict:
        with tempfile.TemporaryDirectory(prefix="patchset-bundle-") as tmp:
            bundle = Path(tmp)
            for name, source in files.items():
                dest = bundle / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, dest)
            return engine.run(dict(request, target=str(self.target)), bundle)
