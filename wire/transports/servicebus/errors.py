"""SDK and network errors of Service Bus, said as the transport's own: which entity, which role, which flag.

One mapping for every sender and receiver, so an error reads the same whichever side met it.
"""

from __future__ import annotations

from dataclasses import dataclass

from azure.core.exceptions import AzureError, ClientAuthenticationError
from azure.servicebus import exceptions as sb_errors

from wire.transports.base import TransportConfigError, TransportUnavailableError

SENDER_ROLE = "Azure Service Bus Data Sender"
RECEIVER_ROLE = "Azure Service Bus Data Receiver"


@dataclass(frozen=True)
class Entity:
    """What an operation addresses, to say in errors which entity and which role is concerned."""

    kind: str  # "topic" | "queue" | "subscription"
    name: str
    flag: str
    role: str
    namespace: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r} in {self.namespace}"


def map_error(error: BaseException, entity: Entity, action: str) -> Exception | None:
    """Our error for an SDK (or network) error, or None when `error` is not a bus failure."""
    if isinstance(error, sb_errors.SessionCannotBeLockedError):
        return TransportUnavailableError(
            f"cannot lock the session of this VM on {entity}: another agent with the same VM name may be running "
            f"(or a previous connection's lock has not expired yet); will retry: {error}"
        )
    if isinstance(error, sb_errors.SessionLockLostError):
        return TransportUnavailableError(
            f"lost the session lock of this VM on {entity} (connection dropped, lock expired, or another agent with "
            f"the same VM name may be running); the session is reopened on next use: {error}"
        )
    if isinstance(error, (sb_errors.ServiceBusAuthenticationError, ClientAuthenticationError)):
        return TransportConfigError(
            f"authentication failed while trying to {action} on {entity}: with --servicebus-namespace the "
            f"VM needs a managed identity (AZURE_CLIENT_ID selects a user-assigned one); with "
            f"--servicebus-connection-string check the key: {error}"
        )
    if isinstance(error, sb_errors.ServiceBusAuthorizationError):
        return TransportConfigError(
            f"not authorised to {action} on {entity}: grant the identity the role {entity.role!r} on the "
            f"{entity.kind} (or use a SAS policy with the {'Send' if 'Sender' in entity.role else 'Listen'} claim): "
            f"{error}"
        )
    if isinstance(error, sb_errors.MessagingEntityNotFoundError):
        return TransportConfigError(
            f"{entity} does not exist: deploy it (infra/) or set {entity.flag} to the right name: {error}"
        )
    if isinstance(error, sb_errors.MessagingEntityDisabledError):
        return TransportConfigError(f"{entity} is disabled: enable it in the namespace: {error}")
    if isinstance(error, sb_errors.MessageSizeExceededError):
        return TransportConfigError(f"the message is larger than {entity} accepts: {error}")
    if isinstance(error, sb_errors.ServiceBusQuotaExceededError):
        return TransportUnavailableError(f"{entity} is full (its consumers are behind); will retry: {error}")
    if isinstance(error, (AzureError, OSError)):
        # Connection, communication, timeout and server-busy errors, and sockets failing under the SDK.
        return TransportUnavailableError(f"cannot {action} on {entity} now; will retry: {error}")
    return None
