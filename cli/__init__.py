"""The `patchset` command: each command parses options, calls one library function and
renders. Results go to stdout (a table, or JSON with --json); progress, messages and
errors go to stderr.

`app` (cli/app.py) holds the shared plumbing, cli/options.py the shared options and
cli/render.py what they print with; each command module, named for its commands, registers
them on `app` when imported, so the modules are imported below in the order `patchset
--help` lists their commands.
"""

from .app import app, main, run
from .render import DeployView
from . import (queue, deploy, probe, series, adopt, capture, rebase, audit, bisect, rollout,
               serve)

__all__ = ["app", "main", "run", "DeployView", "queue", "deploy", "probe", "series", "adopt",
           "capture", "rebase", "audit", "bisect", "rollout", "serve"]
