"""The pinned base as one git bundle file, for hosts that cannot fetch it themselves."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .errors import UpstreamError
from .upstream import BaseTree, cache_root


def base_bundle(base: BaseTree, cache: Path | None = None) -> Path:
    """Create (once) and return a bundle holding the base commit; cached by commit id."""
    path = (cache or cache_root()) / "bundles" / f"{base.commit}.bundle"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    proc = subprocess.run(["git", "bundle", "create", "-q", str(tmp), base.ref],
                          cwd=base.repo, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise UpstreamError(f"cannot bundle the base in {base.repo}: "
                            f"{proc.stderr.strip().splitlines()[-1:]}")
    os.replace(tmp, path)
    return path
