"""The agent's threads and how they hand work to each other.

    watchers ──observations──► main loop: diff → state+outbox (one transaction)
                                                   │
    publisher ◄────────────── oldest pending row ──┘ → transport.publish, in order, with backoff
    commands: receive → processor → result into the outbox → settle; held commands when due

Nothing is acknowledged before it is on disk: observations become outbox rows before
anything is published, and a command is settled only after its result is recorded.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Protocol

from agent import logs
from agent.engagement import DEFAULT_LINGER_SECONDS, Engagement
from agent.health import Metrics, Readiness
from agent.messages import event_message, names_this_vm, result_message, trace_id_of, with_message_id
from agent.proofs import BackOffAfterRefusal, NoProof, ProofRefusedError, ProofUnavailableError, Prover
from agent.sources.tracking import Observation, Tracker
from agent.state import AgentState
from agent.state_files import StateUnavailableError
from agent.stopping import StopFlag
from agent.timing import Backoff, Clock
from agent.traces import TRACES_STATE, Spans, Traces
from wire.errors import MalformedDocumentError, RetryableError
from wire.model import Cloud, CommandResult, EventStatus, MaintenanceEvent
from wire.transports.base import AgentTransport, OutboundMessage, TransportConfigError, TransportUnavailableError
from wire.version import version

if TYPE_CHECKING:  # the hook runner is imported only by agents that have a hook
    from agent.hooks import HookRunner

LOGGER = logging.getLogger("mbridge.agent")
KEEP_PUBLISHED_SECONDS = 24 * 3600
PRUNE_EVERY_SECONDS = 600.0
# How long a message waits for its proof of identity before it goes without one: the metadata
# service answers 503 for a second or so during maintenance, and a report the functions may
# refuse (trust: attested) is still better late than a report never sent. A refusal (a 404 or
# 400) is not waited for: it would be the same after the wait, and a Spot eviction gives 30 s.
PROOF_WAIT_SECONDS = 10.0
PROOF_RETRY_SECONDS = 0.5
# The events of this VM that are scheduled or started, saved with the source state (in the same
# transaction) so `mbridge_maintenance_pending` survives a restart in the middle of a maintenance.
PENDING_STATE = "maintenance_pending"
# At most this many series of `mbridge_maintenance_pending`: a VM has a handful of events at a
# time, and a metadata service gone wrong must not grow the scrape without bound.
MAX_PENDING_SERIES = 32
ENDED = frozenset({EventStatus.COMPLETED, EventStatus.CANCELED})
# How long a stopping agent lets hooks of changes it has just seen start (each keeps its own timeout).
HOOK_SETTLE_SECONDS = 2.0
# The longest the command loop waits for a command in one call when none is held. Nothing polls
# meanwhile: the transports block until a command arrives (the local bus's doorbell, Pub/Sub's
# streaming pull, Service Bus's receive) and a stop interrupts the wait, so this only bounds how
# long an unexpected silence of a transport goes unnoticed.
COMMAND_IDLE_WAIT_SECONDS = 60.0
# How long a resting command loop waits for an event of this VM before it looks again on its own.
RESTING_WAIT_SECONDS = 300.0
# How long a stopping agent waits for the observations it had already received to be recorded.
RECORD_SETTLE_SECONDS = 2.0


class CommandHandler(Protocol):
    """What the loop needs from agent.commands.CommandProcessor."""

    def handle(self, body: bytes) -> CommandResult | None: ...

    def run_due(self) -> list[CommandResult]: ...

    def next_due_at(self) -> datetime | None: ...

    def unreported(self) -> list[CommandResult]: ...

    def mark_reported(self, results: Sequence[CommandResult]) -> None: ...


Watcher = Callable[[threading.Event], None]


@dataclass
class Liveness:
    last_good_poll: float | None = None  # monotonic
    last_good_poll_at: float | None = None  # Unix time, for mbridge_last_good_poll_timestamp_seconds


class Agent:
    def __init__(
        self,
        *,
        cloud: Cloud,
        vm_name: str,
        tracker: Tracker,
        transport: AgentTransport,
        state: AgentState,
        readiness: Readiness,
        metrics: Metrics,
        clock: Clock,
        commands: CommandHandler | None = None,
        flush_seconds: float = 10.0,
        publish_backoff: Backoff | None = None,
        prover: Prover | None = None,
        proof_wait_seconds: float = PROOF_WAIT_SECONDS,
        forward_all: bool = False,
        hooks: HookRunner | None = None,
        command_linger_seconds: float = DEFAULT_LINGER_SECONDS,
        spans: Spans | None = None,
    ) -> None:
        self.cloud = cloud
        self.vm_name = vm_name
        self._tracker = tracker
        self._watchers: list[Watcher] = []
        self._transport = transport
        self._state = state
        self._readiness = readiness
        self._metrics = metrics
        self._clock = clock
        self._commands = commands
        self._engagement = Engagement(clock.monotonic, command_linger_seconds)
        # Set when something may open the command path (an event of this VM, a stop): the resting
        # command loop waits on it instead of receiving.
        self._wake = threading.Event()
        self.command_path_open = False  # for /metrics: whether the command path holds a receive
        self._rested = False  # the transport let its command path go since it was last used
        self._flush_seconds = flush_seconds
        # a metadata service that refuses proofs is asked again only every few minutes
        self._prover: Prover = NoProof() if prover is None else BackOffAfterRefusal(prover, clock.monotonic)
        self._forward_all = forward_all
        self._hooks = hooks
        self._proof_wait_seconds = proof_wait_seconds
        self._unproven_since: tuple[int, float] | None = None  # (outbox seq, monotonic) of the first miss
        self._proofs_refused = False  # since the last proof: logged once, not for every message
        self.last_proof_error = ""  # for --check and the logs; "" while proofs come
        # Capped at 5 s: once the bus is back, the backlog goes out within seconds. One agent per VM
        # retrying every few seconds costs a broker nothing.
        self._publish_backoff = publish_backoff or Backoff(initial=0.5, maximum=5.0)
        # None is the stop's marker: the recorder records what came before it, then ends.
        self._observations: queue.Queue[Observation | None] = queue.Queue()
        self._stop_sources = threading.Event()
        self._stop_publisher = threading.Event()
        self._threads: list[threading.Thread] = []
        self.liveness = Liveness()
        self._pending = _load_pending(state.load(PENDING_STATE))
        self._traces = Traces(state.load(TRACES_STATE))
        self._spans = spans  # None: no span is exported (the default)
        self._readiness.set_pending_impact(self._tracker.impact_pending())
        self._register_metrics()

    def _register_metrics(self) -> None:
        """The gauges read from the agent's own state when /metrics is scraped."""
        self._metrics.info(
            "mbridge_build_info", version=version(), cloud=self.cloud.value, transport=self._transport.name
        )
        # 0 (never) until the first good poll: the alert `time() - it > 90` fires on an agent that never saw one.
        self._metrics.gauge("mbridge_last_good_poll_timestamp_seconds", lambda: self.liveness.last_good_poll_at or 0.0)
        self._metrics.gauges("mbridge_maintenance_pending", self.pending_maintenance)
        self._metrics.gauge("mbridge_command_path_open", lambda: 1.0 if self.command_path_open else 0.0)

    def pending_maintenance(self) -> list[tuple[dict[str, str], float]]:
        """One series per event of this VM not completed or canceled yet: (event_id, kind, status) → 1."""
        return [(dict(labels), 1.0) for labels in self._pending.values()]

    # ---- wiring for watchers

    def attach_watchers(self, watchers: Sequence[Watcher]) -> None:
        """Watchers report through `observe` and `poll_result`, so they are made after the agent."""
        self._watchers.extend(watchers)

    def observe(self, observation: Observation) -> None:
        """Called from watcher threads; the main loop does the rest."""
        self._observations.put(observation)

    def poll_result(self, result: str, kind: str | None) -> None:
        self._metrics.inc("mbridge_polls_total", result="error" if kind else result)
        if kind:
            self._metrics.inc("mbridge_errors_total", kind=kind)
        else:
            self.liveness.last_good_poll = self._clock.monotonic()
            self.liveness.last_good_poll_at = self._clock.now().timestamp()
            self._readiness.metadata_answered()

    # ---- running

    def run(self, stop: StopFlag) -> None:
        """Run until `stop` is set; then flush the outbox (bounded) and return.

        Every worker blocks until it has something to do; this thread only waits for the stop.
        """
        self._start(self._publish_loop, "publisher")
        self._start(self._record_loop, "recorder")
        for index, watcher in enumerate(self._watchers):
            self._start(functools.partial(watcher, self._stop_sources), f"watcher-{index}")
        if self._commands is not None and self._transport.commands is not None:
            self._start(self._command_loop, "commands")
        LOGGER.info(
            "agent %s running (%s, transport %s)",
            self.vm_name,
            self.cloud.value,
            self._transport.name,
            extra=logs.fields(vm=self.vm_name, cloud=self.cloud.value),
        )
        stop.wait()
        self.shutdown()

    def _record_loop(self) -> None:
        """Record each observation the watchers made, in the order they made them."""
        while True:
            observation = self._observations.get()
            if observation is None:
                return
            self._handle_until_recorded(observation, self._stop_sources)

    def _handle_until_recorded(self, observation: Observation, stop: StopFlag) -> None:
        """Handle `observation`, again and again while its state cannot be written (a full disk).

        A watcher reports a change once, so dropping it would lose it; the observations after it
        wait in the queue, in order. Stopping meanwhile loses nothing either: the state on disk
        is the one before the change, so the next start sees the change again.
        """
        backoff = Backoff(initial=0.5, maximum=5.0)
        while True:
            try:
                self.handle_observation(observation)
                return
            except StateUnavailableError as exc:
                if self._wait_for_room(exc, backoff, stop, "cannot record a metadata change yet"):
                    return

    def _wait_for_room(self, exc: StateUnavailableError, backoff: Backoff, stop: StopFlag, what: str) -> bool:
        """Count and log a state write that failed for now, then wait for the retry; True when stopping."""
        delay = backoff.next_delay()
        self._metrics.inc("mbridge_errors_total", kind="state")
        LOGGER.error("%s, retrying in %.1f s: %s", what, delay, exc)
        return stop.wait(delay)

    def handle_observation(self, observation: Observation) -> None:
        try:
            applied = self._tracker.apply(observation)
        except MalformedDocumentError as exc:
            # Keep the previous state; the next poll tries again. Nothing is lost by waiting.
            self._metrics.inc("mbridge_errors_total", kind="malformed")
            LOGGER.warning("ignoring a metadata value that does not parse: %s", exc)
            return
        forwarded = [e for e in applied.events if self._forward_all or names_this_vm(e)]
        if len(forwarded) < len(applied.events):
            self._metrics.inc("mbridge_events_not_forwarded_total", len(applied.events) - len(forwarded))
        # Each published event's envelope is a span of its maintenance's trace (agent/traces.py).
        started = [not self._traces.known(event) for event in forwarded]
        contexts, traces = self._traces.plan(forwarded)
        observed = observation.observed_at
        messages = [(event_message(e, observed, trace), observed.timestamp()) for e, trace in zip(forwarded, contexts)]
        envelope_ids = {id(event): message.envelope_id for event, (message, _) in zip(forwarded, messages)}
        trace_ids = {id(event): trace.trace_id for event, trace in zip(forwarded, contexts)}
        pending = _next_pending(self._pending, applied.events)
        states: dict[str, Any] = {self._tracker.state_name: applied.state_json}
        if pending != self._pending:
            states[PENDING_STATE] = sorted(pending.values(), key=lambda labels: labels["event_id"])
        if self._traces.changed(traces):
            states[TRACES_STATE] = Traces.saved(traces)
        self._state.record(messages, states)
        self._tracker.commit(applied)
        self._traces.commit(traces)
        if self._spans is not None:
            recorded = self._clock.now()
            for event, trace, first in zip(forwarded, contexts, started):
                if first:
                    self._spans.detected(event, trace, observed, recorded)
        self._pending = pending  # replaced whole: /metrics reads it from the server's thread
        if pending:
            self._wake.set()  # a resting command loop opens the path for this VM's event
        if self._hooks is not None:
            # After the commit: a change whose state write failed is seen again, and would run twice.
            # So a hook runs at most once per change (a crash right here loses its run).
            for event in applied.events:
                if names_this_vm(event):
                    self._hooks.notify(event)
        self._metrics.observe("mbridge_detection_lag_seconds", observation.lag_bound)
        for event in applied.events:
            LOGGER.info(
                "%s %s %s (%s)",
                event.kind.value,
                event.event_id,
                event.status.value,
                "concerns this VM" if event.concerns_reporter else "another VM",
                # envelope_id and trace_id only for the events published (--forward own leaves others out)
                extra=logs.event_fields(
                    event, envelope_id=envelope_ids.get(id(event)), trace_id=trace_ids.get(id(event))
                ),
            )
            for name in event.unreadable:
                # Forwarded all the same; the count tells an operator that this release reads less
                # than the cloud sends (the reasons are in the log, once each).
                self._metrics.inc("mbridge_unreadable_fields_total", field=name)
        self._readiness.set_pending_impact(self._tracker.impact_pending())

    def shutdown(self) -> None:
        """Stop watching, record what was seen, then give the publisher up to `flush_seconds` to
        empty the outbox."""
        self._stop_sources.set()
        self._wake.set()
        self._observations.put(None)
        receiver = self._transport.commands
        if receiver is not None:
            receiver.interrupt()
        self._join("recorder", RECORD_SETTLE_SECONDS)
        deadline = time.monotonic() + self._flush_seconds
        while self._state.depth() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = self._state.depth()
        if left:
            LOGGER.warning(
                "stopping with %d envelope(s) still in the outbox; they are published on the next start", left
            )
        self._stop_publisher.set()
        self._state.interrupt_waits()
        for thread in self._threads:
            thread.join(timeout=2.0)
        if self._hooks is not None:
            # A change seen just before stopping gets a moment to run its hook; a running one keeps its timeout.
            self._hooks.close(timeout=HOOK_SETTLE_SECONDS)

    def _join(self, name: str, timeout: float) -> None:
        for thread in self._threads:
            if thread.name == name:
                thread.join(timeout)

    def _start(self, target: Callable[[], Any], name: str) -> None:
        thread = threading.Thread(target=self._guarded, args=(target, name), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _guarded(self, target: Callable[[], Any], name: str) -> None:
        """Run a worker; if it ever raises, log it and run it again: one bug must not silently
        stop the agent from watching, publishing or answering."""
        backoff = Backoff(initial=1.0, maximum=30.0)
        state_backoff = Backoff(initial=0.5, maximum=5.0)
        # The publisher outlives the other workers: it flushes the outbox after they stopped.
        stop = self._stop_publisher if name == "publisher" else self._stop_sources
        while not stop.is_set():
            try:
                target()
                return
            except StateUnavailableError as exc:
                # A full disk or an I/O error, not a bug: what the worker was writing is still where
                # it was (an outbox row, an unsettled command), so it starts over once there may be room.
                self._wait_for_room(exc, state_backoff, stop, f"worker {name} cannot write the agent state")
            except Exception:
                delay = backoff.next_delay()
                self._metrics.inc("mbridge_errors_total", kind="crash")
                LOGGER.exception("worker %s failed; restarting it in %.1f s", name, delay)
                stop.wait(delay)

    def threads_alive(self) -> dict[str, bool]:
        return {thread.name: thread.is_alive() for thread in self._threads}

    # ---- publishing

    def _publish_loop(self) -> None:
        next_prune = 0.0
        while not self._stop_publisher.is_set():
            if self._clock.monotonic() >= next_prune:
                # Published rows are kept a day for inspection, then forgotten.
                self._state.prune(published_before=self._clock.now().timestamp() - KEEP_PUBLISHED_SECONDS)
                next_prune = self._clock.monotonic() + PRUNE_EVERY_SECONDS
            recorded = self._state.generation()
            pending = self._state.next_pending()
            if pending is None:
                # Until a row is recorded, the next prune is due, or the agent stops.
                self._state.wait_for_record(recorded, max(0.0, next_prune - self._clock.monotonic()))
                continue
            message = self._proven(pending.seq, pending.message)
            if message is None:
                self._stop_publisher.wait(PROOF_RETRY_SECONDS)
                continue
            try:
                self._transport.publish(message)
            except (TransportUnavailableError, TransportConfigError) as exc:
                # Never skip ahead: order per VM matters more than latency. A config error is
                # retried too — a role assignment may still be propagating.
                self._state.mark_failed(pending.seq, str(exc))
                delay = self._publish_backoff.next_delay()
                kind = "publish_config" if isinstance(exc, TransportConfigError) else "publish"
                self._metrics.inc("mbridge_errors_total", kind=kind)
                LOGGER.warning(
                    "publishing failed (%s), retrying in %.1f s: %s", kind, delay, exc, extra=_message_fields(message)
                )
                self._stop_publisher.wait(delay)
                continue
            published = self._clock.now()
            now = published.timestamp()
            self._state.mark_published(pending.seq, now)
            if self._spans is not None:
                observed = datetime.fromtimestamp(pending.observed_at, published.tzinfo)
                self._spans.published(message, observed, published)
            self._publish_backoff.reset()
            self._metrics.inc("mbridge_events_published_total", type=pending.message.attributes.get("type", ""))
            self._metrics.observe("mbridge_publish_lag_seconds", max(0.0, now - pending.observed_at))
            LOGGER.info("published envelope %s", message.envelope_id, extra=_message_fields(message))

    def _proven(self, seq: int, message: OutboundMessage) -> OutboundMessage | None:
        """The message with this VM's proof of identity; without one at once when the metadata
        service refuses it, or once the proof was missing for `proof_wait_seconds`; None to wait a
        little and ask again. The proof is made when the message goes out, not when it is
        recorded: a backlog must not publish stale proofs."""
        try:
            body = self._prover.prove(message.body)
        except ProofRefusedError as exc:
            return self._refused_proof(seq, message, exc)
        except ProofUnavailableError as exc:
            now = self._clock.monotonic()
            if self._unproven_since is None or self._unproven_since[0] != seq:
                self._unproven_since = (seq, now)
                self._metrics.inc("mbridge_errors_total", kind="identity_proof")
                LOGGER.warning("no proof of identity for message %d yet: %s", seq, exc, extra=_message_fields(message))
            self.last_proof_error = str(exc)
            if now - self._unproven_since[1] < self._proof_wait_seconds:
                return None
            self._unproven_since = None
            self._metrics.inc("mbridge_unproven_messages_total")
            message = with_message_id(message)
            LOGGER.error(
                "publishing message %d without a proof of identity after %.0f s: functions that require one "
                "(trust: attested) will audit it as unverified and not act on it",
                seq,
                self._proof_wait_seconds,
                extra=_message_fields(message),
            )
            return message
        if self._proofs_refused:
            self._proofs_refused = False
            LOGGER.info("the metadata service gives proofs of identity again", extra=_message_fields(message))
        self._unproven_since = None
        self.last_proof_error = ""
        return with_message_id(replace(message, body=body))

    def _refused_proof(self, seq: int, message: OutboundMessage, refusal: ProofRefusedError) -> OutboundMessage:
        """The message without a proof, at once: counted as every unproven message is, logged once
        for all the messages until a proof comes again."""
        if self._unproven_since is None or self._unproven_since[0] != seq:
            self._metrics.inc("mbridge_errors_total", kind="identity_proof")  # not counted yet for this one
        self._unproven_since = None
        self._metrics.inc("mbridge_unproven_messages_total")
        self.last_proof_error = str(refusal)
        message = with_message_id(message)
        if not self._proofs_refused:
            self._proofs_refused = True
            LOGGER.error(
                "the metadata service refuses proofs of identity (%s): messages go without one at once, counted in "
                "mbridge_unproven_messages_total, and functions that require one (trust: attested) audit them as "
                "unverified and do not act on them; it is asked again every few minutes",
                refusal,
                extra=_message_fields(message),
            )
        else:
            LOGGER.debug("publishing message %d without a proof of identity (refused)", seq)
        return message

    # ---- commands

    def _command_loop(self) -> None:
        assert self._commands is not None
        receiver = self._transport.commands
        assert receiver is not None
        backoff = Backoff(initial=1.0, maximum=30.0)
        # Results a previous run decided but did not get into the outbox before it stopped.
        self._record_results(self._commands.unreported())
        while not self._stop_sources.is_set():
            self._record_results(self._commands.run_due())
            if not self._command_path_wanted():
                self._rest_command_path()
                continue
            self._open_command_path()
            try:
                received = receiver.receive_commands(self._command_wait())
            except (TransportUnavailableError, TransportConfigError) as exc:
                # A missing subscription or role is logged and retried: infra may still be converging.
                delay = backoff.next_delay()
                self._metrics.inc("mbridge_errors_total", kind="commands")
                LOGGER.warning("receiving commands failed, retrying in %.1f s: %s", delay, exc)
                self._stop_sources.wait(delay)
                continue
            backoff.reset()
            for command in received:
                try:
                    result = self._commands.handle(command.body)
                except RetryableError as exc:
                    # Not settled: the bus redelivers it, and the processor re-validates then.
                    self._metrics.inc("mbridge_errors_total", kind="command_retry")
                    delay = backoff.next_delay()
                    LOGGER.warning("command given back for redelivery in %.1f s: %s", delay, exc)
                    self._stop_sources.wait(delay)
                    if command.abandon is not None:
                        command.abandon()
                    continue
                except Exception:
                    # A fault in handling one command must not hold up the ones received with it.
                    # Given back unsettled: the bus redelivers it and, past its max delivery count,
                    # dead-letters it.
                    self._metrics.inc("mbridge_errors_total", kind="command_crash")
                    LOGGER.exception("handling a command failed; it is given back to the bus")
                    if command.abandon is not None:
                        command.abandon()
                    continue
                if result is not None:
                    self._record_results([result])
                command.settle()

    def _command_path_wanted(self) -> bool:
        """Whether commands may come now (agent/engagement.py)."""
        assert self._commands is not None
        return self._engagement.engaged(
            open_events=bool(self._pending),
            drained=self._readiness.drained,
            work_pending=self._commands.next_due_at() is not None,
        )

    def _open_command_path(self) -> None:
        self._rested = False
        if not self.command_path_open:
            self.command_path_open = True
            LOGGER.info("receiving commands", extra=logs.fields(vm=self.vm_name))

    def _rest_command_path(self) -> None:
        """Let the transport's connections go, then wait for an event of this VM (or a stop)."""
        if self.command_path_open:
            self.command_path_open = False
            LOGGER.info(
                "no open event, drain or held command: the command path is released until the next event",
                extra=logs.fields(vm=self.vm_name),
            )
        if not self._rested:
            # Once per rest (also at a start with nothing open: the start-up check opened links).
            self._transport.rest()
            self._rested = True
        # Only an event of this VM can open the path again (a drain or a held command comes with
        # one), and it wakes this wait; the timeout only bounds a wake that went missing.
        self._wake.wait(RESTING_WAIT_SECONDS)
        self._wake.clear()

    def _command_wait(self) -> float:
        """Until the next held command is due or the linger ends, at most COMMAND_IDLE_WAIT_SECONDS."""
        assert self._commands is not None
        wait = min(COMMAND_IDLE_WAIT_SECONDS, max(1.0, self._engagement.seconds_left()))
        due = self._commands.next_due_at()
        if due is None:
            return wait
        return max(0.0, min(wait, (due - self._clock.now()).total_seconds()))

    def _record_results(self, results: Sequence[CommandResult]) -> None:
        if not results:
            return
        now = self._clock.now()
        messages = [(result_message(r, self.cloud, self.vm_name, now), now.timestamp()) for r in results]
        self._state.record(messages)
        if self._commands is not None:
            self._commands.mark_reported(results)
        for result, (message, _) in zip(results, messages):
            self._metrics.inc("mbridge_commands_total", result=result.result)
            LOGGER.info(
                "command %s %s: %s",
                result.command_id,
                result.result,
                result.reason,
                extra=logs.fields(
                    command_id=result.command_id,
                    event_id=result.event_id,
                    vm=result.target,
                    cloud=self.cloud.value,
                    result=result.result,
                    envelope_id=message.envelope_id,
                    trace_id=result.trace_id,
                ),
            )


def _next_pending(pending: dict[str, dict[str, str]], events: Sequence[MaintenanceEvent]) -> dict[str, dict[str, str]]:
    """The open events of this VM after `events`: added or updated while scheduled or started,
    removed once completed or canceled. Events of other VMs are left out (`--forward all` would
    otherwise add a series per VM of the availability set)."""
    after = dict(pending)
    for event in events:
        if not event.concerns_reporter:
            continue
        if event.status in ENDED:
            after.pop(event.event_id, None)
        elif event.event_id in after or len(after) < MAX_PENDING_SERIES:
            after[event.event_id] = {"event_id": event.event_id, "kind": event.kind.value, "status": event.status.value}
        else:
            LOGGER.warning(
                "more than %d open events for this VM: %s is left out of mbridge_maintenance_pending",
                MAX_PENDING_SERIES,
                event.event_id,
                extra=logs.event_fields(event),
            )
    return after


def _load_pending(saved: Any) -> dict[str, dict[str, str]]:
    """The open events saved by the last run; nothing from a state that does not read as such."""
    pending: dict[str, dict[str, str]] = {}
    if not isinstance(saved, list):
        return pending
    for item in saved[:MAX_PENDING_SERIES]:
        if isinstance(item, dict) and all(isinstance(item.get(key), str) for key in ("event_id", "kind", "status")):
            pending[item["event_id"]] = {key: item[key] for key in ("event_id", "kind", "status")}
    return pending


def _message_fields(message: OutboundMessage) -> dict[str, object]:
    """The fields of a message on its way to the bus, from the attributes it carries."""
    attributes = message.attributes
    return logs.fields(
        envelope_id=message.envelope_id,
        event_id=attributes.get("event_id"),
        vm=attributes.get("vm"),
        cloud=attributes.get("cloud"),
        trace_id=trace_id_of(message),
    )
