"""Fault injection for the kill-at-any-point tests: the engine, bisect and rollout name
their crash points, and a test run with PATCHSET_TEST_CRASH_AT=label is SIGKILLed there.
Unset (every real run), a crash point does nothing."""

from __future__ import annotations

import os
import signal


def crash_point(label: str) -> None:
    """Fault injection for the kill-at-any-point tests: PATCHSET_TEST_CRASH_AT=label."""
    if os.environ.get("PATCHSET_TEST_CRASH_AT") == label:
        os.kill(os.getpid(), signal.SIGKILL)
