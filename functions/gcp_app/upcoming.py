"""The instances of the trusted projects that have maintenance upcoming, as the Compute API lists them
(`instances.aggregatedList`), for the tick of the control plane's path (central_entry.py).

An instance's `resourceStatus.upcomingMaintenance` ("Manage host events across compute instances")
is a polled field: the tick reads it once a minute and each notice goes through
`process_central` with quiet repeats (functions/core/central.py), so a notice already taken costs
one claim read and writes nothing. It catches what the system-event log's sink did not deliver,
and a deployment that started after a notice was given; the end of a window comes from the log
(a field that is gone says nothing about how the window ended).

Every instance of each project is listed (500 a page, the API's largest): whether the list's
`filter` can test `resourceStatus.upcomingMaintenance` is not documented. A pass keeps at most
`most` instances with maintenance and says so in the log when it stops there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from google.api_core import exceptions as google_exceptions
from google.cloud import compute_v1

from functions.central.gce_upcoming import GceScope
from wire.errors import PermanentError, RetryableError

LOG = logging.getLogger("mbridge.gcp.upcoming")

PAGE_SIZE = 500
INSTANCES_MOST = 5000  # instances with maintenance a pass reads at most: far more than a fleet's wave


class UpcomingInstances(Protocol):
    def instances(self, scope: GceScope, most: int = INSTANCES_MOST) -> Iterator[Mapping[str, Any]]:
        """The instances with `resourceStatus.upcomingMaintenance`, as the API's JSON names them."""
        ...


class ComputeUpcoming:
    """`UpcomingInstances` over `instances.aggregatedList` of each trusted project."""

    def __init__(self, client: compute_v1.InstancesClient, timeout: float) -> None:
        self._client = client
        self._timeout = timeout

    def instances(self, scope: GceScope, most: int = INSTANCES_MOST) -> Iterator[Mapping[str, Any]]:
        found = 0
        for project in scope.projects:
            try:
                pager = self._client.aggregated_list(
                    request=compute_v1.AggregatedListInstancesRequest(project=project, max_results=PAGE_SIZE),
                    retry=None,
                    timeout=self._timeout,
                )
                for _, listed in pager:
                    for instance in listed.instances:
                        if not instance.resource_status.upcoming_maintenance:
                            continue
                        if found >= most:
                            LOG.warning(
                                "upcoming maintenance: more than %d instances have some; the rest are read on the "
                                "next tick, or from the system-event log",
                                most,
                            )
                            return
                        found += 1
                        yield compute_v1.Instance.to_dict(instance, preserving_proto_field_name=False)
            except (google_exceptions.Forbidden, google_exceptions.PermissionDenied) as exc:
                raise PermanentError(
                    f"the function's service account cannot list the instances of project {project} "
                    f"(compute.instances.list): {exc.message}"
                ) from exc
            except google_exceptions.GoogleAPICallError as exc:
                raise RetryableError(f"listing the instances of project {project} failed: {exc}") from exc
