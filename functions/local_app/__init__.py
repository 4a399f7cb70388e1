"""Local adapters of the function core: SQLite state and audit, a local load-balancer pool, and a
consumer of the agent's embedded bus. What the demo and `mbridge replay` run on."""
