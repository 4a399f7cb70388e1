"""A delay before a failed Service Bus message is redelivered (docs/azure.md#redelivery-backoff).

Service Bus redelivers an abandoned message at once, and dead-letters it after the entity's max
delivery count (10 in infra/). The Functions runtime's retry policies (host.json `retry`,
`@app.retry`) do not apply to Service Bus triggers, in the Python v2 model as in v1 (Microsoft's
"Azure Functions error handling and retries": they cover Timer, Kafka, Event Hubs and Cosmos DB);
the extension's client retry options cover its own calls, not redelivery. So ten failures in a row
take seconds: a role assignment still propagating (a 403 for the minutes after a deployment) or a
storage account restarting dead-letters the message before it could have worked.

The invocation therefore waits before it gives the message back: 2 s after the first delivery,
doubling, at most 60 s, about five minutes over the ten deliveries. The message's lock is renewed
meanwhile (host.json `maxAutoLockRenewalDuration` is 10 minutes), and the worker slot held while
waiting is the backpressure a failing dependency should get.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from wire.errors import BridgeError

LOGGER = logging.getLogger("mbridge.functions.azure.redelivery")

FIRST_DELAY_SECONDS = 2.0
MOST_DELAY_SECONDS = 60.0

Result = TypeVar("Result")


def redelivery_delay(delivery_count: int | None) -> float:
    """Seconds to wait before a message delivered `delivery_count` times (1: the first) is given back."""
    count = max(1, delivery_count or 1)
    return float(min(FIRST_DELAY_SECONDS * 2.0 ** min(count - 1, 16), MOST_DELAY_SECONDS))


def backing_off(
    call: Callable[[], Result], delivery_count: int | None, sleep: Callable[[float], None] = time.sleep
) -> Result:
    """`call()`; when it fails as the product fails (a BridgeError: retryable, or a deployment to
    fix), wait `redelivery_delay` before raising, so the redelivery comes later."""
    try:
        return call()
    except BridgeError:
        delay = redelivery_delay(delivery_count)
        LOGGER.warning("delivery %s failed: the message goes back in %.0f s", delivery_count or 1, delay)
        sleep(delay)
        raise
