"""The `maintenanceresources` rows of Azure Resource Graph, read with azure-mgmt-resourcegraph: the
Azure app's `ResourceGraphRows` (functions/central/resource_graph.py).

One query over the trusted subscriptions (and, when the deployment names them, resource groups),
`ResourceGraphClient.resources(QueryRequest(...))`, read in pages of at most 1,000 rows (Resource
Graph's most per response) with the `$skipToken` of each answer, in the order of the rows' ids so the
pages do not shift under the reader. Each page costs one query of the identity's quota (Microsoft's
"Guidance for throttled requests in Azure Resource Graph": 15 queries in any 5 seconds, by example).
A pass stops at `most` rows and says so in the log.

Errors: a refused identity (401, 403) raises `ResourceGraphConfigError` (permanent) naming the role
to grant; throttling, 5xx and network errors raise `ResourceGraphUnavailableError` (retryable): the
pass stops, the next one starts over.

Nothing here imports the SDK at import time.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from functions.central.event_grid import AzureScope
from functions.central.resource_graph import ROW_TYPE, STATUSES
from wire.errors import PermanentError, RetryableError

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

LOGGER = logging.getLogger("mbridge.functions.azure.resource_graph")

PAGE = 1000  # Resource Graph returns at most 1,000 rows a response
ROLE = "Reader"
_GROUP = re.compile(r"^[-\w.()]{1,90}$")  # what settings.py accepts: nothing a query string could be broken with
_COLUMNS = "id, name, type, tenantId, location, resourceGroup, subscriptionId, properties, zones"


class ResourceGraphConfigError(PermanentError):
    """The identity may not query Resource Graph over the scope, or the query was refused as made."""


class ResourceGraphUnavailableError(RetryableError):
    """Resource Graph throttled, failed or could not be reached; the next pass tries again."""


def scheduled_events_query(scope: AzureScope) -> str:
    """The Kusto query of the scheduled events' rows in `scope` (its subscriptions are the request's)."""
    statuses = ", ".join(f'"{status}"' for status in STATUSES)
    lines = [
        "maintenanceresources",
        f'| where type =~ "{ROW_TYPE}"',
        f"| where tostring(properties.EventStatus) in~ ({statuses})",
    ]
    if scope.resource_groups:
        for group in scope.resource_groups:
            if not _GROUP.match(group):
                raise ValueError(f"{group[:100]!r} is not a resource group name")
        groups = ", ".join(f'"{group}"' for group in scope.resource_groups)
        lines.append(f"| where resourceGroup in~ ({groups})")
    lines += [f"| project {_COLUMNS}", "| order by id asc"]
    return "\n".join(lines)


class SdkResourceGraphRows:
    """`ResourceGraphRows` over a `ResourceGraphClient` (or anything with its `resources`)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def rows(self, scope: AzureScope, most: int) -> Iterator[Mapping[str, Any]]:
        from azure.core.exceptions import AzureError
        from azure.mgmt.resourcegraph.models import QueryRequest, QueryRequestOptions

        query = scheduled_events_query(scope)
        read, token = 0, None
        while read < most:
            request = QueryRequest(
                subscriptions=list(scope.subscriptions),
                query=query,
                options=QueryRequestOptions(top=min(PAGE, most - read), skip_token=token, result_format="objectArray"),
            )
            try:
                response = self._client.resources(request)
            except AzureError as exc:
                raise _mapped(exc, scope) from exc
            data = response.data if isinstance(response.data, list) else []
            for row in data[: most - read]:
                if isinstance(row, dict):
                    yield row
            read += len(data)
            token = response.skip_token
            if not token:
                if str(response.result_truncated).lower() == "true":
                    LOGGER.warning("resource graph: the answer was truncated after %d row(s), with no skip token", read)
                return
        LOGGER.warning(
            "resource graph: stopped after %d rows, the most one pass reads; the rest wait for a later pass "
            "(narrow MBRIDGE_TRUST_RESOURCE_GROUPS, or see docs/azure.md)",
            read,
        )


def resource_graph_rows(credential: TokenCredential) -> SdkResourceGraphRows:
    """The rows of Resource Graph, read with `credential` (the app's identity)."""
    from azure.mgmt.resourcegraph import ResourceGraphClient

    return SdkResourceGraphRows(ResourceGraphClient(credential))


def _mapped(exc: Exception, scope: AzureScope) -> Exception:
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    status = getattr(exc, "status_code", None)
    if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
        return ResourceGraphConfigError(
            f"Resource Graph refused the app's identity ({status or 'no token'}): give it {ROLE} on the resource "
            f"groups of MBRIDGE_TRUST_RESOURCE_GROUPS in {', '.join(scope.subscriptions)} (docs/azure.md)"
        )
    if isinstance(exc, HttpResponseError) and status == 400:
        return ResourceGraphConfigError(f"Resource Graph refused the query: {str(exc)[:300]}")
    return ResourceGraphUnavailableError(f"Resource Graph failed ({status or type(exc).__name__}): {str(exc)[:300]}")
