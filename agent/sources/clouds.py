"""One `Source` per cloud: everything the agent does differently on Azure and on GCE.

`agent/main.py` takes the source of the configured cloud from `SOURCES` and never asks which cloud
it is: how the metadata service is read (a poller or long-polls), the tracker that turns readings
into events, how the VM proves its identity, and who POSTs approvals (Azure only).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from agent.config import AgentSettings
from agent.diff import GCE_KEYS, GceIdentity
from agent.proofs import AzureAttestedProver, GceIdentityProver, Prover
from agent.sources.azure_imds import AzureImdsClient, AzurePoller
from agent.sources.gce_metadata import GceKeyWatcher, GceMetadataClient
from agent.state import AgentState
from agent.timing import Clock
from agent.trackers import AzureTracker, GceTracker, Tracker
from functions.core.model import Cloud

if TYPE_CHECKING:
    from agent.commands import Approver
    from agent.loop import Agent, Watcher

T = TypeVar("T")
# Reads what start-up needs, retrying while the metadata service is not there yet (agent/main.py).
Retry = Callable[[Callable[[], T], threading.Event, str], T]


class Source(Protocol):
    """The metadata service of one cloud, as the agent uses it."""

    proof_name: str  # what the VM's proof of identity is called, for --check

    def own_name(self) -> str: ...

    def describe_read(self) -> str:
        """One read of the maintenance state, described for --check.

        Raises:
            MetadataUnavailableError: the metadata service did not answer it.
        """
        ...

    def tracker(self, vm_name: str, state: AgentState, stop: threading.Event, retry: Retry[str]) -> Tracker: ...

    def watchers(self, agent: Agent, clock: Clock) -> list[Watcher]: ...

    def prover(self, clock: Clock) -> Prover: ...

    def approver(self) -> Approver | None:
        """Who POSTs approvals to the metadata service (None: the cloud has no in-VM approval)."""
        ...

    def close(self) -> None: ...


class AzureSource:
    proof_name = "attested document"

    def __init__(self, settings: AgentSettings) -> None:
        self._settings = settings
        self._client = AzureImdsClient.for_base_url(settings.metadata_url, settings.api_version)

    def own_name(self) -> str:
        return self._client.own_name()

    def describe_read(self) -> str:
        document = self._client.fetch_document(first_call=True)
        return f"Azure Scheduled Events at {self._client.base_url}: incarnation {document.incarnation}"

    def tracker(self, vm_name: str, state: AgentState, stop: threading.Event, retry: Retry[str]) -> Tracker:
        saved = state.load(AzureTracker.state_name)
        return AzureTracker(vm_name, saved, self._settings.harmless_freeze_seconds)

    def watchers(self, agent: Agent, clock: Clock) -> list[Watcher]:
        poller = AzurePoller(
            self._client, agent.observe, clock=clock, interval=self._settings.poll_interval, on_poll=agent.poll_result
        )
        return [poller.run]

    def prover(self, clock: Clock) -> Prover:
        # The prover shares the client: IMDS's rate limit counts every request of this agent.
        return AzureAttestedProver(self._client, clock.monotonic)

    def approver(self) -> Approver | None:
        return self._client

    def close(self) -> None:
        self._client.close()


class GceSource:
    proof_name = "identity token"

    def __init__(self, settings: AgentSettings) -> None:
        self._settings = settings
        self._client = GceMetadataClient.for_base_url(settings.metadata_url)

    def own_name(self) -> str:
        return self._client.own_name()

    def describe_read(self) -> str:
        reading = self._client.read("maintenance-event")
        return f"GCE maintenance-event at {self._client.base_url}: {reading.value}"

    def tracker(self, vm_name: str, state: AgentState, stop: threading.Event, retry: Retry[str]) -> Tracker:
        instance_id = retry(self._client.instance_id, stop, "the instance id")
        return GceTracker(GceIdentity(instance_id=instance_id, reporter=vm_name), state.load(GceTracker.state_name))

    def watchers(self, agent: Agent, clock: Clock) -> list[Watcher]:
        return [
            GceKeyWatcher(self._client, key, agent.observe, clock=clock, on_poll=agent.poll_result).run
            for key in GCE_KEYS
        ]

    def prover(self, clock: Clock) -> Prover:
        return GceIdentityProver(self._client, self._settings.identity_audience)

    def approver(self) -> Approver | None:
        return None  # GCE's "start now" is instances.performMaintenance, outside the VM

    def close(self) -> None:
        self._client.close()


SOURCES: Mapping[Cloud, Callable[[AgentSettings], Source]] = {Cloud.AZURE: AzureSource, Cloud.GCE: GceSource}


def open_source(settings: AgentSettings) -> Source:
    return SOURCES[settings.cloud](settings)
