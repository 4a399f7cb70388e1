"""The /_sim/ control API, and the actions it shares with scenario steps.

Served on every VM port, JSON in and out, never subject to faults. `Actions` is the one place that
turns a validated request into a state change, so a scenario step and the equivalent HTTP call behave
identically.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Callable

from simulator.azure_api import render_event
from simulator.clock import Clock, rfc3339
from simulator.departures import Departures
from simulator.faults import FaultBook, FaultChange, parse_fault_change
from simulator.gce_api import GceChange, GceState, parse_gce_change
from simulator.store import (
    ApprovalResult,
    CentralFeed,
    Cloud,
    EventSpec,
    EventStatus,
    EventStore,
    FieldError,
    MetadataRequest,
    RequestError,
    Response,
    SimEvent,
    SimLog,
    Timeline,
    parse_event_spec,
)
from simulator.traffic import TrafficLog

CONTROL_PREFIX = "/_sim/"
_WIRE_VERSION = "2020-07-01"  # the control API shows events with every field
CENTRAL_PAGE = 100  # GET /_sim/central/events: entries a page unless `limit` says otherwise
CENTRAL_PAGE_MAX = 1000


@dataclass(frozen=True)
class SimContext:
    """Everything one simulator shares between its VM ports, its timeline and its scenario."""

    cloud: Cloud
    clock: Clock
    cond: threading.Condition
    timeline: Timeline
    log: SimLog
    store: EventStore
    gce: GceState
    faults: FaultBook
    traffic: TrafficLog
    departures: Departures
    central: CentralFeed
    vm_names: tuple[str, ...]
    urls: tuple[str, ...]
    default_names: tuple[str, ...] = ()  # the scenario's VM names, for "$N" beyond the VMs given
    scenario_name: str | None = None


class Actions:
    """State changes shared by the control API and scenario steps; `at` is a step's documented time."""

    def __init__(self, ctx: SimContext) -> None:
        self._ctx = ctx

    def resolve_vm(self, ref: str, field: str) -> str:
        return resolve_vm(ref, self._ctx.vm_names, field)

    def resolve_name(self, ref: str, field: str) -> str:
        return resolve_name(ref, self._ctx.vm_names, self._ctx.default_names, field)

    def add_event(self, spec: EventSpec, origin_vm: str, at: float | None = None) -> SimEvent:
        self._require(Cloud.AZURE, "Azure events")
        if spec.resources is not None:
            resources = tuple(self.resolve_name(r, "resources") for r in spec.resources)
        else:
            resources = (origin_vm,)
        if spec.audience is not None:
            audience = tuple(self.resolve_vm(a, "audience") for a in spec.audience)
        else:
            # Azure broadcasts to the whole availability set / placement group: every VM here.
            audience = self._ctx.vm_names
        return self._ctx.store.add(spec, resources, audience, at=at)

    def approve(self, vm: str, event_ids: Sequence[str], at: float | None = None) -> ApprovalResult:
        self._require(Cloud.AZURE, "approvals")
        return self._ctx.store.approve(vm, event_ids, "scenario", at=at)

    def advance_event(self, event_id: str, at: float | None = None) -> tuple[str, SimEvent | None]:
        self._require(Cloud.AZURE, "Azure events")
        return self._ctx.store.advance_event(event_id, at=at)

    def cancel_event(self, event_id: str, at: float | None = None) -> SimEvent:
        self._require(Cloud.AZURE, "Azure events")
        return self._ctx.store.cancel(event_id, at=at)

    def set_gce(self, change: GceChange, origin_vm: str, at: float | None = None) -> tuple[str, bool]:
        self._require(Cloud.GCE, "GCE metadata values")
        vm = origin_vm if change.vm is None else self.resolve_vm(change.vm, "vm")
        return vm, self._ctx.gce.apply(change, vm, at=at)

    def set_faults(self, change: FaultChange, at: float | None = None) -> list[str]:
        vms = list(self._ctx.vm_names) if change.vm is None else [self.resolve_vm(change.vm, "vm")]
        if change.touches_vms:
            self._ctx.faults.apply(change, vms, at=at)
        if change.touches_central:
            self._ctx.central.apply(change.central_delay, change.central_duplicates, change.central_off, at=at)
        return vms

    def advance_clock(self, seconds: float) -> float:
        ctx = self._ctx
        with ctx.cond:
            before = ctx.clock.sim_now()
            ctx.clock.advance(seconds)
            ctx.log.add(f"clock advanced by {seconds:g} documented s", at=before)
            ctx.timeline.run_due()
            # Events still Scheduled now start sooner in real time: their NotBefore text moves.
            ctx.store.clock_advanced()
            ctx.cond.notify_all()
            return ctx.clock.sim_now()

    def _require(self, cloud: Cloud, what: str) -> None:
        if self._ctx.cloud is not cloud:
            raise RequestError(
                400, f"{what} need a {cloud.value} simulator; this one serves {self._ctx.cloud.value} (--cloud)"
            )


def resolve_vm(ref: str, vm_names: Sequence[str], field: str) -> str:
    """A VM this simulator serves: a literal name or "$N" (the N-th VM)."""
    index = _reference(ref)
    if index is None:
        if ref not in vm_names:
            raise FieldError(field, f"{ref!r} is not a VM of this simulator; VMs: {', '.join(vm_names)}")
        return ref
    if index >= len(vm_names):
        raise FieldError(
            field, f"{ref!r} refers to VM #{index} but only {len(vm_names)} VM(s) run; pass more --vm-name flags"
        )
    return vm_names[index]


def resolve_name(ref: str, vm_names: Sequence[str], default_names: Sequence[str], field: str) -> str:
    """A resource name: "$N" is the N-th VM, or the scenario's default name N when fewer VMs run."""
    index = _reference(ref)
    if index is None:
        return ref
    if index < len(vm_names):
        return vm_names[index]
    if index < len(default_names):
        return default_names[index]
    raise FieldError(field, f"{ref!r} refers to VM #{index}, which neither the VMs nor the scenario name")


def _reference(ref: str) -> int | None:
    if len(ref) > 1 and ref.startswith("$") and ref[1:].isdigit():
        return int(ref[1:])
    return None


def event_view(event: SimEvent) -> dict[str, object]:
    """An event as the control API shows it: the wire fields plus the simulator's own timings."""
    view: dict[str, object] = dict(render_event(event, _WIRE_VERSION) or {})
    view["sim"] = {
        "audience": list(event.audience),
        "added_at": round(event.added_at, 3),
        "next": "start" if event.status is EventStatus.SCHEDULED else "complete",
        "due_at": round(event.due_at, 3),
        "not_before_at": None if event.not_before_at is None else round(event.not_before_at, 3),
        "approval": event.approval.value,
        "approvals_from": list(event.approvals_from),
        "keep_serving": event.keep_serving,
        "approved_at": None if event.approved_at is None else round(event.approved_at, 3),
        "approved_by": event.approved_by,
        "started_at": None if event.started_at is None else round(event.started_at, 3),
        "started_for": event.started_for,
    }
    return view


def state_view(ctx: SimContext) -> dict[str, object]:
    """Everything at once, as GET /_sim/state shows it."""
    with ctx.cond:
        incarnations = ctx.store.incarnations()
        pending = ctx.timeline.pending()
        return {
            "cloud": ctx.cloud.value,
            "speed": ctx.clock.speed,
            "clock": {"sim_time": round(ctx.clock.sim_now(), 3), "wall_time": rfc3339(ctx.clock.wall_now())},
            "vms": [
                {"name": vm, "url": url, "document_incarnation": incarnations[vm]}
                for vm, url in zip(ctx.vm_names, ctx.urls)
            ],
            "events": [event_view(e) for e in ctx.store.events()],
            "gce": ctx.gce.snapshot() if ctx.cloud is Cloud.GCE else {},
            "faults": ctx.faults.snapshot(),
            "central": ctx.central.snapshot(),
            "scenario": {
                "name": ctx.scenario_name,
                "steps_pending": sum(1 for entry in pending if str(entry["key"]).startswith("step:")),
            },
            "timeline": pending,
        }


class ControlApi:
    """Routes /_sim/ requests to `Actions` and the read-only views."""

    def __init__(self, ctx: SimContext, actions: Actions) -> None:
        self._ctx = ctx
        self._actions = actions

    def handle(self, request: MetadataRequest) -> Response:
        try:
            return self._route(request)
        except RequestError as exc:
            return _json(exc.status, {"error": exc.message})

    def _route(self, request: MetadataRequest) -> Response:
        path = request.path[len(CONTROL_PREFIX) :].strip("/")
        parts = path.split("/")
        method = request.method
        if method == "GET" and path == "central/events":
            return self._central_events(request)
        if method == "GET" and path == "central/resource-graph":
            return self._resource_graph()
        if method == "GET":
            views: dict[str, Callable[[], object]] = {
                "state": lambda: state_view(self._ctx),
                "approvals": lambda: self._ctx.store.approvals(),
                "log": lambda: self._ctx.log.entries(),
                "faults": lambda: self._ctx.faults.snapshot(),
                "events": lambda: [event_view(e) for e in self._ctx.store.events()],
                "traffic": lambda: self._ctx.traffic.snapshot(),
            }
            view = views.get(path)
            if view is None:
                raise RequestError(
                    404,
                    f"no GET /_sim/{path}; try /_sim/state, approvals, log, faults, events, traffic, central/events, "
                    "central/resource-graph",
                )
            return _json(200, view())
        if method != "POST":
            raise RequestError(405, f"{method} is not supported by the control API; use GET or POST")
        body = _body(request.body)
        if path == "events":
            event = self._actions.add_event(parse_event_spec(body), request.vm)
            return _json(201, event_view(event))
        if len(parts) == 3 and parts[0] == "events" and parts[2] in {"advance", "cancel"}:
            return self._event_step(parts[1], parts[2])
        if path == "gce":
            vm, shown = self._actions.set_gce(parse_gce_change(body), request.vm)
            return _json(200, {"vm": vm, "shown": shown, "metadata": self._ctx.gce.snapshot()[vm]})
        if path == "faults":
            vms = self._actions.set_faults(parse_fault_change(body))
            snapshot = self._ctx.faults.snapshot()
            return _json(200, {vm: snapshot[vm] for vm in vms})
        if path == "clock/advance":
            return _json(200, {"sim_time": round(self._actions.advance_clock(_seconds(body)), 3)})
        raise RequestError(
            404,
            f"no POST /_sim/{path}; try events, events/<id>/advance, events/<id>/cancel, gce, faults, clock/advance",
        )

    def _resource_graph(self) -> Response:
        # Azure Resource Graph's maintenanceresources table: every row as it stands, as one query reads it.
        if self._ctx.cloud is not Cloud.AZURE:
            raise RequestError(
                404,
                "the maintenanceresources table is Azure Resource Graph's; "
                f"this simulator serves {self._ctx.cloud.value} (--cloud azure)",
            )
        rows = self._ctx.central.table.rows()
        return _json(200, {"count": len(rows), "data": rows})

    def _central_events(self, request: MetadataRequest) -> Response:
        # Read as pages of a log: Azure's Event Grid events, or GCE's system-event log entries as a
        # log sink delivers them to Pub/Sub.
        after = _whole_parameter(request, "after", 0, lowest=0)
        limit = _whole_parameter(request, "limit", CENTRAL_PAGE, lowest=1)
        if limit > CENTRAL_PAGE_MAX:
            raise RequestError(400, f"parameter 'limit': at most {CENTRAL_PAGE_MAX} entries a page, got {limit}")
        page = self._ctx.central.page(after, limit)
        entries = [{"seq": seq, "event": event} for seq, event in page]
        return _json(200, {"events": entries, "next": page[-1][0] if page else after})

    def _event_step(self, event_id: str, step: str) -> Response:
        if step == "cancel":
            event = self._actions.cancel_event(event_id)
            return _json(200, {"result": "canceled", "event": event_view(event)})
        result, after = self._actions.advance_event(event_id)
        return _json(200, {"result": result, "event": None if after is None else event_view(after)})


def _json(status: int, payload: object) -> Response:
    return Response(status=status, body=json.dumps(payload).encode())


def _body(raw: bytes) -> Mapping[str, object]:
    if not raw.strip():
        return {}
    try:
        payload: object = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RequestError(400, f"the body is not JSON ({exc}); send a JSON object") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "the body must be a JSON object")
    return payload


def _whole_parameter(request: MetadataRequest, name: str, default: int, lowest: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or int(raw) < lowest:
        raise RequestError(400, f"parameter '{name}': must be a whole number >= {lowest}, got {raw[:40]!r}")
    return int(raw)


def _seconds(body: Mapping[str, object]) -> float:
    seconds = body.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise FieldError("seconds", 'is required: documented seconds >= 0, e.g. {"seconds": 900}')
    return float(seconds)
