"""How long after a drain through the agent's /readyz the load balancers have seen the VM unready
(docs/policy.md#probe-aware-drains): read from the balancers where the app can read them (a reader
of the cloud's, given to `ReadinessBalancer`), else the policy's `readiness_probe_seconds`.

A read never stops a drain. A reader that fails (the cloud unreachable, a permission missing) is
logged, a missing permission as an error with `alert=probe-unread`, and the configured value is
used. What a reader gives is checked before it is recorded in the memento: a finite number of
seconds, 0 or more; anything else (negative, NaN, infinite, not a number) is refused, logged, and
the configured value used. A recorded value is checked again where it is used, since the memento
comes back from the store, and one longer than the approval can wait (`command_ttl_seconds` less
`drain_period_seconds`, the bound the policy puts on the configured value) is cut to that bound:
an approval whose `execute_at` passed its expiry could not be sent at all, while a cut one still
goes out as late as it may.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional

from functions.core.log_fields import fields
from functions.core.policy import Policy
from functions.core.ports import JsonObject
from wire.bounds import bounded
from wire.errors import PermanentError

LOGGER = logging.getLogger("mbridge.functions")

# Where the readiness part of a drain's memento keeps the value read: a retry of the drain and the
# audit see the number the drain was counted with, even if the balancer's probe changed since.
MEMENTO_KEY = "probe_seconds"
READ = "read from the load balancer"
CONFIGURED = "the policy's readiness_probe_seconds"
ALERT = "probe-unread"
# The approval is issued a moment after the VM left, so its execute_at (the VM out, plus this delay,
# plus the drain period) must stay a little inside its time to live, not just at it.
TTL_MARGIN_SECONDS = 1.0

# A VM's name → the detection time of the balancers that probe its /readyz, or None when unknown.
ProbeReader = Callable[[str], Optional[float]]


@dataclass(frozen=True)
class ProbeDelay:
    """How long after a readiness drain the VM counts as out, and where that number came from."""

    seconds: float
    source: str  # READ or CONFIGURED
    read: float | None = None  # the value read, when it was cut to `seconds`

    def said(self) -> str:
        """The delay as the audit records it beside the drain."""
        cut = "" if self.read is None else f", cut from {_secs(self.read)} to what command_ttl_seconds allows"
        return f"out once the balancer's probe saw it: {_secs(self.seconds)} ({self.source}{cut})"


def read_seconds(reader: ProbeReader, vm: str) -> float | None:
    """What `reader` says of `vm`, checked; None (the configured value then applies) when it does not
    know, fails or gives something that is no number of seconds."""
    try:
        value = reader(vm)
    except PermanentError as exc:
        # A misconfiguration (a permission missing): every readiness drain falls back until it is
        # fixed, so it is logged as an error, with what the reader says to grant.
        LOGGER.error(
            "the load balancers' probe of %s could not be read, so the policy's readiness_probe_seconds is used: %s",
            bounded(vm, 200),
            bounded(str(exc)),
            extra=fields(vm=bounded(vm), alert=ALERT),
        )
        return None
    except Exception as exc:
        # Anything else (the cloud busy or unreachable) passes; the drain is not held up for it.
        LOGGER.warning(
            "the load balancers' probe of %s could not be read now, so the policy's readiness_probe_seconds is "
            "used: %s",
            bounded(vm, 200),
            bounded(f"{type(exc).__name__}: {exc}"),
            extra=fields(vm=bounded(vm)),
        )
        return None
    if value is None:
        return None
    checked = seconds_or_none(value)
    if checked is None:
        LOGGER.warning(
            "the load balancers' probe of %s read as %s, which is no number of seconds: the policy's "
            "readiness_probe_seconds is used",
            bounded(vm, 200),
            bounded(repr(value), 100),
            extra=fields(vm=bounded(vm)),
        )
    return checked


def delay(part: JsonObject, policy: Policy, vm: str) -> ProbeDelay:
    """The delay of a drain whose memento's readiness part is `part`: the value recorded there when it
    is usable (cut to what the approval can wait), else the policy's (a memento of an earlier version
    records none)."""
    configured = ProbeDelay(float(policy.readiness_probe_seconds), CONFIGURED)
    if MEMENTO_KEY not in part:
        return configured
    recorded = seconds_or_none(part[MEMENTO_KEY])
    if recorded is None:
        LOGGER.warning(
            "the drain of %s recorded %s as its probe's seconds: the policy's readiness_probe_seconds is used",
            bounded(vm, 200),
            bounded(repr(part[MEMENTO_KEY]), 100),
            extra=fields(vm=bounded(vm)),
        )
        return configured
    limit = max(0.0, policy.command_ttl_seconds - policy.drain_period_seconds - TTL_MARGIN_SECONDS)
    if recorded > limit:
        LOGGER.warning(
            "the load balancers take %s to see %s unready, longer than an approval can wait (command_ttl_seconds "
            "less drain_period_seconds): counted as %s; raise command_ttl_seconds to wait it out",
            _secs(recorded),
            bounded(vm, 200),
            _secs(limit),
            extra=fields(vm=bounded(vm)),
        )
        return ProbeDelay(limit, READ, read=recorded)
    return ProbeDelay(recorded, READ)


def seconds_or_none(value: object) -> float | None:
    """`value` as a number of seconds a probe can take (finite, 0 or more), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _secs(seconds: float) -> str:
    return f"{seconds:g} s"
