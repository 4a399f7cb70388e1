"""Library and network errors of Pub/Sub, said as the transport's own: which resource, which role, which flag.

One mapping for every publish, pull and check, so an error reads the same whichever side met it.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import NoReturn

from google.api_core import exceptions as api_errors
from google.auth import exceptions as auth_errors
from google.cloud.pubsub_v1.publisher import exceptions as publisher_errors  # type: ignore[import-untyped]

from wire.transports.base import TransportConfigError, TransportUnavailableError
from wire.transports.pubsub.settings import EMULATOR_VARIABLE

PUBLISHER_ROLE = "roles/pubsub.publisher"
SUBSCRIBER_ROLE = "roles/pubsub.subscriber"


@dataclass(frozen=True)
class Resource:
    """What an operation addresses, to say in errors which resource and which role is concerned."""

    kind: str  # "topic" | "subscription"
    path: str
    flag: str
    role: str

    def __str__(self) -> str:
        return f"{self.kind} {self.path}"


def map_error(error: BaseException, resource: Resource, action: str) -> Exception | None:
    """Our error for a library (or network) error, or None when `error` is not a bus failure."""
    if isinstance(error, api_errors.NotFound):
        return TransportConfigError(f"{resource} does not exist: create it (infra/) or set {resource.flag}: {error}")
    if isinstance(error, api_errors.PermissionDenied):
        return TransportConfigError(
            f"not allowed to {action} on {resource}: grant {resource.role} on it to the VM's service account: {error}"
        )
    if isinstance(error, (api_errors.Unauthenticated, auth_errors.DefaultCredentialsError, auth_errors.RefreshError)):
        return TransportConfigError(
            f"Google credentials were missing or rejected while trying to {action} on {resource}: on GCE attach a "
            f"service account with the cloud-platform scope, elsewhere set GOOGLE_APPLICATION_CREDENTIALS, or set "
            f"{EMULATOR_VARIABLE} for the emulator: {error}"
        )
    if isinstance(error, (api_errors.InvalidArgument, api_errors.FailedPrecondition)):
        return TransportConfigError(f"Pub/Sub refused to {action} on {resource}: check {resource.flag}: {error}")
    if isinstance(error, publisher_errors.MessageTooLargeError):
        return TransportConfigError(f"the message is larger than Pub/Sub accepts ({action} on {resource}): {error}")
    if isinstance(error, (api_errors.DeadlineExceeded, concurrent.futures.TimeoutError)):
        return TransportUnavailableError(f"timed out trying to {action} on {resource}; will retry: {error!r}")
    if isinstance(
        error,
        (
            api_errors.GoogleAPIError,  # ServiceUnavailable and every other RPC failure
            publisher_errors.PublishToPausedOrderingKeyException,  # an earlier failure of this key
            publisher_errors.FlowControlLimitError,
            auth_errors.TransportError,  # the metadata server could not be reached for a token
            OSError,
        ),
    ):
        return TransportUnavailableError(f"cannot {action} on {resource} now; will retry: {error}")
    return None


def raise_mapped(error: Exception, resource: Resource, action: str) -> NoReturn:
    mapped = map_error(error, resource, action)
    if mapped is None:
        raise error
    raise mapped from error
