"""Live audit: facts gathered on each host, effective patch states, checks, ranking, reports.

Data flows one way (each stage a plain function over dataclasses, testable alone):

    gather (on the host, stdlib only: auditor.host + auditor.facts, shipped in one tar)
      -> raw records with provenance -> facts parsed into typed values (auditor.facts)
      -> fact table (auditor.facttable: `namespace.name` -> value, for one server)
      -> effective state of every patch per server (auditor.states)
      -> checks (auditor.checks, one module each) -> findings
      -> suspects for a symptom (auditor.rank) -> Report -> renderers (auditor.render)

This package's __init__ must stay standard-library only: it is shipped to GPU hosts.
"""
