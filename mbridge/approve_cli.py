"""Flags of `mbridge approve` and the transport it talks through; the logic is mbridge.approve.

The bus settings are the agent's (agent.config.SETTINGS, transport group): the same flags, MBRIDGE_*
variables and config file (--config / MBRIDGE_CONFIG), read and checked the same way. Unlike the
agent, approve has no default transport: jsonl has no command channel, and guessing a bus would
only end in "no answer". A setting it cannot use is one line, `mbridge approve: <setting> (...): ...`,
and exit 2 before anything is sent (mbridge.approve.EXIT_CONFIG).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.config import (
    SETTING,
    TRANSPORT_SETTINGS,
    ConfigError,
    add_config_argument,
    add_transport_arguments,
    default_state_dir,
    env,
    resolve_settings,
)
from agent.timing import SystemClock
from mbridge.approve import EXIT_CONFIG, EXIT_NO_ANSWER, run_approve
from mbridge.trace_flag import trace_id
from wire.errors import BridgeError
from wire.identity import IdentityVerifier
from wire.model import Cloud
from wire.transports.base import Operator, TransportConfigError, TransportUnavailableError
from wire.transports.factory import DEFAULT_RESULTS_SUBSCRIPTION

if TYPE_CHECKING:
    from wire.transports.pubsub import PubSubSettings
    from wire.transports.servicebus import ServiceBusSettings

DEFAULT_WAIT = 30.0

# mbridge approve's flag → the app setting it stands for, and what it takes.
AZURE_TRUST_FLAGS = {
    "--trust-subscriptions": (
        "MBRIDGE_TRUST_SUBSCRIPTIONS",
        "the subscriptions (comma-separated) whose VMs may answer; their vmIds are resolved to names with your "
        "Azure credentials (Reader on the VMs' resource groups). Default: MBRIDGE_LB_SUBSCRIPTION_ID",
    ),
    "--trust-resource-groups": (
        "MBRIDGE_TRUST_RESOURCE_GROUPS",
        "the resource groups (comma-separated) of the VMs that may answer: the deployment's scope, required as "
        "for the functions. Default: MBRIDGE_LB_NIC_RESOURCE_GROUP or MBRIDGE_LB_RESOURCE_GROUP",
    ),
    "--trust-roots": ("MBRIDGE_TRUST_ROOTS", "the roots (PEM text or a file) the attested documents chain to"),
    "--trust-intermediates": (
        "MBRIDGE_TRUST_INTERMEDIATES",
        "intermediate CAs (PEM text or a file) besides Azure's shipped issuing CAs",
    ),
    "--trust-signer-names": (
        "MBRIDGE_TRUST_SIGNER_NAMES",
        "the DNS names (comma-separated) an attested document's signer carries (default metadata.azure.com)",
    ),
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--event-id", required=True, help="the Azure EventId to approve")
    parser.add_argument("--target", required=True, help="the VM whose agent POSTs the approval")
    # Read like the agent's --cloud (flag, MBRIDGE_CLOUD, config file), checked when run.
    parser.add_argument(
        "--cloud", default=None, metavar="{azure,gce}", help="the target VM's cloud [MBRIDGE_CLOUD, default azure]"
    )
    waiting = parser.add_mutually_exclusive_group()
    waiting.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT,
        help=f"seconds to wait for the agent's answer (default {DEFAULT_WAIT:g}); exit 0 accepted, 1 rejected, "
        "2 no answer (or a configuration error, before anything is sent)",
    )
    waiting.add_argument("--no-wait", action="store_true", help="return once the bus accepted the command")
    parser.add_argument(
        "--trace",
        type=trace_id,
        default=None,
        help="the event's trace id (its audit records' trace_id): the command carries a new span of it. Only for an "
        "agent that reads traces (its log lines carry trace_id); an older agent rejects the command. Default: none",
    )
    parser.add_argument(
        "--signing-key",
        default=env("MBRIDGE_SIGNING_KEY"),
        help="Ed25519 private key (PEM, base64 or a file) to sign the command with [MBRIDGE_SIGNING_KEY]",
    )
    trust = parser.add_argument_group(
        "trust", "an answer counts only with a valid proof of identity from the target VM (docs/security.md)"
    )
    trust.add_argument(
        "--trust-file",
        default=env("MBRIDGE_TRUST_FILE"),
        help="verify with a trust file, as the simulator writes it (mbridge simulate --trust-file) "
        "[MBRIDGE_TRUST_FILE]",
    )
    # The Azure trust settings are the function app's (docs/azure.md#trust): each flag sets its variable,
    # and whatever the flags leave out is read from the environment as the app reads it.
    for flag, (variable, what) in AZURE_TRUST_FLAGS.items():
        trust.add_argument(flag, default=None, help=f"Azure: {what} [{variable}]")
    trust.add_argument(
        "--insecure-unverified-results",
        action="store_true",
        help="take any answer without checking who sent it: any VM that can publish could forge it",
    )
    parser.add_argument(
        "--results-subscription",
        default=env("MBRIDGE_RESULTS_SUBSCRIPTION", DEFAULT_RESULTS_SUBSCRIPTION),
        help="Service Bus subscription / Pub/Sub subscription on the events topic to read answers from "
        f"[MBRIDGE_RESULTS_SUBSCRIPTION, default {DEFAULT_RESULTS_SUBSCRIPTION}]",
    )
    add_config_argument(parser)
    add_transport_arguments(parser)


# What approve reads of the agent's settings, and the defaults it has instead of the agent's.
RESOLVED = ("cloud", *(setting.name for setting in TRANSPORT_SETTINGS))
DEFAULTS = {"cloud": Cloud.AZURE.value, "transport": None}


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with the cloud and bus settings taken from their sources and checked; ConfigError
    when a value is wrong or no bus with a command channel is set."""
    values, origins, _ = resolve_settings(RESOLVED, args, defaults=DEFAULTS)
    transport = SETTING["transport"]
    origin = origins["transport"]
    if origin is None:
        raise transport.error(
            "not set: mbridge approve sends the command through the agents' bus",
            "set local, servicebus or pubsub, as the agents have it (a flag, the variable or the agent's --config)",
        )
    if values["transport"] == "jsonl":
        raise transport.error(f"{origin.describe()} has no command channel", "use local, servicebus or pubsub")
    resolved: dict[str, Any] = {**vars(args), **values}
    return argparse.Namespace(**resolved)


def run(args: argparse.Namespace) -> int:
    try:
        args = resolve(args)
        verifier = build_verifier(args) if not args.no_wait else None
        operator = build_operator(args)
        signing_key = None
        if args.signing_key:
            from wire.signing import load_private_key

            signing_key = load_private_key(args.signing_key)
    except (ConfigError, TransportConfigError) as exc:
        print(f"mbridge approve: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except BridgeError as exc:  # e.g. the bus could not be reached: nothing was sent
        print(f"mbridge approve: {exc}", file=sys.stderr)
        return EXIT_NO_ANSWER
    try:
        return run_approve(
            event_id=args.event_id,
            target=args.target,
            cloud=Cloud(args.cloud),
            sender=operator,
            reader=operator,
            wait=None if args.no_wait else args.wait,
            signing_key=signing_key,
            verifier=verifier,
            clock=SystemClock(),
            out=sys.stdout,
            trace=args.trace,
        )
    finally:
        operator.close()


def build_verifier(args: argparse.Namespace) -> IdentityVerifier | None:
    """What checks that an answer comes from the target VM; None only when asked for explicitly."""
    if args.insecure_unverified_results:
        return None
    if args.trust_file:
        from functions.trust.trust_file import TrustFileError, load_trust_file

        try:
            return load_trust_file(args.trust_file)
        except TrustFileError as exc:
            raise ConfigError(str(exc)) from exc
    environ = _azure_trust_environment(args)
    if environ.get("MBRIDGE_TRUST_SUBSCRIPTIONS") or environ.get("MBRIDGE_LB_SUBSCRIPTION_ID"):
        return _azure_verifier(environ)
    raise ConfigError(
        "mbridge approve takes an answer only from the target VM, proven by its cloud: give --trust-subscriptions "
        "and --trust-resource-groups (Azure, with credentials that may read the VMs; or the function app's "
        "MBRIDGE_TRUST_* settings) or --trust-file, or --insecure-unverified-results to take any answer "
        "(docs/security.md)"
    )


def _azure_trust_environment(args: argparse.Namespace) -> dict[str, str]:
    """The environment with the trust flags given written over their variables."""
    environ = dict(os.environ)
    for flag, (variable, _) in AZURE_TRUST_FLAGS.items():
        value = getattr(args, flag.removeprefix("--").replace("-", "_"), None)
        if value:
            environ[variable] = value
    return environ


def _azure_verifier(environ: dict[str, str]) -> IdentityVerifier:
    """The function app's verifier, from the function app's trust settings, on the operator's credentials."""
    from azure.identity import DefaultAzureCredential

    from functions.azure_app.settings import SettingsError, attested_trust
    from functions.azure_app.wiring import attested_verifier

    try:
        trust = attested_trust(environ)
    except SettingsError as exc:
        flags = [f"{flag} for {variable}" for flag, (variable, _) in AZURE_TRUST_FLAGS.items() if variable in str(exc)]
        raise ConfigError(f"{exc} (mbridge approve: {', '.join(flags) or 'the MBRIDGE_TRUST_* settings'})") from exc
    return attested_verifier(trust, DefaultAzureCredential())


def build_operator(args: argparse.Namespace) -> Operator:
    """The sender + results reader for the chosen transport."""
    if args.transport == "local":
        from wire.transports.local import LocalBus, LocalOperator

        bus_path = Path(args.bus_path) if args.bus_path else default_state_dir() / "bus.db"
        if not bus_path.exists():
            raise TransportUnavailableError(f"no local bus at {bus_path}; pass the agent's --bus-path")
        return LocalOperator(LocalBus(bus_path))
    if args.transport == "servicebus":
        from wire.transports import servicebus

        return servicebus.build_operator(servicebus_operator_settings(args))
    from wire.transports import pubsub

    return pubsub.build_operator(pubsub_operator_settings(args))


def bus_settings(args: argparse.Namespace) -> ServiceBusSettings | PubSubSettings:
    """The settings of the cloud bus's operator: the agents' bus settings, the results subscription,
    and the shard count, so that the command goes to the target VM's commands entity (wire.shards)."""
    if args.transport == "servicebus":
        return servicebus_operator_settings(args)
    return pubsub_operator_settings(args)


def servicebus_operator_settings(args: argparse.Namespace) -> ServiceBusSettings:
    from wire.transports.factory import servicebus_settings

    return servicebus_settings(args, args.target, args.results_subscription)


def pubsub_operator_settings(args: argparse.Namespace) -> PubSubSettings:
    from wire.transports.factory import pubsub_settings

    return pubsub_settings(args, args.target, args.results_subscription)
