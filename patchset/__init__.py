"""patchset: a quilt-style patch queue for inference-server forks.

One installed package. Its own rooms: series/ (the series model), pin/ (the pin and
upstream), analysis/ (call paths, guards), authoring/ (init, import, capture, adopt,
rebase), agent/ (the host program, and agent/lib/ the library it shares with the
controller). The layers above it keep the folders of the product card at the top of the
repository (cli/, isolate/, deploy/, auditor/, connect/) and are linked into this package
(patchset/cli -> ../cli, ...), so a checkout, the wheel and a type checker resolve the
same module names with no import-time path changes (ARCHITECTURE.md).
"""

__version__ = "0.1.0"

#: The layer folders above this one, top first (ARCHITECTURE.md).
LAYERS = ("cli", "isolate", "deploy", "auditor", "connect")
