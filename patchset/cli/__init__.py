"""The `patchset` command: each command parses options, calls one library function and
renders. Results go to stdout (a table, or JSON with --json); progress, messages and
errors go to stderr. Heavy libraries load only inside the commands that need them.

Start-up is most of a command's time (bench/RESULTS.md, section cli), so:
- `main()` builds only the command it runs (`app.command_tree`); `--help` builds them all;
- the command modules do not use `from __future__ import annotations`: typer reads each
  command's annotations on every run, and a string annotation costs a compile and an eval
  (half of building the whole tree); a name imported only for type checking is quoted;
- libraries (rich, yaml, the agent, deploy/, isolate/) are imported where they are used.
"""

from .app import app, main, run
# Importing registers the commands, in the order --help lists them.
from . import queue  # noqa: E402,F401
from . import serving  # noqa: E402,F401
from . import isolate  # noqa: E402,F401
from . import rebase  # noqa: E402,F401
from . import audit  # noqa: E402,F401
from . import bisect  # noqa: E402,F401
from . import serve  # noqa: E402,F401
from .app import DeployView  # noqa: E402

__all__ = ["app", "main", "run", "DeployView"]
