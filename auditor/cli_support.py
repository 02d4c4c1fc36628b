"""What the `patchset audit` command needs beyond parsing options: transports for HOST
arguments (localhost is audited even when it has no managed tree yet), how steps reach
each host (ssh argv, address), what `--probe` asks for, one library call, the exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchset.errors import UsageError
from patchset.model import Series

from . import api
from .probe import FidelitySpec, api_key, parse_kinds, parse_sizes, role_url
from .rank import Access
from .render import FORMATS
from .report import to_dict


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")


def transport(resolver: Any, spec: str) -> Any:
    """The transport `status` would use; a localhost without its default tree still gets
    audited (the tree is then a fact that says it is missing)."""
    try:
        return resolver.transport(spec, provision_local=False)
    except UsageError:
        host = resolver.inventory.resolve(spec)
        if not host.local:
            raise
        from deploy.local import LocalTransport
        from patchset.paths import default_target
        return LocalTransport(Path(default_target(resolver.series.upstream)))


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


def probe_plan(kind: str | None, sizes: str | None, key_env: str | None, timeout: float,
               inventory: Any, specs: list[str]) -> api.ProbePlan | None:
    """`--probe KIND [--probe-sizes S] [--api-key-env NAME]` as a plan, checked before any
    host is contacted (bad input is exit 2, not a report full of failed probes). The key
    itself stays in the environment: the plan holds only the variable's name."""
    if kind is None:
        if sizes or key_env:
            raise UsageError("--probe-sizes and --api-key-env need --probe recall|needle|all")
        return None
    spec = FidelitySpec(kinds=parse_kinds(kind, "--probe"),
                        sizes=parse_sizes(sizes, "--probe-sizes"), api_key_env=key_env,
                        timeout=timeout)
    api_key(key_env)
    urls = {}
    for name in specs:
        host = inventory.resolve(name)
        url = role_url(host)
        if url:
            urls[host.name] = url           # the transport's name for it (local -> localhost)
    return api.ProbePlan(spec, urls)


def run(series: Series, transports: list[Any], symptom: str | None, inventory: Any,
        specs: list[str], probes: api.ProbePlan | None = None):
    report = api.audit(series, transports, symptom, access(inventory, specs), probes=probes)
    return report, to_dict(report), api.exit_code(report)


def summary_line(data: dict) -> str:
    c = data["summary"]["checks"]
    down = data["summary"]["unreachable"]
    return (f"{data['summary']['hosts']} host(s): {c['fail']} failed, {c['warn']} warnings, "
            f"{c['unknown']} unknown, {c['pass']} passed"
            + (f", unreachable: {', '.join(down)}" if down else ""))
