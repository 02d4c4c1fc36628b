"""`python -m patchset.cli`."""

import sys

from . import main

sys.exit(main())
