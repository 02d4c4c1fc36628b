"""The `patchset` command: each command parses options, calls one library function and
renders. Results go to stdout (a table, or JSON with --json); progress, messages and
errors go to stderr. Heavy libraries load only inside the commands that need them.

Start-up is most of a command's time (bench/RESULTS.md, section cli), so:
- `main()` imports only the module of the command it runs and builds only that command
  (`app.register_commands`, `app.command_tree`); `--help` imports and builds them all;
- the command modules do not use `from __future__ import annotations`: typer reads each
  command's annotations on every run, and a string annotation costs a compile and an eval
  (half of building the whole tree); a name imported only for type checking is quoted;
- libraries (rich, yaml, the agent, deploy/, isolate/) are imported where they are used.
"""

from .app import DeployView, app, main, register_commands, run

__all__ = ["app", "main", "run", "register_commands", "DeployView"]
