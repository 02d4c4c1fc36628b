"""patchset: a quilt-style patch queue for inference-server forks.

Each layer has a folder of its own at the top of the repository (cli/ on top; isolate/;
deploy/ and auditor/; connect/; this folder, the queue and the agent, at the bottom), and
pip installs them all as one package: patchset.cli, patchset.isolate, ... (pyproject's
package-dir), so the wheel claims no generic top-level name. In a checkout the same
names resolve to those folders through this package's search path.
"""

import os

__version__ = "0.1.0"

#: The layer folders above this one, top first (ARCHITECTURE.md).
LAYERS = ("cli", "isolate", "deploy", "auditor", "connect")

_here = os.path.dirname(os.path.abspath(__file__))
_checkout = os.path.dirname(_here)
if not os.path.isdir(os.path.join(_here, "cli")) and all(
        os.path.isfile(os.path.join(_checkout, layer, "__init__.py")) for layer in LAYERS):
    __path__.append(_checkout)   # noqa: F821 (a package's __path__)
