"""The `patchset` command: each command parses options, calls one library function and
renders. Results go to stdout (a table, or JSON with --json); progress, messages and
errors go to stderr. Heavy libraries load only inside the commands that need them."""

from .app import app, main
# Importing registers the commands, in the order --help lists them.
from . import queue  # noqa: E402,F401
from . import serving  # noqa: E402,F401
from . import isolate  # noqa: E402,F401
from . import rebase  # noqa: E402,F401
from . import audit  # noqa: E402,F401
from . import bisect  # noqa: E402,F401
from .app import DeployView  # noqa: E402

__all__ = ["app", "main", "DeployView"]
