"""Azure Resource Manager as the load balancer sees it: resource ids, If-Match on the ETag, and the
translation of ARM's failures into a retry (throttled, busy, unreachable) or a configuration error
(missing resource, missing role).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError

from wire.errors import PermanentError, RetryableError

PRECONDITION_FAILED = 412
ROLE_HINT = (
    "grant the function app's identity the custom role of docs/azure.md (networkInterfaces read/write, "
    "loadBalancers/backendAddressPools read/write/join, virtualNetworks join actions) on it"
)


class LoadBalancerUnavailableError(RetryableError):
    """ARM throttled, failed, or is still busy with the resource; the message is redelivered."""


class LoadBalancerConfigError(PermanentError):
    """The load balancer, a NIC or a pool is missing, or the identity may not change it."""


@dataclass(frozen=True)
class ResourceId:
    resource_group: str
    name: str

    @classmethod
    def parse(cls, resource_id: str) -> ResourceId:
        parts = resource_id.strip("/").split("/")
        lowered = [part.lower() for part in parts]
        try:
            group = parts[lowered.index("resourcegroups") + 1]
        except (ValueError, IndexError):
            raise LoadBalancerConfigError(f"{resource_id!r} is not an ARM resource id") from None
        return cls(group, parts[-1])


@contextmanager
def arm_errors(what: str, action: str) -> Iterator[None]:
    try:
        yield
    except ClientAuthenticationError as exc:
        raise LoadBalancerConfigError(
            f"cannot {action} {what}: authentication to Azure Resource Manager failed; the function app needs "
            f"a managed identity (AZURE_CLIENT_ID selects a user-assigned one): {exc.message}"
        ) from exc
    except HttpResponseError as exc:
        raise _mapped(exc, what, action) from exc
    except AzureError as exc:  # no HTTP response: connection errors and timeouts
        raise LoadBalancerUnavailableError(f"cannot reach Azure Resource Manager to {action} {what}: {exc}") from exc


def _mapped(exc: HttpResponseError, what: str, action: str) -> Exception:
    status = exc.status_code or 0
    if status == 403:
        return LoadBalancerConfigError(f"not authorised to {action} {what}: {ROLE_HINT}: {exc.message}")
    if status == 404:
        return LoadBalancerConfigError(
            f"cannot {action} {what}: not found; check MBRIDGE_LB_SUBSCRIPTION_ID, MBRIDGE_LB_RESOURCE_GROUP, "
            f"MBRIDGE_LB_NAME and MBRIDGE_LB_NIC_RESOURCE_GROUP: {exc.message}"
        )
    # 409: ARM serialises writes to a NIC or pool ("AnotherOperationInProgress"); it passes.
    if status in (408, 409, 412, 429) or status >= 500:
        return LoadBalancerUnavailableError(f"cannot {action} {what} now (HTTP {status}): {exc.message}")
    return LoadBalancerConfigError(f"Azure Resource Manager refused to {action} {what} (HTTP {status}): {exc.message}")


def if_match(resource: Any) -> dict[str, str]:
    etag = getattr(resource, "etag", None)
    return {"If-Match": etag} if etag else {}
