"""Isolation: narrowing a quality problem down on a live host.

    probe   context-fidelity probes against an OpenAI-compatible endpoint (`patchset
            probe`, `audit --probe`, the `python3 -m patchset.isolate.measure.probe` next steps)
    bisect  A/B the gates, then revert the suspects one at a time, re-probing after each,
            and always put the host back (`patchset bisect`)

The top layer: it uses patchset/ (queue, engine), deploy/ (units, transports) and
auditor/ (ranking, the probe record type); none of them imports it.
"""
