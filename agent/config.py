"""The agent's settings: SETTINGS is the one definition of each (flag, MBRIDGE_* variable, config
file key, what it takes, default, meaning); agent.settings_spec derives the parser, the reading of
every source and the reference in docs/operations.md from it. Values are validated once at start:
a bad one stops the agent with one line saying what to set, and exit 2.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.engagement import DEFAULT_LINGER_SECONDS
from agent.health import DEFAULT_PORT
from agent.hook_command import DEFAULT_TIMEOUT as DEFAULT_HOOK_TIMEOUT
from agent.hook_command import HookCommandError
from agent.hook_command import parse_command as parse_hook_command
from agent.settings_spec import (
    Boolean,
    Choice,
    Listen,
    Number,
    Origin,
    PathKind,
    Setting,
    Text,
    Url,
    add_arguments,
    resolve,
)
from agent.settings_spec import ConfigError as ConfigError  # re-exported: its callers import it from here
from agent.sources.azure.client import API_VERSION, API_VERSIONS
from wire.identity import DEFAULT_AUDIENCE
from wire.model import DEFAULT_HARMLESS_FREEZE_SECONDS, Cloud
from wire.shards import MAX_SHARDS
from wire.transports.factory import DEFAULT_COMMANDS_TOPIC

TRANSPORTS = ("jsonl", "local", "servicebus", "pubsub")
IDENTITY_PROOFS = ("cloud", "none")
FORWARD = ("own", "all")
DEFAULT_METADATA_URL = {Cloud.AZURE: "http://169.254.169.254", Cloud.GCE: "http://metadata.google.internal"}
# Azure IMDS allows 5 requests/s per VM; the poller alone must stay well under it.
MIN_POLL_INTERVAL = 0.25


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
    # Service Bus: how many commands queues (or topics) the deployment spreads commands over; the
    # agent reads its own, wire.shards.entity_for(<queue or topic>, vm, count) (docs/deploy.md).
    commands_shards: int = 1
    # Proof of this VM's identity on every message (docs/security.md): "cloud" or "none".
    identity_proof: str = "cloud"
    identity_audience: str = DEFAULT_AUDIENCE
    # Which events to publish: those whose Resources name this VM ("own"), or every one it sees.
    forward: str = "own"
    # A Freeze this short leaves /readyz ready: the functions' policy harmless_freeze_seconds.
    harmless_freeze_seconds: int = DEFAULT_HARMLESS_FREEZE_SECONDS
    log_level: str = "INFO"
    # A command run on each change of this VM's maintenance (agent/hooks.py), as given; None: none.
    hook_command: str | None = None
    hook_timeout: float = DEFAULT_HOOK_TIMEOUT
    # How long the command path stays open after the last event, drain or held command of this VM
    # (agent/engagement.py); outside that the agent holds no connection and no receive.
    command_linger: float = DEFAULT_LINGER_SECONDS
    # The base URL of a local OpenTelemetry collector the agent exports its spans to (agent/otel.py);
    # None: no export, and nothing of OpenTelemetry is imported.
    otlp_endpoint: str | None = None
    # The config file the settings were read with, if any (--check names it).
    config_file: Path | None = None


def default_state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """/var/lib/mbridge for root (the systemd unit's StateDirectory), else the user's state directory."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/mbridge")
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "mbridge"


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_DEFAULT_STATE_DIR = "`/var/lib/mbridge` (root), else `$XDG_STATE_HOME/mbridge`"

# The one definition of every setting of `mbridge agent` (the transport group is shared with
# `mbridge approve`). Order: the order of `--help` and of the reference.
SETTINGS: tuple[Setting, ...] = (
    Setting("cloud", "MBRIDGE_CLOUD", "which metadata service to watch (required)", Choice([c.value for c in Cloud])),
    Setting(
        "metadata_url",
        "MBRIDGE_METADATA_URL",
        "base URL of the metadata service, e.g. a simulator's http://127.0.0.1:PORT; the documented paths are appended",
        Url(),
        default_doc="`http://169.254.169.254` (azure), `http://metadata.google.internal` (gce)",
    ),
    Setting(
        "vm_name",
        "MBRIDGE_VM_NAME",
        "this VM's name, exactly as Azure prints it in Resources",
        Text("NAME"),
        default_doc="from the metadata service",
    ),
    Setting(
        "state_dir",
        "MBRIDGE_STATE_DIR",
        "outbox, source state and command ledger",
        PathKind(),
        default_doc=_DEFAULT_STATE_DIR,
    ),
    Setting(
        "poll_interval",
        "MBRIDGE_POLL_INTERVAL",
        "Azure poll interval in seconds",
        Number(
            MIN_POLL_INTERVAL,
            unit="seconds",
            why="Azure IMDS allows 5 requests/s per VM, shared with every other IMDS user on it",
        ),
        default="1",
    ),
    Setting(
        "api_version",
        "MBRIDGE_API_VERSION",
        "Azure Scheduled Events api-version; older versions leave out fields (EventSource before 2019-08-01, "
        "Description before 2019-04-01, DurationInSeconds before 2020-07-01), which the agent reads as absent; "
        "e.g. 2019-08-01 where the local docs stop there (Azure China)",
        Choice(API_VERSIONS),
        default=API_VERSION,
    ),
    Setting(
        "listen",
        "MBRIDGE_LISTEN",
        "address of /healthz, /readyz and /metrics",
        Listen(),
        default=f"127.0.0.1:{DEFAULT_PORT}",
    ),
    Setting(
        "dry_run",
        "MBRIDGE_DRY_RUN",
        'never POST approvals; log and answer "dry run: would have approved"',
        Boolean(),
        default="false",
    ),
    Setting(
        "verify_key",
        "MBRIDGE_VERIFY_KEY",
        "Ed25519 public key (PEM, base64 or a file): only commands signed with its private key are executed; "
        "required with every transport but jsonl",
        Text("KEY"),
    ),
    Setting(
        "insecure_unsigned_commands",
        "MBRIDGE_INSECURE_UNSIGNED_COMMANDS",
        "start on a bus without a verify key and execute unsigned commands: anyone who can send to the bus could "
        "then approve this VM's events (docs/security.md)",
        Boolean(),
        default="false",
    ),
    Setting(
        "identity_proof",
        "MBRIDGE_IDENTITY_PROOF",
        "attach proof of this VM's identity from its metadata service to every message; none only for functions "
        "with trust: reporter-name",
        Choice(IDENTITY_PROOFS),
        default="cloud",
    ),
    Setting(
        "identity_audience",
        "MBRIDGE_IDENTITY_AUDIENCE",
        "GCE: the audience of identity tokens, to which each message's digest is added (the functions' "
        "MBRIDGE_TRUST_AUDIENCE)",
        Text("AUDIENCE", spaces=False),
        default=DEFAULT_AUDIENCE,
    ),
    Setting(
        "forward",
        "MBRIDGE_FORWARD",
        "publish only the events whose Resources name this VM (own: only those can move anything), or every one",
        Choice(FORWARD),
        default="own",
    ),
    Setting(
        "harmless_freeze_seconds",
        "MBRIDGE_HARMLESS_FREEZE_SECONDS",
        "a Freeze at most this long leaves /readyz ready; keep it equal to the functions' policy "
        "harmless_freeze_seconds",
        Number(0, integer=True, unit="seconds"),
        default=str(DEFAULT_HARMLESS_FREEZE_SECONDS),
    ),
    Setting(
        "hook_command",
        "MBRIDGE_HOOK_COMMAND",
        "a command run on each change of this VM's maintenance, with the event in MBRIDGE_EVENT_* variables "
        "(docs/operations.md#notifications); split like a shell would, run without one",
        Text("COMMAND"),
    ),
    Setting(
        "hook_timeout",
        "MBRIDGE_HOOK_TIMEOUT",
        "seconds a hook run may take before its process group is killed",
        Number(1, unit="seconds"),
        default=f"{DEFAULT_HOOK_TIMEOUT:g}",
    ),
    Setting(
        "command_linger",
        "MBRIDGE_COMMAND_LINGER",
        "seconds the command path stays open after this VM's last open event, drain or held command; "
        "outside that the agent holds no bus connection and no receive (docs/scale.md)",
        Number(0, unit="seconds"),
        default=f"{DEFAULT_LINGER_SECONDS:g}",
    ),
    Setting(
        "transport",
        "MBRIDGE_TRANSPORT",
        "where events go and commands come from (docs/transports.md)",
        Choice(TRANSPORTS),
        default="jsonl",
        group="transport",
    ),
    Setting(
        "jsonl_path",
        "MBRIDGE_JSONL_PATH",
        "jsonl: the file to append to (fsync'd per line), - for stdout",
        PathKind(),
        default="-",
        group="transport",
    ),
    Setting(
        "bus_path",
        "MBRIDGE_BUS_PATH",
        "local: the embedded SQLite bus",
        PathKind(),
        default_doc="`<state-dir>/bus.db`",
        group="transport",
    ),
    Setting(
        "servicebus_namespace",
        "MBRIDGE_SERVICEBUS_NAMESPACE",
        "Service Bus namespace FQDN, reached with the VM's managed identity",
        Text("FQDN", spaces=False),
        group="transport",
    ),
    Setting(
        "servicebus_connection_string",
        "MBRIDGE_SERVICEBUS_CONNECTION_STRING",
        "Service Bus connection string instead of a managed identity",
        Text("CONNECTION_STRING"),
        group="transport",
        secret=True,
    ),
    Setting(
        "servicebus_topic",
        "MBRIDGE_SERVICEBUS_TOPIC",
        "Service Bus topic of the events",
        Text("TOPIC", spaces=False),
        default="maintenance-events",
        group="transport",
    ),
    Setting(
        "servicebus_commands_queue",
        "MBRIDGE_SERVICEBUS_COMMANDS_QUEUE",
        "session-enabled queue of the commands",
        Text("QUEUE", spaces=False),
        default="maintenance-commands",
        group="transport",
    ),
    Setting(
        "servicebus_commands_subscription",
        "MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION",
        "this VM's own subscription of the commands topic: receive commands there instead of from the queue "
        "(the isolated mode)",
        Text("SUBSCRIPTION", spaces=False),
        group="transport",
    ),
    Setting(
        "servicebus_commands_topic",
        "MBRIDGE_SERVICEBUS_COMMANDS_TOPIC",
        "commands topic of the isolated mode; mbridge approve sends to it when set",
        Text("TOPIC", spaces=False),
        default_doc=f"`{DEFAULT_COMMANDS_TOPIC}` with a subscription",
        group="transport",
    ),
    Setting(
        "commands_shards",
        "MBRIDGE_COMMANDS_SHARDS",
        "servicebus: how many commands queues or topics the deployment has (its commands_shards); the agent "
        "reads its own, the queue or topic name above with -<shard> for shards past 0 (docs/deploy.md)",
        Number(1, integer=True, why="a deployment has at least one commands queue or topic", maximum=MAX_SHARDS),
        default="1",
        group="transport",
    ),
    Setting(
        "pubsub_project",
        "MBRIDGE_PUBSUB_PROJECT",
        "Google Cloud project of the Pub/Sub topics",
        Text("PROJECT", spaces=False),
        group="transport",
    ),
    Setting(
        "pubsub_topic",
        "MBRIDGE_PUBSUB_TOPIC",
        "Pub/Sub topic of the events",
        Text("TOPIC", spaces=False),
        default="maintenance-events",
        group="transport",
    ),
    Setting(
        "pubsub_commands_subscription",
        "MBRIDGE_PUBSUB_COMMANDS_SUBSCRIPTION",
        "this VM's subscription of the commands topic",
        Text("SUBSCRIPTION", spaces=False),
        default_doc="`maintenance-commands-<vm name>`",
        group="transport",
    ),
    Setting(
        "log_level",
        "MBRIDGE_LOG_LEVEL",
        "JSON log lines on stderr from this level up",
        Choice(LOG_LEVELS, upper=True),
        default="INFO",
        group="logging",
    ),
    Setting(
        "otlp_endpoint",
        "MBRIDGE_OTLP_ENDPOINT",
        "export the spans of each maintenance's trace (detection, publishes, commands) over OTLP/HTTP to a local "
        "OpenTelemetry collector at this base URL, e.g. http://127.0.0.1:4318 (/v1/traces is appended); needs "
        "the agent-otel extra (docs/operations.md#agent-traces)",
        Url(),
        default_doc="(none): no export",
        group="logging",
    ),
    Setting(
        "config",
        "MBRIDGE_CONFIG",
        "a TOML file of settings, keyed by the flags without their dashes (poll-interval = 2)",
        PathKind(),
        group="config",
        in_file=False,
    ),
)
SETTING = {setting.name: setting for setting in SETTINGS}
TRANSPORT_SETTINGS = tuple(s for s in SETTINGS if s.group == "transport")


def env(name: str, default: str | None = None) -> str | None:
    """A variable of the commands that are not the agent's (audit, approve's own flags); "" is unset."""
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def add_transport_arguments(parser: argparse.ArgumentParser) -> None:
    """The bus options shared by `mbridge agent` and `mbridge approve` (docs/contracts.md#transport-options)."""
    add_arguments(parser.add_argument_group("transport"), TRANSPORT_SETTINGS, os.environ)


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    """--config FILE: the agent's TOML file, which `mbridge approve` reads its bus from too."""
    add_arguments(parser, [SETTING["config"]], os.environ)


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser, [s for s in SETTINGS if s.group in ("agent", "logging", "config")], os.environ)
    parser.add_argument(
        "--check",
        action="store_true",
        help="run every start-up check (configuration, verify key, state directory, listen address, transport "
        "SDK, metadata, this VM's name, proof of identity, bus access), then exit 0 all ok, 1 problems, "
        "2 configuration error",
    )
    add_transport_arguments(parser)


def resolve_settings(
    names: Iterable[str],
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    defaults: Mapping[str, str | None] | None = None,
) -> tuple[dict[str, Any], dict[str, Origin | None], Path | None]:
    """Values of the named settings from args, the environment, the config file and the defaults."""
    return resolve(SETTINGS, names, args, os.environ if environ is None else environ, defaults)


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> AgentSettings:
    """Every setting from its sources, each checked, then the checks across settings."""
    wanted = [s.name for s in SETTINGS if s.in_file]
    values, _, config_file = resolve_settings(wanted, args, environ)
    v: Any = values  # one value per setting name, each of its kind's type
    if v["cloud"] is None:
        raise SETTING["cloud"].error("not set", "set azure or gce")
    cloud = Cloud(v["cloud"])
    transport = v["transport"]
    if transport == "servicebus" and not (v["servicebus_namespace"] or v["servicebus_connection_string"]):
        raise SETTING["servicebus_namespace"].error(
            "--transport servicebus needs a namespace (managed identity) or a connection string",
            "set it, or --servicebus-connection-string (MBRIDGE_SERVICEBUS_CONNECTION_STRING)",
        )
    if transport == "servicebus" and v["servicebus_commands_topic"] and not v["servicebus_commands_subscription"]:
        raise SETTING["servicebus_commands_subscription"].error(
            "the agent receives from its own subscription of the commands topic, and none is set",
            "set --servicebus-commands-subscription (MBRIDGE_SERVICEBUS_COMMANDS_SUBSCRIPTION) too",
        )
    if transport != "jsonl" and not v["verify_key"] and not v["insecure_unsigned_commands"]:
        raise SETTING["verify_key"].error(
            f"--transport {transport} takes commands from a bus that others can send to, and no key is set",
            "give the functions' public key so that only signed commands are executed, or accept unsigned ones "
            "knowingly with --insecure-unsigned-commands (MBRIDGE_INSECURE_UNSIGNED_COMMANDS) (docs/security.md)",
        )
    if transport == "pubsub" and not v["pubsub_project"]:
        raise SETTING["pubsub_project"].error("--transport pubsub needs a project", "set the project of the topics")
    if v["hook_command"] is not None:
        try:
            parse_hook_command(v["hook_command"])
        except HookCommandError as exc:
            raise SETTING["hook_command"].error(
                str(exc), "give a program or an executable script, and its arguments"
            ) from None
    state_dir = Path(v["state_dir"]) if v["state_dir"] else default_state_dir()
    return AgentSettings(
        cloud=cloud,
        metadata_url=v["metadata_url"] or DEFAULT_METADATA_URL[cloud],
        vm_name=v["vm_name"],
        transport=transport,
        jsonl_path=v["jsonl_path"],
        state_dir=state_dir,
        bus_path=Path(v["bus_path"]) if v["bus_path"] else state_dir / "bus.db",
        poll_interval=v["poll_interval"],
        listen=v["listen"],
        dry_run=v["dry_run"],
        verify_key=v["verify_key"],
        servicebus_namespace=v["servicebus_namespace"],
        servicebus_connection_string=v["servicebus_connection_string"],
        servicebus_topic=v["servicebus_topic"],
        servicebus_commands_queue=v["servicebus_commands_queue"],
        pubsub_project=v["pubsub_project"],
        pubsub_topic=v["pubsub_topic"],
        pubsub_commands_subscription=v["pubsub_commands_subscription"],
        api_version=v["api_version"],
        servicebus_commands_subscription=v["servicebus_commands_subscription"],
        servicebus_commands_topic=v["servicebus_commands_topic"],
        commands_shards=v["commands_shards"],
        identity_proof=v["identity_proof"],
        identity_audience=v["identity_audience"],
        forward=v["forward"],
        harmless_freeze_seconds=v["harmless_freeze_seconds"],
        log_level=v["log_level"],
        hook_command=v["hook_command"],
        hook_timeout=v["hook_timeout"],
        command_linger=v["command_linger"],
        otlp_endpoint=v["otlp_endpoint"],
        config_file=config_file,
    )
