"""`python -m patchset.cli`."""

import sys

from . import run

sys.exit(run())
