"""Builds the core's Deps from the app settings, once per worker process, on first use.

Nothing here runs at import: the Functions host imports function_app.py to index the functions,
and a worker that cannot build its clients should fail the invocation (the message is then
redelivered, and dead-lettered after the subscription's max delivery count) with a message
naming the setting, not the indexing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import requests

from functions.azure_app.autohealer import scale_set_repairs
from functions.azure_app.commands import ServiceBusCommandSender
from functions.azure_app.load_balancer import (
    POOL_EDIT,
    AzureLoadBalancer,
    nics_in_resource_group,
    nics_of_scoped_vm,
    uniform_instances,
)
from functions.azure_app.probe_times import probe_reader
from functions.azure_app.settings import TRUST_FILE, TRUST_SUBSCRIPTIONS, AttestedTrust, Settings, SettingsError
from functions.azure_app.tables import TableAuditLog, TableStateStore, table_errors
from functions.azure_app.vm_directory import vm_directory
from functions.core.balancers import CompositeBalancer, ReadinessBalancer
from functions.core.policy import TRUST_ATTESTED
from functions.core.ports import CommandSender, LoadBalancer
from functions.core.process import ClaimWait, Deps
from functions.core.telemetry import NO_TELEMETRY, Telemetry
from functions.notify import notifying_audit
from functions.telemetry import OFF, TELEMETRY
from functions.trust.azure_attested import IssuerNotServedError
from functions.trust.trust_file import TrustFileError, load_trust_file
from functions.trust.verifiers import AzureAttestedVerifier, CloudVerifier, VmDirectory
from wire.commands import Command
from wire.identity import IdentityVerifier
from wire.signing import sign_command
from wire.transports.servicebus import ServiceBusOperator, ServiceBusSettings

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.data.tables import TableClient, TableServiceClient

# Names of the balancers inside the memento of a drain. A drain recorded under one name is
# restored by the balancer of that name, so these must not change between releases.
AZURE_LB = "azure_lb"
READINESS = "readiness"

# Fetching an attested document's issuing CA from its caIssuers URL (the verifier fetches only for
# Azure's issuing CAs it does not ship, only from Microsoft's and DigiCert's PKI hosts, and
# remembers what each URL gave).
ISSUER_FETCH_TIMEOUT = 10.0
MAX_ISSUER_BYTES = 64 * 1024


def build_deps(settings: Settings, *, credential: TokenCredential | None = None) -> Deps:
    """The ports on Azure services. `credential` defaults to DefaultAzureCredential (the app's
    managed identity; AZURE_CLIENT_ID selects a user-assigned one)."""
    if credential is None:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    service = _table_service(settings, credential)
    signer = _signer(settings)
    sender = ServiceBusCommandSender(ServiceBusOperator(command_bus_settings(settings), credential=credential))
    # One directory of the scope's VMs: who a report is from, and which NICs are that VM's.
    directory = _directory(settings, credential)
    return Deps(
        store=TableStateStore(_table(service, settings.state_table)),
        balancer=_balancer(settings, credential, sender, signer, directory),
        sender=sender,
        # Notices (MBRIDGE_WEBHOOK_URL) go out from their own thread once a record is written.
        audit=notifying_audit(TableAuditLog(_table(service, settings.audit_table)), settings.webhook, cloud="azure"),
        policy=settings.policy,
        signer=signer,
        # A redelivery meeting a live claim waits here; bounced to the bus it would dead-letter.
        claim_wait=ClaimWait(clock=lambda: datetime.now(timezone.utc)),
        verifier=build_verifier(settings, credential, directory=directory),
        telemetry=build_telemetry(settings, credential),
    )


def build_telemetry(settings: Settings, credential: TokenCredential) -> Telemetry:
    """MBRIDGE_TELEMETRY=azure-monitor: each invocation a span and metrics in Application Insights,
    sent with the app's identity (the component takes Entra ID tokens only). Off: nothing is imported."""
    if settings.telemetry == OFF:
        return NO_TELEMETRY
    # A block of its own: the 3.9 type check (mbridge approve reads this module) then follows none of
    # these imports, whose modules take 3.10 and newer.
    if sys.version_info >= (3, 10):
        from azure.monitor.opentelemetry.exporter import AzureMonitorMetricExporter, AzureMonitorTraceExporter

        from functions.telemetry import exporting

        connection = settings.app_insights_connection_string
        # Not flushed after each invocation (exporting's flush): the Functions host keeps the worker
        # and its threads running between invocations, so the batch processor exports within seconds
        # and the reader each minute, and a flush would put a round trip to the ingestion endpoint in
        # every invocation, inside its message lock, and send a burst's spans one request each. A
        # worker that stops (scale-in, `mbridge recover` exiting) exports what is left on its way out.
        return exporting(
            lambda provider: AzureMonitorTraceExporter(
                connection_string=connection, credential=credential, tracer_provider=provider
            ),
            AzureMonitorMetricExporter(connection_string=connection, credential=credential),
            cloud="azure",
            flush=False,
        )
    raise SettingsError(f"{TELEMETRY}={settings.telemetry} needs Python 3.10 or newer")


def _directory(settings: Settings, credential: TokenCredential) -> VmDirectory | None:
    """The compute API's directory of the VMs of MBRIDGE_TRUST_SUBSCRIPTIONS x MBRIDGE_TRUST_RESOURCE_GROUPS,
    when reports are verified with Azure's attested documents (not with a trust file)."""
    if settings.policy.trust != TRUST_ATTESTED or settings.trust_file is not None:
        return None
    return vm_directory(settings, credential)


def build_verifier(
    settings: Settings, credential: TokenCredential, *, directory: VmDirectory | None = None
) -> IdentityVerifier | None:
    """Who sent a report. Policy trust `attested`: the trust file's verifier when MBRIDGE_TRUST_FILE
    is set, else Azure's attested documents checked against the trust settings, the VM named by
    `directory` (default: the compute API on `credential`, in MBRIDGE_TRUST_RESOURCE_GROUPS).
    Trust `reporter-name`: None (the core then takes the reporter at its word).

    Raises:
        SettingsError: the trust file cannot be read, or no subscription is trusted.
    """
    if settings.policy.trust != TRUST_ATTESTED:
        return None
    if settings.trust_file is not None:
        try:
            return load_trust_file(settings.trust_file)
        except TrustFileError as exc:
            raise SettingsError(f"{TRUST_FILE}: {exc}") from exc
    if not settings.trust_subscriptions:
        raise SettingsError(f"{TRUST_SUBSCRIPTIONS} is not set: give the ids of the subscriptions whose VMs report")
    return attested_verifier(settings, credential, directory=directory)


def attested_verifier(
    trust: AttestedTrust, credential: TokenCredential, *, directory: VmDirectory | None = None
) -> IdentityVerifier:
    """Azure's attested documents checked against the trust settings: their roots, intermediates
    (and the issuing CAs fetched as `fetch_issuer` allows), signer names and subscriptions, the VM
    named by `directory` (default: the compute API on `credential`, in the subscriptions x resource
    groups of the settings). The functions check reports with it; `mbridge approve` the answers."""
    azure = AzureAttestedVerifier(
        roots=trust.trust_roots,
        intermediates=trust.trust_intermediates,
        signer_names=trust.trust_signer_names,
        subscriptions=trust.trust_subscriptions,
        directory=directory if directory is not None else vm_directory(trust, credential),
        fetch_issuer=fetch_issuer,
    )
    return CloudVerifier(azure=azure)


class IssuerFetchFailedError(Exception):
    """The issuing CA's server failed (HTTP 5xx): it may answer on a later try."""


def fetch_issuer(url: str) -> bytes:
    """The body at a signer certificate's caIssuers URL: one GET, 10 s, no redirects, at most 64 KiB.

    Raises:
        IssuerNotServedError: the server answered, and not with the certificate (a 3xx, which is
            not followed, a 4xx, or a larger body): the document is refused, not retried.
        requests.RequestException, IssuerFetchFailedError: unreachable, or a 5xx; the verifier
            takes either as "cannot check now" and the message is redelivered.
    """
    with requests.get(url, timeout=ISSUER_FETCH_TIMEOUT, allow_redirects=False, stream=True) as response:
        if response.status_code >= 500:
            raise IssuerFetchFailedError(f"{url} answered HTTP {response.status_code}")
        if response.status_code != 200:
            raise IssuerNotServedError(f"{url} answered HTTP {response.status_code}, not the certificate")
        body = bytearray()
        for chunk in response.iter_content(chunk_size=16 * 1024):
            body.extend(chunk)
            if len(body) > MAX_ISSUER_BYTES:
                raise IssuerNotServedError(f"{url} answered more than {MAX_ISSUER_BYTES} bytes: not a certificate")
    return bytes(body)


def command_bus_settings(settings: Settings) -> ServiceBusSettings:
    """Where the command sender sends: into the target's session of the commands queue, or (the
    isolated mode, MBRIDGE_COMMANDS_MODE=topic) onto the commands topic, where each VM's
    subscription filters on the application property `target`; with MBRIDGE_COMMANDS_SHARDS, the
    queue or topic of the VM's shard (wire.shards)."""
    return ServiceBusSettings(
        namespace=settings.servicebus_namespace,
        connection_string=settings.servicebus_connection_string,
        commands_queue=settings.commands_queue,
        commands_topic=settings.commands_topic if settings.commands_mode == "topic" else None,
        commands_shards=settings.commands_shards,
    )


def _table_service(settings: Settings, credential: TokenCredential) -> TableServiceClient:
    from azure.data.tables import TableServiceClient

    if settings.table_connection_string:
        return TableServiceClient.from_connection_string(settings.table_connection_string)
    return TableServiceClient(endpoint=settings.table_endpoint or "", credential=credential)


def _table(service: TableServiceClient, name: str) -> TableClient:
    # Infra creates the tables; creating them here too makes a fresh Azurite (or a forgotten
    # table) work, and costs one request per worker.
    with table_errors(name, "create the table"):
        return service.create_table_if_not_exists(name)


def _signer(settings: Settings) -> Callable[[Command], Command] | None:
    key = settings.signing_key
    if key is None:
        return None
    return lambda command: sign_command(command, key)


def _balancer(
    settings: Settings,
    credential: TokenCredential,
    sender: CommandSender,
    signer: Callable[[Command], Command] | None,
    directory: VmDirectory | None,
) -> LoadBalancer:
    balancers: list[tuple[str, LoadBalancer]] = []
    target = settings.load_balancer
    probe_seconds = None
    if target is not None:
        from azure.mgmt.network import NetworkManagementClient

        client = NetworkManagementClient(credential, target.subscription_id)
        # A VM's NICs by its full resource id when the scope's VMs are known; by name otherwise.
        lookup = (
            nics_in_resource_group(client, target.nic_resource_group)
            if directory is None
            else nics_of_scoped_vm(client, target.nic_resource_group, directory)
        )
        balancer = AzureLoadBalancer(
            client, target.subscription_id, target.resource_group, target.name, lookup,
            method=target.drain_method,
            # A uniform scale set's instance is known by its resource id, from the scope's VMs only.
            scale_set_instance=None if directory is None else uniform_instances(directory),
        )  # fmt: skip
        balancers.append((AZURE_LB, balancer))
        # How long its probe takes to see a readiness drain (the policy's value when it is not read).
        # Only pool edits leave a uniform scale set's instance to its /readyz; by admin state the
        # instance's entries are set Down with the rest, so no probe of this balancer counts.
        probe_seconds = probe_reader(settings, client) if target.drain_method == POOL_EDIT else None
    if settings.readiness_drain:
        ttl = timedelta(seconds=settings.policy.command_ttl_seconds)
        # With the scope's VMs known, a drain a scale set's automatic repairs would act on is refused.
        guard = (
            scale_set_repairs(directory, port=settings.agent_health_port)
            if directory is not None and settings.autohealer_check
            else None
        )
        readiness = ReadinessBalancer(
            sender, clock=_utc_now, ttl=ttl, signer=signer, guard=guard, probe_seconds=probe_seconds
        )
        balancers.append((READINESS, readiness))
    # Always composite, even with one balancer: the memento keeps the same shape when
    # balancers are added or removed later, so older drains are still restored.
    return CompositeBalancer(balancers)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class DepsProvider:
    """The Deps of this worker: built by `build` on first use, then shared by every invocation.

    A failed build is not remembered: the next invocation tries again (a role assignment or a
    table may have appeared since).
    """

    def __init__(self, build: Callable[[], Deps]) -> None:
        self._build = build
        self._deps: Deps | None = None
        self._lock = threading.Lock()

    def get(self) -> Deps:
        deps = self._deps
        if deps is not None:
            return deps
        with self._lock:
            if self._deps is None:
                self._deps = self._build()
            return self._deps

    @contextmanager
    def overridden(self, deps: Deps) -> Iterator[Deps]:
        """Serve `deps` instead for a while: tests and local runs of the registered function."""
        with self._lock:
            previous, self._deps = self._deps, deps
        try:
            yield deps
        finally:
            with self._lock:
                self._deps = previous


def from_environment(environ: Mapping[str, str]) -> Callable[[], Deps]:
    """A builder reading the settings from `environ` when it is called, not before."""
    return lambda: build_deps(Settings.from_env(environ))
