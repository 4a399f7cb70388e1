"""GCE metadata as the agent's source: a long-poll per maintenance key, the identity token as proof,
and no in-VM approval (instances.performMaintenance is the functions' call)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.config import AgentSettings
from agent.proofs import GceIdentityProver, Prover
from agent.sources.base import Retry
from agent.sources.gce.client import GceKeyWatcher, GceMetadataClient
from agent.sources.gce.diff import GCE_KEYS, GceIdentity
from agent.sources.gce.tracker import GceTracker
from agent.sources.tracking import Tracker
from agent.state import AgentState
from agent.stopping import StopFlag
from agent.timing import Clock

if TYPE_CHECKING:
    from agent.commands import Approver
    from agent.loop import Agent, Watcher


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

    def tracker(self, vm_name: str, state: AgentState, stop: StopFlag, retry: Retry[str]) -> Tracker:
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
