"""What the `patchset audit` command needs beyond parsing options: how steps reach each
host (ssh argv, address), one library call, the exit code. The transports come from
deploy.resolve (Hosts.audit_transport) and the `--probe` probes from isolate.probe
(audit_probes, which opens each host's endpoint with Hosts.endpoint: on the SSH
connection the facts came through): the CLI passes both in, so this package imports
neither."""

from __future__ import annotations

from typing import Any

from patchset.errors import UsageError
from patchset.series.model import Series

from . import api
from . import cohorts as cohorts_mod
from . import policy as policy_mod
from . import waivers as waivers_mod
from .rank import Access
from .render import FORMATS
from .report import to_dict

# The roles `patchset probe HOST` sends to, in order (isolate/measure/probe.py, connect/tunnel.py):
# a host with a port for one is probed by name, through its SSH connection.
PROBE_ROLES = ("router", "decode")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")


def access(inventory: Any, specs: list[str], inventory_file: Any = None,
           series_file: Any = None) -> Access:
    """How the report's suggested commands reach each host, and the --inventory/--series
    they carry: the files the audit was given on its command line (None: it used the
    default, which the suggested command finds again the same way)."""
    out = Access(inventory=str(inventory_file) if inventory_file else None,
                 series=str(series_file) if series_file else None)
    for spec in specs:
        host = inventory.resolve(spec)
        if spec in inventory.hosts and any((host.roles.get(role) or {}).get("port")
                                           for role in PROBE_ROLES):
            out.probe_hosts += (spec,)
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


def load_waivers(option: Any, disabled: bool) -> waivers_mod.WaiverFile | None:
    """`--waivers FILE`, else ./waivers.yaml when it exists, none with `--no-waivers`;
    validated whole (exit 2) before any host is contacted."""
    path = waivers_mod.locate(option, disabled)
    return waivers_mod.load(path, policy_mod.load()) if path is not None else None


def run(series: Series, transports: list[Any], symptom: str | None, inventory: Any,
        specs: list[str], probes: api.HostProbes | None = None,
        inventory_file: Any = None, series_file: Any = None, measured: tuple = (),
        waivers: waivers_mod.WaiverFile | None = None, forks: int = api.DEFAULT_FORKS):
    steps = access(inventory, specs, inventory_file, series_file)
    steps.measured = tuple(measured)          # --measured (auditor/measured.py load_all)
    report = api.audit(series, transports, symptom, steps, probes=probes, waivers=waivers,
                       cohorts=cohorts_mod.from_inventory(inventory, series), forks=forks)
    return report, to_dict(report), api.exit_code(report)


def summary_line(data: dict) -> str:
    c = data["summary"]["checks"]
    down = data["summary"]["unreachable"]
    waived, notes = data["summary"].get("waived"), data["summary"].get("notes")
    return (f"{data['summary']['hosts']} host(s): {c['fail']} failed, {c['warn']} warnings, "
            f"{c['unknown']} unknown, {c['pass']} passed"
            + (f", {waived} waived" if waived else "")
            + (f", unreachable: {', '.join(down)}" if down else "")
            + (f"; {notes} info note(s), not counted" if notes else ""))
