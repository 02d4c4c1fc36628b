"""The environment of every git process patchset starts: one policy, on hosts and in the
CLI alike (standard library only: the agent uses it).

Why: git reads variables that point it at another repository, index or object store
(`GIT_DIR`, `GIT_WORK_TREE`, `GIT_INDEX_FILE`, ...) or that inject configuration
(`GIT_CONFIG_PARAMETERS`, `GIT_CONFIG_COUNT`/`KEY_n`/`VALUE_n`). A user who runs patchset
from a git hook, an IDE terminal or a script that exported them would otherwise have the
engine commit into, reset or read some other repository. They never reach a git child;
the rest of the environment (PATH, HOME, ssh and proxy settings) stays, so clones still
reach their remote the way the user's git does.

Three named modes, one policy: what redirects git never passes, in every mode.
  TREE     the engine's work in a served tree (here and on hosts): the user's config stays.
  LOCAL    scratch trees and caches the controller builds (upstream, import, rebase,
           bundles): no inherited GIT_* at all, no user or system config, C locale, UTC,
           so the same input gives the same objects and files on every machine.
  NETWORK  fetches and clones: the user's config (proxy, insteadOf, credentials) stays,
           prompts off, ssh in batch mode unless the user set GIT_SSH_COMMAND.
`run_git` is the one way patchset starts git; every git child goes through it.
"""

from __future__ import annotations

import os
import subprocess
from typing import IO, Sequence

TREE, LOCAL, NETWORK = "tree", "local", "network"
MODES = (TREE, LOCAL, NETWORK)

REPO_VARS = frozenset(
    "GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_INDEX_VERSION GIT_OBJECT_DIRECTORY"
    " GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_COMMON_DIR GIT_NAMESPACE GIT_PREFIX"
    " GIT_QUARANTINE_PATH GIT_SHALLOW_FILE GIT_GRAFT_FILE GIT_REPLACE_REF_BASE"
    " GIT_NO_REPLACE_OBJECTS GIT_CEILING_DIRECTORIES GIT_DISCOVERY_ACROSS_FILESYSTEM"
    " GIT_CONFIG GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT".split())


def redirects(name: str) -> bool:
    """Whether variable `name` points git elsewhere or injects configuration."""
    return name in REPO_VARS or name.startswith(("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"))


def git_env(extra: dict[str, str] | None = None, mode: str = TREE) -> dict[str, str]:
    """The caller's environment without what redirects git (LOCAL: without any inherited
    GIT_*), C locale, prompts off, as `mode` says; `extra` on top."""
    if mode not in MODES:
        raise ValueError(f"git environment mode {mode!r} is not one of {MODES}")
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("GIT_") if mode == LOCAL else redirects(k))}
    env.update(LC_ALL="C", LANG="C", GIT_TERMINAL_PROMPT="0")
    if mode in (TREE, LOCAL):
        env.update(GIT_CONFIG_NOSYSTEM="1")
    if mode == LOCAL:
        env.update(GIT_CONFIG_GLOBAL=os.devnull, LANGUAGE="C", TZ="UTC")
    if mode == NETWORK:
        env.update(LANGUAGE="C")
        env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes -o ConnectTimeout=10")
    env.update(extra or {})
    return env


def run_git(args: Sequence[str], cwd: str | os.PathLike[str] | None, *, mode: str = TREE,
            extra: dict[str, str] | None = None, input: bytes | None = None,
            timeout: float | None = None) -> subprocess.CompletedProcess[bytes]:
    """`git ARGS` in `cwd` with the policy's environment: stdout and stderr captured as
    bytes, stdin `input` (or nothing: git never waits on a terminal), never raising for
    a non-zero exit (the caller words its own error). FileNotFoundError when there is no
    git, TimeoutExpired past `timeout`, as subprocess raises them."""
    return subprocess.run(["git", *args], cwd=cwd, env=git_env(extra, mode), input=input,
                          stdin=None if input is not None else subprocess.DEVNULL,
                          capture_output=True, timeout=timeout, check=False)


def popen_git(args: Sequence[str], cwd: str | os.PathLike[str] | None, *, mode: str = TREE,
              stdin: int | IO[bytes] | None = None, stdout: int | IO[bytes] | None = None,
              stderr: int | IO[bytes] | None = None) -> subprocess.Popen[bytes]:
    """A streamed git child (fast-import fed, archive read, as it goes) with the same
    environment policy as run_git; the caller owns the pipes and the wait."""
    return subprocess.Popen(["git", *args], cwd=cwd, env=git_env(None, mode),
                            stdin=stdin, stdout=stdout, stderr=stderr)
