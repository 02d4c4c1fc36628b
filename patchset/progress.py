"""Progress reporting without a UI dependency.

Library code (provisioning, apply) reports long steps through this Protocol so it never
imports rich; the CLI passes a rich-backed implementation, tests and quiet runs pass
NullProgress (the default everywhere).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

Advance = Callable[[int], None]


class Progress(Protocol):
    """Something that can show a task with an optional total and advance it."""

    def task(self, description: str, total: int | None = None) -> AbstractContextManager[Advance]:
        """Open a task; the yielded callable advances it by n units (bytes, files).

        total=None means an indeterminate phase (a spinner): callers still may call
        advance, and the task ends when the context exits, successfully or not.
        """
        ...


def _ignore(n: int) -> None:
    """An advance callable that drops its argument."""


class NullProgress:
    """Shows nothing; the default, so library calls need no UI to run."""

    @contextmanager
    def task(self, description: str, total: int | None = None) -> Iterator[Advance]:
        yield _ignore
