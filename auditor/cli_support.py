"""What the `patchset audit` command needs beyond parsing options: how steps reach each
host (ssh argv, address), one library call, the exit code. The transports come from
deploy.resolve (Hosts.audit_transport) and the `--probe` probes from isolate.probe
(audit_probes): the CLI passes both in, so this package imports neither."""

from __future__ import annotations

from typing import Any

from patchset.errors import UsageError
from patchset.model import Series

from . import api
from .rank import Access
from .render import FORMATS
from .report import to_dict


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")


def access(inventory: Any, specs: list[str]) -> Access:
    out = Access()
    for spec in specs:
        host = inventory.resolve(spec)
        if host.local:
            continue
        argv = ["ssh"]
        if host.port:
            argv += ["-p", str(host.port)]
        if host.proxy_jump:
            argv += ["-J", host.proxy_jump]
        argv.append(f"{host.user}@{host.address}" if host.user else host.address)
        out.ssh[spec] = argv
        out.addresses[spec] = host.address
    return out


def run(series: Series, transports: list[Any], symptom: str | None, inventory: Any,
        specs: list[str], probes: api.HostProbes | None = None):
    report = api.audit(series, transports, symptom, access(inventory, specs), probes=probes)
    return report, to_dict(report), api.exit_code(report)


def summary_line(data: dict) -> str:
    c = data["summary"]["checks"]
    down = data["summary"]["unreachable"]
    return (f"{data['summary']['hosts']} host(s): {c['fail']} failed, {c['warn']} warnings, "
            f"{c['unknown']} unknown, {c['pass']} passed"
            + (f", unreachable: {', '.join(down)}" if down else ""))
