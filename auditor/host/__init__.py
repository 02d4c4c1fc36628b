"""The part of the auditor that runs on the audited host (standard library only).

`gather` is shipped, together with `auditor.facts` and patchset's engine, as one tar and
run with the host's python3: one round trip per host, like the engine's apply.
"""
