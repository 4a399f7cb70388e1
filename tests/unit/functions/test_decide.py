"""`decide(event, policy, now)`: the default policy of docs/contracts.md#default-policy, rule by rule.

The decision table below names, for each situation, the rule that must win and the exact
actions it must produce. A sweep over the whole cross product of kinds, statuses, sources,
durations and reporters then checks the invariants that hold for every decision.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from functions.core.decide import Action, Approve, Decision, Drain, PerformMaintenance, Restore, decide
from functions.core.policy import DEFAULT_POLICY, Policy
from tests.factories import OBSERVED_AT, azure_event
from wire.model import Cloud, EventKind, EventSource, EventStatus, MaintenanceEvent

NOW = OBSERVED_AT  # 22:11:58 UTC; the factory's NotBefore is 15 minutes later
SET = ("WestNO_0", "WestNO_1")
DRAIN_SET = Drain(SET)
GCE_VM = "gce-vm-1"

S = EventStatus
K = EventKind
USER = EventSource.USER
PLATFORM = EventSource.PLATFORM


def at(seconds: float, base: datetime = NOW) -> datetime:
    return base + timedelta(seconds=seconds)


GCE_RAW = {  # metadata key and value of each kind, as the agent records them
    EventKind.LIVE_MIGRATE: ("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE"),
    EventKind.HOST_TERMINATE: ("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE"),
    EventKind.PREEMPT: ("preempted", "TRUE"),
    EventKind.UPCOMING: ("upcoming-maintenance", None),
    EventKind.UNKNOWN: ("maintenance-event", "SUSPEND_ON_HOST_MAINTENANCE"),
}


def gce_event(
    kind: EventKind,
    status: EventStatus = EventStatus.SCHEDULED,
    *,
    can_reschedule: Any = None,
    raw_value: Any = None,
) -> MaintenanceEvent:
    """A GCE event as the agent builds it: the reporter is its only resource."""
    if raw_value is None and kind is EventKind.UPCOMING:
        raw_value = {"maintenanceType": "SCHEDULED", "maintenanceStatus": "PENDING"}
        if can_reschedule is not None:
            raw_value["canReschedule"] = can_reschedule
    return MaintenanceEvent(
        cloud=Cloud.GCE,
        event_id="5f3c1f6e0a0b4c1d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d",
        kind=kind,
        status=status,
        reporter=GCE_VM,
        sequence="etag-1",
        resources=(GCE_VM,),
        not_before=at(60),
        raw={"key": GCE_RAW[kind][0], "value": raw_value if raw_value is not None else GCE_RAW[kind][1]},
    )


def window(start: int, end: int) -> Policy:
    return Policy(gce_upcoming_action="perform_maintenance", maintenance_window_utc=(start, end))


def case(
    case_id: str,
    event: MaintenanceEvent,
    rule: str,
    actions: tuple[Action, ...],
    policy: Policy = DEFAULT_POLICY,
    now: datetime = NOW,
) -> Any:
    return pytest.param(event, policy, now, rule, actions, id=case_id)


PERFORM = (Drain((GCE_VM,)), PerformMaintenance(GCE_VM))

DECISION_TABLE = [
    # --- rule 1: completed / canceled → restore what was drained, never approve ---------------
    case("completed-freeze", azure_event(status=S.COMPLETED), "1-ended", (Restore(),)),
    case("canceled-freeze", azure_event(status=S.CANCELED), "1-ended", (Restore(),)),
    case("completed-0s-freeze", azure_event(status=S.COMPLETED, duration_seconds=0), "1-ended", (Restore(),)),
    case("canceled-10s-freeze", azure_event(status=S.CANCELED, duration_seconds=10), "1-ended", (Restore(),)),
    case(
        "completed-user-reboot",
        azure_event(kind=K.REBOOT, status=S.COMPLETED, event_source=USER),
        "1-ended",
        (Restore(),),
    ),
    case("canceled-platform-redeploy", azure_event(kind=K.REDEPLOY, status=S.CANCELED), "1-ended", (Restore(),)),
    case(
        "completed-reboot-reporter-not-affected",
        azure_event(kind=K.REBOOT, status=S.COMPLETED, reporter="WestNO_2"),
        "1-ended",
        (Restore(),),
    ),
    case("completed-terminate-vm-gone", azure_event(kind=K.TERMINATE, status=S.COMPLETED), "1-ended", ()),
    case("completed-azure-preempt-vm-gone", azure_event(kind=K.PREEMPT, status=S.COMPLETED), "1-ended", ()),
    case("completed-gce-preempt-vm-gone", gce_event(K.PREEMPT, S.COMPLETED), "1-ended", ()),
    case("completed-gce-live-migrate", gce_event(K.LIVE_MIGRATE, S.COMPLETED), "1-ended", (Restore(),)),
    case("completed-gce-host-terminate", gce_event(K.HOST_TERMINATE, S.COMPLETED), "1-ended", (Restore(),)),
    case("completed-gce-upcoming", gce_event(K.UPCOMING, S.COMPLETED), "1-ended", (Restore(),)),
    case(
        "completed-with-approvals-on-in-window",
        gce_event(K.UPCOMING, S.COMPLETED, can_reschedule=True),
        "1-ended",
        (Restore(),),
        window(0, 23),
    ),
    # --- rule 2: started (no notice, or the next step) → drain the VMs in Resources -------------
    case("started-platform-reboot", azure_event(kind=K.REBOOT, status=S.STARTED), "2-started", (DRAIN_SET,)),
    case(
        "started-user-redeploy",
        azure_event(kind=K.REDEPLOY, status=S.STARTED, event_source=USER),
        "2-started",
        (DRAIN_SET,),
    ),
    case("started-unknown-freeze", azure_event(status=S.STARTED, duration_seconds=-1), "2-started", (DRAIN_SET,)),
    case("started-11s-freeze", azure_event(status=S.STARTED, duration_seconds=11), "2-started", (DRAIN_SET,)),
    case(
        "started-reboot-reporter-not-affected-drains-resources",
        azure_event(kind=K.REBOOT, status=S.STARTED, reporter="WestNO_2"),
        "2-started",
        (DRAIN_SET,),
    ),
    case(
        "started-terminate",
        azure_event(kind=K.TERMINATE, status=S.STARTED, resources=("vmss_3",), reporter="vmss_3"),
        "2-started",
        (Drain(("vmss_3",)),),
    ),
    case(
        "started-with-approvals-off",
        azure_event(kind=K.REBOOT, status=S.STARTED),
        "2-started",
        (DRAIN_SET,),
        Policy(approve_platform_events=False, approve_user_events=False),
    ),
    case("started-gce-preempt", gce_event(K.PREEMPT, S.STARTED), "2-started", (Drain((GCE_VM,)),)),
    case("started-gce-upcoming-ongoing", gce_event(K.UPCOMING, S.STARTED), "2-started", (Drain((GCE_VM,)),)),
    # --- rule 3: Freeze with 0 <= duration <= 10 s → approve at once, no drain --------------------
    case("freeze-0s", azure_event(duration_seconds=0), "3-short-freeze", (Approve("WestNO_0"),)),
    case("freeze-5s", azure_event(duration_seconds=5), "3-short-freeze", (Approve("WestNO_0"),)),
    case("freeze-10s", azure_event(duration_seconds=10), "3-short-freeze", (Approve("WestNO_0"),)),
    case(
        "freeze-10s-user",
        azure_event(duration_seconds=10, event_source=USER),
        "3-short-freeze",
        (Approve("WestNO_0"),),
    ),
    case(
        "freeze-5s-reporter-second-in-resources",
        azure_event(reporter="WestNO_1"),
        "3-short-freeze",
        (Approve("WestNO_1"),),
    ),
    case(
        "freeze-5s-reporter-not-affected",
        azure_event(reporter="WestNO_2"),
        "3-short-freeze",
        (Approve("WestNO_0"),),
    ),
    case(
        "freeze-5s-approved-even-with-platform-approvals-off",
        azure_event(),
        "3-short-freeze",
        (Approve("WestNO_0"),),
        Policy(approve_platform_events=False),
    ),
    case(
        "freeze-3s-at-a-3s-threshold",
        azure_event(duration_seconds=3),
        "3-short-freeze",
        (Approve("WestNO_0"),),
        Policy(harmless_freeze_seconds=3),
    ),
    case(
        "freeze-4s-over-a-3s-threshold",
        azure_event(duration_seconds=4),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
        Policy(harmless_freeze_seconds=3),
    ),
    case(
        "freeze-0s-at-a-0s-threshold",
        azure_event(duration_seconds=0),
        "3-short-freeze",
        (Approve("WestNO_0"),),
        Policy(harmless_freeze_seconds=0),
    ),
    # --- not harmless: unknown (-1), absent, or longer than the threshold -----------------------
    case(
        "freeze-minus-1s-is-not-harmless",
        azure_event(duration_seconds=-1),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
    ),
    case(
        "freeze-11s-is-not-harmless",
        azure_event(duration_seconds=11),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
    ),
    case(
        "freeze-without-duration-is-not-harmless",
        azure_event(duration_seconds=None),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
    ),
    case(
        "freeze-minus-1s-user",
        azure_event(duration_seconds=-1, event_source=USER),
        "4-user",
        (DRAIN_SET, Approve("WestNO_0")),
    ),
    case(
        "reboot-of-5s-is-no-freeze",
        azure_event(kind=K.REBOOT, duration_seconds=5),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
    ),
    # --- rule 4: user-initiated → drain, then approve at once (execute_at None) ----------------
    case("user-reboot", azure_event(kind=K.REBOOT, event_source=USER), "4-user", (DRAIN_SET, Approve("WestNO_0"))),
    case(
        "user-redeploy",
        azure_event(kind=K.REDEPLOY, event_source=USER, duration_seconds=-1),
        "4-user",
        (DRAIN_SET, Approve("WestNO_0")),
    ),
    case(
        "user-reboot-reporter-second",
        azure_event(kind=K.REBOOT, event_source=USER, reporter="WestNO_1"),
        "4-user",
        (DRAIN_SET, Approve("WestNO_1")),
    ),
    case(
        "user-reboot-reporter-not-affected",
        azure_event(kind=K.REBOOT, event_source=USER, reporter="WestNO_2"),
        "4-user",
        (DRAIN_SET, Approve("WestNO_0")),
    ),
    case(
        "user-reboot-not-before-past-still-at-once",
        azure_event(kind=K.REBOOT, event_source=USER, not_before=at(-60)),
        "4-user",
        (DRAIN_SET, Approve("WestNO_0")),
    ),
    case(
        "user-reboot-user-approvals-off",
        azure_event(kind=K.REBOOT, event_source=USER),
        "4-user",
        (DRAIN_SET,),
        Policy(approve_user_events=False),
    ),
    case(
        "user-reboot-platform-approvals-off-does-not-matter",
        azure_event(kind=K.REBOOT, event_source=USER),
        "4-user",
        (DRAIN_SET, Approve("WestNO_0")),
        Policy(approve_platform_events=False),
    ),
    case(
        "user-terminate-reported-by-another-instance",
        azure_event(kind=K.TERMINATE, event_source=USER, resources=("vmss_3",), reporter="vmss_1"),
        "4-user",
        (Drain(("vmss_3",)), Approve("vmss_3")),
    ),
    # --- rule 5: other Azure scheduled → drain, approve at now + drain period, capped ----------
    case("platform-reboot", azure_event(kind=K.REBOOT), "5-platform", (DRAIN_SET, Approve("WestNO_0", at(30)))),
    case(
        "platform-redeploy",
        azure_event(kind=K.REDEPLOY, duration_seconds=-1),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
    ),
    case(
        "platform-freeze-30s",
        azure_event(duration_seconds=30),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
    ),
    case(
        "no-event-source-counts-as-platform",
        azure_event(kind=K.REBOOT, event_source=None),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
    ),
    case(
        "platform-reboot-reporter-second",
        azure_event(kind=K.REBOOT, reporter="WestNO_1"),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_1", at(30))),
    ),
    case(
        "platform-reboot-reporter-not-affected",
        azure_event(kind=K.REBOOT, reporter="WestNO_2"),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
    ),
    case(
        "platform-reboot-drain-period-120s",
        azure_event(kind=K.REBOOT),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(120))),
        Policy(drain_period_seconds=120),
    ),
    case(
        "platform-reboot-drain-period-0",
        azure_event(kind=K.REBOOT),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", NOW)),
        Policy(drain_period_seconds=0),
    ),
    case(
        "platform-reboot-without-not-before",
        azure_event(kind=K.REBOOT, not_before=None),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
    ),
    case(
        "platform-reboot-capped-at-not-before-minus-margin",
        azure_event(kind=K.REBOOT, not_before=at(20)),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(15))),
    ),
    case(
        "platform-reboot-cap-exactly-at-drain-period",
        azure_event(kind=K.REBOOT, not_before=at(35)),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
    ),
    case(
        "platform-reboot-cap-with-margin-0",
        azure_event(kind=K.REBOOT, not_before=at(10)),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(10))),
        Policy(not_before_margin_seconds=0),
    ),
    case(
        "platform-reboot-cap-with-margin-60",
        azure_event(kind=K.REBOOT, not_before=at(80)),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(20))),
        Policy(not_before_margin_seconds=60),
    ),
    case(
        "platform-reboot-not-before-within-margin-is-now",
        azure_event(kind=K.REBOOT, not_before=at(3)),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", NOW)),
    ),
    case(
        "platform-reboot-not-before-past-is-now",
        azure_event(kind=K.REBOOT, not_before=at(-600)),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", NOW)),
    ),
    case(
        "azure-preempt-30s-notice",
        azure_event(kind=K.PREEMPT, resources=("spot_0",), reporter="spot_0", not_before=at(30)),
        "5-platform",
        (Drain(("spot_0",)), Approve("spot_0", at(25))),
    ),
    case(
        "platform-reboot-platform-approvals-off",
        azure_event(kind=K.REBOOT),
        "5-platform",
        (DRAIN_SET,),
        Policy(approve_platform_events=False),
    ),
    case(
        "platform-reboot-user-approvals-off-does-not-matter",
        azure_event(kind=K.REBOOT),
        "5-platform",
        (DRAIN_SET, Approve("WestNO_0", at(30))),
        Policy(approve_user_events=False),
    ),
    case(
        "terminate-approved-by-its-own-instance",
        azure_event(kind=K.TERMINATE, resources=("vmss_3",), reporter="vmss_3", duration_seconds=-1),
        "5-platform",
        (Drain(("vmss_3",)), Approve("vmss_3", at(30))),
    ),
    case(
        "terminate-reported-by-another-instance",
        azure_event(kind=K.TERMINATE, resources=("vmss_3",), reporter="vmss_1", duration_seconds=-1),
        "5-platform",
        (Drain(("vmss_3",)), Approve("vmss_3", at(30))),
    ),
    # --- rule 6: GCE ---------------------------------------------------------------------------
    case("gce-live-migrate", gce_event(K.LIVE_MIGRATE), "6-gce", (Drain((GCE_VM,)),)),
    case("gce-host-terminate", gce_event(K.HOST_TERMINATE), "6-gce", (Drain((GCE_VM,)),)),
    case("gce-preempt-scheduled", gce_event(K.PREEMPT), "6-gce", (Drain((GCE_VM,)),)),
    case(
        "gce-live-migrate-never-approved",
        gce_event(K.LIVE_MIGRATE),
        "6-gce",
        (Drain((GCE_VM,)),),
        window(0, 23),
    ),
    case("gce-upcoming-audit-only", gce_event(K.UPCOMING, can_reschedule=True), "6-gce-upcoming", ()),
    case(
        "gce-upcoming-audit-even-in-window",
        gce_event(K.UPCOMING, can_reschedule=True),
        "6-gce-upcoming",
        (),
        Policy(maintenance_window_utc=(20, 23)),
    ),
    case(
        "gce-upcoming-perform-bool",
        gce_event(K.UPCOMING, can_reschedule=True),
        "6-gce-upcoming",
        PERFORM,
        window(20, 23),
    ),
    case(
        "gce-upcoming-perform-string",
        gce_event(K.UPCOMING, can_reschedule="true"),
        "6-gce-upcoming",
        PERFORM,
        window(20, 23),
    ),
    case(
        "gce-upcoming-perform-string-any-case",
        gce_event(K.UPCOMING, can_reschedule=" TRUE "),
        "6-gce-upcoming",
        PERFORM,
        window(20, 23),
    ),
    case(
        "gce-upcoming-window-start-inclusive",
        gce_event(K.UPCOMING, can_reschedule=True),
        "6-gce-upcoming",
        PERFORM,
        window(22, 23),
    ),
    case(
        "gce-upcoming-window-end-exclusive",
        gce_event(K.UPCOMING, can_reschedule=True),
        "6-gce-upcoming",
        (),
        window(20, 22),
    ),
    case(
        "gce-upcoming-outside-window",
        gce_event(K.UPCOMING, can_reschedule=True),
        "6-gce-upcoming",
        (),
        window(1, 6),
    ),
    case(
        "gce-upcoming-no-window",
        gce_event(K.UPCOMING, can_reschedule=True),
        "6-gce-upcoming",
        (),
        Policy(gce_upcoming_action="perform_maintenance"),
    ),
    case(
        "gce-upcoming-wrapping-window-before-midnight",
        gce_event(K.UPCOMING, can_reschedule=True),
        "6-gce-upcoming",
        PERFORM,
        window(21, 3),
    ),
    case(
        "gce-upcoming-wrapping-window-after-midnight",
        gce_event(K.UPCOMING, can_reschedule="true"),
        "6-gce-upcoming",
        PERFORM,
        window(21, 3),
        datetime(2022, 4, 12, 2, 59, 59, tzinfo=timezone.utc),
    ),
    case(
        "gce-upcoming-wrapping-window-end-exclusive",
        gce_event(K.UPCOMING, can_reschedule=True),
        "6-gce-upcoming",
        (),
        window(21, 3),
        datetime(2022, 4, 12, 3, 0, tzinfo=timezone.utc),
    ),
    case(
        "gce-upcoming-wrapping-window-midday",
        gce_event(K.UPCOMING, can_reschedule=True),
        "6-gce-upcoming",
        (),
        window(21, 3),
        datetime(2022, 4, 12, 12, 0, tzinfo=timezone.utc),
    ),
    case(
        "gce-upcoming-cannot-reschedule-bool",
        gce_event(K.UPCOMING, can_reschedule=False),
        "6-gce-upcoming",
        (),
        window(20, 23),
    ),
    case(
        "gce-upcoming-cannot-reschedule-string",
        gce_event(K.UPCOMING, can_reschedule="false"),
        "6-gce-upcoming",
        (),
        window(20, 23),
    ),
    case(
        "gce-upcoming-reschedule-unknown",
        gce_event(K.UPCOMING),
        "6-gce-upcoming",
        (),
        window(20, 23),
    ),
    case(
        "gce-upcoming-reschedule-neither-true-nor-false",
        gce_event(K.UPCOMING, can_reschedule="yes"),
        "6-gce-upcoming",
        (),
        window(20, 23),
    ),
    case(
        "gce-upcoming-reschedule-as-number-is-not-true",
        gce_event(K.UPCOMING, can_reschedule=1),
        "6-gce-upcoming",
        (),
        window(20, 23),
    ),
    case(
        "gce-upcoming-value-not-an-object",
        gce_event(K.UPCOMING, raw_value="canReschedule=true"),
        "6-gce-upcoming",
        (),
        window(20, 23),
    ),
]


@pytest.mark.parametrize(("event", "policy", "now", "rule", "actions"), DECISION_TABLE)
def test_decision_table(
    event: MaintenanceEvent, policy: Policy, now: datetime, rule: str, actions: tuple[Action, ...]
) -> None:
    # GIVEN an event, a policy and the time of the invocation (one row of the table)
    # WHEN the function core decides
    decision = decide(event, policy, now)

    # THEN the expected rule wins, with exactly the expected actions in that order
    assert decision.rule == rule
    assert decision.actions == actions
    assert decision.reason


@pytest.mark.parametrize(
    ("reporter", "resources", "kind", "target"),
    [
        pytest.param("WestNO_0", ("WestNO_0", "WestNO_1"), K.REBOOT, "WestNO_0", id="reporter-first"),
        pytest.param("WestNO_1", ("WestNO_0", "WestNO_1"), K.REBOOT, "WestNO_1", id="reporter-second"),
        pytest.param("WestNO_2", ("WestNO_1", "WestNO_0"), K.REBOOT, "WestNO_1", id="not-affected-first-of-resources"),
        pytest.param("westno_0", ("WestNO_0", "WestNO_1"), K.REBOOT, "WestNO_0", id="name-match-is-exact"),
        pytest.param("vmss_3", ("vmss_3",), K.TERMINATE, "vmss_3", id="terminate-self"),
        pytest.param("vmss_1", ("vmss_3",), K.TERMINATE, "vmss_3", id="terminate-reported-by-another-instance"),
        pytest.param("spot_1", ("spot_0",), K.PREEMPT, "spot_0", id="preempt-reported-by-another-vm"),
    ],
)
@pytest.mark.parametrize("source", [USER, PLATFORM], ids=["user", "platform"])
def test_one_approval_per_event_and_its_target(
    reporter: str, resources: tuple[str, ...], kind: EventKind, target: str, source: EventSource
) -> None:
    # GIVEN a scheduled event reported by `reporter`
    event = azure_event(kind=kind, reporter=reporter, resources=resources, event_source=source)

    # WHEN the function core decides
    decision = decide(event, DEFAULT_POLICY, NOW)

    # THEN exactly one approval goes to the expected VM, after the drain of every VM in Resources
    approvals = [action for action in decision.actions if isinstance(action, Approve)]
    assert [approval.target for approval in approvals] == [target]
    assert decision.actions[0] == Drain(resources)


def test_user_approval_is_immediate_and_platform_approval_waits_for_the_drain() -> None:
    # GIVEN the same reboot, once user-initiated and once by the platform
    user = azure_event(kind=K.REBOOT, event_source=USER)
    platform = azure_event(kind=K.REBOOT, event_source=PLATFORM)

    # WHEN the function core decides both
    user_approval = decide(user, DEFAULT_POLICY, NOW).actions[-1]
    platform_approval = decide(platform, DEFAULT_POLICY, NOW).actions[-1]

    # THEN the user event is approved at once and the platform event after the 30 s drain period
    assert user_approval == Approve("WestNO_0", execute_at=None)
    assert platform_approval == Approve("WestNO_0", execute_at=at(30))


# --- invariants over the whole cross product ----------------------------------------------------

AZURE_KINDS = (K.FREEZE, K.REBOOT, K.REDEPLOY, K.PREEMPT, K.TERMINATE, K.UNKNOWN)
DURATIONS = (None, -1, 0, 5, 10, 11, 900)
SOURCES = (None, USER, PLATFORM)
REPORTERS = ("WestNO_0", "WestNO_1", "WestNO_2")  # first, second, not in Resources
NOT_BEFORES = (None, at(-60), at(2), at(20), at(900))
POLICIES = (
    DEFAULT_POLICY,
    Policy(approve_user_events=False, approve_platform_events=False),
    Policy(harmless_freeze_seconds=0, drain_period_seconds=0, not_before_margin_seconds=0),
    Policy(drain_period_seconds=300, not_before_margin_seconds=60),
)

SWEEP = list(itertools.product(AZURE_KINDS, tuple(EventStatus), SOURCES, DURATIONS, REPORTERS))


@pytest.mark.parametrize(("policy_index", "policy"), list(enumerate(POLICIES)))
def test_invariants_of_every_azure_decision(policy_index: int, policy: Policy) -> None:
    # GIVEN every combination of kind, status, source, duration, reporter and NotBefore
    checked = 0
    for (kind, status, source, duration, reporter), not_before in itertools.product(SWEEP, NOT_BEFORES):
        event = azure_event(
            kind=kind,
            status=status,
            event_source=source,
            duration_seconds=duration,
            reporter=reporter,
            not_before=not_before,
        )
        label = f"policy {policy_index}: {kind.value} {status.value} {source} {duration} {reporter} {not_before}"

        # WHEN the function core decides
        decision = decide(event, policy, NOW)

        # THEN the decision keeps the promises of docs/contracts.md#default-policy, whatever the combination
        _check_invariants(event, policy, decision, label)
        checked += 1
    assert checked == len(SWEEP) * len(NOT_BEFORES)


def _check_invariants(event: MaintenanceEvent, policy: Policy, decision: Decision, label: str) -> None:
    approvals = [action for action in decision.actions if isinstance(action, Approve)]
    drains = [action for action in decision.actions if isinstance(action, Drain)]
    assert decision.reason, label
    assert len(approvals) <= 1, label
    assert len(drains) <= 1, label
    assert not any(isinstance(action, PerformMaintenance) for action in decision.actions), label
    if event.status in (S.COMPLETED, S.CANCELED):
        assert decision.rule == "1-ended", label
        assert not approvals, f"an ended event is never approved: {label}"
        assert not drains, label
        if event.kind not in (K.TERMINATE, K.PREEMPT):
            assert decision.actions == (Restore(),), label
        elif event.status is S.COMPLETED:
            assert decision.actions == (), f"the VM is gone, nothing to restore: {label}"
        return
    assert not any(isinstance(action, Restore) for action in decision.actions), label
    if event.status is S.STARTED:
        assert not approvals, f"a started event is never approved: {label}"
    for drain in drains:
        assert drain.vms == event.resources, label
        assert decision.actions.index(drain) == 0, f"the drain comes before the approval: {label}"
    for approval in approvals:
        assert approval.target in event.resources, label
        if not event.concerns_reporter:
            assert approval.target == event.resources[0], label
        elif event.kind is not K.TERMINATE:  # a Terminate goes to the instance itself (checked above)
            assert approval.target == event.reporter, label
        if approval.execute_at is not None:
            assert approval.execute_at >= NOW, label
            assert approval.execute_at <= at(policy.drain_period_seconds), label
            if event.not_before is not None and event.not_before - NOW > timedelta(
                seconds=policy.not_before_margin_seconds
            ):
                latest = event.not_before - timedelta(seconds=policy.not_before_margin_seconds)
                assert approval.execute_at <= latest, label
    short_freeze = (
        event.kind is K.FREEZE
        and event.duration_seconds is not None
        and 0 <= event.duration_seconds <= policy.harmless_freeze_seconds
    )
    if event.status is S.SCHEDULED and event.kind is K.UNKNOWN:
        assert decision.rule == "unreadable", label
        assert decision.actions == (Drain(event.resources),), f"an unknown kind is drained, never approved: {label}"
        return
    if event.status is S.SCHEDULED:
        if short_freeze:
            assert decision.actions == (Approve(approvals[0].target),), label
        else:
            assert drains, f"an impactful scheduled event is drained: {label}"
            user = event.event_source is USER
            assert bool(approvals) == (policy.approve_user_events if user else policy.approve_platform_events), label


@pytest.mark.parametrize("kind", [K.LIVE_MIGRATE, K.HOST_TERMINATE, K.PREEMPT, K.UPCOMING, K.UNKNOWN])
@pytest.mark.parametrize("status", list(EventStatus))
@pytest.mark.parametrize("policy", [DEFAULT_POLICY, window(0, 23)], ids=["default", "perform-in-window"])
def test_gce_is_never_approved(kind: EventKind, status: EventStatus, policy: Policy) -> None:
    # GIVEN any GCE event (GCE has no approval API)
    event = gce_event(kind, status, can_reschedule=True)

    # WHEN the function core decides
    decision = decide(event, policy, NOW)

    # THEN no approval command is ever sent; anything drained is the reporting VM
    assert not any(isinstance(action, Approve) for action in decision.actions)
    for action in decision.actions:
        if isinstance(action, Drain):
            assert action.vms == (GCE_VM,)


# --- purity --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("event", "policy", "now", "rule", "actions"), DECISION_TABLE)
def test_decide_is_pure(
    event: MaintenanceEvent, policy: Policy, now: datetime, rule: str, actions: tuple[Action, ...]
) -> None:
    # GIVEN an event and a copy of what it carries
    raw_before = copy.deepcopy(event.raw)
    twin = replace(event, raw=copy.deepcopy(event.raw))

    # WHEN decide runs twice on the same inputs, and once on an equal copy
    first = decide(event, policy, now)
    second = decide(event, policy, now)
    third = decide(twin, policy, now)

    # THEN the three decisions are equal, and the event was left untouched
    assert first == second == third
    assert event.raw == raw_before
    assert first.rule == rule


def test_decide_reads_no_clock() -> None:
    # GIVEN the same platform reboot decided at two invocation times far from the real clock
    event = azure_event(kind=K.REBOOT, not_before=None)
    long_ago = datetime(2001, 1, 1, 0, 0, tzinfo=timezone.utc)
    far_ahead = datetime(2099, 12, 31, 23, 0, tzinfo=timezone.utc)

    # WHEN the function core decides at each of them
    past = decide(event, DEFAULT_POLICY, long_ago)
    future = decide(event, DEFAULT_POLICY, far_ahead)

    # THEN every time in the decisions derives from the `now` passed in, not from a clock
    assert past.actions[-1] == Approve("WestNO_0", at(30, long_ago))
    assert future.actions[-1] == Approve("WestNO_0", at(30, far_ahead))


def test_maintenance_window_follows_the_now_passed_in() -> None:
    # GIVEN a rescheduleable upcoming maintenance and a window of 01:00-02:00 UTC
    event = gce_event(K.UPCOMING, can_reschedule=True)
    policy = window(1, 2)

    # WHEN decided at 01:30 and at 02:30 UTC
    inside = decide(event, policy, datetime(2030, 6, 1, 1, 30, tzinfo=timezone.utc))
    outside = decide(event, policy, datetime(2030, 6, 1, 2, 30, tzinfo=timezone.utc))

    # THEN only the invocation inside the window starts the maintenance
    assert inside.actions == PERFORM
    assert outside.actions == ()


# --- cases where the order or wording of the rules needed a decision (docs/contracts.md#default-policy) ---


@pytest.mark.parametrize("kind", [K.TERMINATE, K.PREEMPT])
def test_canceled_terminate_or_preempt_restores_the_vm_that_stays(kind: EventKind) -> None:
    # GIVEN a terminate/preempt that Azure canceled before it started (the VM was never removed)
    event = azure_event(kind=kind, status=S.CANCELED, resources=("vmss_3",), reporter="vmss_3")

    # WHEN the function core decides
    decision = decide(event, DEFAULT_POLICY, NOW)

    # THEN what this system drained for it is restored (rule 1)
    assert decision.rule == "1-ended"
    assert decision.actions == (Restore(),)


def test_short_freeze_arriving_already_started_is_left_alone() -> None:
    # GIVEN a 5 s Freeze first seen already Started (no notice)
    event = azure_event(status=S.STARTED, duration_seconds=5)

    # WHEN the function core decides
    decision = decide(event, DEFAULT_POLICY, NOW)

    # THEN the harmless-Freeze rule is checked before rule 2: draining for a pause of a few
    # seconds that is already under way would cost more than the pause (docs/architecture.md)
    assert decision.rule == "3-short-freeze"
    assert decision.actions == ()


def test_maintenance_window_is_judged_in_utc_whatever_the_offset_of_now() -> None:
    # GIVEN a window of 02:00-04:00 UTC and an invocation at 03:00 UTC written as 05:00+02:00
    event = gce_event(K.UPCOMING, can_reschedule=True)
    now = datetime(2030, 6, 1, 5, 0, tzinfo=timezone(timedelta(hours=2)))

    # WHEN the function core decides
    decision = decide(event, window(2, 4), now)

    # THEN it is inside the window: drain and start the maintenance
    assert decision.actions == PERFORM


# --- what the agent could not read ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "actions"),
    [
        (azure_event(kind=K.UNKNOWN, unreadable=("EventType",)), (DRAIN_SET,)),
        (azure_event(kind=K.REBOOT, unreadable=("EventStatus",)), (DRAIN_SET,)),
        (azure_event(kind=K.UNKNOWN, event_source=USER, not_before=None, unreadable=("EventType",)), (DRAIN_SET,)),
        (azure_event(kind=K.UNKNOWN, resources=(), unreadable=("EventType", "Resources")), (Drain(("WestNO_0",)),)),
        (gce_event(K.UNKNOWN), (Drain((GCE_VM,)),)),
    ],
    ids=["unknown-type", "unknown-status", "unknown-user-event", "unreadable-resources", "gce-unknown-value"],
)
def test_a_notice_that_could_not_be_read_is_drained_and_never_approved_early(
    event: MaintenanceEvent, actions: tuple[Action, ...]
) -> None:
    # GIVEN an event whose type or status the agent could not read WHEN the default policy decides
    decision = decide(event, DEFAULT_POLICY, NOW)

    # THEN its VMs are drained and no approval is sent: Azure starts it at NotBefore, never earlier
    assert (decision.rule, decision.actions) == ("unreadable", actions)


@pytest.mark.parametrize("status", [S.COMPLETED, S.CANCELED])
def test_an_unknown_kind_that_ended_is_restored(status: EventStatus) -> None:
    decision = decide(azure_event(kind=K.UNKNOWN, status=status, unreadable=("EventType",)), DEFAULT_POLICY, NOW)
    assert decision.actions == (Restore(),)


def test_an_unreadable_field_that_does_not_change_the_decision_keeps_the_rule() -> None:
    # A Reboot whose EventSource could not be read is a platform Reboot: drained, approved after the period.
    decision = decide(azure_event(kind=K.REBOOT, event_source=None, unreadable=("EventSource",)), DEFAULT_POLICY, NOW)
    assert decision.rule == "5-platform"


@pytest.mark.parametrize(
    ("not_before", "executes_at", "reason"),
    [
        (at(900), at(30), "platform reboot: drain, approve after the 30 s drain period"),
        (None, at(30), "platform reboot: drain, approve after the 30 s drain period"),
        (
            at(20),
            at(15),
            "platform reboot: drain, approve 15 s after the drain: capped by NotBefore less the 5 s margin "
            "(the 30 s drain period would pass it)",
        ),
        (
            at(3),
            NOW,
            "platform reboot: drain, approve at once: the 30 s drain period would pass NotBefore less the 5 s margin",
        ),
    ],
)
def test_a_platform_reason_says_when_the_approval_really_goes(
    not_before: datetime | None, executes_at: datetime, reason: str
) -> None:
    # GIVEN a platform Reboot whose NotBefore may come before the drain period is over
    decision = decide(azure_event(kind=K.REBOOT, not_before=not_before), DEFAULT_POLICY, NOW)

    # THEN the reason printed and audited next to the approval says when it is POSTed, and why
    assert decision.actions[-1] == Approve("WestNO_0", executes_at)
    assert decision.reason == reason
