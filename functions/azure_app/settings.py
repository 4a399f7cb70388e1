"""The Azure app's settings: read from the app settings (environment) once per worker, validated.

Every name is a constant here and documented in docs/azure.md. A wrong or missing value raises
`SettingsError` naming the setting and what it takes, before any message is handled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from functions.core.errors import PermanentError
from functions.core.policy import Policy, load_policy
from functions.core.signing import load_private_key

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# The trigger reads these three itself (%...% in the binding, `connection` prefix).
EVENTS_TOPIC = "MBRIDGE_EVENTS_TOPIC"
EVENTS_SUBSCRIPTION = "MBRIDGE_EVENTS_SUBSCRIPTION"
SERVICEBUS_CONNECTION = "MBRIDGE_SERVICEBUS"  # the binding's `connection`: a prefix, or a connection string
SERVICEBUS_NAMESPACE = "MBRIDGE_SERVICEBUS__fullyQualifiedNamespace"
COMMANDS_QUEUE = "MBRIDGE_COMMANDS_QUEUE"
COMMANDS_MODE = "MBRIDGE_COMMANDS_MODE"
COMMANDS_TOPIC = "MBRIDGE_COMMANDS_TOPIC"
TABLE_ENDPOINT = "MBRIDGE_TABLE_ENDPOINT"
TABLE_CONNECTION_STRING = "MBRIDGE_TABLE_CONNECTION_STRING"
STATE_TABLE = "MBRIDGE_STATE_TABLE"
AUDIT_TABLE = "MBRIDGE_AUDIT_TABLE"
LB_SUBSCRIPTION_ID = "MBRIDGE_LB_SUBSCRIPTION_ID"
LB_RESOURCE_GROUP = "MBRIDGE_LB_RESOURCE_GROUP"
LB_NAME = "MBRIDGE_LB_NAME"
LB_NIC_RESOURCE_GROUP = "MBRIDGE_LB_NIC_RESOURCE_GROUP"
READINESS_DRAIN = "MBRIDGE_READINESS_DRAIN"
POLICY = "MBRIDGE_POLICY"
SIGNING_KEY = "MBRIDGE_SIGNING_KEY"
TRUST_RESOURCE_GROUPS = "MBRIDGE_TRUST_RESOURCE_GROUPS"

DEFAULT_COMMANDS_QUEUE = "maintenance-commands"
DEFAULT_COMMANDS_TOPIC = "maintenance-commands"
# How commands reach the agents (docs/azure.md): the session queue (one session per VM), or a topic
# with one filtered subscription per VM, readable by that VM's identity only (the isolated mode).
COMMANDS_MODES = ("queue", "topic")
DEFAULT_STATE_TABLE = "mbridgestate"
DEFAULT_AUDIT_TABLE = "mbridgeaudit"

# Table Storage: 3-63 alphanumeric characters, starting with a letter.
_TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]{2,62}$")
# A resource group: 1-90 letters, digits (Unicode ones too), '-', '_', '.', '(' and ')', not ending in '.'.
_RESOURCE_GROUP = re.compile(r"^[-\w.()]{0,89}[-\w()]$")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class SettingsError(PermanentError):
    """An app setting is missing or wrong; the message names it and says what it takes."""


@dataclass(frozen=True)
class LoadBalancerTarget:
    """The Azure Load Balancer whose backend pools the app drains VMs from."""

    subscription_id: str
    resource_group: str
    name: str
    nic_resource_group: str  # where the VMs' NICs are listed (defaults to the LB's group)


@dataclass(frozen=True)
class Settings:
    events_topic: str
    events_subscription: str
    servicebus_namespace: str | None
    # repr=False: connection strings carry account keys.
    servicebus_connection_string: str | None = field(repr=False)
    commands_queue: str
    table_endpoint: str | None
    table_connection_string: str | None = field(repr=False)
    state_table: str
    audit_table: str
    load_balancer: LoadBalancerTarget | None
    readiness_drain: bool
    policy: Policy
    signing_key: Ed25519PrivateKey | None = field(repr=False, compare=False)
    # "topic": commands go to `commands_topic` with the application property `target` instead of
    # into the target's session of `commands_queue`.
    commands_mode: str = "queue"
    commands_topic: str = DEFAULT_COMMANDS_TOPIC
    # Where the VMs an attested document names are looked up by vmId, in each subscription;
    # empty: the whole subscription.
    trust_resource_groups: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Read and validate every setting.

        Raises:
            SettingsError: naming the first setting that is missing or wrong.
        """
        env = _Env(environ)
        namespace, sb_connection = env.optional(SERVICEBUS_NAMESPACE), env.optional(SERVICEBUS_CONNECTION)
        if bool(namespace) == bool(sb_connection):
            raise SettingsError(
                f"set exactly one of {SERVICEBUS_NAMESPACE} (the namespace FQDN, e.g. mybus.servicebus.windows.net, "
                f"used with the app's managed identity) and {SERVICEBUS_CONNECTION} (a connection string)"
            )
        if namespace is not None and ("." not in namespace or namespace.lower().startswith("endpoint=")):
            raise SettingsError(
                f"{SERVICEBUS_NAMESPACE} takes the fully qualified namespace such as mybus.servicebus.windows.net, "
                f"not {namespace[:40]!r}; a connection string goes in {SERVICEBUS_CONNECTION}"
            )
        table_endpoint, table_connection = env.optional(TABLE_ENDPOINT), env.optional(TABLE_CONNECTION_STRING)
        if bool(table_endpoint) == bool(table_connection):
            raise SettingsError(
                f"set exactly one of {TABLE_ENDPOINT} (e.g. https://myaccount.table.core.windows.net, used with the "
                f"app's managed identity) and {TABLE_CONNECTION_STRING} (a connection string, e.g. for Azurite)"
            )
        if table_endpoint is not None and not table_endpoint.startswith(("https://", "http://")):
            raise SettingsError(f"{TABLE_ENDPOINT} is a URL such as https://myaccount.table.core.windows.net")
        return cls(
            events_topic=env.required(EVENTS_TOPIC, "the Service Bus topic the agents publish to"),
            events_subscription=env.required(EVENTS_SUBSCRIPTION, "the topic's subscription this app consumes"),
            servicebus_namespace=namespace,
            servicebus_connection_string=sb_connection,
            commands_queue=env.optional(COMMANDS_QUEUE) or DEFAULT_COMMANDS_QUEUE,
            table_endpoint=table_endpoint,
            table_connection_string=table_connection,
            state_table=env.table_name(STATE_TABLE, DEFAULT_STATE_TABLE),
            audit_table=env.table_name(AUDIT_TABLE, DEFAULT_AUDIT_TABLE),
            load_balancer=_load_balancer(env),
            readiness_drain=env.flag(READINESS_DRAIN, default=True),
            policy=_policy(env.optional(POLICY)),
            signing_key=_signing_key(env.optional(SIGNING_KEY)),
            commands_mode=env.choice(COMMANDS_MODE, COMMANDS_MODES),
            commands_topic=env.optional(COMMANDS_TOPIC) or DEFAULT_COMMANDS_TOPIC,
            trust_resource_groups=_resource_groups(env.optional(TRUST_RESOURCE_GROUPS)),
        )


class _Env:
    """The environment, with empty values treated as unset (the portal leaves empty settings)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def optional(self, name: str) -> str | None:
        value = self._environ.get(name, "").strip()
        return value or None

    def required(self, name: str, what: str) -> str:
        value = self.optional(name)
        if value is None:
            raise SettingsError(f"{name} is not set: give {what}")
        return value

    def flag(self, name: str, *, default: bool) -> bool:
        value = self.optional(name)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise SettingsError(f"{name} is true or false, not {value!r}")

    def choice(self, name: str, choices: tuple[str, ...]) -> str:
        """One of `choices` (case-insensitive); unset: the first."""
        value = (self.optional(name) or choices[0]).lower()
        if value not in choices:
            raise SettingsError(f"{name} is {' or '.join(choices)}, not {self.optional(name)!r}")
        return value

    def table_name(self, name: str, default: str) -> str:
        value = self.optional(name) or default
        if not _TABLE_NAME.match(value):
            raise SettingsError(
                f"{name}={value!r} is not a Table Storage name: 3-63 letters and digits, starting with a letter"
            )
        return value


def _load_balancer(env: _Env) -> LoadBalancerTarget | None:
    names = (LB_SUBSCRIPTION_ID, LB_RESOURCE_GROUP, LB_NAME)
    values = [env.optional(name) for name in names]
    if not any(values):
        return None
    missing = [name for name, value in zip(names, values) if value is None]
    if missing:
        raise SettingsError(
            f"{', '.join(missing)} not set: a load balancer needs {', '.join(names)} together "
            f"(or none of them, to drain through the agents' /readyz only)"
        )
    subscription_id, resource_group, name = (value or "" for value in values)
    return LoadBalancerTarget(
        subscription_id=subscription_id,
        resource_group=resource_group,
        name=name,
        nic_resource_group=env.optional(LB_NIC_RESOURCE_GROUP) or resource_group,
    )


def _resource_groups(text: str | None) -> tuple[str, ...]:
    """Comma-separated resource group names, each once (ARM compares them case-insensitively)."""
    groups: dict[str, str] = {}
    for item in (text or "").split(","):
        name = item.strip()
        if not name:
            continue
        if not _RESOURCE_GROUP.fullmatch(name):
            raise SettingsError(
                f"{TRUST_RESOURCE_GROUPS}: {name[:100]!r} is not a resource group name (1-90 letters, digits, "
                f"'-', '_', '.', '(' or ')', not ending in '.'); give names separated by commas, not resource ids"
            )
        groups.setdefault(name.lower(), name)
    return tuple(groups.values())


def _policy(text: str | None) -> Policy:
    try:
        return load_policy(text)
    except PermanentError as exc:
        raise SettingsError(f"{POLICY}: {exc}") from exc


def _signing_key(text: str | None) -> Ed25519PrivateKey | None:
    if text is None:
        return None
    try:
        return load_private_key(text)
    except PermanentError as exc:
        # The message never quotes the value: it is a private key.
        raise SettingsError(f"{SIGNING_KEY}: {exc}") from None
