"""The host agent: the one program patchset runs on a host (standard library only).

Shipped to a host as one tar (patchset/transport.py: `bundle`, `BOOTSTRAP`) and run with
the host's python3; run in-process for a local tree. It serves every host operation:
the tree transaction (engine: apply, revert, status, capture, bisect-mark), the systemd
units (deployer: facts, deploy), and the audit's fact gathering (gather). Every host read
goes through runner.py and the fact classes (facts/); staleness has one rule
(staleness.py); redaction one implementation (redact.py). Only relative imports inside:
on a host the package is named `patchset_agent`, so it never meets another installed
patchset.
"""
