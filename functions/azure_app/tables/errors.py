"""What Table Storage's failures mean for an invocation: retry (throttled, unreachable) or fix the
deployment (missing table, missing role), each error naming the table and what to do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError

from wire.errors import PermanentError, RetryableError

TABLE_ROLE = "Storage Table Data Contributor"


class TableStorageUnavailableError(RetryableError):
    """Table Storage throttled, failed or could not be reached; the message is redelivered."""


class TableStorageConfigError(PermanentError):
    """The table is missing or the app's identity may not use it; fix the deployment."""


class TableValueTooLargeError(PermanentError):
    """A value larger than one entity can hold, even in pieces."""


@contextmanager
def table_errors(table: str, action: str) -> Iterator[None]:
    """Map what azure-data-tables raises to our errors, naming the table and what to do."""
    try:
        yield
    except ClientAuthenticationError as exc:
        raise TableStorageConfigError(
            f"cannot {action} in table {table!r}: authentication failed; the function app needs a managed "
            f"identity (AZURE_CLIENT_ID selects a user-assigned one) or a valid connection string: {exc.message}"
        ) from exc
    except HttpResponseError as exc:
        status = exc.status_code or 0
        if status == 403:
            raise TableStorageConfigError(
                f"not authorised to {action} in table {table!r}: grant the function app's identity the role "
                f"{TABLE_ROLE!r} on the storage account: {exc.message}"
            ) from exc
        if status == 404:
            raise TableStorageConfigError(
                f"table {table!r} does not exist: deploy it (infra/) or fix MBRIDGE_STATE_TABLE / "
                f"MBRIDGE_AUDIT_TABLE: {exc.message}"
            ) from exc
        if status in (408, 429) or status >= 500:
            raise TableStorageUnavailableError(f"cannot {action} in table {table!r} now: {exc.message}") from exc
        raise TableStorageConfigError(f"table {table!r} refused to {action} (HTTP {status}): {exc.message}") from exc
    except AzureError as exc:  # connection and timeout errors: no HTTP response at all
        raise TableStorageUnavailableError(f"cannot reach table {table!r} to {action}: {exc}") from exc
