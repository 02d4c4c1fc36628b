"""The `patchset` command: each command parses options, calls one library function and
renders. Results go to stdout (a table, or JSON with --json); progress, messages and
errors go to stderr.

`app` (cli/app.py) holds the shared options and helpers; each command module registers its
commands on it when imported, so the modules are imported below in the order `patchset
--help` lists their commands.
"""

from .app import DeployView, app, main, run
from . import queue, serving, isolate, rebase, audit, bisect, rollout, serve

__all__ = ["app", "main", "run", "DeployView",
           "queue", "serving", "isolate", "rebase", "audit", "bisect", "rollout", "serve"]
