"""The fan-in benchmark: its synthetic reporters, their delivery, and how a run becomes figures."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from bench.fan_in import (
    AgentsRun,
    agents_run_figures,
    own_reports,
    report_outcomes,
    reporter_envelopes,
    synthetic_run,
    synthetic_run_figures,
)
from functions.core.ports import AuditRecord
from wire.envelope import decode
from wire.model import MaintenanceEvent

NOW = datetime(2024, 5, 2, 12, 0, 0, tzinfo=timezone.utc)
RESOURCES = ["vm-0000", "vm-0001", "vm-0002"]


def _event(body: bytes) -> MaintenanceEvent:
    event = decode(body).data
    assert isinstance(event, MaintenanceEvent)
    return event


def test_fan_in_reporters_publish_one_id_for_one_event_of_the_first_vms() -> None:
    bodies, resources = reporter_envelopes(count=20, resources=5)

    envelopes = [decode(body) for body in bodies]
    assert len({envelope.id for envelope in envelopes}) == 1
    assert len(set(bodies)) == 20  # each reporter's own envelope
    assert resources == [f"vm-{index:04d}" for index in range(5)]
    assert all(_event(body).resources == tuple(resources) for body in bodies)
    assert [_event(body).reporter for body in bodies] == [f"vm-{index:04d}" for index in range(20)]


def test_forward_own_keeps_only_the_reports_of_vms_in_resources() -> None:
    # GIVEN what 20 VMs report of an event of the first 5 (--forward all)
    bodies, resources = reporter_envelopes(count=20, resources=5)

    # WHEN only their own reports are kept
    own = own_reports(bodies)

    # THEN those are the 5 reports of the VMs in Resources, unchanged
    assert [_event(body).reporter for body in own] == resources
    assert own == bodies[:5]


def test_synthetic_delivery_drains_and_approves_each_vm_once_and_refuses_the_others(tmp_path: Path) -> None:
    # GIVEN 30 reporters of an event of 4 VMs, a tenth of them delivered twice
    bodies, resources = reporter_envelopes(count=30, resources=4)

    # WHEN they are delivered to the core from its concurrent instances
    run = synthetic_run(bodies, tmp_path)

    # THEN each VM in Resources is drained once, the event is approved once, by one of them, every
    # other reporter is refused as not-self, and every delivery was taken
    assert len(run.approvals) == 1
    assert run.approvals[0] in resources
    assert run.drains == Counter(dict.fromkeys(resources, 1))
    assert run.record.not_self == {f"vm-{index:04d}" for index in range(4, 30)}
    assert run.record.errors == 0
    assert sum(run.record.outcomes.values()) == 30 + 3  # bodies[::10]: 3 delivered twice
    assert run.record.outcomes["processed"] == 4
    assert run.record.invocations == 33 + run.record.busy
    assert run.settle >= 0.0
    assert all(figure.met is not False for figure in synthetic_run_figures("f", run, resources, "setup"))
    assert (tmp_path / "warnings.log").read_text(encoding="utf-8").count("not-self") >= 26


def test_only_the_own_reports_need_a_tenth_of_the_invocations_for_the_same_effect(tmp_path: Path) -> None:
    bodies, resources = reporter_envelopes(count=30, resources=3)

    every = synthetic_run(bodies, tmp_path / "all")
    own = synthetic_run(own_reports(bodies), tmp_path / "own")

    assert (len(own.approvals), sorted(own.drains)) == (len(every.approvals), sorted(every.drains))
    assert len(own.approvals) == 1
    assert own.approvals[0] in resources
    assert own.record.not_self == set()
    assert own.record.invocations - own.record.busy == 3 + 1  # one of the three delivered twice
    assert every.record.invocations - every.record.busy == 30 + 3


def _run(approvals: list[tuple[str, str]], drains: list[str], *, settled: bool = True) -> AgentsRun:
    return AgentsRun(
        forward="own",
        notice=100.0,
        settled_at=100.75 if settled else None,
        published=list(RESOURCES),
        invocations=3,
        approvals=[{"vm": vm, "outcome": outcome, "source": "http"} for vm, outcome in approvals],
        drains=drains,
        removals=drains,
        outcomes=Counter({"event": 3}),
        not_self=[],
        problems=[] if settled else ["not settled within 60 s"],
    )


def test_a_run_where_one_vm_approves_the_event_once_all_are_out_meets_the_targets() -> None:
    run = _run([("vm-0002", "accepted")], RESOURCES)

    figures = {figure.name: figure for figure in agents_run_figures("fan", run, RESOURCES, "setup")}

    assert figures["fan.approvals"].value == 1
    assert figures["fan.approvals"].met is True
    assert "one, from a VM in Resources; 1 counted: 1 accepted" in figures["fan.approvals"].note
    assert figures["fan.drains"].met is True
    assert figures["fan.settle"].value == 0.75
    assert figures["fan.not_self"].value == 0


def test_two_approvals_of_one_event_and_a_vm_drained_twice_are_told_apart() -> None:
    # GIVEN a run in which the event was approved twice and vm-0001 was drained twice, vm-0002 never
    run = _run(
        [("vm-0000", "accepted"), ("vm-0001", "already-approved")], ["vm-0000", "vm-0001", "vm-0001"], settled=False
    )

    figures = {figure.name: figure for figure in agents_run_figures("fan", run, RESOURCES, "setup")}

    # THEN the drains' count matches its target, but the notes say what is wrong, and nothing settled
    assert figures["fan.approvals"].met is False
    assert "NOT one, from a VM in Resources; 1 counted" in figures["fan.approvals"].note
    assert "NOT each VM once" in figures["fan.drains"].note
    assert figures["fan.settle"].value is None


def test_report_outcomes_count_how_each_report_was_taken_and_nothing_else() -> None:
    def record(kind: str, vm: str) -> AuditRecord:
        return AuditRecord(NOW, kind, "envelope", "event", vm)

    records = [
        record("event", "a"),
        record("decision", "a"),
        record("action", "a"),
        record("not-self", "b"),
        record("not-self", "c"),
        record("duplicate", "a"),
        record("unverified", "d"),
    ]

    assert report_outcomes(records) == Counter({"not-self": 2, "event": 1, "duplicate": 1, "unverified": 1})
