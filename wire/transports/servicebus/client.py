"""The SDK surface the Service Bus transport uses, and the real client behind it.

Protocols of the few SDK calls the transport makes, so that tests can hand in small fakes of the
network edge while still building and reading the SDK's real message types.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Callable, Protocol

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage

from wire.transports.base import TransportConfigError
from wire.transports.servicebus.settings import ServiceBusSettings

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential


class SessionLike(Protocol):
    @property
    def locked_until_utc(self) -> datetime | None: ...

    def renew_lock(self, *, timeout: float | None = ...) -> datetime: ...


class SenderLike(Protocol):
    def send_messages(self, message: ServiceBusMessage, *, timeout: float | None = ...) -> None: ...

    def create_message_batch(self) -> object: ...

    def close(self) -> None: ...


class ReceiverLike(Protocol):
    @property
    def session(self) -> SessionLike: ...

    def __enter__(self) -> object: ...

    def receive_messages(
        self, max_message_count: int | None = ..., max_wait_time: float | None = ...
    ) -> list[ServiceBusReceivedMessage]: ...

    def complete_message(self, message: ServiceBusReceivedMessage) -> None: ...

    def renew_message_lock(self, message: ServiceBusReceivedMessage, *, timeout: float | None = ...) -> datetime: ...

    def close(self) -> None: ...


class ServiceBusClientLike(Protocol):
    def get_topic_sender(self, topic_name: str) -> SenderLike: ...

    def get_queue_sender(self, queue_name: str) -> SenderLike: ...

    def get_queue_receiver(self, queue_name: str, *, session_id: str | None = ...) -> ReceiverLike: ...

    def get_subscription_receiver(self, topic_name: str, subscription_name: str) -> ReceiverLike: ...

    def close(self) -> None: ...


ClientFactory = Callable[[ServiceBusSettings], ServiceBusClientLike]


def connect(settings: ServiceBusSettings, credential: TokenCredential | None = None) -> ServiceBusClientLike:
    """The real SDK client: SAS from the connection string, or the namespace with `credential`
    (default: DefaultAzureCredential, which uses the VM's managed identity; AZURE_CLIENT_ID selects
    a user-assigned one). Nothing touches the network until a handler opens."""
    settings.validate()
    if settings.connection_string:
        try:
            client: ServiceBusClientLike = ServiceBusClient.from_connection_string(settings.connection_string)
        except ValueError:
            # `from None`: the SDK's error could quote the string, and with it the key.
            raise TransportConfigError(
                "--servicebus-connection-string is malformed: copy it from the namespace's or entity's "
                "shared access policy (Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...)"
            ) from None
        return client
    if credential is None:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    return ServiceBusClient(settings.namespace or "", credential)


def default_factory(credential: TokenCredential | None) -> ClientFactory:
    def factory(settings: ServiceBusSettings) -> ServiceBusClientLike:
        return connect(settings, credential)

    return factory
