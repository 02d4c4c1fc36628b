"""Rolling a change out: the plan, its gates, the resumable log, and the run itself
(canary, then batches; roll back every changed host on a failed gate)."""
