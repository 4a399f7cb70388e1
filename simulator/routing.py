"""Where one request of one VM goes: the control API (/_sim/) straight to `ControlApi`, a GCE
simulator's Compute API view (/compute/v1/) to `ComputeView`; metadata paths first through the
faults, then to the cloud's API module.

Shared by all VM servers of a simulator; it also drops the requests of a VM that has left.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from simulator.azure_api import ATTESTED_PATH, SCHEDULED_EVENTS_PATH, AzureApi, parse_start_requests
from simulator.control import CONTROL_PREFIX, ControlApi, SimContext
from simulator.gce_api import IDENTITY_PATH, PREFIX, GceApi
from simulator.gce_api.compute_view import COMPUTE_PREFIX, ComputeView
from simulator.store import ApprovalResult, Cloud, MetadataRequest, Response


class Router:
    """Dispatches one request of one VM; shared by all VM servers of a simulator."""

    def __init__(self, ctx: SimContext, control: ControlApi, azure: AzureApi, gce: GceApi, stop: threading.Event):
        self._ctx = ctx
        self._control = control
        self._azure = azure
        self._gce = gce
        self._stop = stop
        self._compute = ComputeView(ctx.gce, ctx.departures.gone)

    def route(self, request: MetadataRequest) -> Response | None:
        """The answer, or None to drop the connection without one."""
        departures = self._ctx.departures
        # A request on a connection opened before its VM left, or one that waited while it left.
        if departures.gone(request.vm):
            return None
        response = self._answer(request)
        return None if departures.gone(request.vm) else response

    def _answer(self, request: MetadataRequest) -> Response | None:
        if request.path.startswith(CONTROL_PREFIX):
            return self._control.handle(request)
        if request.path.startswith(COMPUTE_PREFIX) and self._ctx.cloud is Cloud.GCE:
            return self._compute.handle(request)  # the project's API, not the VM's metadata: no faults
        response = self._metadata(request)
        self._ctx.traffic.record(request.vm, None if response is None else response.status)
        return response

    def _metadata(self, request: MetadataRequest) -> Response | None:
        azure = self._ctx.cloud is Cloud.AZURE
        # IMDS documents the slow first call for Scheduled Events; on GCE any first request is delayed.
        path = request.path.rstrip("/")
        first_call = path == SCHEDULED_EVENTS_PATH if azure else True
        proof_request = path == (ATTESTED_PATH if azure else PREFIX + IDENTITY_PATH)
        admission = self._ctx.faults.admit(request.vm, first_call, proof_request)
        if admission.drop:
            self._note_refused_approval(request, 0, "dropped")
            return None
        if admission.delay > 0:
            self._stop.wait(admission.delay)
        if admission.reject is not None:
            self._note_refused_approval(request, admission.reject.status, admission.reason)
            return admission.reject
        response = self._azure.handle(request) if azure else self._gce.handle(request)
        if response.status == 200 and response.broken is not None and self._ctx.faults.take_malformed(request.vm):
            response = replace(response, body=response.broken)
        return response

    def _note_refused_approval(self, request: MetadataRequest, status: int, outcome: str) -> None:
        # Every POST of StartRequests goes into the approval log, also those a fault swallowed.
        is_approval = request.method == "POST" and request.path.rstrip("/") == SCHEDULED_EVENTS_PATH
        if self._ctx.cloud is Cloud.AZURE and is_approval:
            event_ids = parse_start_requests(request.body) or []
            self._ctx.store.record_approval(request.vm, event_ids, ApprovalResult(status, outcome), "http")
