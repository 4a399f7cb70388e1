"""Azure Service Bus transport, on the official `azure-servicebus` SDK.

Contracts: docs/contracts.md#on-the-bus, #routing and #transport-options.

- Events go to a topic (`maintenance-events`), one message per envelope, `MessageId` = SHA-256 of the
  body as sent (command results: their envelope id), so the topic's duplicate detection drops an
  identical resend but never one VM's report in favour of another's.
- Commands come from a session-enabled queue (`maintenance-commands`); the agent binds its receiver
  to the session named after its VM, so it only ever sees its own commands, in order.
- Or, in the isolated mode (`--servicebus-commands-subscription`), from this VM's own subscription
  of a commands topic (also `maintenance-commands`), whose filter passes only the messages whose
  application property `target` is this VM and on which only this VM's identity holds the Data
  Receiver role. No sessions there: a VM cannot be given a role on one session of a queue, but it
  can on one subscription of a topic.
- `mbridge approve` (and the functions) send into that queue with `SessionId` = target VM, or into
  the topic with the application property `target`, and read the command results from the events
  topic through a subscription (`operator-results`).

Handlers (senders, receivers) are opened once and reused; after any error the handler is closed and a
new one is created on next use, because the SDK does not recover a handler whose link has failed.

The SDK is imported in this package only: the agent imports it when this transport is chosen.

- `settings`: the options and their validation (no SDK)
- `client`: the SDK calls used (protocols, for fakes in tests) and the real client
- `errors`: SDK errors as ours, naming the entity, the role and the flag
- `handlers`: a handler's lifetime (reused, replaced after an error) and the serialised sender
- `messages`: our messages as the SDK's and back (MessageId, properties, session, payload)
- `receiving`: the agent's command receivers (session of the queue, or own subscription of the topic)
- `transport`: the agent's transport
- `operator`: the operator's side (`mbridge approve`, the functions)
"""

from __future__ import annotations

from wire.transports.servicebus.client import (
    ClientFactory,
    ReceiverLike,
    SenderLike,
    ServiceBusClientLike,
    SessionLike,
    connect,
)
from wire.transports.servicebus.errors import map_error
from wire.transports.servicebus.messages import COMMAND_CONTENT_TYPE, EVENT_CONTENT_TYPE, body_bytes
from wire.transports.servicebus.operator import ServiceBusOperator, build_operator
from wire.transports.servicebus.receiving import ServiceBusCommandReceiver, ServiceBusSubscriptionCommandReceiver
from wire.transports.servicebus.settings import ServiceBusSettings
from wire.transports.servicebus.transport import ServiceBusTransport, build_agent_transport

__all__ = [
    "COMMAND_CONTENT_TYPE",
    "EVENT_CONTENT_TYPE",
    "ClientFactory",
    "ReceiverLike",
    "SenderLike",
    "ServiceBusClientLike",
    "ServiceBusCommandReceiver",
    "ServiceBusOperator",
    "ServiceBusSettings",
    "ServiceBusSubscriptionCommandReceiver",
    "ServiceBusTransport",
    "SessionLike",
    "body_bytes",
    "build_agent_transport",
    "build_operator",
    "connect",
    "map_error",
]
