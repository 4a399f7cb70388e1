"""The agent's settings: command-line flags that default to MBRIDGE_* environment variables,
validated once at start (a bad setting stops the agent with a message saying what to set).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.health import DEFAULT_PORT
from agent.sources.azure.client import API_VERSION, API_VERSIONS
from wire.errors import PermanentError
from wire.identity import DEFAULT_AUDIENCE
from wire.model import DEFAULT_HARMLESS_FREEZE_SECONDS, Cloud
from wire.transports.factory import DEFAULT_COMMANDS_TOPIC

TRANSPORTS = ("jsonl", "local", "servicebus", "pubsub")
IDENTITY_PROOFS = ("cloud", "none")
FORWARD = ("own", "all")
DEFAULT_METADATA_URL = {Cloud.AZURE: "http://169.254.169.254", Cloud.GCE: "http://metadata.google.internal"}
# Azure IMDS allows 5 requests/s per VM; the poller alone must stay well under it.
MIN_POLL_INTERVAL = 0.25


class ConfigError(PermanentError):
    """A setting is missing or invalid; the message names the flag and its variable."""


@dataclass(frozen=True)
class AgentSettings:
    cloud: Cloud
    metadata_url: str
    vm_name: str | None
    transport: str
    jsonl_path: str
    state_dir: Path
    bus_path: Path
    poll_interval: float
    listen: tuple[str, int] | None
    dry_run: bool
    verify_key: str | None
    servicebus_namespace: str | None
    servicebus_connection_string: str | None
    servicebus_topic: str
    servicebus_commands_queue: str
    pubsub_project: str | None
    pubsub_topic: str
    pubsub_commands_subscription: str | None
    flush_seconds: float = 10.0
    api_version: str = API_VERSION
    # The isolated commands mode (docs/transports.md): this VM's own subscription of the commands
    # topic instead of its session of the commands queue. None: the queue.
    servicebus_commands_subscription: str | None = None
    servicebus_commands_topic: str | None = None
    # Proof of this VM's identity on every message (docs/security.md): "cloud" or "none".
    identity_proof: str = "cloud"
    identity_audience: str = DEFAULT_AUDIENCE
    # Which events to publish: those whose Resources name this VM ("own"), or every one it sees.
    forward: str = "own"
    # A Freeze this short leaves /readyz ready: the functions' policy harmless_freeze_seconds.
    harmless_freeze_seconds: int = DEFAULT_HARMLESS_FREEZE_SECONDS


def default_state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """/var/lib/mbridge for root (the systemd unit's StateDirectory), else the user's state directory."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/mbridge")
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "mbridge"


def env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def env_flag(name: str) -> bool:
    return (env(name) or "").lower() in ("1", "true", "yes", "on")


def add_transport_arguments(parser: argparse.ArgumentParser) -> None:
    """The bus options shared by `mbridge agent` and `mbridge approve` (docs/contracts.md#transport-options)."""
    group = parser.add_argument_group("transport")
    group.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default=env("MBRIDGE_TRANSPORT", "jsonl"),
        help="where events go and commands come from [MBRIDGE_TRANSPORT, default jsonl]",
    )
    group.add_argument(
        "--jsonl-path",
        default=env("MBRIDGE_JSONL_PATH", "-"),
        help="jsonl: file to append to, - for stdout [MBRIDGE_JSONL_PATH]",
    )
    group.add_argument(
        "--bus-path", default=env("MBRIDGE_BUS_PATH"), help="local: bus file [MBRIDGE_BUS_PATH, <state-dir>/bus.db]"
    )
    group.add_argument(
        "--servicebus-namespace",
        default=env("MBRIDGE_SERVICEBUS_NAMESPACE"),
        help="Service Bus FQDN, managed identity [MBRIDGE_SERVICEBUS_NAMESPACE]",
    )
    group.add_argument(
        "--servicebus-connection-string",
        default=env("MBRIDGE_SERVICEBUS_CONNECTION_STRING"),
        help="Service Bus connection string instead of managed identity [MBRIDGE_SERVICEBUS_CONNECTION_STRING]",
    )
    group.add_argument(
        "--servicebus-topic",
        default=env("MBRIDGE_SERVICEBUS_TOPIC", "maintenance-events"),
        help="[MBRIDGE_SERVICEBUS_TOPIC]",
    )
    group.add_argument(
        "--servicebus-commands-queue",
        default=env("MBRIDGE_SERVICEBUS_COMMANDS_QUEUE", "maintenance-commands"),
        help="session-enabled queue [MBRIDGE_SERVICEBUS_COMMANDS_QUEUE]",
    )
    group.add_argument(
        "--servicebus-commands-subscription",
        default=env("MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION"),
        help="this VM's own subscription of the commands topic: receive commands there instead of from the "
        "queue (the isolated mode) [MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION]",
    )
    group.add_argument(
        "--servicebus-commands-topic",
        default=env("MBRIDGE_SERVICEBUS_COMMANDS_TOPIC"),
        help="commands topic of the isolated mode; mbridge approve sends to it when set "
        f"[MBRIDGE_SERVICEBUS_COMMANDS_TOPIC, default {DEFAULT_COMMANDS_TOPIC} with a subscription]",
    )
    group.add_argument("--pubsub-project", default=env("MBRIDGE_PUBSUB_PROJECT"), help="[MBRIDGE_PUBSUB_PROJECT]")
    group.add_argument(
        "--pubsub-topic", default=env("MBRIDGE_PUBSUB_TOPIC", "maintenance-events"), help="[MBRIDGE_PUBSUB_TOPIC]"
    )
    group.add_argument(
        "--pubsub-commands-subscription",
        default=env("MBRIDGE_PUBSUB_COMMANDS_SUBSCRIPTION"),
        help="[MBRIDGE_PUBSUB_COMMANDS_SUBSCRIPTION, default maintenance-commands-<vm name>]",
    )


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cloud",
        choices=[c.value for c in Cloud],
        default=env("MBRIDGE_CLOUD"),
        help="which metadata service to watch [MBRIDGE_CLOUD] (required)",
    )
    parser.add_argument(
        "--metadata-url",
        default=env("MBRIDGE_METADATA_URL"),
        help="base URL of the metadata service, e.g. a simulator's http://127.0.0.1:PORT "
        "[MBRIDGE_METADATA_URL, default http://169.254.169.254 or http://metadata.google.internal]",
    )
    parser.add_argument(
        "--vm-name", default=env("MBRIDGE_VM_NAME"), help="this VM's name [MBRIDGE_VM_NAME, default: from metadata]"
    )
    parser.add_argument(
        "--state-dir",
        default=env("MBRIDGE_STATE_DIR"),
        help="outbox, state and command ledger [MBRIDGE_STATE_DIR, default /var/lib/mbridge for root, "
        "else $XDG_STATE_HOME/mbridge]",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        # A string default goes through `type` too: a bad MBRIDGE_POLL_INTERVAL is a usage error.
        default=env("MBRIDGE_POLL_INTERVAL", "1.0"),
        help="Azure poll interval in seconds [MBRIDGE_POLL_INTERVAL, default 1]",
    )
    parser.add_argument(
        "--api-version",
        default=env("MBRIDGE_API_VERSION", API_VERSION),
        help=f"Azure Scheduled Events api-version, one of {', '.join(API_VERSIONS)} "
        f"[MBRIDGE_API_VERSION, default {API_VERSION}]",
    )
    parser.add_argument(
        "--listen",
        default=env("MBRIDGE_LISTEN", f"127.0.0.1:{DEFAULT_PORT}"),
        help=f"host:port for /healthz /readyz /metrics, or 'off' [MBRIDGE_LISTEN, default 127.0.0.1:{DEFAULT_PORT}]",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=env_flag("MBRIDGE_DRY_RUN"),
        help="never POST approvals to IMDS; log what would be done [MBRIDGE_DRY_RUN]",
    )
    parser.add_argument(
        "--verify-key",
        default=env("MBRIDGE_VERIFY_KEY"),
        help="Ed25519 public key (PEM, base64 or a file): commands must be signed with its private key "
        "[MBRIDGE_VERIFY_KEY]",
    )
    parser.add_argument(
        "--insecure-unsigned-commands",
        action="store_true",
        default=env_flag("MBRIDGE_INSECURE_UNSIGNED_COMMANDS"),
        help="accept unsigned commands from the bus (anyone who can send to it could approve this VM's "
        "events); without it, every transport but jsonl needs --verify-key [MBRIDGE_INSECURE_UNSIGNED_COMMANDS]",
    )
    parser.add_argument(
        "--identity-proof",
        choices=IDENTITY_PROOFS,
        default=env("MBRIDGE_IDENTITY_PROOF", "cloud"),
        help="attach proof of this VM's identity from the metadata service to every message (Azure attested "
        "document, GCE identity token), or none [MBRIDGE_IDENTITY_PROOF, default cloud]",
    )
    parser.add_argument(
        "--identity-audience",
        default=env("MBRIDGE_IDENTITY_AUDIENCE", DEFAULT_AUDIENCE),
        help="GCE: the audience identity tokens are asked for (the functions' MBRIDGE_TRUST_AUDIENCE), to which "
        f"the message's digest is added [MBRIDGE_IDENTITY_AUDIENCE, default {DEFAULT_AUDIENCE}]",
    )
    parser.add_argument(
        "--forward",
        choices=FORWARD,
        default=env("MBRIDGE_FORWARD", "own"),
        help="publish only the events whose Resources name this VM (own: only those can move anything), "
        "or every event this VM sees [MBRIDGE_FORWARD, default own]",
    )
    parser.add_argument(
        "--harmless-freeze-seconds",
        type=int,
        default=env("MBRIDGE_HARMLESS_FREEZE_SECONDS", str(DEFAULT_HARMLESS_FREEZE_SECONDS)),
        help="a Freeze at most this long leaves /readyz ready; keep it equal to the functions' policy "
        f"harmless_freeze_seconds [MBRIDGE_HARMLESS_FREEZE_SECONDS, default {DEFAULT_HARMLESS_FREEZE_SECONDS}]",
    )
    parser.add_argument(
        "--check", action="store_true", help="diagnose metadata access, own name and bus auth, then exit 0 or 1"
    )
    add_transport_arguments(parser)


def parse_listen(text: str | None) -> tuple[str, int] | None:
    if text is None or text.lower() in ("", "off", "none"):
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen {text!r}: expected HOST:PORT (port 0 = any free port) or 'off' [MBRIDGE_LISTEN]")
    return (host.strip("[]") or "127.0.0.1", int(port))


def settings_from_args(args: argparse.Namespace) -> AgentSettings:
    if not args.cloud:
        raise ConfigError("--cloud azure|gce is required [MBRIDGE_CLOUD]")
    cloud = Cloud(args.cloud)
    if args.poll_interval < MIN_POLL_INTERVAL:
        raise ConfigError(
            f"--poll-interval {args.poll_interval:g} is below {MIN_POLL_INTERVAL:g} s: Azure IMDS allows 5 requests/s "
            "per VM, shared with every other IMDS user on it [MBRIDGE_POLL_INTERVAL]"
        )
    if args.api_version not in API_VERSIONS:
        raise ConfigError(
            f"--api-version {args.api_version!r} is not a Scheduled Events version the Azure docs list: "
            f"use one of {', '.join(API_VERSIONS)} (default {API_VERSION}) [MBRIDGE_API_VERSION]"
        )
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
    if args.transport == "servicebus" and not (args.servicebus_namespace or args.servicebus_connection_string):
        raise ConfigError(
            "--transport servicebus needs --servicebus-namespace FQDN (managed identity) "
            "or --servicebus-connection-string [MBRIDGE_SERVICEBUS_NAMESPACE / MBRIDGE_SERVICEBUS_CONNECTION_STRING]"
        )
    if args.transport == "servicebus" and args.servicebus_commands_topic and not args.servicebus_commands_subscription:
        raise ConfigError(
            "--servicebus-commands-topic: the agent receives from its own subscription of the commands topic; "
            "set --servicebus-commands-subscription too [MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION]"
        )
    if args.transport != "jsonl" and not args.verify_key and not args.insecure_unsigned_commands:
        raise ConfigError(
            f"--transport {args.transport} takes commands from a bus that others can send to: "
            "give the functions' public key with --verify-key [MBRIDGE_VERIFY_KEY] so that only signed commands "
            "are executed, or accept unsigned ones knowingly with --insecure-unsigned-commands "
            "[MBRIDGE_INSECURE_UNSIGNED_COMMANDS] (docs/security.md)"
        )
    if args.harmless_freeze_seconds < 0:
        raise ConfigError("--harmless-freeze-seconds must be >= 0 [MBRIDGE_HARMLESS_FREEZE_SECONDS]")
    if not args.identity_audience or any(c.isspace() for c in args.identity_audience):
        raise ConfigError("--identity-audience must be a non-empty string without spaces [MBRIDGE_IDENTITY_AUDIENCE]")
    if args.transport == "pubsub" and not args.pubsub_project:
        raise ConfigError("--transport pubsub needs --pubsub-project [MBRIDGE_PUBSUB_PROJECT]")
    return AgentSettings(
        cloud=cloud,
        metadata_url=(args.metadata_url or DEFAULT_METADATA_URL[cloud]).rstrip("/"),
        vm_name=args.vm_name,
        transport=args.transport,
        jsonl_path=args.jsonl_path,
        state_dir=state_dir,
        bus_path=Path(args.bus_path) if args.bus_path else state_dir / "bus.db",
        poll_interval=args.poll_interval,
        listen=parse_listen(args.listen),
        dry_run=args.dry_run,
        verify_key=args.verify_key,
        servicebus_namespace=args.servicebus_namespace,
        servicebus_connection_string=args.servicebus_connection_string,
        servicebus_topic=args.servicebus_topic,
        servicebus_commands_queue=args.servicebus_commands_queue,
        pubsub_project=args.pubsub_project,
        pubsub_topic=args.pubsub_topic,
        pubsub_commands_subscription=args.pubsub_commands_subscription,
        api_version=args.api_version,
        servicebus_commands_subscription=args.servicebus_commands_subscription,
        servicebus_commands_topic=args.servicebus_commands_topic,
        identity_proof=args.identity_proof,
        identity_audience=args.identity_audience,
        forward=args.forward,
        harmless_freeze_seconds=args.harmless_freeze_seconds,
    )
