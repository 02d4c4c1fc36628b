"""``python -m sglang_router.launch_router`` stand-in (P/D mini load balancer).

``sglang_router`` is a separate package (sgl-model-gateway), not part of the
pinned SGLang tree, so its CLI cannot be derived from the tree: the options
below are the commonly used subset of upstream's ``router_args.py``
(``RouterArgs.add_cli_args``) with its names, nargs and defaults.  Anything
else is rejected with argparse's exit code 2, as upstream's parser would.

Behaviour: ``/health`` is 200 when every worker's ``/health`` is 200, else
503.  ``/v1/models`` and ``/model_info`` come from the first decode (or
worker).  ``/v1/chat/completions`` in ``--pd-disaggregation`` mode goes to a
prefill and a decode (round robin) at the same time, with
``bootstrap_host``/``bootstrap_port``/``bootstrap_room`` added as the real
router does; the decode's answer is returned.  Without P/D the request is
proxied to one of ``--worker-urls``.  Workers are not awaited at startup.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import random
import signal
import sys
import threading
import urllib.parse
from typing import Any

from sglang_standin.httpd import Handler, Server, request

logger = logging.getLogger("sglang_router")
POLICIES = ["random", "round_robin", "cache_aware", "power_of_two"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch_router", description="SGLang Router (stand-in)")
    p.add_argument("--host", type=str, default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--worker-urls", type=str, nargs="*", default=[])
    p.add_argument("--policy", type=str, default="cache_aware", choices=POLICIES)
    p.add_argument("--prefill-policy", type=str, default=None, choices=POLICIES)
    p.add_argument("--decode-policy", type=str, default=None, choices=POLICIES)
    p.add_argument("--mini-lb", action="store_true")
    p.add_argument("--pd-disaggregation", action="store_true")
    p.add_argument("--prefill", nargs="+", action="append")
    p.add_argument("--decode", nargs=1, action="append", metavar=("URL",))
    p.add_argument("--worker-startup-timeout-secs", type=int, default=600)
    p.add_argument("--worker-startup-check-interval", type=int, default=30)
    p.add_argument("--cache-threshold", type=float, default=0.3)
    p.add_argument("--balance-abs-threshold", type=int, default=64)
    p.add_argument("--balance-rel-threshold", type=float, default=1.5)
    p.add_argument("--max-payload-size", type=int, default=512 * 1024 * 1024)
    p.add_argument("--dp-aware", action="store_true")
    p.add_argument("--api-key", type=str, default=None)
    p.add_argument("--log-dir", type=str, default=None)
    p.add_argument("--log-level", type=str, default="info", choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("--prometheus-port", type=int, default=29000)
    p.add_argument("--prometheus-host", type=str, default="127.0.0.1")
    p.add_argument("--request-id-headers", type=str, nargs="*")
    p.add_argument("--request-timeout-secs", type=int, default=1800)
    p.add_argument("--max-concurrent-requests", type=int, default=256)
    p.add_argument("--health-check-timeout-secs", type=int, default=5)
    p.add_argument("--health-check-interval-secs", type=int, default=60)
    p.add_argument("--health-check-endpoint", type=str, default="/health")
    p.add_argument("--disable-retries", action="store_true")
    p.add_argument("--disable-circuit-breaker", action="store_true")
    return p


def parse_prefill(specs: list[list[str]] | None, parser: argparse.ArgumentParser) -> list[tuple[str, int | None]]:
    out = []
    for spec in specs or []:
        if len(spec) > 2:
            parser.error(f"--prefill takes URL [BOOTSTRAP_PORT], got {spec}")
        port: int | None = None
        if len(spec) == 2 and spec[1].lower() != "none":
            try:
                port = int(spec[1])
            except ValueError:
                parser.error(f"invalid bootstrap port {spec[1]!r}")
        out.append((spec[0].rstrip("/"), port))
    return out


class Router:
    def __init__(self, args: argparse.Namespace, prefills: list[tuple[str, int | None]], decodes: list[str]) -> None:
        self.args = args
        self.prefills = prefills
        self.decodes = decodes
        self.workers = [u.rstrip("/") for u in args.worker_urls]
        self._p = itertools.cycle(prefills) if prefills else None
        self._d = itertools.cycle(decodes) if decodes else None
        self._w = itertools.cycle(self.workers) if self.workers else None
        self._lock = threading.Lock()

    def all_urls(self) -> list[str]:
        return [u for u, _ in self.prefills] + self.decodes + self.workers

    def headers(self, incoming: Any) -> dict[str, str]:
        if self.args.api_key:
            return {"Authorization": f"Bearer {self.args.api_key}"}
        auth = incoming.get("Authorization")
        return {"Authorization": auth} if auth else {}

    def pick(self) -> tuple[tuple[str, int | None] | None, str]:
        with self._lock:
            if self.args.pd_disaggregation:
                if self._p is None or self._d is None:
                    raise LookupError("no prefill or decode workers")
                return next(self._p), next(self._d)
            if self._w is None:
                raise LookupError("no workers")
            return None, next(self._w)


def make_handler(router: Router) -> type[Handler]:
    timeout = float(router.args.request_timeout_secs)

    def health(h: Handler) -> None:
        urls = router.all_urls()
        endpoint, timeout_s = router.args.health_check_endpoint, router.args.health_check_timeout_secs
        ok = bool(urls) and all(request("GET", u + endpoint, timeout=timeout_s)[0] == 200 for u in urls)
        h.send_empty(200 if ok else 503)

    def forward_get(h: Handler) -> None:
        target = (router.decodes or router.workers or [None])[0]
        if target is None:
            h.send_json(503, {"error": "no workers"})
            return
        status, body, ctype = request("GET", target + h.path, headers=router.headers(h.headers), timeout=timeout)
        h.send_bytes(status or 502, body, ctype or "application/json")

    def chat(h: Handler) -> None:
        raw = h.read_body()
        try:
            body = json.loads(raw)
            prefill, decode = router.pick()
        except (ValueError, LookupError) as exc:
            h.send_json(400 if isinstance(exc, ValueError) else 503, {"error": str(exc)})
            return
        hdrs = router.headers(h.headers)
        if prefill is None:
            status, out, ctype = request("POST", decode + "/v1/chat/completions", body, hdrs, timeout)
            h.send_bytes(status or 502, out, ctype or "application/json")
            return
        purl, bport = prefill
        body = {**body, "bootstrap_host": urllib.parse.urlsplit(purl).hostname, "bootstrap_port": bport,
                "bootstrap_room": random.getrandbits(63)}
        result: dict[str, tuple] = {}
        t = threading.Thread(target=lambda: result.setdefault(
            "prefill", request("POST", purl + "/v1/chat/completions", {**body, "stream": False}, hdrs, timeout)))
        t.start()
        status, out, ctype = request("POST", decode + "/v1/chat/completions", body, hdrs, timeout)
        t.join(timeout)
        pstatus = result.get("prefill", (0,))[0]
        if pstatus != 200:
            logger.error("prefill %s failed with status %s", purl, pstatus)
            if status == 200:
                status, ctype = 502, "application/json"
                out = json.dumps({"error": f"prefill {purl} failed ({pstatus})"}).encode()
        h.send_bytes(status or 502, out, ctype or "application/json")

    class RouterHandler(Handler):
        routes = {
            ("GET", "/health"): health,
            ("GET", "/health_generate"): health,
            ("GET", "/v1/models"): forward_get,
            ("GET", "/model_info"): forward_get,
            ("GET", "/get_model_info"): forward_get,
            ("POST", "/v1/chat/completions"): chat,
        }

    return RouterHandler


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), format="[%(asctime)s] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", force=True)
    prefills = parse_prefill(args.prefill, parser)
    decodes = [d[0].rstrip("/") for d in (args.decode or [])]
    if args.pd_disaggregation and (not prefills or not decodes):
        parser.error("--pd-disaggregation needs at least one --prefill and one --decode")
    router = Router(args, prefills, decodes)
    signal.signal(signal.SIGTERM, _exit_on_term)
    httpd = Server(args.host, args.port, make_handler(router))
    logger.info("Router (stand-in) listening on %s:%d, prefill=%s decode=%s workers=%s",
                args.host, args.port, prefills, decodes, router.workers)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
