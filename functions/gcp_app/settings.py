"""Settings of the Google Cloud Functions app: MBRIDGE_* environment variables, read and validated
once per instance (docs/gcp.md lists every one).

A wrong value stops the first invocation with a message naming the variable: the invocation
fails (HTTP 500), Pub/Sub redelivers, and nothing is acted on with a half-understood setting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from functions.core.policy import DEFAULT_POLICY, Policy, PolicyError, load_policy
from functions.notify import WebhookConfig, WebhookConfigError, webhook_config
from functions.telemetry import GCP, OFF, TELEMETRY, telemetry_setting
from functions.trust.gce_token import GOOGLE_CERTS_URL
from functions.trust.trust_file import TrustFileError, load_trust_file
from wire.errors import PermanentError
from wire.identity import DEFAULT_AUDIENCE
from wire.shards import parse_shards

ENV_PROJECT = "MBRIDGE_GCP_PROJECT"
# Set by Google's runtimes and by `gcloud` tooling; used when MBRIDGE_GCP_PROJECT is not.
ENV_PROJECT_FALLBACK = "GOOGLE_CLOUD_PROJECT"
ENV_FIRESTORE_DATABASE = "MBRIDGE_FIRESTORE_DATABASE"
ENV_FIRESTORE_PREFIX = "MBRIDGE_FIRESTORE_COLLECTION_PREFIX"
ENV_COMMANDS_TOPIC = "MBRIDGE_PUBSUB_COMMANDS_TOPIC"
# How many topics the commands are spread over (wire.shards; docs/gcp.md).
ENV_COMMANDS_SHARDS = "MBRIDGE_COMMANDS_SHARDS"
ENV_INSTANCE_GROUPS = "MBRIDGE_INSTANCE_GROUPS"
ENV_MAINTENANCE_ZONES = "MBRIDGE_MAINTENANCE_ZONES"
ENV_READINESS_DRAIN = "MBRIDGE_READINESS_DRAIN"
# on_central_tick reads the instances' upcomingMaintenance from the Compute API (central_entry.py)
ENV_CENTRAL_UPCOMING = "MBRIDGE_CENTRAL_UPCOMING"
# Before a drain through /readyz, read the VM's managed instance group's autohealing health checks and
# refuse a drain that would fail one (functions/gcp_app/autohealer.py); the agents' health port.
ENV_AUTOHEALER_CHECK = "MBRIDGE_AUTOHEALER_CHECK"
ENV_AGENT_HEALTH_PORT = "MBRIDGE_AGENT_HEALTH_PORT"
# A drain through /readyz counts from when the backend services' health checks saw it, as read from
# them (functions/gcp_app/probe_times.py); false: the policy's readiness_probe_seconds, always.
ENV_READ_PROBES = "MBRIDGE_READ_PROBES"
ENV_POLICY = "MBRIDGE_POLICY"
ENV_SIGNING_KEY = "MBRIDGE_SIGNING_KEY"
ENV_COMPUTE_TIMEOUT = "MBRIDGE_COMPUTE_TIMEOUT_SECONDS"
ENV_LOG_LEVEL = "MBRIDGE_LOG_LEVEL"
# Who sent a report (policy trust: attested): docs/gcp.md, "Trust".
ENV_TRUST_FILE = "MBRIDGE_TRUST_FILE"
ENV_TRUST_AUDIENCE = "MBRIDGE_TRUST_AUDIENCE"
ENV_TRUST_PROJECTS = "MBRIDGE_TRUST_PROJECTS"
ENV_TRUST_ZONES = "MBRIDGE_TRUST_ZONES"
ENV_TRUST_CERTS_URL = "MBRIDGE_TRUST_CERTS_URL"
# Notices to people (docs/operations.md, "Notifications"): the URL is a secret, like the signing key.
ENV_WEBHOOK_URL = "MBRIDGE_WEBHOOK_URL"
ENV_WEBHOOK_TEMPLATE = "MBRIDGE_WEBHOOK_TEMPLATE"
ENV_WEBHOOK_ACTIONS = "MBRIDGE_WEBHOOK_ACTIONS"
ENV_WEBHOOK_SUMMARY_SECONDS = "MBRIDGE_WEBHOOK_SUMMARY_SECONDS"
# Spans to Cloud Trace and metrics to Cloud Monitoring for each invocation (docs/operations.md#telemetry).
ENV_TELEMETRY = TELEMETRY
DEFAULT_DATABASE = "(default)"
DEFAULT_PREFIX = "mbridge_"
DEFAULT_COMMANDS_TOPIC = "maintenance-commands"
DEFAULT_COMPUTE_TIMEOUT = 120.0
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Google's certificates of the keys that sign identity tokens (PEM by key id).
DEFAULT_CERTS_URL = GOOGLE_CERTS_URL
MAX_AUDIENCE_CHARS = 512

# GCE resource names (RFC 1035 labels): zones like us-central1-a, groups like web-ig.
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_PREFIX = re.compile(r"^[A-Za-z0-9_-]{0,64}$")
# A project id: 6-30 lowercase letters, digits and '-', starting with a letter, not ending in '-';
# older projects may carry a domain ("example.com:my-project").
_PROJECT = re.compile(r"^(?:[a-z0-9][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class SettingsError(PermanentError):
    """An environment variable is missing or invalid; the message names it and what it accepts."""


@dataclass(frozen=True)
class GroupRef:
    """One unmanaged instance group (zonal), as `zone/name`."""

    zone: str
    name: str

    def __str__(self) -> str:
        return f"{self.zone}/{self.name}"


@dataclass(frozen=True)
class Settings:
    project: str
    firestore_database: str = DEFAULT_DATABASE
    firestore_prefix: str = DEFAULT_PREFIX
    commands_topic: str = DEFAULT_COMMANDS_TOPIC
    instance_groups: tuple[GroupRef, ...] = ()
    maintenance_zones: tuple[str, ...] = ()
    readiness_drain: bool = True
    central_upcoming: bool = True
    autohealer_check: bool = True
    agent_health_port: int = 9797
    read_probes: bool = True
    policy: Policy = DEFAULT_POLICY
    signing_key: str | None = None
    compute_timeout: float = DEFAULT_COMPUTE_TIMEOUT
    log_level: str = "INFO"
    # A trust file (local runs and tests): when set, it alone verifies the reports' proofs.
    trust_file: str | None = None
    # What an identity token must be for: the audience the agents ask for (--identity-audience),
    # the projects whose VMs may report (empty: `project`) and their zones (empty: every zone).
    trust_audience: str = DEFAULT_AUDIENCE
    trust_projects: tuple[str, ...] = ()
    trust_zones: tuple[str, ...] = ()
    trust_certs_url: str = DEFAULT_CERTS_URL
    # Where notices of decisions and actions are posted; None: nowhere. (Its URL is kept out of repr.)
    webhook: WebhookConfig | None = None
    # > 1: the commands of VM v go to wire.shards.entity_for(commands_topic, v, commands_shards).
    commands_shards: int = 1
    # off, or gcp: each invocation a span in Cloud Trace and metrics in Cloud Monitoring (functions/telemetry).
    telemetry: str = OFF

    @property
    def trusted_projects(self) -> tuple[str, ...]:
        """The projects whose VMs' identity tokens are accepted."""
        return self.trust_projects or (self.project,)

    @property
    def trusted_zones(self) -> tuple[str, ...] | None:
        """The zones whose VMs' identity tokens are accepted; None: every zone of the trusted projects."""
        return self.trust_zones or None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Read and validate every MBRIDGE_* variable.

        Raises:
            SettingsError: naming the variable that is missing or wrong.
        """

        def get(name: str) -> str:
            return environ.get(name, "").strip()

        project = get(ENV_PROJECT) or get(ENV_PROJECT_FALLBACK)
        if not project:
            raise SettingsError(
                f"{ENV_PROJECT} is not set: give the Google Cloud project id of the Firestore database, "
                "the commands topic and the instance groups"
            )
        groups = _groups(get(ENV_INSTANCE_GROUPS))
        zones = _zones(get(ENV_MAINTENANCE_ZONES), ENV_MAINTENANCE_ZONES) or tuple(
            dict.fromkeys(group.zone for group in groups)
        )
        prefix = environ.get(ENV_FIRESTORE_PREFIX, DEFAULT_PREFIX).strip()
        if not _PREFIX.match(prefix):
            raise SettingsError(f"{ENV_FIRESTORE_PREFIX}={prefix!r}: use up to 64 letters, digits, '_' or '-'")
        level = (get(ENV_LOG_LEVEL) or "INFO").upper()
        if level not in LOG_LEVELS:
            raise SettingsError(f"{ENV_LOG_LEVEL}={level!r}: use one of {', '.join(LOG_LEVELS)}")
        readiness = _boolean(ENV_READINESS_DRAIN, get(ENV_READINESS_DRAIN), default=True)
        if not groups and not readiness:
            raise SettingsError(
                f"nothing can drain a VM: set {ENV_INSTANCE_GROUPS} (zone/name,...) or leave {ENV_READINESS_DRAIN} "
                "on (the agent's /readyz for health-probe load balancers)"
            )
        return cls(
            project=project,
            firestore_database=get(ENV_FIRESTORE_DATABASE) or DEFAULT_DATABASE,
            firestore_prefix=prefix,
            commands_topic=get(ENV_COMMANDS_TOPIC) or DEFAULT_COMMANDS_TOPIC,
            commands_shards=_shards(get(ENV_COMMANDS_SHARDS)),
            instance_groups=groups,
            maintenance_zones=zones,
            readiness_drain=readiness,
            central_upcoming=_boolean(ENV_CENTRAL_UPCOMING, get(ENV_CENTRAL_UPCOMING), default=True),
            autohealer_check=_boolean(ENV_AUTOHEALER_CHECK, get(ENV_AUTOHEALER_CHECK), default=True),
            agent_health_port=_port(ENV_AGENT_HEALTH_PORT, get(ENV_AGENT_HEALTH_PORT), 9797),
            read_probes=_boolean(ENV_READ_PROBES, get(ENV_READ_PROBES), default=True),
            policy=_policy(environ.get(ENV_POLICY)),
            signing_key=environ.get(ENV_SIGNING_KEY) or None,
            compute_timeout=_seconds(ENV_COMPUTE_TIMEOUT, get(ENV_COMPUTE_TIMEOUT), DEFAULT_COMPUTE_TIMEOUT),
            log_level=level,
            trust_file=_trust_file(get(ENV_TRUST_FILE)),
            trust_audience=_audience(get(ENV_TRUST_AUDIENCE)),
            trust_projects=_projects(get(ENV_TRUST_PROJECTS)),
            trust_zones=_zones(get(ENV_TRUST_ZONES), ENV_TRUST_ZONES),
            trust_certs_url=_certs_url(get(ENV_TRUST_CERTS_URL)),
            webhook=_webhook(
                get(ENV_WEBHOOK_URL),
                get(ENV_WEBHOOK_TEMPLATE),
                get(ENV_WEBHOOK_ACTIONS),
                get(ENV_WEBHOOK_SUMMARY_SECONDS),
            ),
            telemetry=_telemetry(get(ENV_TELEMETRY)),
        )


def _groups(text: str) -> tuple[GroupRef, ...]:
    groups: list[GroupRef] = []
    for item in _items(text):
        zone, _, name = item.partition("/")
        if not (_NAME.match(zone) and _NAME.match(name)):
            raise SettingsError(
                f"{ENV_INSTANCE_GROUPS}: {item!r} is not zone/name (e.g. us-central1-a/web-ig); "
                "separate several groups with commas"
            )
        groups.append(GroupRef(zone, name))
    return tuple(dict.fromkeys(groups))


def _zones(text: str, variable: str) -> tuple[str, ...]:
    zones = _items(text)
    for zone in zones:
        if not _NAME.match(zone):
            raise SettingsError(f"{variable}: {zone!r} is not a zone name such as us-central1-a")
    return tuple(dict.fromkeys(zones))


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _telemetry(text: str) -> str:
    try:
        return telemetry_setting(text, GCP)
    except ValueError as error:
        raise SettingsError(str(error)) from None


def _boolean(name: str, text: str, *, default: bool) -> bool:
    if not text:
        return default
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise SettingsError(f"{name}={text!r}: use true or false")


def _seconds(name: str, text: str, default: float) -> float:
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"{name}={text!r}: give a number of seconds") from None
    if not 0 < value <= 3600:
        raise SettingsError(f"{name}={text!r}: give a number of seconds between 0 and 3600")
    return value


def _trust_file(path: str) -> str | None:
    """The trust file's path, once it is known to load (local runs and tests)."""
    if not path:
        return None
    try:
        load_trust_file(path)
    except TrustFileError as exc:
        raise SettingsError(f"{ENV_TRUST_FILE}: {exc}") from exc
    return path


def _audience(text: str) -> str:
    if not text:
        return DEFAULT_AUDIENCE
    if len(text) > MAX_AUDIENCE_CHARS or any(c.isspace() or not c.isprintable() for c in text):
        raise SettingsError(
            f"{ENV_TRUST_AUDIENCE}={text[:100]!r}: give the audience the agents ask identity tokens for "
            f"(their --identity-audience), at most {MAX_AUDIENCE_CHARS} characters without spaces"
        )
    return text


def _projects(text: str) -> tuple[str, ...]:
    projects = _items(text)
    for project in projects:
        if not _PROJECT.match(project):
            raise SettingsError(
                f"{ENV_TRUST_PROJECTS}: {project[:100]!r} is not a project id such as my-project-123; give the "
                "ids (not names or numbers) separated by commas"
            )
    return tuple(dict.fromkeys(projects))


def _certs_url(text: str) -> str:
    if not text:
        return DEFAULT_CERTS_URL
    try:
        parts = urlsplit(text)
        host, _port = (parts.hostname or "").lower(), parts.port  # the port raises ValueError when not a number
    except ValueError:
        parts, host = urlsplit(""), ""
    if not host or not (parts.scheme == "https" or (parts.scheme == "http" and host in _LOOPBACK)):
        raise SettingsError(
            f"{ENV_TRUST_CERTS_URL}={text[:200]!r}: give an https URL such as {DEFAULT_CERTS_URL} (http only for a "
            "local stand-in on localhost)"
        )
    return text


def _webhook(url: str, template: str, actions: str, summary_seconds: str) -> WebhookConfig | None:
    try:
        return webhook_config(url or None, template or None, actions or None, summary_seconds or None)
    except WebhookConfigError as exc:
        # The message names the variable and never quotes the URL's path (it holds the webhook's key).
        raise SettingsError(str(exc)) from None


def _policy(text: str | None) -> Policy:
    try:
        return load_policy(text)
    except PolicyError as exc:
        raise SettingsError(f"{ENV_POLICY}: {exc}") from exc


def _shards(value: str) -> int:
    try:
        return parse_shards(value or "1")
    except ValueError as error:
        raise SettingsError(f"{ENV_COMMANDS_SHARDS}: {error}") from None


def _port(name: str, text: str, default: int) -> int:
    if not text.strip():
        return default
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise SettingsError(f"{name} must be a TCP port, 1 to 65535 (the agents' --listen port), got {text[:20]!r}")
    return port
