"""The one validation layer for strings that come from outside: manifests, inventories,
the command line.

Every check is a *whole-string* match (`re.fullmatch`): a pattern written `^...$` and used
with `re.match` accepts a trailing newline (Python's `$` matches before a final `\\n`), so
`"gpu1\\n"` would reach the network and a gate value `"1\\nLD_PRELOAD=..."` an env file.
Patterns here carry no anchors at all; `tests/hardening/test_hardening_strings.py` asserts
that no product module keeps a `$`-anchored pattern.

Standard library only: deploy/units.py and the host-side modules import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# C0 and C1 controls, DEL, the Unicode line/paragraph separators and the bidirectional
# controls (the "Trojan Source" set, CVE-2021-42574: text that reads one way and is stored
# another): none of them may travel from input into an env file, a unit, a command line,
# a report or a message.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{_BIDI}]")
_CONTROL_NO_TAB = re.compile(f"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029{_BIDI}]")


@dataclass(frozen=True)
class Rule:
    """A named whole-string pattern; `what` completes "is not ..." in messages."""

    regex: str
    what: str

    def ok(self, value: object) -> bool:
        return isinstance(value, str) and re.fullmatch(self.regex, value) is not None


PATCH_NAME = Rule(r"[a-z0-9][a-z0-9-]{0,62}", "a patch name ([a-z0-9-], at most 63)")
ENV_NAME = Rule(r"[A-Za-z_][A-Za-z0-9_]{0,127}", "an environment variable name")
# A gate's "on" value lands in an env file and is compared with a process's environ:
# a plain token, never a second assignment or a shell word.
GATE_VALUE = Rule(r"[A-Za-z0-9_.:,+-]{1,64}", "a plain gate value (letters, digits, "
                  "_ . : , + -)")
SHA256 = Rule(r"[0-9a-f]{64}", "a 64-hex sha256")
SHORT_SHA = Rule(r"[0-9a-f]{12,64}", "a hex digest (12-64)")
VERSION = Rule(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}", "a version (e.g. 0.5.14)")
PYTHON_VERSION = Rule(r"[0-9]\.[0-9]{1,2}", "a Python version like 3.11")
PLATFORM = Rule(r"[A-Za-z0-9_.]{1,100}", "a wheel platform tag")
WHEEL_FILE = Rule(r"[A-Za-z0-9_.+!-]{1,200}\.whl", "a wheel file name")
HOST_NAME = Rule(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", "an inventory host name")
ADDRESS = Rule(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]",
               "a host name or address")
BIND = Rule(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|[0-9A-Fa-f:.]{2,45}", "a bind address")
USER = Rule(r"[a-z_][a-z0-9_.-]{0,31}", "a user name")
ABS_PATH = Rule(r"/[A-Za-z0-9_./+@-]{0,4095}", "an absolute path")
REMOTE_PATH = Rule(r"(?:~/|/)[A-Za-z0-9_./+@-]{0,4095}", "an absolute or ~/ path")
KEY_FILE = Rule(r"~?/[A-Za-z0-9_./+@-]{0,4095}", "a key file path")
PROXY_JUMP = Rule(r"[A-Za-z0-9_.@:,\[\]][A-Za-z0-9_.@:,\[\]-]{0,511}", "a ProxyJump spec")
GPUS = Rule(r"[0-9]{1,3}(?:,[0-9]{1,3}){0,255}", "a GPU list like \"0,1,2,3\"")
MODEL = Rule(r"[A-Za-z0-9_./+@:][A-Za-z0-9_./+@:-]{0,4095}", "a model path or id")
TOKEN = Rule(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}", "a plain token")
HTTP_URL = Rule(r"https?://(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\])"
                r"(?::[0-9]{1,5})?/?", "an http(s)://host:port URL")

MODULE_NAME = Rule(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", "a dotted module name")
QUALNAME = Rule(r"<module>|[A-Za-z_][A-Za-z0-9_]*(?:\.(?:<locals>|[A-Za-z_][A-Za-z0-9_]*))*",
                "a qualified name (`Class.method`, `f.<locals>.g`) or <module>")

# Variables a patch gate may never be: the loader's and interpreters' code-loading hooks,
# the shell's, and the ones deploy sets itself (deploy/units.py MANAGED_ENV).
RESERVED_ENV_PREFIXES = ("LD_", "DYLD_", "PYTHON", "GCONV_", "MALLOC_")
RESERVED_ENV = frozenset({
    "PATH", "HOME", "SHELL", "IFS", "ENV", "BASH_ENV", "PERL5LIB", "PERL5OPT", "RUBYOPT",
    "NODE_OPTIONS", "LOCPATH", "NLSPATH", "TMPDIR", "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER", "PATCHSET_PATCHES", "PATCHSET_TREE", "SPT_NOENV", "PATCHSET_TRACE",
    "PATCHSET_TRACE_DIR"})


def reserved_env(name: str) -> bool:
    return name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)


def control_char(value: str, allow_tab: bool = False) -> str | None:
    """The first control character in `value`, or None."""
    found = (_CONTROL_NO_TAB if allow_tab else CONTROL).search(value)
    return found.group() if found else None


def printable(text: str) -> str:
    """`text` with every control character shown as an escape (`\\x1b`, `\\n`, `\\r`):
    messages quote input, and input must never move the cursor or clear a terminal."""
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def describe(char: str) -> str:
    names = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte",
             "\t": "a tab", "\x1b": "an escape character"}
    return names.get(char) or "control character " + printable(char)
