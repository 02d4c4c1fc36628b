"""One error hierarchy and one exit-code table for the whole tool.

Every expected failure is a PatchsetError subclass whose message is a single line that
names the file/line/field or host involved; the CLI prints it and exits with `exit_code`.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_FAILED = 4
EXIT_INTERNAL = 70        # a bug: a short trace here, the full one in the debug log
EXIT_INTERRUPTED = 130    # Ctrl-C


class PatchsetError(Exception):
    """Root of every error the tool expects and reports in one line."""

    exit_code = EXIT_FAILED


class ManifestError(PatchsetError):
    """patches.yaml or a patch file is invalid; names file:line: field."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, file: str, line: int | None, field: str, message: str) -> None:
        self.file, self.line, self.field, self.message = file, line, field, message
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {field}: {message}")


class UsageError(PatchsetError):
    """Bad command-line input (unknown patch name, bad selection, bad host spec)."""

    exit_code = EXIT_BAD_INPUT


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


class HostUnreachable(PatchsetError):
    """A host could not be reached."""

    exit_code = EXIT_UNREACHABLE
