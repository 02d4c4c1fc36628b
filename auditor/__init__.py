"""Live audit: facts gathered on each host, effective patch states, checks, ranking, reports.

Data flows one way (each stage a plain function over dataclasses, testable alone):

    gather (on the host: the agent's gather.py, runner.py and facts/, patchset/agent/)
      -> raw records with provenance -> facts parsed into typed values (the same fact
         classes, patchset.agent.lib.facts, on the controller: auditor.hostfacts)
      -> fact table (auditor.facttable: `namespace.name` -> value, for one server)
      -> effective state of every patch per server (auditor.states)
      -> checks (auditor.checks, one module each) -> findings
      -> suspects for a symptom (auditor.rank) -> Report -> renderers (auditor.render)
"""
