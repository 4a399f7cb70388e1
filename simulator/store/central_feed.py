"""Azure's central Scheduled Events feed, as the simulator publishes it: one Event Grid event per state
change of an event in the store, read back in pages by a local consumer (GET /_sim/central/events).

Azure also publishes Scheduled Events outside the VM (preview): the Event Grid system topic of type
`Microsoft.ResourceNotifications.MaintenanceResources` emits a
`Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted` event on every state
change, including `Completed` and `Canceled`, which IMDS never shows (Microsoft's "Scheduled Events
in Event Grid" page; the event's shape is the Event Grid schema example of Azure/azure-rest-api-specs
`Microsoft.ResourceNotifications/stable/2018-01-01`). Recording it here, from the same store the VMs
read, lets a consumer of the central feed be tested against the very events the agents see.

The feed's own faults (delivery delay, duplicates, switched off) live here too: they are the
simulator's, not a VM's, and the feed alone consults them. The same publication writes Resource
Graph's table (resource_graph.py, `CentralFeed.table`): at once, whatever `central_delay` and
`central_duplicates` do to Event Grid's deliveries, and not at all while `central_off`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from simulator.clock import Clock
from simulator.store.azure_events import EventStatus, SimEvent
from simulator.store.log import SimLog
from simulator.store.resource_graph import ResourceGraphTable

EVENT_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
RESOURCE_TYPE = "Microsoft.Maintenance/scheduledEvents"
DATA_API_VERSION = "2023-07-01"  # the spec example's; Microsoft's page says it is unused during the preview


class FeedStatus(str, Enum):
    """EventStatus as the central feed shows it: IMDS's two, plus the two ends only the feed shows."""

    SCHEDULED = "Scheduled"
    STARTED = "Started"
    COMPLETED = "Completed"
    CANCELED = "Canceled"


@dataclass(frozen=True)
class AzureHome:
    """Where the simulated VMs live in Azure: what the feed's resource ids name."""

    subscription_id: str
    resource_group: str
    location: str


@dataclass(frozen=True)
class CentralFaults:
    delay: float = 0.0  # real seconds between an emission and the moment it can be read
    duplicates: int = 0  # every Nth emission is delivered twice; 0: never
    off: bool = False  # emissions are lost while true


@dataclass(frozen=True)
class _Delivery:
    due: float  # real (monotonic) seconds
    order: int
    event: Mapping[str, object]


class CentralFeed:
    """The Event Grid events of one simulator, in delivery order; guarded by its shared condition.

    An entry's `seq` is its place in delivery order, so a consumer paging with `after` never skips
    one: an emission still delayed gets its seq when it is delivered. With one delay throughout,
    delivery order is emission order; shortening the delay can deliver a later emission first, which
    Event Grid, guaranteeing no order, may do too.
    """

    def __init__(self, clock: Clock, cond: threading.Condition, log: SimLog, home: AzureHome) -> None:
        self._clock = clock
        self._cond = cond
        self._log = log
        self._home = home
        self._faults = CentralFaults()
        self._emitted = 0  # emissions since central_duplicates was last set: what "every Nth" counts
        self._order = 0
        self._pending: list[_Delivery] = []
        self._delivered: list[Mapping[str, object]] = []
        # Resource Graph's table, written by the same publication (resource_graph.py).
        self.table = ResourceGraphTable(cond)

    def record(self, event: SimEvent, status: FeedStatus, at: float) -> None:
        """Emit the event in `status`; `at` is the documented time of the change."""
        with self._cond:
            self.publish(lambda: self._emission(event, status, at), f"{status.value} of event {event.event_id}", at)

    def _emission(self, event: SimEvent, status: FeedStatus, at: float) -> Mapping[str, object]:
        # One switch publishes to both: the Event Grid event, and the Resource Graph row it updates.
        body = self._event_grid_event(event, status, at)
        info = body["data"]["resourceInfo"]
        self.table.write(
            info["id"],
            event.event_id,
            info["properties"],
            subscription_id=self._home.subscription_id,
            resource_group=self._home.resource_group,
            location=self._home.location,
        )
        return body

    def publish(self, build: Callable[[], Mapping[str, object]], what: str, at: float, vm: str | None = None) -> None:
        """Emit what `build` makes (called only when the feed is on), subject to the feed's faults;
        `what` names it in the log."""
        with self._cond:
            if self._faults.off:
                self._log.add(f"central feed: {what} lost (central_off)", vm=vm, at=at)
                return
            self._emitted += 1
            body = build()
            every = self._faults.duplicates
            copies = 2 if every and self._emitted % every == 0 else 1
            if copies == 2:
                self._log.add(f"central feed: {what} delivered twice (central_duplicates)", vm=vm, at=at)
            due = self._clock.real_now() + self._faults.delay
            for _ in range(copies):
                self._order += 1
                # The same mapping twice: a duplicate is the same payload with the same id, byte for byte.
                self._pending.append(_Delivery(due=due, order=self._order, event=body))

    def page(self, after: int, limit: int) -> list[tuple[int, Mapping[str, object]]]:
        """Up to `limit` delivered entries after seq `after`, as (seq, event); seq counts from 1."""
        with self._cond:
            self._deliver()
            return [(after + index + 1, event) for index, event in enumerate(self._delivered[after : after + limit])]

    def apply(
        self,
        delay: float | None = None,
        duplicates: int | None = None,
        off: bool | None = None,
        at: float | None = None,
    ) -> None:
        """Change the given faults; a new `duplicates` counts emissions from now."""
        with self._cond:
            faults = self._faults
            if delay is not None:
                faults = replace(faults, delay=delay)
            if duplicates is not None:
                faults = replace(faults, duplicates=duplicates)
                self._emitted = 0
            if off is not None:
                faults = replace(faults, off=off)
            self._faults = faults
            self._log.add(
                f"central feed faults now delay={faults.delay:g}s, duplicates={faults.duplicates}, "
                f"off={'yes' if faults.off else 'no'}",
                at=at,
            )

    def snapshot(self) -> dict[str, object]:
        with self._cond:
            self._deliver()
            return {
                "faults": {
                    "central_delay": self._faults.delay,
                    "central_duplicates": self._faults.duplicates,
                    "central_off": self._faults.off,
                },
                "delivered": len(self._delivered),
                "pending": len(self._pending),
            }

    def _deliver(self) -> None:
        now = self._clock.real_now()
        due = sorted((d for d in self._pending if d.due <= now), key=lambda d: (d.due, d.order))
        if due:
            self._pending = [d for d in self._pending if d.due > now]
            self._delivered.extend(d.event for d in due)

    def _event_grid_event(self, event: SimEvent, status: FeedStatus, at: float) -> dict[str, Any]:
        # Raised on the first VM it names (Resources is never empty in Azure; the first VM that sees
        # it otherwise). Microsoft's examples raise it on a scale set: the simulator has none.
        vm = (*event.resources, *event.audience, "vm")[0]
        home = self._home
        subject = (
            f"/subscriptions/{home.subscription_id}/resourceGroups/{home.resource_group}"
            f"/providers/Microsoft.Compute/virtualMachines/{vm}"
        )
        # The wall-clock moment of the change's documented time: now for a change made now; for one a
        # clock advance jumped over, the moment it was due (the moment NotBefore shows).
        moment = _event_grid_time(self._clock.wall_at(at))
        return {
            "id": str(uuid.uuid4()),
            "topic": f"/subscriptions/{home.subscription_id}",
            "subject": subject,
            "data": {
                "resourceInfo": {
                    "id": f"{subject}/providers/Microsoft.Maintenance/scheduledevents/{event.event_id}",
                    "name": event.event_id,
                    "type": RESOURCE_TYPE,
                    "location": home.location,
                    "properties": {
                        "DurationInSeconds": event.duration_seconds,
                        "Description": event.description,
                        "EventId": event.event_id,
                        "EventSource": event.event_source.value,
                        "EventStatus": status.value,
                        "EventType": event.event_type.value,
                        # "Is blank if the event is in the started state"; the ends carry no start either.
                        "NotBefore": event.not_before if status is FeedStatus.SCHEDULED else "",
                        "Resources": list(event.resources),
                        "ResourceType": "VirtualMachine",
                    },
                },
                "operationalInfo": {"resourceEventTime": moment},
                "apiVersion": DATA_API_VERSION,
            },
            "eventType": EVENT_TYPE,
            "dataVersion": "3.0",
            "metadataVersion": "1",
            "eventTime": moment,
        }


def feed_status(status: EventStatus) -> FeedStatus:
    """The feed's status of an event the store holds (Scheduled or Started)."""
    return FeedStatus.SCHEDULED if status is EventStatus.SCHEDULED else FeedStatus.STARTED


def _event_grid_time(epoch: float) -> str:
    # Event Grid writes seven fraction digits ("2017-06-26T18:41:00.9584103Z"); Python keeps six.
    moment = datetime.fromtimestamp(epoch, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}0Z"
