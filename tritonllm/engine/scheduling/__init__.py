"""Which sequences run in a step and how many of their tokens: the scheduler (priorities, chunked prefill,
preemption), the KV block pool with its prefix cache, and the step cost model the scheduler budgets with. Imports
`state/` only."""
