"""The demo's witnesses: envelopes, audit records and approval POSTs become stages, each once."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from functions.core.ports import AuditRecord
from mbridge.demo.timeline import EventTimeline, Observer, Refusal, departure_of
from tests.factories import azure_event
from wire.envelope import encode, envelope_for_event
from wire.model import Cloud, EventKind, EventStatus
from wire.timefmt import format_rfc3339

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
EVENT_ID = "9B1D4C77-0E3A-4F62-8A55-3C7E1B2D4F22"


def at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def watch(*timelines: EventTimeline) -> tuple[Observer, list[tuple[str, str, str]]]:
    seen: list[tuple[str, str, str]] = []
    observer = Observer(timelines, lambda timeline, stage, detail, _when: seen.append((timeline.key, stage, detail)))
    return observer, seen


def reboot_timeline() -> EventTimeline:
    return EventTimeline("user-reboot", Cloud.AZURE, EventKind.REBOOT, EVENT_ID.lower(), injected_at=T0)


def body(status: EventStatus, reporter: str, observed_ms: int, **fields: object) -> bytes:
    event = azure_event(event_id=EVENT_ID, kind=EventKind.REBOOT, status=status, reporter=reporter, **fields)
    return encode(envelope_for_event(event, at(observed_ms)))


def test_every_reporter_and_redelivery_marks_each_stage_once_at_its_first_sighting() -> None:
    timeline = reboot_timeline()
    observer, seen = watch(timeline)

    # WHEN three VMs report the scheduled event (one of them twice) and then its start
    observer.envelope(body(EventStatus.SCHEDULED, "web-1", 300), at(305))
    observer.envelope(body(EventStatus.SCHEDULED, "web-0", 280), at(310))
    observer.envelope(body(EventStatus.SCHEDULED, "web-1", 300), at(320))
    observer.envelope(body(EventStatus.STARTED, "web-2", 1500), at(1502))

    # THEN detected/published come from the first envelope seen, and started from its own
    assert timeline.elapsed_ms("detected") == 300
    assert timeline.elapsed_ms("published") == 305
    assert timeline.elapsed_ms("started") == 1500
    assert timeline.reporters == {"web-0", "web-1", "web-2"}
    assert [stage for _, stage, _ in seen] == ["detected", "published", "started"]


def test_audit_records_give_decided_drained_sent_and_restored() -> None:
    timeline = reboot_timeline()
    observer, seen = watch(timeline)

    def record(kind: str, ms: int, **fields: object) -> AuditRecord:
        values: dict[str, object] = {"envelope_id": "e", "event_id": EVENT_ID, "vm": "web-2"}
        values.update(fields)
        return AuditRecord(at(ms), kind, **values)  # type: ignore[arg-type]

    observer.audit(record("decision", 400, rule="4-user", reason="user-initiated"))
    observer.audit(record("action", 401, action="drain"))
    observer.audit(record("action", 402, action="approve"))
    observer.audit(record("command-result", 900, action="accepted", reason="approved"))
    observer.audit(record("action", 3000, action="restore"))
    observer.audit(record("action", 3000, action="restore", event_id="some-other-event"))

    assert (timeline.elapsed_ms("decided"), timeline.elapsed_ms("drained"), timeline.elapsed_ms("restored")) == (
        400,
        401,
        3000,
    )
    assert timeline.rules == ["4-user"]
    assert timeline.drained == ["web-2"]
    assert timeline.restored == ["web-2"]
    assert [(c.target, c.execute_at) for c in timeline.approve_commands] == [("web-2", None)]
    assert timeline.command_results == [("web-2", "accepted", "approved")]
    assert ("user-reboot", "approval sent", "to web-2, at once") in seen


def test_approved_is_when_imds_accepted_a_post_not_when_one_was_refused() -> None:
    timeline = reboot_timeline()
    observer, _ = watch(timeline)
    for ms, outcome in ((700, "rate-limited"), (950, "accepted"), (990, "already-approved")):
        observer.approval({"event_ids": [EVENT_ID], "vm": "web-2", "outcome": outcome, "time": format_rfc3339(at(ms))})

    assert timeline.elapsed_ms("approved") == 950
    assert [a.outcome for a in timeline.approvals] == ["rate-limited", "accepted", "already-approved"]
    assert len(timeline.accepted_approvals()) == 1


def test_a_gce_flow_learns_its_event_id_from_the_first_envelope_of_its_kind() -> None:
    migration = EventTimeline("gce-migration", Cloud.GCE, EventKind.LIVE_MIGRATE, None, injected_at=T0)
    observer, _ = watch(migration)
    gce = azure_event(
        cloud=Cloud.GCE, event_id="gce-1234-abc", kind=EventKind.LIVE_MIGRATE, reporter="gce-0",
        resources=("gce-0",), duration_seconds=None, event_source=None,
    )  # fmt: skip
    observer.envelope(encode(envelope_for_event(gce, at(60))), at(62))
    observer.envelope(encode(envelope_for_event(replace(gce, status=EventStatus.COMPLETED), at(1100))), at(1102))

    assert migration.event_id == "gce-1234-abc"
    assert migration.ended_as == "completed"
    assert migration.elapsed_ms("completed") == 1100
    # and its audit records are found by that id from now on
    observer.audit(AuditRecord(at(80), "action", "e", "gce-1234-abc", "gce-0", action="drain"))
    assert migration.drained == ["gce-0"]


def test_a_canceled_event_ends_as_canceled_and_malformed_bodies_are_ignored() -> None:
    timeline = reboot_timeline()
    observer, _ = watch(timeline)
    observer.envelope(b"not json", at(1))
    observer.envelope(body(EventStatus.CANCELED, "web-0", 700), at(701))
    assert timeline.ended_as == "canceled"
    assert "detected" not in timeline.stages


def test_a_dead_agents_event_is_seen_from_the_control_planes_records_and_ends_at_its_earliest_witness() -> None:
    timeline = reboot_timeline()
    observer, seen = watch(timeline)
    central = {"sender": "control plane: event-grid as /subscriptions/s/resourceGroups/rg/.../web-2"}

    # WHEN the audit log shows the control plane's report, the agent found silent, and the end as the
    # control plane reported it; then the agent of another VM reports the end, seen later
    observer.audit(AuditRecord(at(100), "event", "e", EVENT_ID, "web-2", status="scheduled", detail=central))
    observer.audit(AuditRecord(at(3200), "agent-silent", "e", EVENT_ID, "web-2", reason="its agent has not"))
    observer.audit(AuditRecord(at(9000), "event", "e", EVENT_ID, "web-2", status="completed", detail=central))
    observer.envelope(body(EventStatus.COMPLETED, "web-1", 9400), at(9500))

    # THEN the silence and the control plane's end are on the timeline, the end at its earliest witness
    assert timeline.silent == ["web-2"]
    assert (timeline.ended_centrally, timeline.ended_as) == ("completed", "completed")
    assert timeline.ended_at == at(9000)
    assert [stage for _, stage, _ in seen][:3] == ["reported centrally", "silent", "completed"]


def test_the_listener_is_told_each_sightings_own_time() -> None:
    # The narration orders its lines by these times: the witness's, not when the demo read it.
    timeline = reboot_timeline()
    told: list[tuple[str, datetime]] = []
    observer = Observer([timeline], lambda _timeline, stage, _detail, when: told.append((stage, when)))

    observer.audit(AuditRecord(at(900), "action", "e", EVENT_ID, "web-1", action="drain"))
    observer.audit(AuditRecord(at(400), "action", "e", EVENT_ID, "web-0", action="drain"))
    observer.audit(AuditRecord(at(950), "action", "e", EVENT_ID, "web-0", action="approve"))
    observer.envelope(body(EventStatus.SCHEDULED, "web-0", 300), at(305))

    assert told == [
        ("drained", at(900)),
        ("drained", at(400)),  # a second VM's drain: its own time, not the stage's first
        ("approval sent", at(950)),
        ("detected", at(300)),
        ("published", at(305)),
    ]


def test_a_refusal_is_kept_with_the_vm_it_names_and_its_time() -> None:
    timeline = reboot_timeline()
    observer, seen = watch(timeline)

    observer.audit(AuditRecord(at(33), "unverified", "e", EVENT_ID, "web-0", reason="the proof is web-2's"))
    observer.audit(AuditRecord(at(41), "not-self", "e", EVENT_ID, "web-2", reason="web-2 reports others"))

    assert timeline.refusals == [
        Refusal("unverified", "the proof is web-2's", "web-0", at(33)),
        Refusal("not-self", "web-2 reports others", "web-2", at(41)),
    ]
    assert [stage for _, stage, _ in seen] == ["refused", "refused"]


def test_a_vm_deleted_by_its_event_is_seen_in_the_simulators_log() -> None:
    timeline = reboot_timeline()
    observer, seen = watch(timeline)

    # WHEN the simulator logs that the event's VM stopped answering, and another VM's for another event
    observer.departure("web-2", EVENT_ID, at(3520))
    observer.departure("vmss-0", "7A3F9D12-8B6C-4A01-9C24-5E8B1D7F6A44", at(3600))

    # THEN the event's timeline has the deletion, on the VM's own row, and the narration says it
    assert timeline.vm_stages["web-2"]["deleted"] == at(3520)
    assert timeline.deleted == ["web-2"]
    assert [(key, stage) for key, stage, _ in seen] == [("user-reboot", "deleted")]


def test_the_simulators_log_of_a_deletion_names_the_vm_and_the_event() -> None:
    entry = {
        "time": format_rfc3339(at(3520)), "vm": "spot-0",
        "message": "stopped answering: deleted by Preempt 1C8E5A90-4D2B-4E77-B013-6F9A2C3D5E33",
    }  # fmt: skip

    assert departure_of(entry) == ("spot-0", "1C8E5A90-4D2B-4E77-B013-6F9A2C3D5E33", at(3520))
    assert departure_of({**entry, "message": "stopped answering: preempted, shut down"}) is None
    assert departure_of({**entry, "message": "event 1C8E5A90 removed (completed)"}) is None
