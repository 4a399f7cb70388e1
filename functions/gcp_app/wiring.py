"""Builds the `Deps` of the Cloud Functions app: once per instance, on first use.

Nothing is built at import: the functions framework imports main.py before serving, and a
client created then would read credentials before they are needed (and in tests, without any).
A function instance handles several requests at a time (gen2 concurrency), so the first build
is guarded by a lock and every later invocation shares the same clients.

Tests replace the whole `Deps` with `override(deps)`; nothing else in this module is patched.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TypeVar

import requests
from google.cloud import compute_v1, firestore

from functions.core.balancers import CompositeBalancer, ReadinessBalancer
from functions.core.policy import TRUST_ATTESTED
from functions.core.ports import LoadBalancer, Maintenance
from functions.core.process import ClaimWait, Deps
from functions.core.telemetry import NO_TELEMETRY, Telemetry
from functions.gcp_app import logging as logs
from functions.gcp_app.autohealer import ComputeMigReader, MigAutohealers
from functions.gcp_app.commands import PubSubCommandSender
from functions.gcp_app.compute import ComputeMaintenance, InstanceGroupBalancer
from functions.gcp_app.firestore_audit import FirestoreAuditLog
from functions.gcp_app.firestore_store import FirestoreStateStore
from functions.gcp_app.instance_directory import ComputeInstanceDirectory
from functions.gcp_app.probe_times import PURPOSE, ComputeBackendReader, GroupProbeTimes
from functions.gcp_app.settings import ENV_TRUST_AUDIENCE, ENV_TRUST_FILE, Settings, SettingsError
from functions.notify import notifying_audit
from functions.notify.webhook import where
from functions.telemetry import OFF, TELEMETRY
from functions.trust.gce_instances import GceInstance, InstanceDirectory
from functions.trust.gce_token import GoogleCerts
from functions.trust.trust_file import TrustFileError, load_trust_file
from functions.trust.verifiers import CloudVerifier, GceTokenVerifier
from wire.commands import Command
from wire.identity import DEFAULT_AUDIENCE, IdentityVerifier
from wire.signing import load_private_key, sign_command
from wire.transports.pubsub import PublisherFactory, PubSubOperator, PubSubSettings, new_commands_publisher

LOG = logging.getLogger("mbridge.gcp.wiring")
Made = TypeVar("Made")

# Names of the parts of a drain memento (CompositeBalancer): kept stable, because mementos
# stored under them are restored by later invocations, possibly after a configuration change.
INSTANCE_GROUPS = "instance_groups"
READINESS = "readiness"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def new_firestore_client(settings: Settings) -> firestore.Client:
    """Honours FIRESTORE_EMULATOR_HOST (then no credentials are needed)."""
    return firestore.Client(project=settings.project, database=settings.firestore_database)


@dataclass(frozen=True)
class Clients:
    """Factories of the Google clients; the defaults use Application Default Credentials."""

    firestore: Callable[[Settings], firestore.Client] = new_firestore_client
    instance_groups: Callable[[], compute_v1.InstanceGroupsClient] = compute_v1.InstanceGroupsClient
    zone_operations: Callable[[], compute_v1.ZoneOperationsClient] = compute_v1.ZoneOperationsClient
    instances: Callable[[], compute_v1.InstancesClient] = compute_v1.InstancesClient
    instance_group_managers: Callable[[], compute_v1.InstanceGroupManagersClient] = (
        compute_v1.InstanceGroupManagersClient
    )
    region_instance_group_managers: Callable[[], compute_v1.RegionInstanceGroupManagersClient] = (
        compute_v1.RegionInstanceGroupManagersClient
    )
    health_checks: Callable[[], compute_v1.HealthChecksClient] = compute_v1.HealthChecksClient
    region_health_checks: Callable[[], compute_v1.RegionHealthChecksClient] = compute_v1.RegionHealthChecksClient
    backend_services: Callable[[], compute_v1.BackendServicesClient] = compute_v1.BackendServicesClient
    region_backend_services: Callable[[], compute_v1.RegionBackendServicesClient] = (
        compute_v1.RegionBackendServicesClient
    )
    publisher: PublisherFactory = new_commands_publisher


def build_deps(settings: Settings, clients: Clients | None = None, clock: Callable[[], datetime] = utc_now) -> Deps:
    """Every adapter the settings ask for. Compute clients are created only when instance groups
    or maintenance zones are configured.

    Raises:
        KeyFormatError / SigningUnavailableError (PermanentError): MBRIDGE_SIGNING_KEY is unusable.
    """
    clients = clients or Clients()
    signer = _signer(settings.signing_key)
    firestore_client = clients.firestore(settings)
    names = {"prefix": settings.firestore_prefix, "database": settings.firestore_database}
    operator = PubSubOperator(
        PubSubSettings(
            project=settings.project,
            commands_topic=settings.commands_topic,
            commands_shards=settings.commands_shards,
        ),
        publisher_factory=clients.publisher,
    )
    sender = PubSubCommandSender(operator)
    # One directory for the verifier and the Compute adapters: the instance a report was verified
    # for is the one drained and maintained. Created only when something asks it.
    directory = _LazyDirectory(lambda: instance_directory(settings, clients))
    parts: list[tuple[str, LoadBalancer]] = []
    if settings.instance_groups:
        groups = InstanceGroupBalancer(
            clients.instance_groups(),
            clients.zone_operations(),
            settings.project,
            settings.instance_groups,
            directory,
            timeout=settings.compute_timeout,
        )
        parts.append((INSTANCE_GROUPS, groups))
    if settings.readiness_drain:
        # The check and the probes' times read the Compute API; with a trust file (local runs and
        # tests: the VMs are a simulator's, no instance group holds them) they have nothing to read.
        local = settings.trust_file is not None
        guard = _autohealers(settings, clients, directory) if settings.autohealer_check and not local else None
        probes = _probe_times(settings, clients, directory) if settings.read_probes and not local else None
        readiness = ReadinessBalancer(sender, clock, signer=signer, guard=guard, probe_seconds=probes)
        parts.append((READINESS, readiness))
    maintenance: Maintenance | None = None
    if settings.maintenance_zones:
        maintenance = ComputeMaintenance(
            clients.instances(), directory, settings.maintenance_zones, timeout=settings.compute_timeout
        )
    return Deps(
        store=FirestoreStateStore(firestore_client, **names),
        balancer=CompositeBalancer(parts),
        sender=sender,
        # Notices (MBRIDGE_WEBHOOK_URL) go out from their own thread once a record is written.
        audit=notifying_audit(FirestoreAuditLog(firestore_client, **names), settings.webhook, cloud="gce"),
        policy=settings.policy,
        maintenance=maintenance,
        signer=signer,
        # A redelivery meeting a live claim waits here; bounced to the bus it would dead-letter.
        claim_wait=ClaimWait(clock=lambda: datetime.now(timezone.utc)),
        verifier=build_verifier(settings, directory),
        telemetry=build_telemetry(settings),
    )


def build_telemetry(settings: Settings) -> Telemetry:
    """MBRIDGE_TELEMETRY=gcp: each invocation a span in Cloud Trace and metrics in Cloud Monitoring,
    of the function's project, with Application Default Credentials, exported before each invocation
    answers: once it has, Cloud Functions may throttle the instance's CPU, and the SDK's export threads
    would wait for the next request. Off: nothing is imported."""
    if settings.telemetry == OFF:
        return NO_TELEMETRY
    # A block of its own: a 3.9 type check then follows none of these imports (3.10 and newer).
    if sys.version_info >= (3, 10):
        from opentelemetry.exporter.cloud_monitoring import CloudMonitoringMetricsExporter
        from opentelemetry.exporter.cloud_trace import CloudTraceSpanExporter

        from functions.telemetry import exporting

        return exporting(
            CloudTraceSpanExporter(project_id=settings.project),  # type: ignore[no-untyped-call]
            # Each instance writes series of its own: Cloud Monitoring refuses two writers of one series.
            CloudMonitoringMetricsExporter(project_id=settings.project, add_unique_identifier=True),
            cloud="gcp",
            flush=True,
        )
    raise SettingsError(f"{TELEMETRY}={settings.telemetry} needs Python 3.10 or newer")


def instance_directory(settings: Settings, clients: Clients | None = None) -> ComputeInstanceDirectory:
    """The instances of the trusted projects and zones, from the Compute API."""
    return ComputeInstanceDirectory(
        (clients or Clients()).instances(),
        settings.trusted_projects,
        settings.trusted_zones,
        timeout=settings.compute_timeout,
    )


def _autohealers(settings: Settings, clients: Clients, directory: InstanceDirectory) -> Callable[[str], str | None]:
    """The readiness drain's guard against autohealing (functions/gcp_app/autohealer.py); its Compute
    clients are made at its first question, as the directory's are."""
    guard = _on_first_use(
        lambda: MigAutohealers(
            _mig_reader(settings, clients), directory.instances_named, port=settings.agent_health_port
        )
    )
    return lambda vm: guard().conflict(vm)


def _probe_times(settings: Settings, clients: Clients, directory: InstanceDirectory) -> Callable[[str], float | None]:
    """The readiness drain's reader of the backend services' health checks (functions/gcp_app/
    probe_times.py); its Compute clients are made at its first question."""

    def make() -> GroupProbeTimes:
        reader = ComputeBackendReader(
            _mig_reader(settings, clients, purpose=PURPOSE),
            clients.backend_services(),
            clients.region_backend_services(),
            timeout=settings.compute_timeout,
        )
        return GroupProbeTimes(reader, directory.instances_named, port=settings.agent_health_port)

    times = _on_first_use(make)
    return lambda vm: times().seconds(vm)


def _mig_reader(settings: Settings, clients: Clients, **options: str) -> ComputeMigReader:
    return ComputeMigReader(
        clients.instances(),
        clients.instance_group_managers(),
        clients.region_instance_group_managers(),
        clients.health_checks(),
        clients.region_health_checks(),
        timeout=settings.compute_timeout,
        **options,
    )


def _on_first_use(make: Callable[[], Made]) -> Callable[[], Made]:
    """`make()`'s result, made once, at the first call (by one caller when several come at once)."""
    made: list[Made] = []
    lock = threading.Lock()

    def get() -> Made:
        with lock:
            if not made:
                made.append(make())
            return made[0]

    return get


class _LazyDirectory:
    """Makes the Compute client on first lookup: a function with a trust file and no Compute
    adapters never needs one (nor credentials for it)."""

    def __init__(self, make: Callable[[], InstanceDirectory]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._directory: InstanceDirectory | None = None

    def instances_named(self, name: str, *, expecting: str | None = None) -> Sequence[GceInstance]:
        with self._lock:
            if self._directory is None:
                self._directory = self._make()
            directory = self._directory
        return directory.instances_named(name, expecting=expecting)


def build_verifier(settings: Settings, directory: InstanceDirectory | None = None) -> IdentityVerifier | None:
    """Who sent a report. Policy trust `attested`: the trust file's verifier when MBRIDGE_TRUST_FILE
    is set, else GCE identity tokens checked against Google's certificates (fetched from
    MBRIDGE_TRUST_CERTS_URL and cached as Google says), for the trust audience, of the one instance
    of the trusted projects and zones with the token's name (`directory`; default: the Compute
    API's). Trust `reporter-name`: None (the core then takes the reporter at its word).

    Raises:
        SettingsError: the trust file cannot be read.
    """
    if settings.policy.trust != TRUST_ATTESTED:
        return None
    if settings.trust_file is not None:
        try:
            return load_trust_file(settings.trust_file)
        except TrustFileError as exc:
            raise SettingsError(f"{ENV_TRUST_FILE}: {exc}") from exc
    gce = GceTokenVerifier(
        certs=GoogleCerts(requests.Session(), settings.trust_certs_url),
        audience=settings.trust_audience,
        projects=settings.trusted_projects,
        zones=settings.trusted_zones,
        directory=directory if directory is not None else _LazyDirectory(lambda: instance_directory(settings)),
    )
    return CloudVerifier(gce=gce)


def _signer(key_source: str | None) -> Callable[[Command], Command] | None:
    if key_source is None:
        return None
    private_key = load_private_key(key_source)
    return lambda command: sign_command(command, private_key)


_lock = threading.Lock()
_built: Deps | None = None
_override: Deps | None = None


def deps() -> Deps:
    """The instance's Deps: the override when a test set one, else built from the environment
    on first use (which also configures structured logging).

    Raises:
        SettingsError: an MBRIDGE_* variable is missing or wrong (the invocation fails; fix and redeploy).
    """
    global _built
    if _override is not None:
        return _override
    with _lock:
        if _built is None:
            settings = Settings.from_env()
            logs.configure(settings.log_level, project=settings.project)
            _built = build_deps(settings)
            LOG.info(
                "wired: project %s, Firestore database %s, commands topic %s (%d shards), instance groups %s, "
                "readiness %s, trust %s, webhook %s",
                settings.project,
                settings.firestore_database,
                settings.commands_topic,
                settings.commands_shards,
                ", ".join(map(str, settings.instance_groups)) or "none",
                "on" if settings.readiness_drain else "off",
                _trust_summary(settings),
                _webhook_summary(settings),
            )
            _warn_of_a_shared_audience(settings)
        return _built


def _trust_summary(settings: Settings) -> str:
    if settings.policy.trust != TRUST_ATTESTED:
        return settings.policy.trust
    if settings.trust_file is not None:
        return f"the trust file {settings.trust_file}"
    zones = ", ".join(settings.trusted_zones or ("every zone",))
    projects = ", ".join(settings.trusted_projects)
    return f"identity tokens for {settings.trust_audience} of projects {projects} ({zones})"


def _warn_of_a_shared_audience(settings: Settings) -> None:
    """An audience every deployment uses lets a token lifted from one deployment's topic count in
    another that trusts the same project: say so at every start until it is set."""
    if (
        settings.policy.trust == TRUST_ATTESTED
        and settings.trust_file is None
        and (settings.trust_audience == DEFAULT_AUDIENCE)
    ):
        LOG.warning(
            "%s is the shared default %r: identity tokens made for any other deployment of maintenance-bridge that "
            "trusts these projects are accepted here too. Set it (and the agents' MBRIDGE_IDENTITY_AUDIENCE) to a "
            "value of this deployment's own, e.g. maintenance-bridge/%s/<deployment name> (docs/gcp.md, Trust)",
            ENV_TRUST_AUDIENCE,
            DEFAULT_AUDIENCE,
            settings.project,
            extra={"labels": {"alert": "shared-audience"}},
        )


def _webhook_summary(settings: Settings) -> str:
    webhook = settings.webhook
    if webhook is None:
        return "none"
    # Scheme and host only: the rest of the URL is the webhook's key.
    return f"{where(webhook.url)} for {', '.join(sorted(webhook.notice_filter.names))}"


@contextmanager
def override(replacement: Deps) -> Iterator[Deps]:
    """Make `deps()` return `replacement` inside the block (the test seam)."""
    global _override
    previous, _override = _override, replacement
    try:
        yield replacement
    finally:
        _override = previous


def reset() -> None:
    """Forget the built Deps; the next `deps()` builds them again from the environment."""
    global _built
    with _lock:
        _built = None
