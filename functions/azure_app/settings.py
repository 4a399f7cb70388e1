"""The Azure app's settings: read from the app settings (environment) once per worker, validated.

Every name is a constant here and documented in docs/azure.md. A wrong or missing value raises
`SettingsError` naming the setting and what it takes, before any message is handled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from asn1crypto import pem as asn1_pem  # type: ignore[import-untyped]
from asn1crypto import x509 as asn1_x509
from cryptography import x509

from functions.central.event_grid import AzureScope
from functions.core.policy import TRUST_ATTESTED, Policy, load_policy
from functions.notify import WebhookConfig, WebhookConfigError, webhook_config
from functions.telemetry import AZURE_MONITOR, OFF, telemetry_setting
from functions.telemetry import TELEMETRY as TELEMETRY
from functions.trust.azure_attested import (
    DEFAULT_SIGNER_NAMES,
    AttestationError,
    azure_extra_roots,
    load_certificates,
)
from functions.trust.trust_file import TrustFileError, load_trust_file
from wire.errors import PermanentError
from wire.shards import parse_shards
from wire.signing import load_private_key

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# The trigger reads these three itself (%...% in the binding, `connection` prefix).
EVENTS_TOPIC = "MBRIDGE_EVENTS_TOPIC"
EVENTS_SUBSCRIPTION = "MBRIDGE_EVENTS_SUBSCRIPTION"
CENTRAL_QUEUE = "MBRIDGE_CENTRAL_QUEUE"  # where the Event Grid subscription delivers the control plane's reports
# true: a timer reads the control plane's reports back from Resource Graph every five minutes
CENTRAL_RECONCILE = "MBRIDGE_CENTRAL_RECONCILE"
SERVICEBUS_CONNECTION = "MBRIDGE_SERVICEBUS"  # the binding's `connection`: a prefix, or a connection string
SERVICEBUS_NAMESPACE = "MBRIDGE_SERVICEBUS__fullyQualifiedNamespace"
COMMANDS_QUEUE = "MBRIDGE_COMMANDS_QUEUE"
COMMANDS_MODE = "MBRIDGE_COMMANDS_MODE"
COMMANDS_TOPIC = "MBRIDGE_COMMANDS_TOPIC"
# How many queues (or topics) the commands are spread over (wire.shards; docs/azure.md).
COMMANDS_SHARDS = "MBRIDGE_COMMANDS_SHARDS"
TABLE_ENDPOINT = "MBRIDGE_TABLE_ENDPOINT"
TABLE_CONNECTION_STRING = "MBRIDGE_TABLE_CONNECTION_STRING"
STATE_TABLE = "MBRIDGE_STATE_TABLE"
AUDIT_TABLE = "MBRIDGE_AUDIT_TABLE"
LB_SUBSCRIPTION_ID = "MBRIDGE_LB_SUBSCRIPTION_ID"
LB_RESOURCE_GROUP = "MBRIDGE_LB_RESOURCE_GROUP"
LB_NAME = "MBRIDGE_LB_NAME"
LB_NIC_RESOURCE_GROUP = "MBRIDGE_LB_NIC_RESOURCE_GROUP"
# How a VM is taken out of the load balancer: its pool memberships edited away (the default, what
# deployments made before the choice existed were granted), or its pool entries set to admin state
# Down (docs/azure.md, "Admin state or pool edits").
LB_DRAIN = "MBRIDGE_LB_DRAIN"
LB_DRAIN_METHODS = ("pool-edit", "admin-state")
READINESS_DRAIN = "MBRIDGE_READINESS_DRAIN"
# Before a drain through /readyz, refuse one its scale set's automatic repairs would act on
# (functions/azure_app/autohealer.py); the agents' health port.
AUTOHEALER_CHECK = "MBRIDGE_AUTOHEALER_CHECK"
AGENT_HEALTH_PORT = "MBRIDGE_AGENT_HEALTH_PORT"
# A drain through /readyz counts from when the load balancer's probe saw it, as read from the load
# balancer (functions/azure_app/probe_times.py); false: the policy's readiness_probe_seconds, always.
READ_PROBES = "MBRIDGE_READ_PROBES"
POLICY = "MBRIDGE_POLICY"
SIGNING_KEY = "MBRIDGE_SIGNING_KEY"
TRUST_RESOURCE_GROUPS = "MBRIDGE_TRUST_RESOURCE_GROUPS"
# Who sent a report (policy trust: attested): docs/azure.md, "Trust".
TRUST_FILE = "MBRIDGE_TRUST_FILE"
TRUST_ROOTS = "MBRIDGE_TRUST_ROOTS"
TRUST_INTERMEDIATES = "MBRIDGE_TRUST_INTERMEDIATES"
TRUST_SIGNER_NAMES = "MBRIDGE_TRUST_SIGNER_NAMES"
TRUST_SUBSCRIPTIONS = "MBRIDGE_TRUST_SUBSCRIPTIONS"
# Notices to people (docs/operations.md, "Notifications"): the URL is a secret, like the signing key.
WEBHOOK_URL = "MBRIDGE_WEBHOOK_URL"
WEBHOOK_TEMPLATE = "MBRIDGE_WEBHOOK_TEMPLATE"
WEBHOOK_ACTIONS = "MBRIDGE_WEBHOOK_ACTIONS"
WEBHOOK_SUMMARY_SECONDS = "MBRIDGE_WEBHOOK_SUMMARY_SECONDS"
# Spans and metrics of each invocation to Application Insights (docs/operations.md#telemetry): TELEMETRY,
# imported from functions.telemetry, and the connection string the platform sets.
APPLICATIONINSIGHTS_CONNECTION_STRING = "APPLICATIONINSIGHTS_CONNECTION_STRING"

DEFAULT_COMMANDS_QUEUE = "maintenance-commands"
DEFAULT_COMMANDS_TOPIC = "maintenance-commands"
# How commands reach the agents (docs/azure.md): the session queue (one session per VM), or a topic
# with one filtered subscription per VM, readable by that VM's identity only (the isolated mode).
COMMANDS_MODES = ("queue", "topic")
DEFAULT_STATE_TABLE = "mbridgestate"
DEFAULT_AUDIT_TABLE = "mbridgeaudit"
# The roots the attested documents' signers chain to when MBRIDGE_TRUST_ROOTS is not set: these
# from certifi's bundle (DigiCert's for the cross-signed issuing CAs, Microsoft's 2017 ones for
# those Microsoft signed), and Microsoft TLS RSA Root G2, which certifi lacks, shipped with the
# code (functions/trust/azure_attested/azure_cas). The first one must be found.
DEFAULT_ROOT_NAME = "DigiCert Global Root G2"
DEFAULT_ROOT_NAMES = (
    DEFAULT_ROOT_NAME,
    "DigiCert Global Root G3",
    "Microsoft RSA Root Certificate Authority 2017",
    "Microsoft ECC Root Certificate Authority 2017",
)

# Table Storage: 3-63 alphanumeric characters, starting with a letter.
_TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]{2,62}$")
# A resource group: 1-90 letters, digits (Unicode ones too), '-', '_', '.', '(' and ')', not ending in '.'.
_RESOURCE_GROUP = re.compile(r"^[-\w.()]{0,89}[-\w()]$")
_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_DNS_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)+$")
_PEM_BEGIN = "-----BEGIN"
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
    drain_method: str = LB_DRAIN_METHODS[0]


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
    # > 1: the commands of VM v go to wire.shards.entity_for(<queue or topic>, v, commands_shards).
    commands_shards: int = 1
    # Where the VMs an attested document names are looked up by vmId, in each subscription;
    # empty: the whole subscription.
    trust_resource_groups: tuple[str, ...] = ()
    # A trust file (local runs and tests): when set, it alone verifies the reports' proofs.
    trust_file: str | None = None
    # What an attested document must chain to and be signed by, and the subscriptions whose VMs
    # may report (lower case); the roots and subscriptions are empty when nothing is verified with
    # attested documents (policy trust: reporter-name, or a trust file).
    trust_roots: tuple[x509.Certificate, ...] = field(default=(), repr=False)
    trust_intermediates: tuple[x509.Certificate, ...] = field(default=(), repr=False)
    trust_signer_names: tuple[str, ...] = DEFAULT_SIGNER_NAMES
    trust_subscriptions: tuple[str, ...] = ()
    # Where notices of decisions and actions are posted; None: nowhere. (Its URL is kept out of repr.)
    webhook: WebhookConfig | None = None
    # The Service Bus queue the control plane's reports arrive on (an Event Grid subscription of the
    # MaintenanceResources system topic); None: the app reads none (docs/azure.md).
    central_queue: str | None = None
    # Before a drain through /readyz: refuse one a scale set's automatic repairs act on (autohealer.py).
    autohealer_check: bool = True
    agent_health_port: int = 9797
    # Read the probe's time of a readiness drain from the load balancer (probe_times.py).
    read_probes: bool = True
    # Whether the app reconciles with Resource Graph's maintenanceresources table (docs/azure.md).
    central_reconcile: bool = False
    # off, or azure-monitor: each invocation a span and metrics to Application Insights, whose
    # connection string the platform sets (functions/telemetry).
    telemetry: str = OFF
    app_insights_connection_string: str | None = field(default=None, repr=False)

    @property
    def central_scope(self) -> AzureScope:
        """Whose VMs the control plane's reports may move: the trusted subscriptions and groups."""
        return AzureScope(subscriptions=self.trust_subscriptions, resource_groups=self.trust_resource_groups)

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
        policy = _policy(env.optional(POLICY))
        load_balancer = _load_balancer(env)
        trust_file = _trust_file(env.optional(TRUST_FILE))
        attested = policy.trust == TRUST_ATTESTED and trust_file is None
        subscriptions = _subscriptions(env.optional(TRUST_SUBSCRIPTIONS), load_balancer, needed=attested)
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
            load_balancer=load_balancer,
            readiness_drain=env.flag(READINESS_DRAIN, default=True),
            policy=policy,
            signing_key=_signing_key(env.optional(SIGNING_KEY)),
            commands_mode=env.choice(COMMANDS_MODE, COMMANDS_MODES),
            commands_topic=env.optional(COMMANDS_TOPIC) or DEFAULT_COMMANDS_TOPIC,
            commands_shards=env.shards(COMMANDS_SHARDS),
            trust_resource_groups=_resource_groups(env.optional(TRUST_RESOURCE_GROUPS), load_balancer, needed=attested),
            trust_file=trust_file,
            trust_roots=_roots(env.optional(TRUST_ROOTS), needed=attested),
            trust_intermediates=_certificates(TRUST_INTERMEDIATES, env.optional(TRUST_INTERMEDIATES)),
            trust_signer_names=_signer_names(env.optional(TRUST_SIGNER_NAMES)),
            trust_subscriptions=subscriptions,
            webhook=_webhook(env),
            central_queue=_central_queue(env, subscriptions),
            central_reconcile=_central_reconcile(env, subscriptions),
            autohealer_check=env.flag(AUTOHEALER_CHECK, default=True),
            agent_health_port=env.port(AGENT_HEALTH_PORT, 9797),
            read_probes=env.flag(READ_PROBES, default=True),
            telemetry=_telemetry(env),
            app_insights_connection_string=env.optional(APPLICATIONINSIGHTS_CONNECTION_STRING),
        )


def _telemetry(env: _Env) -> str:
    """off, or azure-monitor, which needs the Application Insights connection string."""
    try:
        chosen = telemetry_setting(env.optional(TELEMETRY), AZURE_MONITOR)
    except ValueError as error:
        raise SettingsError(str(error)) from None
    if chosen != OFF and env.optional(APPLICATIONINSIGHTS_CONNECTION_STRING) is None:
        raise SettingsError(
            f"{TELEMETRY}={chosen} exports to Application Insights, and {APPLICATIONINSIGHTS_CONNECTION_STRING} "
            "is not set: the deployment sets it (docs/azure.md); set it, or leave telemetry off"
        )
    return chosen


def central_functions(environ: Mapping[str, str]) -> tuple[bool, bool]:
    """Whether the app registers the control plane's functions: (the queue's, the reconciliation's).
    Read before the settings are validated (function_app.py): a value that is not a flag registers
    nothing, and the settings' validation names it on the first invocation."""
    queue = _Env(environ).optional(CENTRAL_QUEUE) is not None
    return queue, (_Env(environ).optional(CENTRAL_RECONCILE) or "").lower() in _TRUE


def _central_queue(env: _Env, subscriptions: tuple[str, ...]) -> str | None:
    """The queue of the control plane's reports, refused without the subscriptions they may concern."""
    queue = env.optional(CENTRAL_QUEUE)
    if queue is not None:
        _central_scope_given(f"{CENTRAL_QUEUE} is set", subscriptions)
    return queue


def _central_reconcile(env: _Env, subscriptions: tuple[str, ...]) -> bool:
    """Whether to read Resource Graph's scheduled events, refused without the subscriptions to read."""
    reconcile = env.flag(CENTRAL_RECONCILE, default=False)
    if reconcile:
        _central_scope_given(f"{CENTRAL_RECONCILE} is true", subscriptions)
    return reconcile


def _central_scope_given(what: str, subscriptions: tuple[str, ...]) -> None:
    if not subscriptions:
        raise SettingsError(
            f"{what} but {TRUST_SUBSCRIPTIONS} is not set: the control plane reports every VM of a "
            "subscription, and only the VMs of the subscriptions (and resource groups) given there are this "
            "deployment's"
        )


class AttestedTrust(Protocol):
    """What an Azure attested document is checked against, and where its VM is looked up: the
    functions check reports with it (`Settings`), and `mbridge approve` the agents' answers
    (`attested_trust`), so an answer verifies exactly when a report of the same VM would."""

    @property
    def trust_roots(self) -> tuple[x509.Certificate, ...]: ...

    @property
    def trust_intermediates(self) -> tuple[x509.Certificate, ...]: ...

    @property
    def trust_signer_names(self) -> tuple[str, ...]: ...

    @property
    def trust_subscriptions(self) -> tuple[str, ...]: ...

    @property
    def trust_resource_groups(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class TrustSettings:
    """The trust settings alone (an `AttestedTrust`), for a tool that runs beside the app."""

    trust_roots: tuple[x509.Certificate, ...] = field(repr=False)
    trust_intermediates: tuple[x509.Certificate, ...] = field(repr=False)
    trust_signer_names: tuple[str, ...]
    trust_subscriptions: tuple[str, ...]
    trust_resource_groups: tuple[str, ...]


def attested_trust(environ: Mapping[str, str]) -> TrustSettings:
    """The app's trust settings for attested documents, read as `Settings.from_env` reads them (the
    same names, defaults and checks; the load balancer's settings give the same defaults), and
    every one required, as the app requires them with trust `attested` and no trust file.

    Raises:
        SettingsError: naming the first setting that is missing or wrong.
    """
    env = _Env(environ)
    load_balancer = _load_balancer(env)
    return TrustSettings(
        trust_roots=_roots(env.optional(TRUST_ROOTS), needed=True),
        trust_intermediates=_certificates(TRUST_INTERMEDIATES, env.optional(TRUST_INTERMEDIATES)),
        trust_signer_names=_signer_names(env.optional(TRUST_SIGNER_NAMES)),
        trust_subscriptions=_subscriptions(env.optional(TRUST_SUBSCRIPTIONS), load_balancer, needed=True),
        trust_resource_groups=_resource_groups(env.optional(TRUST_RESOURCE_GROUPS), load_balancer, needed=True),
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

    def port(self, name: str, default: int) -> int:
        value = self.optional(name)
        if value is None:
            return default
        if not value.isdigit() or not 1 <= int(value) <= 65535:
            raise SettingsError(f"{name} is a TCP port, 1 to 65535 (the agents' --listen port), not {value[:20]!r}")
        return int(value)

    def choice(self, name: str, choices: tuple[str, ...]) -> str:
        """One of `choices` (case-insensitive); unset: the first."""
        value = (self.optional(name) or choices[0]).lower()
        if value not in choices:
            raise SettingsError(f"{name} is {' or '.join(choices)}, not {self.optional(name)!r}")
        return value

    def shards(self, name: str) -> int:
        """A commands shard count (wire.shards); unset: 1."""
        try:
            return parse_shards(self.optional(name) or "1")
        except ValueError as error:
            raise SettingsError(f"{name}: {error}") from None

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
        drain_method=env.choice(LB_DRAIN, LB_DRAIN_METHODS),
    )


def _resource_groups(text: str | None, load_balancer: LoadBalancerTarget | None, *, needed: bool) -> tuple[str, ...]:
    """Comma-separated resource group names, each once (ARM compares them case-insensitively); unset:
    the load balancer's NICs' group. The VMs that may report are those of these groups only: a VM of
    another group (a sandbox) named like one of them must never speak for it."""
    if text is None:
        if load_balancer is not None:
            return (load_balancer.nic_resource_group,)
        if needed:
            raise SettingsError(
                f"{TRUST_RESOURCE_GROUPS} is not set: give the resource groups of the VMs that report, separated by "
                f"commas (with {LB_RESOURCE_GROUP} set, the group of its NICs is the default). A VM outside them, "
                "even one with the name of one of yours, is refused"
            )
        return ()
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


def _trust_file(path: str | None) -> str | None:
    """The trust file's path, once it is known to load (local runs and tests)."""
    if path is None:
        return None
    try:
        load_trust_file(path)
    except TrustFileError as exc:
        raise SettingsError(f"{TRUST_FILE}: {exc}") from exc
    return path


def _roots(text: str | None, *, needed: bool) -> tuple[x509.Certificate, ...]:
    """The given roots; unset: Azure's (`default_roots`), when an attested verifier is built."""
    if text is not None:
        return _certificates(TRUST_ROOTS, text)
    return default_roots() if needed else ()


def default_roots() -> tuple[x509.Certificate, ...]:
    """The roots of `DEFAULT_ROOT_NAMES` from certifi's bundle (installed with requests), chosen by
    subject CN, and the shipped Microsoft TLS RSA Root G2.

    Raises:
        SettingsError: certifi is missing or its bundle has no such root; then set MBRIDGE_TRUST_ROOTS.
    """
    try:
        import certifi
    except ImportError:
        raise SettingsError(
            f"{TRUST_ROOTS} is not set and certifi (installed with requests) is missing: give the PEM of "
            f"{DEFAULT_ROOT_NAME} (or a path to it)"
        ) from None
    try:
        bundle = Path(certifi.where()).read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise SettingsError(f"{TRUST_ROOTS} is not set and certifi's bundle cannot be read: {exc}") from exc
    found: list[x509.Certificate] = []
    for block in re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", bundle, flags=re.S):
        if _common_name(block.encode("ascii", errors="replace")) in DEFAULT_ROOT_NAMES:
            found.extend(load_certificates(block.encode("ascii")))
    if not any(_common_name_of(root) == DEFAULT_ROOT_NAME for root in found):
        raise SettingsError(
            f"{TRUST_ROOTS} is not set and certifi's bundle ({certifi.where()}) has no {DEFAULT_ROOT_NAME}: "
            "give the PEM of the roots Azure's attested documents chain to (or a path to it)"
        )
    return (*found, *azure_extra_roots())


def _common_name_of(certificate: x509.Certificate) -> str | None:
    names = certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(names[0].value) if names else None


def _common_name(pem: bytes) -> str | None:
    """The subject CN of a PEM certificate, read with asn1crypto: cryptography would warn about, or
    refuse, certificates of the bundle that break RFC 5280 (a serial number of zero, say)."""
    try:
        _, _, der = asn1_pem.unarmor(pem)
        name = asn1_x509.Certificate.load(der).subject.native.get("common_name")
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def _certificates(name: str, text: str | None) -> tuple[x509.Certificate, ...]:
    """PEM text (newlines may be written as \\n) or the path of a PEM bundle; unset: none."""
    if text is None:
        return ()
    if _PEM_BEGIN in text:
        data = (text if "\n" in text else text.replace("\\n", "\n")).encode("ascii", errors="replace")
        origin = "the PEM text"
    else:
        try:
            data = Path(text).read_bytes()
        except OSError as exc:
            raise SettingsError(
                f"{name}: cannot read {text[:200]!r} ({exc.strerror or exc}); give PEM text or the path of a PEM bundle"
            ) from None
        origin = f"the file {text[:200]}"
    try:
        certificates = load_certificates(data)
    except AttestationError as exc:
        raise SettingsError(f"{name}: {origin} is not PEM certificates: {exc}") from exc
    if not certificates:
        raise SettingsError(f"{name}: {origin} holds no certificate")
    return tuple(certificates)


def _signer_names(text: str | None) -> tuple[str, ...]:
    """DNS names an attested document's signer certificate must carry (or a subdomain of one)."""
    names = [item.strip().lower().rstrip(".") for item in (text or "").split(",") if item.strip()]
    for name in names:
        if not _DNS_NAME.match(name):
            raise SettingsError(
                f"{TRUST_SIGNER_NAMES}: {name[:100]!r} is not a DNS name such as metadata.azure.com; give names "
                "separated by commas"
            )
    return tuple(dict.fromkeys(names)) or DEFAULT_SIGNER_NAMES


def _subscriptions(text: str | None, load_balancer: LoadBalancerTarget | None, *, needed: bool) -> tuple[str, ...]:
    """The subscriptions whose VMs may report (lower case, each once); unset: the load balancer's."""
    if text is None:
        if load_balancer is not None:
            return (load_balancer.subscription_id.lower(),)
        if needed:
            raise SettingsError(
                f"{TRUST_SUBSCRIPTIONS} is not set: give the ids of the subscriptions whose VMs report, separated by "
                f"commas (with {LB_SUBSCRIPTION_ID} set, that subscription is the default)"
            )
        return ()
    subscriptions = [item.strip().lower() for item in text.split(",") if item.strip()]
    for subscription in subscriptions:
        if not _GUID.match(subscription):
            raise SettingsError(
                f"{TRUST_SUBSCRIPTIONS}: {subscription[:100]!r} is not a subscription id (a GUID such as "
                "00000000-0000-0000-0000-000000000000); give ids separated by commas"
            )
    if not subscriptions:
        raise SettingsError(f"{TRUST_SUBSCRIPTIONS} names no subscription: give subscription ids separated by commas")
    return tuple(dict.fromkeys(subscriptions))


def _policy(text: str | None) -> Policy:
    try:
        return load_policy(text)
    except PermanentError as exc:
        raise SettingsError(f"{POLICY}: {exc}") from exc


# App Service leaves a Key Vault reference's own text in the setting when it cannot resolve it
# (no access to the secret, wrong identity, vault unreachable); name that, not a key format.
_KEY_VAULT_REFERENCE = "@Microsoft.KeyVault("


def _webhook(env: _Env) -> WebhookConfig | None:
    url = env.optional(WEBHOOK_URL)
    if url is not None and url.startswith(_KEY_VAULT_REFERENCE):
        raise SettingsError(
            f"{WEBHOOK_URL}: the Key Vault reference was not resolved; give the identity named by the app's "
            "keyVaultReferenceIdentity 'Key Vault Secrets User' on the secret, check that the secret exists and "
            "is enabled, and restart the app"
        )
    try:
        return webhook_config(
            url, env.optional(WEBHOOK_TEMPLATE), env.optional(WEBHOOK_ACTIONS), env.optional(WEBHOOK_SUMMARY_SECONDS)
        )
    except WebhookConfigError as exc:
        # The message names the setting and never quotes the URL's path (it holds the webhook's key).
        raise SettingsError(str(exc)) from None


def _signing_key(text: str | None) -> Ed25519PrivateKey | None:
    if text is None:
        return None
    if text.strip().startswith(_KEY_VAULT_REFERENCE):
        raise SettingsError(
            f"{SIGNING_KEY}: the Key Vault reference was not resolved; give the identity named by the app's "
            "keyVaultReferenceIdentity 'Key Vault Secrets User' on the secret, check that the secret exists and "
            "is enabled, and restart the app (its Environment variables page shows the reference's status)"
        )
    try:
        return load_private_key(text)
    except PermanentError as exc:
        # The message never quotes the value: it is a private key.
        raise SettingsError(f"{SIGNING_KEY}: {exc}") from None
