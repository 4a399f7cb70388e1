"""`mbridge agent`: build the agent from its settings and run it (`--check` is agent/check.py)."""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from agent import logs
from agent.config import SETTING, AgentSettings, ConfigError, add_agent_arguments, settings_from_args
from agent.health import HealthServer, Metrics, Readiness
from agent.health.catalog import agent_metrics
from agent.loop import Agent
from agent.proofs import NoProof, Prover
from agent.sources.base import Source
from agent.sources.http import MetadataUnavailableError
from agent.sources.registry import open_source
from agent.state import AgentState
from agent.state_files import StateUnavailableError
from agent.stopping import StopFlag, StopSignal
from agent.timing import Clock, SystemClock
from wire.errors import BridgeError
from wire.transports.base import AgentTransport, TransportConfigError
from wire.version import version

if TYPE_CHECKING:  # imported lazily at run time: only agents with a command channel, or a hook, need them
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from agent.commands import CommandProcessor
    from agent.commands.ports import Approver
    from agent.hooks import HookRunner
    from agent.traces import Spans

LOGGER = logging.getLogger("mbridge.agent")
READINESS_STATE = "readiness"
AGENT_DB = "agent.db"  # outbox and source state
LEDGER_DB = "commands.db"  # the command ledger

T = TypeVar("T")

# Exit codes (docs/operations.md#configuration): the installer reads 2 as "fix the configuration"
# and stops there, anything else as worth starting the agent anyway (it retries on its own).
EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_CONFIG = 2

# How long the child that checks the verification key at start may take (a cold start of the
# interpreter and cryptography on a small VM takes about a second).
VERIFY_KEY_CHECK_TIMEOUT = 60.0

# The span export (--otlp-endpoint): its module, imported by name (mypy's 3.9 pass leaves it out),
# and the extra that installs what it imports.
OTEL_MODULE = "agent.otel"
OTEL_EXTRA = "agent-otel"

# The module each bus's transport imports, what it needs, and the extra that installs it.
TRANSPORT_SDKS = {
    "servicebus": ("wire.transports.servicebus", "the Azure Service Bus SDK", "agent-servicebus"),
    "pubsub": ("wire.transports.pubsub", "the Google Cloud Pub/Sub library", "agent-pubsub"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    add_agent_arguments(parser)
    parser.add_argument("--version", action="version", version=f"mbridge {version()}")


def run(args: argparse.Namespace) -> int:
    # Handlers first: a SIGTERM during start-up must still end in a clean exit.
    stop = StopSignal()  # a signal handler may set it while the main thread waits on it
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        settings = settings_from_args(args)
        logs.configure(settings.log_level)
        if args.check:
            from agent.check import check  # only --check loads the diagnosis

            return check(settings, out=sys.stdout)
        # What the start would meet only later, after a wait on the metadata service: found now,
        # it is one line and exit 2 rather than a failure minutes into the start.
        check_verify_key(settings)
        import_transport(settings.transport)
        check_transport_settings(settings)
        import_otel(settings)
    except ConfigError as exc:
        print(f"mbridge agent: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        return run_agent(settings, stop)
    except BridgeError as exc:
        LOGGER.error("cannot start: %s", exc)
        # A setting that cannot work (a state directory, a port) exits 2 like a bad flag: the
        # installers read 2 as "fix the configuration", anything else as worth retrying.
        return EXIT_CONFIG if isinstance(exc, ConfigError) else EXIT_PROBLEM


def resolve_vm_name(settings: AgentSettings, source: Source, stop: StopFlag) -> str:
    """--vm-name, else the name the metadata service reports (retried: IMDS may be slow at boot)."""
    if settings.vm_name:
        return settings.vm_name
    return _retry(source.own_name, stop, "this VM's name")


def import_transport(transport: str) -> str:
    """Import the chosen bus's module as the transport does, and say what it needed. Raises
    ConfigError when its SDK is missing: an install without the bus's extra never starts."""
    if transport not in TRANSPORT_SDKS:
        return f"transport {transport}: needs no SDK"
    module, needs, extra = TRANSPORT_SDKS[transport]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise SETTING["transport"].error(
            f"{transport!r} needs {needs}, which cannot be imported ({exc})",
            f"install maintenance-bridge[{extra}] (infra/agent/install-agent.sh does), or choose another transport",
        ) from None
    return f"transport {transport}: {needs} is importable"


def import_otel(settings: AgentSettings) -> Any:
    """The span export's module when --otlp-endpoint is set (None without it: nothing of
    OpenTelemetry is imported). Raises ConfigError when the extra that brings it is missing."""
    if settings.otlp_endpoint is None:
        return None
    try:
        return importlib.import_module(OTEL_MODULE)
    except ImportError as exc:
        raise SETTING["otlp_endpoint"].error(
            f"exporting spans needs the OpenTelemetry SDK and its OTLP/HTTP exporter, which cannot be imported ({exc})",
            f"install maintenance-bridge[{OTEL_EXTRA}] beside the agent (the agent's .pex does not carry it; on "
            "Python 3.9 pip picks OpenTelemetry 1.41, the last release for 3.9), or leave the setting unset",
        ) from None


def open_spans(settings: AgentSettings, vm_name: str, clock: Clock) -> Spans | None:
    """Where the agent's spans go: None (the default) unless --otlp-endpoint is set."""
    otel = import_otel(settings)
    if otel is None:
        return None
    spans: Spans = otel.open_spans(settings.otlp_endpoint, cloud=settings.cloud, vm_name=vm_name, clock=clock)
    return spans


def load_verify_key(settings: AgentSettings) -> Ed25519PublicKey | None:
    """The key commands must be signed with, None without one; ConfigError when it does not load."""
    if not settings.verify_key:
        return None
    from wire.signing import load_public_key

    try:
        return load_public_key(settings.verify_key)
    except BridgeError as exc:
        raise SETTING["verify_key"].error(
            str(exc), "give the functions' Ed25519 public key: PEM, base64, or the path of a file holding one"
        ) from None


def check_verify_key(settings: AgentSettings) -> None:
    """Load the verification key once, in a short-lived child process: a key that does not load
    stops the agent now (exit 2), while this process loads `cryptography` (8 MB resident, see
    docs/performance.md) only when the first command comes. Loaded here if no child can start.

    Raises:
        ConfigError: the key does not load; the message is the loader's.
    """
    if not settings.verify_key:
        return
    import subprocess

    try:
        child = subprocess.run(
            [sys.executable, "-m", "agent.verify_key_check"],
            input=settings.verify_key.encode("utf-8"),
            capture_output=True,
            timeout=VERIFY_KEY_CHECK_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        load_verify_key(settings)
        return
    if child.returncode == 0:
        return
    message = child.stderr.decode("utf-8", "replace").strip().splitlines()
    if child.returncode != EXIT_CONFIG or not message:
        load_verify_key(settings)  # the child failed for a reason of its own: load it here instead
        return
    raise SETTING["verify_key"].error(
        message[-1], "give the functions' Ed25519 public key: PEM, base64, or the path of a file holding one"
    )


def build_transport(settings: AgentSettings, vm_name: str) -> AgentTransport:
    """The chosen transport; cloud SDKs are imported only here, only when chosen."""
    import_transport(settings.transport)
    if settings.transport == "jsonl":
        from wire.transports.jsonl import JsonlTransport

        return JsonlTransport(settings.jsonl_path)
    if settings.transport == "local":
        from wire.transports.local import LocalTransport

        return LocalTransport.open(settings.bus_path, vm_name)
    from wire.transports.factory import build_cloud_transport

    return build_cloud_transport(settings, vm_name)


def build_transport_checked(settings: AgentSettings, vm_name: str) -> AgentTransport:
    """`build_transport`, with what it refuses as the ConfigError it is. Building a transport reads
    only its settings (no client touches the network before it is used), so a TransportConfigError
    here is a value or a combination of the bus's settings that cannot work: exit 2, not 1."""
    try:
        return build_transport(settings, vm_name)
    except TransportConfigError as exc:
        raise SETTING["transport"].error(
            f"{settings.transport}: {exc}", "fix the setting it names (docs/transports.md)"
        ) from None


def check_transport_settings(settings: AgentSettings) -> None:
    """Build the cloud transport once and drop it: its settings refused now are one line and exit 2,
    not a failure once the metadata service has answered (the VM's name comes from it).

    Raises:
        ConfigError: the bus's settings cannot work together, or one has the wrong shape.
    """
    if settings.transport in TRANSPORT_SDKS:
        build_transport_checked(settings, settings.vm_name or "unknown-vm").close()


def run_agent(
    settings: AgentSettings,
    stop: StopFlag,
    clock: Clock | None = None,
    transport: AgentTransport | None = None,
) -> int:
    """Run until `stop` is set. `transport` replaces the one the settings name (for embedding
    the agent, e.g. in the demo, or wrapping it in tests)."""
    clock = clock or SystemClock()
    # The state first: an unusable state directory is a configuration error, best found at once
    # (and said in one line, the only one).
    state = _retry(lambda: AgentState(settings.state_dir / AGENT_DB), stop, "the agent state", StateUnavailableError)
    # The release as a field of the start-up line: a log store can then say which VMs run which.
    LOGGER.info(
        "mbridge agent %s starting",
        version(),
        extra=logs.fields(version=version(), cloud=settings.cloud.value, vm=settings.vm_name),
    )
    source = open_source(settings)
    vm_name = resolve_vm_name(settings, source, stop)
    transport = transport or build_transport_checked(settings, vm_name)
    metrics = agent_metrics()
    readiness = _readiness(state, follows_commands=transport.commands is not None)
    tracker = source.tracker(vm_name, state, stop, _retry)
    spans = open_spans(settings, vm_name, clock)
    commands = (
        _command_processor(settings, source, vm_name, readiness, clock, stop, spans) if transport.commands else None
    )
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
        hooks=_hooks(settings, metrics),
        command_linger_seconds=settings.command_linger,
        spans=spans,
    )
    agent.attach_watchers(source.watchers(agent, clock))
    metrics.gauge("mbridge_outbox_depth", lambda: float(state.depth()))
    started = clock.monotonic()
    # Before the first good poll: the time since the start, so the age grows from the start.
    metrics.gauge(
        "mbridge_seconds_since_last_good_poll",
        lambda: (
            clock.monotonic() - (started if agent.liveness.last_good_poll is None else agent.liveness.last_good_poll)
        ),
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
        if spans is not None:
            spans.close()
    LOGGER.info("agent %s stopped", vm_name)
    return 0


def build_prover(settings: AgentSettings, source: Source, clock: Clock) -> Prover:
    """How this agent proves its identity on each message."""
    if settings.identity_proof == "none":
        return NoProof()
    return source.prover(clock)


def _retry(
    read: Callable[[], T],
    stop: StopFlag,
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


def _hooks(settings: AgentSettings, metrics: Metrics) -> HookRunner | None:
    """The hook command's runner, if one is set (the setting was checked when it was read)."""
    if settings.hook_command is None:
        return None
    from agent.hook_command import parse_command
    from agent.hooks import HookRunner

    return HookRunner(parse_command(settings.hook_command), settings.hook_timeout, metrics=metrics)


def _readiness(state: AgentState, *, follows_commands: bool) -> Readiness:
    saved: Any = state.load(READINESS_STATE) or {}

    def persist(drained: bool, reason: str) -> None:
        state.record([], {READINESS_STATE: {"drained": drained, "reason": reason}})

    return Readiness(
        follows_commands=follows_commands,
        drained=bool(saved.get("drained", False)),
        reason=str(saved.get("reason", "")),
        persist=persist,
        awaiting_first_poll=True,
    )


def _command_processor(
    settings: AgentSettings,
    source: Source,
    vm_name: str,
    readiness: Readiness,
    clock: Clock,
    stop: StopFlag,
    spans: Spans | None = None,
) -> CommandProcessor:
    from agent.commands import CommandLedger, CommandProcessor

    def verify_key() -> Ed25519PublicKey:
        key = load_verify_key(settings)
        assert key is not None  # only called when a key is set
        return key

    return CommandProcessor(
        vm_name=vm_name,
        cloud=settings.cloud,
        ledger=_retry(
            lambda: CommandLedger(settings.state_dir / LEDGER_DB), stop, "the command ledger", StateUnavailableError
        ),
        readiness=readiness,
        approver=_traced(source.approver(), spans),
        verify_key=verify_key if settings.verify_key else None,
        dry_run=settings.dry_run,
        clock=clock,
        spans=spans,
    )


def _traced(approver: Approver | None, spans: Spans | None) -> Approver | None:
    """The approver, its POSTs spans of the command carried out when spans are exported."""
    return approver if approver is None or spans is None else spans.approver(approver)


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
