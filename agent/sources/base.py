"""What the agent needs from one cloud's metadata service: the `Source` interface.

`agent/main.py` takes the source of the configured cloud from `agent.sources.registry` and never
asks which cloud it is: how the metadata service is read (a poller or long-polls), the tracker that
turns readings into events, how the VM proves its identity, and who POSTs approvals (Azure only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from agent.sources.tracking import Tracker
from agent.stopping import StopFlag

if TYPE_CHECKING:
    from agent.commands import Approver
    from agent.loop import Agent, Watcher
    from agent.proofs import Prover
    from agent.state import AgentState
    from agent.timing import Clock

T = TypeVar("T")
# Reads what start-up needs, retrying while the metadata service is not there yet (agent/main.py).
Retry = Callable[[Callable[[], T], StopFlag, str], T]


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

    def tracker(self, vm_name: str, state: AgentState, stop: StopFlag, retry: Retry[str]) -> Tracker: ...

    def watchers(self, agent: Agent, clock: Clock) -> list[Watcher]: ...

    def prover(self, clock: Clock) -> Prover: ...

    def approver(self) -> Approver | None:
        """Who POSTs approvals to the metadata service (None: the cloud has no in-VM approval)."""
        ...

    def close(self) -> None: ...
