"""What the terminal says about an approval agrees with what was sent.

The platform rule once said "approve after the 3 s drain period" while the approval of a Spot
eviction went out at once (its 30 s of notice, 3 s at the demo's speed, end before the drain
period would). The decision's reason and the demo's line for the approval are both read from the
audit log the real function core writes.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from functions.core.policy import Policy
from functions.core.process import Deps, process
from functions.local_app.store import SqliteStore
from mbridge.demo.timeline import EventTimeline, Observer
from tests.factories import azure_event
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.envelope import encode, envelope_for_event
from wire.identity import ReporterName
from wire.model import Cloud, EventKind

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
DEMO_POLICY = Policy(drain_period_seconds=3.0)  # the demo's default --drain-period


def narrate(kind: EventKind, vm: str, notice_seconds: float) -> list[tuple[str, str]]:
    """(stage, detail) lines the demo prints for `vm`'s own report of a platform event with this
    much notice, as the function core handles it with the demo's policy."""
    store = SqliteStore(":memory:")
    try:
        deps = Deps(
            store=store,
            balancer=FakeBalancer({"pool": (vm,)}),
            sender=RecordingSender(),
            audit=store,
            policy=DEMO_POLICY,
            monotonic=FakeClock(NOW).monotonic,
            verifier=ReporterName(),  # who may speak for a VM is not what this test is about
        )
        event = azure_event(
            kind=kind, event_id="1C8E5A90-4D2B-4E77-B013-6F9A2C3D5E33", reporter=vm, resources=(vm,),
            duration_seconds=-1, not_before=NOW + timedelta(seconds=notice_seconds),
        )  # fmt: skip
        process(encode(envelope_for_event(event, NOW)), deps, NOW)
        seen: list[tuple[str, str]] = []
        timeline = EventTimeline("flow", Cloud.AZURE, kind, event.event_id, injected_at=NOW)
        observer = Observer([timeline], lambda _timeline, stage, detail, _when: seen.append((stage, detail)))
        for record in store.query():
            observer.audit(record)
        return seen
    finally:
        store.close()


def line(seen: list[tuple[str, str]], stage: str) -> str:
    (detail,) = [detail for name, detail in seen if name == stage]
    return detail


def test_a_spot_eviction_approved_at_once_is_said_to_be_approved_at_once() -> None:
    # WHEN spot-0's Preempt arrives with the 3 s of notice it has at the demo's speed
    seen = narrate(EventKind.PREEMPT, "spot-0", notice_seconds=3)

    # THEN the decision says why the approval does not wait, and the approval line agrees
    decided = line(seen, "decided")
    assert "approve at once: the 3 s drain period would pass NotBefore less the 5 s margin" in decided
    assert "after the 3 s drain period" not in decided
    assert line(seen, "approval sent") == "to spot-0, at once"


@pytest.mark.parametrize(
    ("notice_seconds", "decided", "sent"),
    [
        (90, "approve after the 3 s drain period", "3.0 s after the drain"),
        (7, "approve 2 s after the drain: capped by NotBefore less the 5 s margin", "2.0 s after the drain"),
    ],
)
def test_an_approval_that_waits_says_how_long_and_the_decision_says_why(
    notice_seconds: float, decided: str, sent: str
) -> None:
    seen = narrate(EventKind.REBOOT, "web-0", notice_seconds)
    assert decided in line(seen, "decided")
    assert line(seen, "approval sent").endswith(sent)
