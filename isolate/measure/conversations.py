"""The drift probe's conversations: long, multi-turn, with tools, and the same on every run.

Why generated and not a dataset: nothing may be downloaded (the users' GPU hosts are often
offline, and a probe must not depend on a hub), and an A/B compares runs token for token,
so the text must be identical wherever and whenever it is built. Each conversation is an
operator's session with an assistant that calls tools (metrics, logs, a query) and
summarises what they returned: the shape of the agent sessions where the users' drift
was first reported, with numbers and names the model must carry across turns.

The text is rendered with neutral role tags, not a model's chat template: `/generate`
takes the text as it is and the server's own tokenizer turns it into ids (no local
tokenizer), and drift is a comparison of the server with itself, which any template
serves equally.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import TypedDict

WORDS_PER_TOKEN = 0.75          # English prose: real tokenizers give >= 1.3 tokens per word
DEFAULT_SIZES = (8192, 16384, 32768)
SERVICES = ("checkout", "search", "ledger", "gateway", "scheduler", "billing", "inventory",
            "auth", "router", "indexer", "mailer", "reports")
METRICS = ("p99 latency", "error rate", "queue depth", "GPU memory", "tokens per second",
           "cache hit rate", "restarts")
LEVELS = ("INFO", "WARN", "ERROR")
EVENTS = ("request served", "retry scheduled", "connection reset", "batch flushed",
          "cache evicted", "worker restarted", "timeout waiting for upstream",
          "config reloaded", "checkpoint loaded", "slow query logged")
class Tool(TypedDict):
    name: str
    description: str
    parameters: dict[str, str]


TOOLS: list[Tool] = [
    {"name": "get_metrics", "description": "Recent values of one metric of a service.",
     "parameters": {"service": "string", "metric": "string", "minutes": "integer"}},
    {"name": "read_log", "description": "The last lines of a service's log.",
     "parameters": {"service": "string", "lines": "integer"}},
    {"name": "run_query", "description": "A read-only SQL query on the operations database.",
     "parameters": {"sql": "string"}},
]


@dataclass(frozen=True)
class Conversation:
    name: str            # e.g. "ops-16k"
    size: int            # the size asked for, in tokens (estimated from words)
    text: str            # rendered, ending with the assistant's turn to speak
    follow_up: str       # the next user turn, for the second-turn variant
    turns: int


def build(size: int, seed: int = 0) -> Conversation:
    """One conversation of about `size` tokens; the same (size, seed) gives the same text."""
    rng = random.Random(f"patchset-drift/{size}/{seed}")
    parts = [_tag("system", "You are an operations assistant. Call a tool when you need "
                            "data, then answer from what it returned. Tools: "
                  + json.dumps(TOOLS, sort_keys=True))]
    words, turns = _words(parts[0]), 0
    while words < size * WORDS_PER_TOKEN:
        turn = _cycle(rng, turns)
        parts += turn
        words += sum(_words(p) for p in turn)
        turns += 1
    service = rng.choice(SERVICES)
    parts.append(_tag("user", f"Across everything above, which service looked worst, and "
                              f"what would you check first on {service}?"))
    follow = (f"Now compare the {rng.choice(METRICS)} of {service} with the first tool "
              "result of this session and say whether it got better or worse.")
    return Conversation(name=f"ops-{_label(size)}", size=size,
                        text="".join(parts) + "<|assistant|>\n",
                        follow_up=_tag("user", follow) + "<|assistant|>\n", turns=turns)


def build_all(sizes: tuple[int, ...] = DEFAULT_SIZES, seed: int = 0) -> list[Conversation]:
    return [build(size, seed) for size in sizes]


def _cycle(rng: random.Random, turn: int) -> list[str]:
    """One user question, the assistant's tool call, the tool's result, the summary."""
    service, metric = rng.choice(SERVICES), rng.choice(METRICS)
    tool = TOOLS[turn % len(TOOLS)]["name"]
    if tool == "get_metrics":
        args = {"service": service, "metric": metric, "minutes": rng.choice((15, 30, 60))}
        values = [round(rng.uniform(0.5, 250.0), 2) for _ in range(24)]
        result = {"service": service, "metric": metric, "values": values}
        summary = (f"The {metric} of {service} ranged from {min(values)} to {max(values)}, "
                   f"ending at {values[-1]}; the median was {sorted(values)[12]}.")
    elif tool == "read_log":
        args = {"service": service, "lines": 20}
        lines = [f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d} "
                 f"{rng.choice(LEVELS)} {service}[{rng.randint(100, 999)}] "
                 f"{rng.choice(EVENTS)} id={rng.randint(10000, 99999)}" for _ in range(20)]
        result = {"service": service, "lines": lines}
        errors = sum(" ERROR " in line for line in lines)
        summary = (f"The last 20 lines of {service} hold {errors} errors; the most recent "
                   f"entry is: {lines[-1]}.")
    else:
        table = rng.choice(("incidents", "deploys", "alerts"))
        args = {"sql": f"SELECT service, count(*) FROM {table} GROUP BY service"}
        rows = [(s, rng.randint(0, 40)) for s in rng.sample(SERVICES, 6)]   # JSON arrays
        result = {"columns": ["service", "count"], "rows": rows}
        worst = max(rows, key=lambda r: r[1])
        summary = f"In {table}, {worst[0]} leads with {worst[1]}; {len(rows)} services listed."
    question = (f"Turn {turn + 1}: what is going on with {service}? Look at its "
                f"{metric if tool == 'get_metrics' else tool.replace('_', ' ')}.")
    call = json.dumps({"name": tool, "arguments": args}, sort_keys=True)
    return [_tag("user", question), _tag("assistant", f"<tool_call>{call}</tool_call>"),
            _tag("tool", json.dumps(result, sort_keys=True)), _tag("assistant", summary)]


def _tag(role: str, text: str) -> str:
    return f"<|{role}|>\n{text}\n"


def _words(text: str) -> int:
    return len(text.split())


def _label(size: int) -> str:
    return f"{size // 1024}k" if size % 1024 == 0 else str(size)
