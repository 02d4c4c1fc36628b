"""One error hierarchy and one exit-code table for the whole tool.

Every expected failure is a PatchsetError subclass whose message is a single line that
names the file/line/field or host involved; the CLI prints it and exits with `exit_code`.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Iterable


class Exit(IntEnum):
    """The exit codes of every command; plain ints in JSON. What each means is MEANINGS
    below (docs/reference/exit-codes.md is generated from it). Several results (hosts,
    restarts, checks) give one code: `Exit.combine(codes)`."""

    OK = 0
    FINDINGS = 1
    BAD_INPUT = 2
    UNREACHABLE = 3
    FAILED = 4
    INCONCLUSIVE = 5
    INTERNAL = 70
    INTERRUPTED = 130

    @classmethod
    def combine(cls, codes: Iterable[int]) -> int:
        """The one code of several: UNREACHABLE if any is, else the worst (largest); OK for
        none. A code of the table comes back as its member; any other int unchanged."""
        codes = set(codes)
        worst = cls.UNREACHABLE if cls.UNREACHABLE in codes else max(codes, default=cls.OK)
        return cls(worst) if worst in cls._value2member_map_ else worst


# The one exit-code table: the reference page and the tests read it from here.
MEANINGS: dict[Exit, str] = {
    Exit.OK: "done / clean (audit: every check passed, `info` notes and waived findings "
             "aside)",
    Exit.FINDINGS: "findings: `status` saw drift, hand edits, foreign commits or an "
                   "interrupted transaction; `check` failed (a selection that does not apply "
                   "on the pin); an audit check failed, warned or was `unknown` and no valid "
                   "waiver accepts it, a waiver expired, or a host's facts could not be "
                   "gathered; a probe failed or a drift is above the noise; a bisect found no "
                   "change that flips the probe; a rollout gate failed (or could not "
                   "decide) and the changed hosts were rolled back",
    Exit.BAD_INPUT: "bad input: manifest, patch file, selection, option, inventory, target "
                    "path, a pin the cached wheel or the provisioned tree disagrees with, a "
                    "damaged run or report file (nothing was changed)",
    Exit.UNREACHABLE: "unreachable: a host, the probed endpoint, the package index or "
                      "upstream's git repository could not be reached (an audit still "
                      "reports the others)",
    Exit.FAILED: "refused or failed: the target refused or failed the operation (dirty, not "
                 "the pin, locked, a patch does not apply, the engine was killed; a bisect "
                 "stopped or did not restore; a rollout's rollback failed): nothing was changed, or the next command "
                 "finishes it. `plan HOST` and `apply --dry-run` build the result as `apply` "
                 "does, so a patch that does not apply is the same refusal from all three",
    Exit.INCONCLUSIVE: "inconclusive: a measurement could not decide at the data measured (a "
                       "drift comparison neither above the noise nor bounded below the "
                       "tolerance; a probe whose server gave no text to judge; a bisect that "
                       "left suspects undecided or whose probe could not judge; a `trace` "
                       "that observed nothing on a host); the output says what it would "
                       "take. Could-not-judge is never exit 0",
    Exit.INTERNAL: "internal error (a bug): a one-line summary, the trace in "
                   "`$PATCHSET_HOME/debug.log`",
    Exit.INTERRUPTED: "interrupted (Ctrl-C); a `bisect` restores the host first",
}


class PatchsetError(Exception):
    """Root of every error the tool expects and reports in one line. `kind` and `details`
    are the agent's, for an error that came from a host (patchset/transport.py)."""

    exit_code = Exit.FAILED
    kind: str = ""
    details: str = ""


class ManifestError(PatchsetError):
    """patches.yaml or a patch file is invalid; names file:line: field."""

    exit_code = Exit.BAD_INPUT

    def __init__(self, file: str, line: int | None, field: str, message: str) -> None:
        self.file, self.line, self.field, self.message = file, line, field, message
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {field}: {message}")


class UsageError(PatchsetError):
    """Bad command-line input (unknown patch name, bad selection, bad host spec)."""

    exit_code = Exit.BAD_INPUT


class SelectionError(UsageError):
    """A selection that cannot be satisfied (conflicts, unknown names)."""


class UpstreamError(PatchsetError):
    """The pinned upstream could not be fetched, verified or laid out."""


class TargetError(PatchsetError):
    """The target tree refused the operation (dirty, not the pin, locked, drifted)."""


class LockedError(TargetError):
    """Another patchset process holds the target's lock."""


class BisectPending(TargetError):
    """A bisect holds the host in a test state; `record` says who started it and what to
    restore (the host's `.patchset/bisect.json`)."""

    record: dict = {}


class Unreachable(PatchsetError):
    """No answer: a host (SSH), the server a probe or an audit speaks to (HTTP), the
    package index or upstream's git repository could not be reached. Not a verdict about what is there; the one
    unreachable error of the tool (exit 3)."""

    exit_code = Exit.UNREACHABLE
