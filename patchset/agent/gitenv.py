"""The environment of every git process patchset starts: one policy, on hosts and in the
CLI alike (standard library only: the agent uses it).

Why: git reads variables that point it at another repository, index or object store
(`GIT_DIR`, `GIT_WORK_TREE`, `GIT_INDEX_FILE`, ...) or that inject configuration
(`GIT_CONFIG_PARAMETERS`, `GIT_CONFIG_COUNT`/`KEY_n`/`VALUE_n`). A user who runs patchset
from a git hook, an IDE terminal or a script that exported them would otherwise have the
engine commit into, reset or read some other repository. They never reach a git child;
the rest of the environment (PATH, HOME, ssh and proxy settings) stays, so clones still
reach their remote the way the user's git does.
"""

from __future__ import annotations

import os

REPO_VARS = frozenset(
    "GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_INDEX_VERSION GIT_OBJECT_DIRECTORY"
    " GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_COMMON_DIR GIT_NAMESPACE GIT_PREFIX"
    " GIT_QUARANTINE_PATH GIT_SHALLOW_FILE GIT_GRAFT_FILE GIT_REPLACE_REF_BASE"
    " GIT_NO_REPLACE_OBJECTS GIT_CEILING_DIRECTORIES GIT_DISCOVERY_ACROSS_FILESYSTEM"
    " GIT_CONFIG GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT".split())


def redirects(name: str) -> bool:
    """Whether variable `name` points git elsewhere or injects configuration."""
    return name in REPO_VARS or name.startswith(("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"))


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without what redirects git, in the C locale, prompts off,
    no system config; `extra` on top."""
    env = {k: v for k, v in os.environ.items() if not redirects(k)}
    env.update(LC_ALL="C", LANG="C", GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1")
    env.update(extra or {})
    return env
