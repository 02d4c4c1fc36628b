"""The server imports the tree patchset manages.

`python -m sglang.launch_server` imports sglang from its working directory, PYTHONPATH or
the venv's site-packages, whichever comes first: if that is not the managed tree, every
applied patch is a silent no-op. Checked with the server's own interpreter, working
directory and PYTHONPATH (find_spec, no import), and for the inventory's interpreter.
"""

from __future__ import annotations

import os

from ..model import Evidence, Finding
from ..states import managed_package_dir
from .base import AuditContext, Reporter

ID = "imported-tree"
SEVERITY = "high"
TAGS = ("tree", "python")
SUB_TAGS = ("inventory-python",)
finding = Reporter(ID, SEVERITY)


def check(ctx: AuditContext) -> list[Finding]:
    out: list[Finding] = []
    for host in ctx.hosts:
        tree = host.facts.tree
        managed = managed_package_dir(tree.value, ctx.series.upstream.git_prefix,
                                      ctx.series.upstream.name) if tree.known else None
        for server in host.facts.sglang_servers:
            subject = f"{server.id} imports"
            imports = server.imports
            ev = [Evidence.of("import origin", imports)]
            if not imports.known or managed is None:
                why = imports.reason if not imports.known else f"tree unknown: {tree.reason}"
                out.append(finding(host.host, subject, managed or "the managed tree",
                                   "unknown", "unknown", why, ev))
                continue
            origin = os.path.dirname(imports.value["origin"])
            status = "pass" if origin == managed else "fail"
            out.append(finding(host.host, subject, managed, origin, status,
                               "" if status == "pass" else
                               f"{server.id} imports {origin}: the applied patches do not "
                               "run there (fix PYTHONPATH or the working directory)", ev))
        interp = (tree.value.get("interpreter") if tree.known else None) or None
        if interp and interp.get("managed") is False:
            out.append(finding(host.host, f"{interp.get('python')} imports",
                               interp.get("expected"), interp.get("imports") or
                               interp.get("error"), "warn", "the inventory's interpreter "
                               "does not import the managed tree", sub="inventory-python",
                               severity="medium"))
    return out
