"""/healthz, /readyz and /metrics (Prometheus text format) on the agent's --listen address.

`/readyz` is how a health-probe load balancer drains the VM with no control-plane
permission at all: it turns unready on a `drain` command and ready again on `restore`
(docs/contracts.md#what-the-agent-checks). Without a command channel it is unready while an impactful event for
this VM is pending, so the load balancer drains the VM on its own.

Anyone who can reach --listen can connect, so the server is one thread around a selector:
a connection costs a buffer, never a thread, and each has a deadline, a size limit and a
place in a bounded table (ConnectionLimits; docs/agent.md, "Health and metrics").

- `server`: the HTTP server (one thread, a selector, bounded connections)
- `endpoints`: what each path answers
- `readiness`: ready or drained, and why
- `metrics`: the registry of counters, gauges and histograms
"""

from __future__ import annotations

from agent.health.endpoints import METRICS_CONTENT_TYPE
from agent.health.metrics import LAG_BUCKETS, Histogram, Metrics
from agent.health.readiness import Readiness
from agent.health.server import DEFAULT_LIMITS, DEFAULT_PORT, ConnectionLimits, HealthServer

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_PORT",
    "LAG_BUCKETS",
    "METRICS_CONTENT_TYPE",
    "ConnectionLimits",
    "HealthServer",
    "Histogram",
    "Metrics",
    "Readiness",
]
