"""Which instances of the trusted projects (and zones) carry a name, from the Compute Engine API.

`ComputeInstanceDirectory` is the `InstanceDirectory` of the Cloud Function: the verifier asks it
for the instance a token's name stands for, and the Compute adapters for the instance to drain and
to start maintenance of. Per trusted project, one `instances.aggregatedList` with the filter
`name = "NAME"` (every zone at once; the names are checked again here, and the zones filtered to
the trusted ones). It needs `compute.instances.list` on each trusted project, no more.

Answers are cached per name. A name not asked for before, or asked after `max_age_seconds`, is
listed again; so is one whose cached instances lack the instance id the caller holds proof of (an
instance made since), but at most once per `min_refresh_seconds`, so a stream of tokens of
unknown instances costs one listing a minute per name, not one per report. An instance's name
never changes and an id is never given to another instance, so when a listing fails for a
reason that passes (throttling, a 5xx, no network) the instances already known for the name are
served and the failed listing is not tried again for `min_refresh_seconds`; with none known it
raises, and the message is redelivered. A refused listing (403, no credentials) is permanent and
names the role to grant.

Lookups run on the function's concurrent invocation threads: a listing holds a per-name lock, and
lookups waiting for it use its result instead of listing again.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from google.api_core import exceptions as api_errors
from google.cloud import compute_v1

from functions.gcp_app.compute import CREDENTIAL_ERRORS, RETRYABLE_ERRORS, ComputeConfigError, ComputeUnavailableError
from functions.gcp_app.settings import ENV_TRUST_PROJECTS
from functions.trust.gce_instances import GceInstance, InstanceScope
from wire.errors import BridgeError

LOG = logging.getLogger("mbridge.gcp.instances")

DEFAULT_MIN_REFRESH_SECONDS = 60.0
DEFAULT_MAX_AGE_SECONDS = 900.0
MAX_NAMES = 4096  # names cached at once; the oldest listing is forgotten first
LIST_PERMISSION = "compute.instances.list"
ROLE = "mbridgeInstanceReader"
# An instance name (RFC 1035 label): anything else names no instance, and is never put in a filter.
_INSTANCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class _Listing:
    instances: tuple[GceInstance, ...]
    loaded_at: float


@dataclass
class _Name:
    lock: threading.Lock = field(default_factory=threading.Lock)
    listing: _Listing | None = None
    failed_at: float | None = None  # when a listing last failed while an older one was served


class ComputeInstanceDirectory:
    """The instances of the scope named so, from instances.aggregatedList (see the module doc)."""

    def __init__(
        self,
        instances: compute_v1.InstancesClient,
        projects: Collection[str],
        zones: Collection[str] | None = None,
        *,
        timeout: float = 120.0,
        min_refresh_seconds: float = DEFAULT_MIN_REFRESH_SECONDS,
        max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min_refresh_seconds < 0 or max_age_seconds < min_refresh_seconds:
            raise ValueError("0 <= min_refresh_seconds <= max_age_seconds")
        self._client = instances
        self._scope = InstanceScope.of(projects, zones)
        self._timeout = timeout
        self._min_refresh = min_refresh_seconds
        self._max_age = max_age_seconds
        self._clock = clock
        self._lock = threading.Lock()  # guards _names, never held while Compute Engine is asked
        self._names: dict[str, _Name] = {}

    @property
    def scope(self) -> InstanceScope:
        return self._scope

    def instances_named(self, name: str, *, expecting: str | None = None) -> Sequence[GceInstance]:
        if not _INSTANCE_NAME.match(name):
            return ()
        state = self._state(name)
        answer = self._cached(state, expecting, self._clock())
        if answer is not None:
            return answer
        with state.lock:
            # Another invocation may have listed the name while this one waited for the lock.
            now = self._clock()
            answer = self._cached(state, expecting, now)
            if answer is not None:
                return answer
            known = state.listing
            if known is not None and state.failed_at is not None and now - state.failed_at < self._min_refresh:
                return known.instances
            try:
                listing = _Listing(self._list(name), now)
            except ComputeUnavailableError as exc:
                if known is None:
                    raise
                state.failed_at = now
                LOG.warning("the instances named %s cannot be listed now; serving the last listing: %s", name, exc)
                return known.instances
            state.listing, state.failed_at = listing, None
        return listing.instances

    # ---- the cache

    def _state(self, name: str) -> _Name:
        with self._lock:
            state = self._names.get(name)
            if state is None:
                if len(self._names) >= MAX_NAMES:
                    self._forget_oldest()
                state = self._names[name] = _Name()
            return state

    def _forget_oldest(self) -> None:
        def loaded_at(item: tuple[str, _Name]) -> float:
            listing = item[1].listing
            return float("-inf") if listing is None else listing.loaded_at

        oldest, _ = min(self._names.items(), key=loaded_at)
        del self._names[oldest]

    def _cached(self, state: _Name, expecting: str | None, now: float) -> tuple[GceInstance, ...] | None:
        """The cached answer when it may be given without listing again, else None."""
        listing = state.listing
        if listing is None or now - listing.loaded_at >= self._max_age:
            return None
        lacks_expected = expecting is not None and all(i.instance_id != expecting for i in listing.instances)
        if lacks_expected and now - listing.loaded_at >= self._min_refresh:
            return None
        return listing.instances

    # ---- Compute Engine

    def _list(self, name: str) -> tuple[GceInstance, ...]:
        found: list[GceInstance] = []
        for project in sorted(self._scope.projects):
            with _errors(project, name):
                pager = self._client.aggregated_list(
                    request=compute_v1.AggregatedListInstancesRequest(project=project, filter=f'name = "{name}"'),
                    # No retries in the call: a failure serves the last listing or redelivers the message.
                    retry=None,
                    timeout=self._timeout,
                )
                for scope, listed in pager:
                    zone = scope.rsplit("/", 1)[-1]  # "zones/europe-west1-b"
                    for instance in listed.instances:
                        # Checked again: the filter narrows the answer, this decides it.
                        if instance.name == name and self._scope.admits(project, zone):
                            found.append(GceInstance(project, zone, name, str(instance.id)))
        LOG.info(
            "instances named %s in %s: %s",
            name,
            self._scope,
            "; ".join(map(str, found)) or "none",
            extra={"labels": {"vm": name}},
        )
        return tuple(found)


@contextmanager
def _errors(project: str, name: str) -> Iterator[None]:
    what = f"the instances named {name} in project {project}"
    role = (
        f"grant the function's service account a role with {LIST_PERMISSION} on project {project} (the "
        f"Terraform's custom role {ROLE}; docs/gcp.md, IAM)"
    )
    try:
        yield
    except BridgeError:
        raise
    except api_errors.Forbidden as error:
        raise ComputeConfigError(f"not allowed to list {what}: {role}: {error}") from error
    except api_errors.NotFound as error:
        raise ComputeConfigError(
            f"project {project} was not found while listing {what}: check {ENV_TRUST_PROJECTS}: {error}"
        ) from error
    except CREDENTIAL_ERRORS as error:
        raise ComputeConfigError(
            f"Google credentials were missing or rejected while listing {what}: attach a service account to the "
            f"function and {role}: {error}"
        ) from error
    except RETRYABLE_ERRORS as error:
        raise ComputeUnavailableError(f"cannot list {what} now: {error}") from error
    except api_errors.GoogleAPICallError as error:
        raise ComputeConfigError(f"Compute Engine refused to list {what}: {error}") from error
