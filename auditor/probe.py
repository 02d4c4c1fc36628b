"""Fidelity probes the `--symptom` next steps end with: small, bounded, standard library.

    python3 -m auditor.probe needle --url http://HOST:PORT --tokens 20000
        a multi-turn chat: turn 1 plants "the token is X", filler turns follow up to
        about N words, the last turn asks for the token of turn 1; pass if the answer has X
    python3 -m auditor.probe greedy --url URL --max-tokens 2000
        the same greedy (temperature 0) generation twice; pass if identical
    python3 -m auditor.probe throughput --url URL --parallel 32
        N parallel 256-token generations; prints completion tokens per second

Each prints one JSON line and exits 0 (pass) or 1 (fail); a server that cannot be reached
exits 3. `--api-key` or $SGLANG_API_KEY is sent as a bearer token. Run it before and after
each isolation step and compare.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

FILLER = ("The quick brown fox jumps over the lazy dog while the operator reads the "
          "deployment notes and checks the queue once more. ")


def chat(url: str, messages: list[dict], max_tokens: int, key: str | None,
         timeout: float = 600) -> dict:
    body = json.dumps({"model": "default", "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", body, headers)
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.loads(resp.read())


def _text(reply: dict) -> str:
    return reply["choices"][0]["message"].get("content") or ""


def needle(url: str, tokens: int, key: str | None) -> dict:
    token = "NEEDLE-" + secrets.token_hex(3).upper()
    messages = [{"role": "user", "content": f"Remember this: the token is {token}."},
                {"role": "assistant", "content": "Noted."}]
    words, turn = 0, 2
    per_turn = max(50, tokens // 20)
    while words < tokens and turn < 200:
        text = (FILLER * (per_turn // len(FILLER.split()) + 1))
        messages += [{"role": "user", "content": f"Turn {turn} notes: {text}"},
                     {"role": "assistant", "content": "Noted."}]
        words += len(text.split())
        turn += 1
    messages.append({"role": "user", "content": "What was the token in turn 1? Answer with "
                                                "the token only."})
    reply = chat(url, messages, 32, key)
    answer = _text(reply)
    return {"probe": "needle", "ok": token in answer, "token": token, "answer": answer[:200],
            "prompt_words": words, "turns": turn, "usage": reply.get("usage")}


def greedy(url: str, max_tokens: int, key: str | None) -> dict:
    messages = [{"role": "user", "content": "Write a detailed, step by step explanation of "
                                            "how a hash map handles collisions."}]
    first, second = (_text(chat(url, messages, max_tokens, key)) for _ in range(2))
    same = first == second
    diverge = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b),
                   None if same else min(len(first), len(second)))
    return {"probe": "greedy", "ok": same, "chars": len(first), "diverges_at": diverge}


def throughput(url: str, parallel: int, key: str | None) -> dict:
    messages = [{"role": "user", "content": "Count slowly from one to five hundred."}]
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(parallel, 64)) as pool:
        replies = list(pool.map(lambda _: chat(url, messages, 256, key), range(parallel)))
    elapsed = time.monotonic() - start
    done = sum((r.get("usage") or {}).get("completion_tokens", 0) for r in replies)
    return {"probe": "throughput", "ok": done > 0, "requests": parallel,
            "completion_tokens": done, "seconds": round(elapsed, 3),
            "tokens_per_second": round(done / elapsed, 1) if elapsed else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m auditor.probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probe", choices=("needle", "greedy", "throughput"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--parallel", type=int, default=32)
    parser.add_argument("--api-key", default=os.environ.get("SGLANG_API_KEY"))
    args = parser.parse_args(argv)
    try:
        if args.probe == "needle":
            result: dict[str, Any] = needle(args.url, args.tokens, args.api_key)
        elif args.probe == "greedy":
            result = greedy(args.url, args.max_tokens, args.api_key)
        else:
            result = throughput(args.url, args.parallel, args.api_key)
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        print(json.dumps({"probe": args.probe, "ok": False, "error": str(exc)}))
        return 3
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
