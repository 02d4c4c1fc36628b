"""The agent's library: standard-library modules shipped to every host with the agent and
the only part of the agent the controller may import (Ansible's module_utils split): the
wire and its records, the bounded reader, the one writer, the one git runner, the diff
parser, redaction, the fact classes, the tracer's vocabulary. Only relative imports, and
nothing from the host program above it (patchset/agent/*.py)."""
