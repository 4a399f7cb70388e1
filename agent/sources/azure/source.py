"""Azure IMDS as the agent's source: a poller of Scheduled Events, the attested document as proof,
and StartRequests POSTs as approvals."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.config import AgentSettings
from agent.proofs import AzureAttestedProver, Prover
from agent.sources.azure.client import AzureImdsClient, AzurePoller, requests_per_second
from agent.sources.azure.tracker import AzureTracker
from agent.sources.base import Retry
from agent.sources.tracking import Tracker
from agent.state import AgentState
from agent.stopping import StopFlag
from agent.timing import Clock

if TYPE_CHECKING:
    from agent.commands import Approver
    from agent.loop import Agent, Watcher


class AzureSource:
    proof_name = "attested document"

    def __init__(self, settings: AgentSettings) -> None:
        self._settings = settings
        self._client = AzureImdsClient.for_base_url(
            settings.metadata_url, settings.api_version, requests_per_second(settings.poll_interval)
        )

    def own_name(self) -> str:
        return self._client.own_name()

    def describe_read(self) -> str:
        document = self._client.fetch_document(first_call=True)
        return f"Azure Scheduled Events at {self._client.base_url}: incarnation {document.incarnation}"

    def tracker(self, vm_name: str, state: AgentState, stop: StopFlag, retry: Retry[str]) -> Tracker:
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
