"""The pinned base as one git bundle file, for hosts that cannot fetch it themselves."""

from __future__ import annotations

import os
import re
from pathlib import Path

from patchset.errors import UpstreamError
from patchset.agent.lib.gitenv import LOCAL, run_git
from patchset.pin.upstream import BaseTree, cache_root


def base_bundle(base: BaseTree, cache: Path | None = None) -> Path:
    """Create (once) and return a bundle holding the base commit; cached by commit id.

    A cached bundle is used only when its head is that very commit (git checks every
    object against its id when the host clones it), so a damaged or foreign file under
    the name is rebuilt, never shipped."""
    if not re.fullmatch(r"[0-9a-f]{40}", base.commit):
        raise UpstreamError(f"base commit {base.commit!r} is not a 40-hex commit id")
    path = (Path(cache) if cache else cache_root()).absolute() / "bundles" / \
        f"{base.commit}.bundle"
    if path.exists() and _holds(path, base):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    proc = run_git(["bundle", "create", "-q", str(tmp), f"refs/heads/{base.ref}"], base.repo,
                   mode=LOCAL)
    if proc.returncode != 0 or not _holds(tmp, base):
        tmp.unlink(missing_ok=True)
        raise UpstreamError(f"cannot bundle the base in {base.repo}: "
                            f"{(proc.stderr.decode(errors='replace').strip().splitlines() or ['no head'])[-1]}")
    os.replace(tmp, path)
    return path


def _holds(bundle: Path, base: BaseTree) -> bool:
    """Whether `bundle` is a readable bundle whose heads are exactly the base commit."""
    proc = run_git(["bundle", "list-heads", str(bundle)], base.repo, mode=LOCAL)
    heads = {line.split()[0] for line in proc.stdout.decode(errors="replace").splitlines()
             if line.strip()}
    return proc.returncode == 0 and heads == {base.commit}
