"""Google Cloud Pub/Sub transport, on the official `google-cloud-pubsub` library.

Contracts: docs/contracts.md#on-the-bus, #routing and #transport-options.

- Events go to a topic (`maintenance-events`) without an ordering key (any agent could write another
  VM's name as one: see `settings.EVENTS_ORDERING_KEY`), with attributes repeating `type`, `vm`,
  `cloud`, `event_id` (plus `envelope_id`, since Pub/Sub assigns its own message ids).
- Commands are published to `maintenance-commands` with attribute `target` = VM and ordering key =
  VM (only the functions and operators publish there); each VM pulls from
  its own subscription (`maintenance-commands-<vm>`, filtered on `target` in the cloud). Emulators
  ignore filters, so the agent also drops (and acknowledges) commands addressed to other VMs.
- `mbridge approve` publishes a command and reads results from the events topic through a
  subscription (`operator-results`).

Every call is a single attempt bounded by a timeout (`retry=None`): the agent's loop retries with
backoff, and with ordering enabled (commands) the library would otherwise retry a publish forever.

PUBSUB_EMULATOR_HOST is honoured by the library itself (plain-text channel, no credentials).
The library is imported in this package only: the agent imports it when this transport is chosen.

- `settings`: the options, their validation and the emulator's address (no library)
- `client`: the library calls used (protocols, for substitutes in tests) and the real clients
- `errors`: library errors as ours, naming the resource, the role and the flag
- `calls`: publish, pull, acknowledge and the checks, one attempt each; the clients, made on first use
- `receiving`: the agent's command receiver (this VM's subscription)
- `transport`: the agent's transport
- `operator`: the operator's side (`mbridge approve`)
"""

from __future__ import annotations

from wire.transports.pubsub.client import (
    PublisherFactory,
    PublisherLike,
    SubscriberFactory,
    SubscriberLike,
    new_commands_publisher,
    new_events_publisher,
    new_subscriber,
)
from wire.transports.pubsub.errors import map_error
from wire.transports.pubsub.operator import PubSubOperator, build_operator
from wire.transports.pubsub.receiving import PubSubCommandReceiver
from wire.transports.pubsub.settings import (
    EMULATOR_VARIABLE,
    EVENTS_ORDERING_KEY,
    EVENTS_SUBSCRIPTION_ORDERED,
    PubSubSettings,
    emulator_host,
)
from wire.transports.pubsub.transport import PubSubTransport, build_agent_transport

__all__ = [
    "EMULATOR_VARIABLE",
    "EVENTS_ORDERING_KEY",
    "EVENTS_SUBSCRIPTION_ORDERED",
    "PubSubCommandReceiver",
    "PubSubOperator",
    "PubSubSettings",
    "PubSubTransport",
    "PublisherFactory",
    "PublisherLike",
    "SubscriberFactory",
    "SubscriberLike",
    "build_agent_transport",
    "build_operator",
    "emulator_host",
    "map_error",
    "new_commands_publisher",
    "new_events_publisher",
    "new_subscriber",
]
