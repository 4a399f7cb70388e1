"""The agent's loop with in-memory fakes of its ports: ordering, settling, and surviving errors."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pytest

from agent.engagement import DEFAULT_LINGER_SECONDS
from agent.health import Metrics, Readiness
from agent.loop import Agent
from agent.messages import event_message
from agent.sources.azure.client import AzureObservation
from agent.sources.azure.document import parse_scheduled_events, to_maintenance_event
from agent.sources.azure.tracker import AzureTracker
from agent.state import AgentState
from agent.timing import Clock, SystemClock
from tests.fixtures import fixture_text
from tests.kit.clock import FakeClock
from tests.unit.agent.full_disk import no_room_to_grow, write_until_it_fails
from tests.waiting import wait_until
from wire.bounds import MAX_ENVELOPE_BYTES
from wire.envelope import decode
from wire.errors import RetryableError
from wire.model import Cloud, CommandResult, EventStatus, MaintenanceEvent
from wire.transports.base import InboundCommand, OutboundMessage


@dataclass
class FakeReceiver:
    queued: list[InboundCommand] = field(default_factory=list)
    interrupted: threading.Event = field(default_factory=threading.Event)
    calls: int = 0

    def receive_commands(self, max_wait: float) -> Sequence[InboundCommand]:
        self.calls += 1
        taken, self.queued = self.queued, []
        if not taken:
            self.interrupted.wait(min(max_wait, 0.05))
        return taken

    def interrupt(self) -> None:
        self.interrupted.set()


@dataclass
class FakeTransport:
    name: str = "fake"
    published: list[OutboundMessage] = field(default_factory=list)
    receiver: FakeReceiver = field(default_factory=FakeReceiver)
    rests: int = 0

    @property
    def commands(self) -> FakeReceiver:
        return self.receiver

    def publish(self, message: OutboundMessage) -> None:
        self.published.append(message)

    def check(self) -> str:
        return "fake"

    def rest(self) -> None:
        self.rests += 1

    def close(self) -> None:
        return None


@dataclass
class FakeProcessor:
    """Answers every command by echoing its body; raises a retryable error for b"retry"."""

    reported: list[str] = field(default_factory=list)

    def handle(self, body: bytes) -> CommandResult | None:
        if body == b"retry":
            raise RetryableError("IMDS is not answering")
        if body == b"bug":
            raise RuntimeError("a bug in handling this one command")
        return CommandResult(command_id=body.decode(), accepted=True, event_id="E1", target="WestNO_0")

    def run_due(self) -> list[CommandResult]:
        return []

    def next_due_at(self) -> datetime | None:
        return None

    def unreported(self) -> list[CommandResult]:
        return [CommandResult(command_id="left-over", accepted=False, event_id="E0", target="WestNO_0")]

    def mark_reported(self, results: Sequence[CommandResult]) -> None:
        self.reported.extend(r.command_id for r in results)


def build(
    tmp_path: Path,
    transport: FakeTransport,
    commands: FakeProcessor | None = None,
    state: AgentState | None = None,
    clock: Clock | None = None,
) -> tuple[Agent, Metrics]:
    metrics = Metrics()
    agent = Agent(
        cloud=Cloud.AZURE,
        vm_name="WestNO_0",
        tracker=AzureTracker("WestNO_0", None),
        transport=transport,
        state=state or AgentState(tmp_path / "agent.db"),
        readiness=Readiness(follows_commands=commands is not None),
        metrics=metrics,
        clock=clock or SystemClock(),
        commands=commands,
        flush_seconds=2.0,
    )
    return agent, metrics


def observation(n: int) -> AzureObservation:
    return AzureObservation(
        document=parse_scheduled_events(fixture_text(f"azure/live-migration-{n}.json")),
        observed_at=datetime(2022, 4, 11, 22, 11, 50 + n, tzinfo=timezone.utc),
        lag_bound=0.1,
    )


def test_a_watcher_that_crashes_is_restarted_and_nothing_is_lost(tmp_path: Path) -> None:
    # GIVEN a watcher that fails once with a bug, then reports the documented documents
    transport = FakeTransport()
    agent, metrics = build(tmp_path, transport)
    calls = []

    def watcher(stop: threading.Event) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        for n in range(1, 5):
            agent.observe(observation(n))
        stop.wait()

    agent.attach_watchers([watcher])
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()

    # WHEN the agent runs
    wait_until(lambda: len(transport.published) == 3, 10, "three envelopes")
    stop.set()
    runner.join(timeout=10)

    # THEN the watcher ran again, the crash was counted, and the three envelopes went out in order
    assert len(calls) == 2
    assert metrics.value("mbridge_errors_total", kind="crash") == 1
    types = [json.loads(m.body)["type"].rsplit(".", 1)[1] for m in transport.published]
    assert types == ["scheduled", "started", "completed"]
    assert {m.key for m in transport.published} == {"WestNO_0"}


def test_commands_are_settled_after_their_result_is_recorded_and_retryable_ones_are_given_back(
    tmp_path: Path,
) -> None:
    # GIVEN a command that can be answered and one whose IMDS check fails for now
    transport = FakeTransport()
    processor = FakeProcessor()
    agent, metrics = build(tmp_path, transport, processor)
    events: list[str] = []
    transport.receiver.queued = [
        InboundCommand(b"cmd-1", {}, settle=lambda: events.append("settled cmd-1")),
        InboundCommand(
            b"retry",
            {},
            settle=lambda: events.append("settled retry"),
            abandon=lambda: events.append("abandoned retry"),
        ),
    ]
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()

    # WHEN the agent runs
    wait_until(lambda: "abandoned retry" in events and len(transport.published) >= 2, 20, lambda: str(events))
    stop.set()
    runner.join(timeout=10)

    # THEN the left-over result of an earlier run and cmd-1's result were published and marked,
    # cmd-1 was settled, and the retryable one was given back, never settled
    published = [json.loads(m.body)["subject"] for m in transport.published]
    assert published[:2] == ["left-over", "cmd-1"]
    assert processor.reported[:2] == ["left-over", "cmd-1"]
    assert events == ["settled cmd-1", "abandoned retry"]
    assert metrics.value("mbridge_errors_total", kind="command_retry") == 1


def test_a_command_whose_handling_crashes_is_given_back_and_the_next_is_still_handled(tmp_path: Path) -> None:
    # GIVEN a command whose handling hits a bug, received in one batch with a good one
    transport = FakeTransport()
    processor = FakeProcessor()
    agent, metrics = build(tmp_path, transport, processor)
    events: list[str] = []
    transport.receiver.queued = [
        InboundCommand(
            b"bug", {}, settle=lambda: events.append("settled bug"), abandon=lambda: events.append("abandoned bug")
        ),
        InboundCommand(b"cmd-2", {}, settle=lambda: events.append("settled cmd-2")),
    ]
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()

    # WHEN the agent runs
    wait_until(lambda: "settled cmd-2" in events, 10, lambda: str(events))
    stop.set()
    runner.join(timeout=10)

    # THEN the crashing one was given back unsettled (the bus redelivers, then dead-letters it), the
    # next one was handled in the same pass, the crash was counted, and the worker never restarted
    assert events == ["abandoned bug", "settled cmd-2"]
    assert metrics.value("mbridge_errors_total", kind="command_crash") == 1
    assert metrics.value("mbridge_errors_total", kind="crash") == 0


def test_an_observation_that_meets_a_full_disk_is_recorded_once_there_is_room(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN an agent whose disk is full (the page limit: see full_disk.py) before a change comes
    state = AgentState(tmp_path / "agent.db")
    make_room = no_room_to_grow(state._db)
    write_until_it_fails(lambda n: state.record([], {f"filler-{n}": "x" * 200}))
    transport = FakeTransport()
    agent, metrics = build(tmp_path, transport, state=state)
    agent.observe(observation(2))
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()

    # WHEN the change cannot be recorded for a while
    wait_until(lambda: metrics.value("mbridge_errors_total", kind="state") >= 2, 10, "two failed records")
    assert transport.published == []
    assert runner.is_alive()

    # ... and then there is room again
    make_room()
    wait_until(lambda: len(transport.published) == 1, 10, "the envelope")
    stop.set()
    runner.join(timeout=10)

    # THEN the change was recorded and published after all, the agent said why it waited, and
    # nothing was taken for a crash
    assert json.loads(transport.published[0].body)["type"].endswith(".scheduled")
    assert metrics.value("mbridge_errors_total", kind="crash") == 0
    failures = [r for r in caplog.records if "database or disk is full" in r.getMessage()]
    assert failures
    assert all(r.exc_info is None for r in caplog.records)


def test_an_entry_too_large_for_one_bus_message_is_forwarded_cut_to_fit() -> None:
    # GIVEN an Azure entry whose Description alone is larger than a Service Bus message holds
    entry = {
        "EventId": "E-HUGE",
        "EventType": "Reboot",
        "Resources": ["WestNO_0"],
        "EventStatus": "Scheduled",
        "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
        "Description": "x" * 400_000,
    }
    (event,) = parse_scheduled_events(json.dumps({"DocumentIncarnation": 1, "Events": [entry]})).events
    observed = datetime(2022, 4, 11, 22, 11, 58, tzinfo=timezone.utc)

    # WHEN the agent makes its message
    message = event_message(to_maintenance_event(event, status=EventStatus.SCHEDULED, reporter="WestNO_0",
                                                 sequence="1"), observed)  # fmt: skip

    # THEN it fits one bus message and still carries what the functions act on; what was cut is named
    assert len(message.body) <= MAX_ENVELOPE_BYTES
    data = decode(message.body).data
    assert isinstance(data, MaintenanceEvent)
    assert (data.event_id, data.kind.value, data.resources, data.not_before) == (
        "E-HUGE", "reboot", ("WestNO_0",), datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc),
    )  # fmt: skip
    assert set(data.unreadable) == {"raw", "Description"}
    assert data.raw["cut_bytes"] > 400_000
    assert len(data.description) <= 2048


def test_an_entry_naming_more_vms_than_a_message_holds_keeps_whether_this_vm_is_affected() -> None:
    # GIVEN an Azure entry listing 20,000 VMs, this one among them
    names = [f"vm-{n:05d}-{'x' * 20}" for n in range(20_000)] + ["WestNO_0"]
    entry = {"EventId": "E-WIDE", "EventType": "Reboot", "Resources": names, "EventStatus": "Scheduled"}
    (event,) = parse_scheduled_events(json.dumps({"DocumentIncarnation": 1, "Events": [entry]})).events
    mapped = to_maintenance_event(event, status=EventStatus.SCHEDULED, reporter="WestNO_0", sequence="1")

    # WHEN the agent makes its message THEN it fits, and still says this VM is affected
    message = event_message(mapped, datetime(2022, 4, 11, 22, 11, 58, tzinfo=timezone.utc))
    assert len(message.body) <= MAX_ENVELOPE_BYTES
    data = decode(message.body).data
    assert isinstance(data, MaintenanceEvent)
    assert (data.resources, data.concerns_reporter) == (("WestNO_0",), True)
    assert "Resources" in data.unreadable


def test_envelopes_forwarded_with_fields_the_agent_could_not_read_are_counted_by_field(tmp_path: Path) -> None:
    # GIVEN a document with one entry of a type Azure added and a NotBefore this release cannot read
    agent, metrics = build(tmp_path, FakeTransport())
    entry = {"EventId": "E-NEW", "EventType": "Hibernate", "EventStatus": "Scheduled", "NotBefore": "soon"}
    document = parse_scheduled_events(json.dumps({"DocumentIncarnation": 3, "Events": [entry]}))

    # WHEN the agent takes it in
    agent.handle_observation(
        AzureObservation(document=document, observed_at=datetime(2026, 3, 1, tzinfo=timezone.utc), lag_bound=0.0)
    )

    # THEN the envelope is recorded, and /metrics says which fields could not be read
    assert metrics.value("mbridge_unreadable_fields_total", field="EventType") == 1
    assert metrics.value("mbridge_unreadable_fields_total", field="NotBefore") == 1


def test_an_agent_with_nothing_open_lets_its_command_path_go_and_an_event_of_its_own_opens_it_again(
    tmp_path: Path,
) -> None:
    # GIVEN a running agent with a command channel, no event, no drain and no held command
    clock = FakeClock()
    transport = FakeTransport()
    agent, metrics = build(tmp_path, transport, FakeProcessor(), clock=clock)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        # it receives while the linger after its start lasts
        wait_until(lambda: transport.receiver.calls >= 1, 20, "the agent never received")
        assert transport.rests == 0
        assert "mbridge_command_path_open 1" in metrics.render()

        # WHEN the linger runs out
        clock.advance(DEFAULT_LINGER_SECONDS)
        wait_until(lambda: transport.rests >= 1, 20, "the agent kept its command path")

        # THEN it let the transport's connections go and stopped receiving
        received_before_the_event = transport.receiver.calls
        assert "mbridge_command_path_open 0" in metrics.render()

        # WHEN an event of this VM is seen (a Freeze naming WestNO_0)
        agent.observe(observation(2))

        # THEN the command path opens again for the commands that answer its report
        wait_until(lambda: transport.receiver.calls > received_before_the_event, 20, "no receive after the event")
        assert "mbridge_command_path_open 1" in metrics.render()
    finally:
        stop.set()
        runner.join(timeout=10)
    assert not runner.is_alive()


# ---- one trace per maintenance


def _traces(state: AgentState) -> list[tuple[str, str, str]]:
    """(status, trace id, span id) of each envelope in the outbox, in order."""
    carried = []
    for message in state.messages():
        envelope = decode(message.body)
        parent = str(envelope.extensions["traceparent"])
        _, trace_id, span_id, _ = parent.split("-")
        carried.append((envelope.type.rsplit(".", 1)[-1], trace_id, span_id))
    return carried


def test_every_envelope_of_one_maintenance_shares_its_trace_across_a_restart_each_with_a_span_of_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN an agent that sees a live migration scheduled, then stops and starts again
    state = AgentState(tmp_path / "agent.db")
    agent, _ = build(tmp_path, FakeTransport(), state=state)
    with caplog.at_level("INFO", logger="mbridge.agent"):
        for n in (1, 2):
            agent.handle_observation(observation(n))
    restarted, _ = build(tmp_path, FakeTransport(), state=state)

    # WHEN the restarted agent sees it start and go away
    for n in (3, 4):
        restarted.handle_observation(observation(n))

    # THEN its three envelopes carry one trace, each publish a span of its own
    carried = _traces(state)
    assert [status for status, _, _ in carried] == ["scheduled", "started", "completed"]
    assert len({trace_id for _, trace_id, _ in carried}) == 1
    assert len({span_id for _, _, span_id in carried}) == 3
    # AND the line saying the agent detected it names the trace
    trace_id = carried[0][1]
    assert any(getattr(r, "trace_id", None) == trace_id and "scheduled" in r.getMessage() for r in caplog.records)
    # AND the ended event's trace is not kept: a later event of the same id starts its own
    assert state.load("maintenance_traces") == []


def test_another_maintenance_has_a_trace_of_its_own_and_a_saved_trace_that_does_not_read_is_not_used(
    tmp_path: Path,
) -> None:
    # GIVEN a state whose saved traces were damaged (not a list of [event, trace id] pairs)
    state = AgentState(tmp_path / "agent.db")
    state.record([], {"maintenance_traces": [["azure:anything", "NOT-A-TRACE"], 7]})
    agent, _ = build(tmp_path, FakeTransport(), state=state)

    # WHEN it sees a live migration scheduled, then a document with its start and another event
    agent.handle_observation(observation(2))
    entry = {"EventId": "E-OTHER", "EventType": "Reboot", "EventStatus": "Scheduled", "Resources": ["WestNO_0"]}
    started = json.loads(fixture_text("azure/live-migration-3.json"))["Events"]
    both = parse_scheduled_events(json.dumps({"DocumentIncarnation": 10, "Events": [*started, entry]}))
    agent.handle_observation(AzureObservation(document=both, observed_at=observation(3).observed_at, lag_bound=0.0))

    # THEN the two maintenances have two traces, each kept for the event's later steps
    carried = _traces(state)
    assert [status for status, _, _ in carried] == ["scheduled", "started", "scheduled"]
    assert carried[0][1] == carried[1][1] != carried[2][1]
    saved = state.load("maintenance_traces")
    assert saved is not None
    assert [trace_id for _, trace_id in saved] == [carried[1][1], carried[2][1]]
