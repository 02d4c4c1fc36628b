"""`python3 -m patchset_agent BUNDLE_DIR` (shipped) or `python -m patchset.agent BUNDLE_DIR`."""

import sys

from .main import main

sys.exit(main(sys.argv))
