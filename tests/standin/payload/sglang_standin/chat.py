"""Deterministic chat answers and injectable context faults (no model here).

Tokens: the stand-in's "tokenizer" counts whitespace-separated words of the
message contents (roles are not counted).  ``usage.prompt_tokens`` is that
count for what the server *sees*; ``truncate:N`` keeps the last N of them.

Faults, from ``STANDIN_FAULT`` (comma-separated, read once at startup):

* ``drop_history``: the server sees only the system messages and the last
  message of the conversation (earlier turns are silently dropped);
* ``truncate:N``: the server sees only the last N tokens of the conversation
  (left truncation, as a context window that silently cuts the start);
* ``none`` or empty: no fault.

An unknown fault name is a startup error (a typo must not pass as "no fault").

``STANDIN_FAULT_RULES=FILE`` (JSON list) ties faults to the code that is really
there, so a test can model "this patch (with its gate on) breaks context": each
rule ``{"fault": F, "file": "srt/...py", "contains": TEXT, "env": NAME,
"equals": VALUE}`` adds fault F when every condition it names holds: ``file``
(relative to the served ``sglang`` package) contains TEXT, and the server's
environment has NAME=VALUE.  Read once at startup, like the real code paths.

Answers depend only on what the server sees, so a fidelity probe can plant a
token and ask for it later:

1. Recall: when the last user message mentions ``token`` and ``turn N``, the
   answer is the token planted in the N-th *visible* user message, i.e. the
   word after ``token`` (``token is X``, ``token: X``, ``token X``), or
   ``I don't know.`` when there is no such message or token.
2. Count: ``how many turns`` / ``how many messages`` -> the number of visible
   user messages, as digits.
3. Anything else: ``You said: <last user message>``.

``max_tokens`` / ``max_completion_tokens`` cut the answer (finish_reason
``length``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

FAULT_ENV = "STANDIN_FAULT"

_RECALL_TURN = re.compile(r"\bturn\s+(\d+)\b", re.I)
_TOKEN_WORD = re.compile(r"\btoken\b", re.I)
_PLANTED = re.compile(r"\btoken\b\W*(?:(?:is|was)\b\W*)?([A-Za-z0-9][\w\-]*)", re.I)
_COUNT = re.compile(r"\bhow many (?:turns|messages)\b", re.I)


@dataclasses.dataclass(frozen=True)
class Faults:
    drop_history: bool = False
    truncate: int | None = None

    @classmethod
    def parse(cls, text: str | None) -> "Faults":
        drop, trunc = False, None
        for item in (text or "").replace(";", ",").split(","):
            item = item.strip()
            if not item or item == "none":
                continue
            if item == "drop_history":
                drop = True
            elif item.startswith("truncate:") and item[len("truncate:"):].isdigit():
                trunc = int(item[len("truncate:"):])
            else:
                raise ValueError(f"{FAULT_ENV}: unknown fault {item!r} (drop_history | truncate:N | none)")
        return cls(drop, trunc)

    def __str__(self) -> str:
        parts = (["drop_history"] if self.drop_history else []) + (
            [f"truncate:{self.truncate}"] if self.truncate is not None else []
        )
        return ",".join(parts) or "none"

    def apply(self, messages: list[dict]) -> list[dict]:
        """What the server sees of *messages* (normalized ``{role, content}``)."""
        seen = list(messages)
        if self.drop_history and seen:
            seen = [m for m in seen[:-1] if m["role"] == "system"] + [seen[-1]]
        if self.truncate is not None:
            budget = self.truncate
            kept: list[dict] = []
            for m in reversed(seen):
                words = m["content"].split()
                if budget <= 0:
                    break
                if len(words) > budget:
                    kept.append({"role": m["role"], "content": " ".join(words[-budget:])})
                    budget = 0
                    break
                kept.append(m)
                budget -= len(words)
            seen = list(reversed(kept))
        return seen


RULES_ENV = "STANDIN_FAULT_RULES"


def load_rules(rules_file: str) -> list[dict]:
    """The JSON list of rule objects in *rules_file* (ValueError on another shape)."""
    import json
    import pathlib
    rules = json.loads(pathlib.Path(rules_file).read_text())
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise ValueError(f"{rules_file}: must be a JSON list of objects")
    return rules


def rule_holds(rule: dict, pkg_dir: Any, environ: dict) -> bool:
    """Every condition *rule* names holds for this server: ``file`` (relative to the served
    ``sglang`` package dir *pkg_dir*) exists and contains ``contains``; the environment
    has ``env`` = ``equals``.  Shared by the fault rules and the numerics rules (toy.py)."""
    import pathlib
    if "file" in rule:
        path = pathlib.Path(pkg_dir) / rule["file"]
        if not path.is_file() or rule.get("contains", "") not in path.read_text(errors="replace"):
            return False
    if "env" in rule and environ.get(rule["env"]) != rule.get("equals"):
        return False
    return True


def rule_faults(rules_file: str | None, pkg_dir: Any, environ: dict) -> list[str]:
    """The faults of the rules in *rules_file* whose conditions hold for this server."""
    if not rules_file:
        return []
    return [rule["fault"] for rule in load_rules(rules_file) if rule_holds(rule, pkg_dir, environ)]


def normalize(messages: Any) -> list[dict]:
    """OpenAI messages -> ``[{role, content: str}]``; ValueError on a bad shape."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError("each message needs a role")
        content = m.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            text = " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        else:
            raise ValueError("message content must be a string or a list of parts")
        out.append({"role": str(m["role"]), "content": text})
    return out


def count_tokens(messages: list[dict]) -> int:
    return sum(len(m["content"].split()) for m in messages)


def answer(seen: list[dict]) -> str:
    users = [m["content"] for m in seen if m["role"] == "user"]
    if not users:
        return "I see no question."
    last = users[-1]
    turn = _RECALL_TURN.search(last)
    if turn and _TOKEN_WORD.search(last):
        n = int(turn.group(1))
        earlier = users[:-1]
        if 1 <= n <= len(earlier):
            planted = _PLANTED.search(earlier[n - 1])
            if planted:
                return planted.group(1)
        return "I don't know."
    if _COUNT.search(last):
        return str(len(users))
    return f"You said: {last}"


def complete(seen: list[dict], max_tokens: int | None) -> tuple[str, str, int]:
    """(text, finish_reason, completion_tokens) for what the server sees."""
    text = answer(seen)
    words = text.split()
    if max_tokens is not None and max_tokens >= 0 and len(words) > max_tokens:
        return " ".join(words[:max_tokens]), "length", max_tokens
    return text, "stop", len(words)
