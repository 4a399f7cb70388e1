"""The ports every transport implements, and the messages that cross them.

Events (and command results) go out as `OutboundMessage`s: the structured CloudEvent
bytes plus the attributes of docs/contracts.md#on-the-bus. Commands come in as `InboundCommand`s
that the agent settles once it has recorded what it did with them, so a crash before
that means redelivery, never loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Callable, Protocol

from wire.errors import PermanentError, RetryableError

# Message attributes / application properties that repeat envelope fields (docs/contracts.md#on-the-bus).
ATTRIBUTE_NAMES = ("type", "vm", "cloud", "event_id")


class TransportUnavailableError(RetryableError):
    """The bus cannot be reached or refused the operation for now; retry with backoff."""


class TransportConfigError(PermanentError):
    """The transport is misconfigured (missing setting, bad credentials); the message says what to set."""


@dataclass(frozen=True)
class OutboundMessage:
    """One envelope to publish.

    `message_id` (default: `envelope_id`) becomes the Service Bus MessageId and the local bus's key
    (duplicate detection); `key` is the VM the message is about: the target VM of a command (its
    session / ordering key), the reporting VM of an event (no cloud bus orders events on it: any
    agent could claim the name). An agent's events carry a message id of their own (the digest of
    the body with its proof): every VM of an event publishes the same envelope id, and a broker
    that dropped all but the first would let any VM that publishes first shadow the others' reports.
    """

    envelope_id: str
    body: bytes
    key: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    message_id: str = ""

    @property
    def bus_id(self) -> str:
        """The id the bus deduplicates on."""
        return self.message_id or self.envelope_id


@dataclass(frozen=True)
class InboundCommand:
    """A command as received. Call `settle()` after the outcome is durably recorded;
    an unsettled command is redelivered by the bus (at once after `abandon()`)."""

    body: bytes
    attributes: Mapping[str, str]
    settle: Callable[[], None]
    delivery_count: int | None = None
    # Give the command back for redelivery now (after a transient failure); None = let the
    # bus redeliver when its lock / ack deadline expires.
    abandon: Callable[[], None] | None = None


class EventPublisher(Protocol):
    """Publishes envelopes, in the order given, on the events channel."""

    def publish(self, message: OutboundMessage) -> None:
        """Return once the bus has durably accepted the message.

        Raises:
            TransportUnavailableError: not accepted now; the caller retries the same message.
            TransportConfigError: retrying cannot help until the configuration is fixed.
        """
        ...


class CommandReceiver(Protocol):
    """Receives the commands addressed to one VM."""

    def receive_commands(self, max_wait: float) -> Sequence[InboundCommand]:
        """Wait up to `max_wait` seconds; return what arrived (possibly nothing).

        Raises:
            TransportUnavailableError: the bus cannot be reached now.
        """
        ...

    def interrupt(self) -> None:
        """Make a `receive_commands` waiting in another thread return now (the agent is stopping).
        A transport whose SDK cannot cut a wait short lets it run out (its wait is bounded)."""
        ...


class CommandSender(Protocol):
    """What `mbridge approve` and the functions use to address an agent."""

    def send_command(self, message: OutboundMessage) -> None: ...


class ResultReader(Protocol):
    """Reads envelopes from the events channel, for `mbridge approve --wait`."""

    def read_results(self, max_wait: float) -> Sequence[bytes]: ...


class Operator(CommandSender, ResultReader, Protocol):
    """The operator's side of a transport (`mbridge approve`): send, read answers, close."""

    def close(self) -> None: ...


class AgentTransport(EventPublisher, Protocol):
    """What the agent needs from a transport. `commands` is None when the transport has
    no command channel (jsonl): then `/readyz` follows pending events instead."""

    name: str

    @property
    def commands(self) -> CommandReceiver | None: ...

    def check(self) -> str:
        """Verify reachability and authorisation without side effects visible to consumers;
        return a one-line description of what was checked.

        Raises:
            TransportConfigError / TransportUnavailableError with an actionable message.
        """
        ...

    def rest(self) -> None:
        """The agent has nothing open (agent/engagement.py): close the connections and
        links the command path holds, so an idle VM costs the bus nothing. The next receive (and,
        where this closed it, the next publish) opens them again."""
        ...

    def close(self) -> None: ...
