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

``POST /generate`` follows sgl-model-gateway's PD router
(``sgl-model-gateway/src/routers/http/pd_router.rs``: ``route_generate``,
``inject_bootstrap_into_value``, ``execute_dual_dispatch_internal``,
``merge_logprobs_in_json``): a prefill and a decode are picked; the bootstrap fields
are added -- one room per item when ``input_ids`` is a list of lists
(``generate_batch_size_from_value``), else one room for the body (a ``text`` batch then
gets rooms r, r+1, ... from the servers' own ``_normalize_bootstrap_params``); the same
body goes to both at once; a decode error is answered first, then a prefill error
(``{"error": {"message", "type", "code"}}`` as ``routers/error.rs`` builds it); else the
decode's answer, with -- for a non-streaming ``return_logprob`` request whose answers are
JSON objects -- the prefill's ``meta_info.input_token_logprobs`` put in front of the
decode's (a batch's JSON list is passed through unmerged, as upstream).  A stream is
relayed from the decode as it comes (upstream's stream merge parses the prefill's body as
JSON, which a streamed prefill answer is not, so nothing is merged).  Not modelled:
retries, circuit breakers, cache-aware/power-of-two selection (round robin is used).

``POST /flush_cache`` (an admin route: POST only) calls ``POST WORKER/flush_cache`` on
every worker at once, with the router's ``--api-key`` (``WorkerManager::flush_cache_all``)
and answers ``FlushCacheResult``'s JSON: 200 ``{"status": "success", ...}`` when every
worker answered 2xx, else 206 ``"partial_success"`` with the failed workers.
"""

from __future__ import annotations

import argparse
import http
import itertools
import json
import logging
import random
import signal
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
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


def error_body(status: int, code: str, message: str) -> bytes:
    """``routers/error.rs`` ``create_error``: ``{"error": {"message", "type", "code"}}``."""
    try:
        kind = http.HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        kind = "unknown_status_code"
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


def status_text(status: int) -> str:
    """A status as reqwest's ``StatusCode`` displays it ("400 Bad Request")."""
    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


class Upstream:
    """One request to a worker whose body is read later (all at once, or as a stream)."""

    def __init__(self, url: str, body: Any, headers: dict[str, str], timeout: float) -> None:
        self.url = url
        self.status = 0
        self.ctype = ""
        self.error = ""
        self._resp: Any = None
        self._body: bytes | None = None
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        req = urllib.request.Request(url, data=data, method="POST",
                                     headers={**headers, "Content-Type": "application/json"})
        try:
            self._resp = urllib.request.urlopen(req, timeout=timeout)
            self.status = self._resp.status
        except urllib.error.HTTPError as exc:
            self.status, self._body = exc.code, exc.read()
            self.ctype = exc.headers.get("content-type", "") if exc.headers else ""
            return
        except (urllib.error.URLError, OSError) as exc:
            self.error = f"error sending request for url ({url}): {getattr(exc, 'reason', exc)}"
            return
        self.ctype = self._resp.headers.get("content-type", "")

    def read(self) -> bytes:
        if self._body is None:
            try:
                self._body = self._resp.read() if self._resp is not None else b""
            except OSError as exc:
                self.error, self._body = str(exc), b""
            finally:
                if self._resp is not None:
                    self._resp.close()
        return self._body

    def chunks(self) -> Any:
        """The body as it arrives (for a stream)."""
        if self._resp is None or self._body is not None:
            yield self.read()
            return
        try:
            while True:
                chunk = self._resp.read1(65536)
                if not chunk:
                    return
                yield chunk
        finally:
            self._resp.close()

    def message(self) -> str:
        """The error message in an error answer (``handle_decode_error_response``)."""
        raw = self.read()
        try:
            obj = json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")
        if isinstance(obj, dict):
            err = obj.get("error")
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                return err["message"]
            if isinstance(obj.get("message"), str):
                return obj["message"]
        return raw.decode(errors="replace")


# status -> error code suffix, as handle_decode_error_response / process_prefill_response map them
_ERROR_CODES = {400: "bad_request", 404: "not_found", 500: "internal_error", 503: "unavailable",
                502: "bad_gateway"}


def merge_input_logprobs(prefill: Any, decode: Any) -> Any:
    """``merge_logprobs_in_json``: the prefill's ``meta_info.input_token_logprobs`` in front of
    the decode's, when both answers are objects carrying that list."""
    if isinstance(prefill, dict) and isinstance(decode, dict):
        pm, dm = prefill.get("meta_info"), decode.get("meta_info")
        if isinstance(pm, dict) and isinstance(dm, dict):
            p_lp, d_lp = pm.get("input_token_logprobs"), dm.get("input_token_logprobs")
            if isinstance(p_lp, list) and isinstance(d_lp, list):
                dm["input_token_logprobs"] = p_lp + d_lp
    return decode


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

    def relay(h: Handler, up: Upstream) -> None:
        """A worker's 2xx answer to the client: streamed through, or as one body."""
        if up.ctype.startswith("text/event-stream"):
            h.send_response(up.status)
            h.send_header("content-type", up.ctype)
            h.end_headers()
            for chunk in up.chunks():
                h.wfile.write(chunk)
                h.wfile.flush()
            return
        h.send_bytes(up.status, up.read(), up.ctype or "application/json")

    def generate(h: Handler) -> None:
        raw = h.read_body()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("Request must be a JSON object")
        except ValueError as exc:
            h.send_bytes(400, error_body(400, "json_parse_error", f"Invalid JSON data: {exc}"))
            return
        try:
            prefill, decode = router.pick()
        except LookupError as exc:
            h.send_bytes(503, error_body(503, "server_selection_failed", f"No available servers: {exc}"))
            return
        hdrs = router.headers(h.headers)
        if prefill is None:  # regular mode: one worker
            up = Upstream(decode + "/generate", body, hdrs, timeout)
            if not up.status:
                h.send_bytes(502, error_body(502, "request_failed", up.error))
            elif up.status >= 300:
                h.send_bytes(up.status, up.read(), up.ctype or "application/json")
            else:
                relay(h, up)
            return
        purl, bport = prefill
        host = urllib.parse.urlsplit(purl).hostname
        stream, return_logprob = body.get("stream") is True, body.get("return_logprob") is True
        ids = body.get("input_ids")
        batch = len(ids) if isinstance(ids, list) and ids and isinstance(ids[0], list) else None
        if batch is None:
            body = {**body, "bootstrap_host": host, "bootstrap_port": bport,
                    "bootstrap_room": random.getrandbits(63)}
        else:
            body = {**body, "bootstrap_host": [host] * batch, "bootstrap_port": [bport] * batch,
                    "bootstrap_room": [random.getrandbits(63) for _ in range(batch)]}
        result: dict[str, Upstream] = {}

        def to_prefill() -> None:
            up = Upstream(purl + "/generate", body, hdrs, timeout)
            up.read()  # process_prefill_response reads (or consumes) the prefill's whole body
            result["prefill"] = up

        t = threading.Thread(target=to_prefill, daemon=True)
        t.start()
        dec = Upstream(decode + "/generate", body, hdrs, timeout)
        t.join(timeout)
        pre = result.get("prefill")
        if not dec.status:
            h.send_bytes(502, error_body(502, "decode_server_error", f"Decode server error: {dec.error}"))
            return
        if not 200 <= dec.status < 300:
            logger.error("Decode server returned error status decode_url=%s status=%s", decode, dec.status)
            if stream:
                payload = json.dumps({"message": dec.message(), "status": dec.status})
                h.send_bytes(dec.status, f"data: {{'error': {payload}}}".encode(), "text/event-stream")
            else:
                status = dec.status if dec.status in _ERROR_CODES else 500
                h.send_bytes(status, error_body(status, "decode_" + _ERROR_CODES.get(dec.status, "error"),
                                                dec.message()))
            return
        if pre is None or not pre.status:
            why = pre.error if pre is not None else "no answer"
            logger.error("Prefill server failed (CRITICAL) prefill_url=%s error=%s", purl, why)
            h.send_bytes(502, error_body(502, "prefill_server_error",
                                         f"Prefill server error: {why}. This will cause decode timeout."))
            return
        if not 200 <= pre.status < 300:
            text = pre.read().decode(errors="replace")
            logger.error("Prefill server returned error status prefill_url=%s status=%s body=%s",
                         purl, pre.status, text)
            status = pre.status if pre.status in _ERROR_CODES else 500
            h.send_bytes(status, error_body(status, "prefill_" + _ERROR_CODES.get(pre.status, "error"),
                                            f"Prefill server error ({status_text(pre.status)}): {text}"))
            return
        if stream or not return_logprob:
            relay(h, dec)
            return
        out = dec.read()
        try:
            merged = merge_input_logprobs(json.loads(pre.read()), json.loads(out))
            out = json.dumps(merged, separators=(",", ":"), ensure_ascii=False).encode()
        except ValueError:
            logger.warning("Failed to parse responses for prefill/decode merging")
        h.send_bytes(dec.status, out, "application/json")

    def flush_cache(h: Handler) -> None:
        h.read_body()
        urls = router.all_urls()
        if not urls:
            h.send_json(200, {"status": "success", "message": "No HTTP workers available for cache flush",
                              "workers_flushed": 0, "total_http_workers": 0, "total_workers": 0})
            return
        hdrs = {"Authorization": f"Bearer {router.args.api_key}"} if router.args.api_key else {}
        results: dict[str, tuple] = {}

        def one(url: str) -> None:
            results[url] = request("POST", url + "/flush_cache", b"", hdrs, timeout)

        threads = [threading.Thread(target=one, args=(u,), daemon=True) for u in urls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        ok = [u for u in urls if 200 <= results.get(u, (0,))[0] < 300]
        failed = []
        for u in urls:
            status = results.get(u, (0,))[0]
            if not 200 <= status < 300:
                failed.append({"worker": u, "error": f"HTTP {status_text(status)}" if status else
                               f"error sending request for url ({u}/flush_cache)"})
        if not failed:
            h.send_json(200, {"status": "success",
                              "message": f"Successfully flushed cache on all {len(ok)} HTTP workers",
                              "workers_flushed": len(ok), "total_http_workers": len(urls),
                              "total_workers": len(urls)})
            return
        for f in failed:
            logger.warning("Failed to flush cache on worker %s: %s", f["worker"], f["error"])
        h.send_json(206, {"status": "partial_success",
                          "message": f"Cache flush completed: {len(ok)} succeeded, {len(failed)} failed "
                                     f"(out of {len(urls)} HTTP workers)",
                          "workers_flushed": len(ok), "total_http_workers": len(urls),
                          "total_workers": len(urls), "successful": ok, "failed": failed})

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
            ("POST", "/generate"): generate,
            ("POST", "/flush_cache"): flush_cache,
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
