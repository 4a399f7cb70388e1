"""`mbridge agent`: build the agent from its settings, run it, or diagnose its environment."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO, TypeVar

from agent import logs
from agent.config import AgentSettings, ConfigError, add_agent_arguments, env, settings_from_args
from agent.health import HealthServer, Metrics, Readiness
from agent.loop import Agent
from agent.proofs import NoProof, ProofUnavailableError, Prover
from agent.sources.base import Source
from agent.sources.http import MetadataUnavailableError
from agent.sources.registry import open_source
from agent.state import SCHEMA as AGENT_SCHEMA
from agent.state import AgentState
from agent.state_files import StateUnavailableError, state_dir_problems
from agent.timing import Clock, SystemClock
from wire.errors import BridgeError
from wire.transports.base import AgentTransport, TransportConfigError, TransportUnavailableError

if TYPE_CHECKING:  # imported lazily at run time: only agents with a command channel need it
    from agent.commands import CommandProcessor

LOGGER = logging.getLogger("mbridge.agent")
READINESS_STATE = "readiness"
AGENT_DB = "agent.db"  # outbox and source state
LEDGER_DB = "commands.db"  # the command ledger

T = TypeVar("T")


def configure(parser: argparse.ArgumentParser) -> None:
    add_agent_arguments(parser)
    parser.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        default=env("MBRIDGE_LOG_LEVEL", "INFO"),
        help="[MBRIDGE_LOG_LEVEL, default INFO]",
    )


def run(args: argparse.Namespace) -> int:
    # Handlers first: a SIGTERM during start-up must still end in a clean exit.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    logs.configure(args.log_level)
    try:
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"mbridge agent: {exc}", file=sys.stderr)
        return 2
    if args.check:
        return check(settings, out=sys.stdout)
    try:
        return run_agent(settings, stop)
    except BridgeError as exc:
        LOGGER.error("cannot start: %s", exc)
        # A setting that cannot work (a state directory, a port) exits 2 like a bad flag: the
        # installers read 2 as "fix the configuration", anything else as worth retrying.
        return 2 if isinstance(exc, ConfigError) else 1


def resolve_vm_name(settings: AgentSettings, source: Source, stop: threading.Event) -> str:
    """--vm-name, else the name the metadata service reports (retried: IMDS may be slow at boot)."""
    if settings.vm_name:
        return settings.vm_name
    return _retry(source.own_name, stop, "this VM's name")


def build_transport(settings: AgentSettings, vm_name: str) -> AgentTransport:
    """The chosen transport; cloud SDKs are imported only here, only when chosen."""
    if settings.transport == "jsonl":
        from wire.transports.jsonl import JsonlTransport

        return JsonlTransport(settings.jsonl_path)
    if settings.transport == "local":
        from wire.transports.local import LocalTransport

        return LocalTransport.open(settings.bus_path, vm_name)
    from wire.transports.factory import build_cloud_transport

    return build_cloud_transport(settings, vm_name)


def run_agent(
    settings: AgentSettings,
    stop: threading.Event,
    clock: Clock | None = None,
    transport: AgentTransport | None = None,
) -> int:
    """Run until `stop` is set. `transport` replaces the one the settings name (for embedding
    the agent, e.g. in the demo, or wrapping it in tests)."""
    clock = clock or SystemClock()
    # The state first: an unusable state directory is a configuration error, best found at once.
    state = _retry(lambda: AgentState(settings.state_dir / AGENT_DB), stop, "the agent state", StateUnavailableError)
    source = open_source(settings)
    vm_name = resolve_vm_name(settings, source, stop)
    transport = transport or build_transport(settings, vm_name)
    metrics = _metrics()
    readiness = _readiness(state, follows_commands=transport.commands is not None)
    tracker = source.tracker(vm_name, state, stop, _retry)
    commands = _command_processor(settings, source, vm_name, readiness, clock, stop) if transport.commands else None
    if commands is not None:
        tracker.follow_approvals(commands.approved_event_ids)
    agent = Agent(
        cloud=settings.cloud,
        vm_name=vm_name,
        tracker=tracker,
        transport=transport,
        state=state,
        readiness=readiness,
        metrics=metrics,
        clock=clock,
        commands=commands,
        flush_seconds=settings.flush_seconds,
        prover=build_prover(settings, source, clock),
        forward_all=settings.forward == "all",
    )
    agent.attach_watchers(source.watchers(agent, clock))
    metrics.gauge("mbridge_outbox_depth", lambda: float(state.depth()))
    metrics.gauge(
        "mbridge_seconds_since_last_good_poll",
        lambda: None if agent.liveness.last_good_poll is None else clock.monotonic() - agent.liveness.last_good_poll,
    )
    health = _start_health(settings, metrics, readiness, agent)
    try:
        agent.run(stop)
    finally:
        if health is not None:
            health.stop()
        transport.close()
        state.close()
        source.close()
    LOGGER.info("agent %s stopped", vm_name)
    return 0


def build_prover(settings: AgentSettings, source: Source, clock: Clock) -> Prover:
    """How this agent proves its identity on each message."""
    if settings.identity_proof == "none":
        return NoProof()
    return source.prover(clock)


def _retry(
    read: Callable[[], T],
    stop: threading.Event,
    what: str,
    transient: type[BridgeError] = MetadataUnavailableError,
) -> T:
    """Read what start-up needs, retrying while it raises `transient`: the metadata service may be
    slow while the VM boots, a full disk may get space again."""
    delay = 1.0
    while True:
        try:
            return read()
        except transient as exc:
            LOGGER.warning("cannot read %s yet (%s); retrying in %.0f s", what, exc, delay)
            if stop.wait(delay):
                raise
            delay = min(delay * 2, 30.0)


def _metrics() -> Metrics:
    metrics = Metrics()
    metrics.describe("mbridge_polls_total", "counter", "Metadata reads by result (changed, unchanged, error).")
    metrics.describe("mbridge_errors_total", "counter", "Errors by kind.")
    metrics.describe(
        "mbridge_unreadable_fields_total",
        "counter",
        "Envelopes forwarded with a field of the cloud's entry this release could not read, by field.",
    )
    metrics.describe("mbridge_events_published_total", "counter", "Envelopes the bus accepted, by type.")
    metrics.describe(
        "mbridge_unproven_messages_total",
        "counter",
        "Messages published without a proof of this VM's identity (the metadata service gave none in time).",
    )
    metrics.describe(
        "mbridge_events_not_forwarded_total",
        "counter",
        "Events of other VMs seen in the metadata and not published (--forward own).",
    )
    metrics.describe("mbridge_commands_total", "counter", "Commands answered, by result.")
    metrics.describe("mbridge_outbox_depth", "gauge", "Envelopes waiting for the bus.")
    metrics.describe(
        "mbridge_seconds_since_last_good_poll", "gauge", "Seconds since the metadata service last answered."
    )
    metrics.describe(
        "mbridge_detection_lag_seconds",
        "histogram",
        "Upper bound of how long a change was visible in the metadata service before the agent saw it.",
    )
    metrics.describe(
        "mbridge_publish_lag_seconds", "histogram", "From observing a change to the bus accepting its envelope."
    )
    return metrics


def _readiness(state: AgentState, *, follows_commands: bool) -> Readiness:
    saved: Any = state.load(READINESS_STATE) or {}

    def persist(drained: bool, reason: str) -> None:
        state.record([], {READINESS_STATE: {"drained": drained, "reason": reason}})

    return Readiness(
        follows_commands=follows_commands,
        drained=bool(saved.get("drained", False)),
        reason=str(saved.get("reason", "")),
        persist=persist,
    )


def _command_processor(
    settings: AgentSettings,
    source: Source,
    vm_name: str,
    readiness: Readiness,
    clock: Clock,
    stop: threading.Event,
) -> CommandProcessor:
    from agent.commands import CommandLedger, CommandProcessor

    verify_key = None
    if settings.verify_key:
        from wire.signing import load_public_key

        verify_key = load_public_key(settings.verify_key)
    return CommandProcessor(
        vm_name=vm_name,
        cloud=settings.cloud,
        ledger=_retry(
            lambda: CommandLedger(settings.state_dir / LEDGER_DB), stop, "the command ledger", StateUnavailableError
        ),
        readiness=readiness,
        approver=source.approver(),
        verify_key=verify_key,
        dry_run=settings.dry_run,
        clock=clock,
    )


def _start_health(settings: AgentSettings, metrics: Metrics, readiness: Readiness, agent: Agent) -> HealthServer | None:
    if settings.listen is None:
        return None

    def liveness() -> dict[str, object]:
        threads = agent.threads_alive()
        return {"healthy": all(threads.values()), "threads": threads}

    host, port = settings.listen
    try:
        server = HealthServer(host, port, metrics=metrics, readiness=readiness, liveness=liveness)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({exc}); choose another --listen or 'off'") from exc
    server.start()
    LOGGER.info("health endpoints on %s", server.address)
    return server


def check(settings: AgentSettings, out: TextIO) -> int:
    """Diagnose metadata reachability, this VM's name and bus access; 0 healthy, 1 problems."""
    problems = 0

    def report(ok: bool, text: str) -> None:
        nonlocal problems
        problems += 0 if ok else 1
        print(f"{'ok     ' if ok else 'PROBLEM'} {text}", file=out)

    source = open_source(settings)
    try:
        report(True, source.describe_read())
    except MetadataUnavailableError as exc:
        report(
            False,
            f"metadata service at {settings.metadata_url}: {exc}. Is this a VM of that cloud, "
            "and is the link-local address reachable (no proxy, no firewall rule)?",
        )
    try:
        name = source.own_name()
        note = f" (overridden by --vm-name {settings.vm_name})" if settings.vm_name and settings.vm_name != name else ""
        report(True, f"this VM's name: {name}{note}")
    except MetadataUnavailableError as exc:
        if settings.vm_name:
            report(True, f"this VM's name: {settings.vm_name} (from --vm-name; metadata did not say: {exc})")
        else:
            report(False, f"this VM's name: {exc}; pass --vm-name NAME to set it")
    _check_proof(settings, source, report)
    vm_name = settings.vm_name or "unknown-vm"
    try:
        transport = build_transport(settings, vm_name)
        try:
            report(True, transport.check())
        finally:
            transport.close()
    except (TransportConfigError, TransportUnavailableError, ConfigError) as exc:
        report(False, f"transport {settings.transport}: {exc}")
    _check_state_dir(settings.state_dir, report)
    source.close()
    print("healthy" if problems == 0 else f"{problems} problem(s)", file=out)
    return 0 if problems == 0 else 1


def _check_proof(settings: AgentSettings, source: Source, report: Callable[[bool, str], None]) -> None:
    """Ask the metadata service for a proof of identity as the publisher will."""
    if settings.identity_proof == "none":
        report(True, "proof of identity: off (--identity-proof none); functions must use trust: reporter-name")
        return
    probe = b'{"specversion":"1.0","id":"check"}'
    try:
        proven = build_prover(settings, source, SystemClock()).prove(probe)
    except ProofUnavailableError as exc:
        report(
            False,
            f"proof of identity: {exc}. Messages will go without one, and functions with trust: attested "
            "will not act on them",
        )
        return
    what = source.proof_name
    report(True, f"proof of identity: the metadata service gives an {what} ({len(proven) - len(probe)} bytes)")


def _check_state_dir(state_dir: Path, report: Callable[[bool, str], None]) -> None:
    """Write a database in the state directory for real, and look at the agent's own files there."""
    from agent.commands import SCHEMA as LEDGER_SCHEMA

    problems = state_dir_problems(state_dir, {AGENT_DB: AGENT_SCHEMA, LEDGER_DB: LEDGER_SCHEMA})
    for problem in problems:
        report(False, problem)
    if not problems:
        report(True, f"state directory {state_dir}: the agent can write its databases there")
