"""Azure IMDS as a VM sees it: Scheduled Events (GET and POST), a minimal instance document, and the
attested document (signed by a PKI made per run: simulator/attestation.py).

Request checks follow IMDS: the `Metadata: true` header (not enforced by the 2017-03-01 preview of
Scheduled Events), no proxied requests (`X-Forwarded-For`), and an explicit, known api-version. The
document is rendered per api-version, so older clients see only the fields and event types their
version had.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, TypedDict

from simulator.store import (
    ApprovalResult,
    EventStore,
    EventType,
    MetadataRequest,
    Response,
    SimEvent,
)

if TYPE_CHECKING:
    from simulator.attestation import AttestationAuthority
    from simulator.clock import Clock

SCHEDULED_EVENTS_PATH = "/metadata/scheduledevents"
INSTANCE_PATH = "/metadata/instance"
ATTESTED_PATH = "/metadata/attested/document"

# The Scheduled Events version table; the newest three are what IMDS names in its 400 answer.
SCHEDULED_EVENTS_VERSIONS = (
    "2017-03-01",
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
)
SCHEDULED_EVENTS_NEWEST = ("2020-07-01", "2019-08-01", "2019-04-01")
PREVIEW_VERSION = "2017-03-01"  # before "Metadata header requirement enforced for all requests"

# Documented IMDS versions of the instance endpoint.
INSTANCE_VERSIONS = (
    "2017-03-01",
    "2017-04-02",
    "2017-08-01",
    "2017-10-01",
    "2017-12-01",
    "2018-02-01",
    "2018-04-02",
    "2018-10-01",
    "2019-02-01",
    "2019-03-11",
    "2019-04-30",
    "2019-06-01",
    "2019-06-04",
    "2019-08-01",
    "2019-08-15",
    "2019-11-01",
    "2020-06-01",
    "2020-07-15",
    "2020-09-01",
    "2020-10-01",
    "2020-12-01",
    "2021-01-01",
    "2021-02-01",
    "2021-03-01",
    "2021-05-01",
    "2021-10-01",
    "2021-11-01",
    "2021-11-15",
    "2021-12-13",
    "2023-07-01",
    "2023-11-15",
)
INSTANCE_NEWEST = ("2023-11-15", "2023-07-01", "2021-12-13")

# The attested endpoint came with 2018-10-01 ("Endpoint categories"); every documented IMDS version
# since serves it ("Supported API versions" of the IMDS docs).
ATTESTED_VERSIONS = (
    "2018-10-01",
    "2019-02-01",
    "2019-03-11",
    "2019-04-30",
    "2019-06-01",
    "2019-06-04",
    "2019-08-01",
    "2019-08-15",
    "2019-11-01",
    "2020-06-01",
    "2020-07-15",
    "2020-09-01",
    "2020-10-01",
    "2020-12-01",
    "2021-01-01",
    "2021-02-01",
    "2021-03-01",
    "2021-05-01",
    "2021-08-01",
    "2021-10-01",
    "2021-11-01",
    "2021-11-15",
    "2021-12-13",
    "2023-07-01",
    "2023-11-15",
    "2024-03-15",
    "2024-07-17",
    "2025-04-07",
)
ATTESTED_NEWEST = ("2025-04-07", "2024-07-17", "2024-03-15")
_NONCE = re.compile(r"[0-9]{10}")

# When each event type and field appeared (release notes of the version table).
_TYPE_SINCE: Mapping[EventType, str] = {EventType.PREEMPT: "2017-11-01", EventType.TERMINATE: "2019-01-01"}
_DESCRIPTION_SINCE = "2019-04-01"
_EVENT_SOURCE_SINCE = "2019-08-01"
_DURATION_SINCE = "2020-07-01"

_BAD_VERSION = (
    "Bad request. api-version is invalid or was not specified in the request. "
    "For more information refer to aka.ms/azureimds"
)
_MISSING_HEADER = "Bad request. Required metadata header not specified"
_PROXIED = "Bad request. Requests with an X-Forwarded-For header are refused; call IMDS directly, not through a proxy"
_MALFORMED = 'Bad request. The body must be JSON: {"StartRequests": [{"EventId": "<EventId>"}]}'
_BAD_NONCE = (
    "Bad request. nonce must be a string of exactly 10 digits (0-9), e.g. nonce=1234567890; "
    "leave it out to get the current time as the nonce"
)

SIM_LOCATION = "westeurope"
SIM_RESOURCE_GROUP = "maintenance-bridge-sim"
SIM_SUBSCRIPTION_ID = str(uuid.uuid5(uuid.NAMESPACE_URL, "maintenance-bridge-sim/subscription"))


class AzureEventJson(TypedDict, total=False):
    """One element of `Events`, keys in the documented order; newer fields only in newer versions."""

    EventId: str
    EventStatus: str
    EventType: str
    ResourceType: str
    Resources: list[str]
    NotBefore: str
    Description: str
    EventSource: str
    DurationInSeconds: int


class AzureDocumentJson(TypedDict):
    DocumentIncarnation: int
    Events: list[AzureEventJson]


def render_event(event: SimEvent, version: str) -> AzureEventJson | None:
    """The event as `version` shows it, or None when that version predates its EventType."""
    since = _TYPE_SINCE.get(event.event_type)
    if since is not None and version < since:
        return None
    # The 2017-03-01 preview prefixed IaaS resource names with "_" (removed in 2017-08-01).
    prefix = "_" if version == PREVIEW_VERSION else ""
    rendered = AzureEventJson(
        EventId=event.event_id,
        EventStatus=event.status.value,
        EventType=event.event_type.value,
        ResourceType="VirtualMachine",
        Resources=[prefix + name for name in event.resources],
        NotBefore=event.not_before,
    )
    if version >= _DESCRIPTION_SINCE:
        rendered["Description"] = event.description
    if version >= _EVENT_SOURCE_SINCE:
        rendered["EventSource"] = event.event_source.value
    if version >= _DURATION_SINCE:
        rendered["DurationInSeconds"] = event.duration_seconds
    return rendered


def render_document(incarnation: int, events: Sequence[SimEvent], version: str) -> AzureDocumentJson:
    shown = [rendered for rendered in (render_event(e, version) for e in events) if rendered is not None]
    return AzureDocumentJson(DocumentIncarnation=incarnation, Events=shown)


def vm_id(vm: str) -> str:
    """The simulated VM's vmId: a UUID of its name, the same in every run."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"maintenance-bridge-sim/vm/{vm}"))


def instance_document(vm: str) -> dict[str, object]:
    """The part of /metadata/instance that identifies the VM (its name is what Resources lists)."""
    return {
        "compute": {
            "name": vm,
            "vmId": vm_id(vm),
            "location": SIM_LOCATION,
            "resourceGroupName": SIM_RESOURCE_GROUP,
            "subscriptionId": SIM_SUBSCRIPTION_ID,
            "vmScaleSetName": "",
            "azEnvironment": "AzurePublicCloud",
        },
        "network": {"interface": []},
    }


def json_response(status: int, payload: object, document: bool = False) -> Response:
    """A JSON answer; a `document` one can be broken by the `malformed` fault (truncated JSON)."""
    body = json.dumps(payload).encode()
    return Response(status=status, body=body, broken=body[: len(body) // 2] if document else None)


def error(status: int, message: str, newest: Sequence[str] | None = None) -> Response:
    payload: dict[str, object] = {"error": message}
    if newest is not None:
        payload["newest-versions"] = list(newest)
    return json_response(status, payload)


class AzureApi:
    """Answers the Azure metadata paths of one simulator (every VM port shares it).

    `attestation` signs the attested documents; without one, this simulator's PKI is made when first
    needed (the first attested document, or the first read of `attestation`): its three RSA keys
    take a tenth of a second or more, which a simulator that serves no attested document (most test
    simulators) need not spend. `clock` gives the documents' times (real wall-clock time, whatever
    the speed); without one, the system clock.
    """

    def __init__(
        self, store: EventStore, attestation: AttestationAuthority | None = None, *, clock: Clock | None = None
    ) -> None:
        self._store = store
        self._attestation = attestation
        self._attestation_lock = threading.Lock()
        self._clock = clock

    @property
    def attestation(self) -> AttestationAuthority:
        """The authority signing this simulator's attested documents; `roots_pem()` is what to trust."""
        with self._attestation_lock:
            if self._attestation is None:
                from simulator.attestation import AttestationAuthority

                self._attestation = AttestationAuthority.generate(now=self._wall_now(), region=SIM_LOCATION)
            return self._attestation

    def handle(self, request: MetadataRequest) -> Response:
        path = request.path.rstrip("/") or "/"
        if path == SCHEDULED_EVENTS_PATH:
            return self._scheduled_events(request)
        if path == INSTANCE_PATH or path.startswith(INSTANCE_PATH + "/"):
            return self._instance(request, path)
        if path == ATTESTED_PATH:
            return self._attested(request)
        return error(404, f"Resource not found: {request.path}")

    # ---- Scheduled Events

    def _scheduled_events(self, request: MetadataRequest) -> Response:
        version = request.query.get("api-version", "")
        refusal = _refusal(request, version, SCHEDULED_EVENTS_VERSIONS, SCHEDULED_EVENTS_NEWEST)
        if request.method == "GET":
            if refusal is not None:
                return refusal[0]
            incarnation, events = self._store.document(request.vm)
            return json_response(200, render_document(incarnation, events, version), document=True)
        if request.method == "POST":
            if refusal is not None:
                response, outcome = refusal
                self._store.record_approval(request.vm, [], ApprovalResult(response.status, outcome), "http")
                return response
            return self._approve(request)
        return error(405, f"Method {request.method} is not allowed; use GET or POST")

    def _approve(self, request: MetadataRequest) -> Response:
        event_ids = parse_start_requests(request.body)
        if event_ids is None:
            self._store.record_approval(request.vm, [], ApprovalResult(400, "malformed"), "http")
            return error(400, _MALFORMED)
        self._store.approve(request.vm, event_ids, "http")
        return Response(status=200, body=b"", content_type="application/json; charset=utf-8")

    # ---- instance metadata

    def _instance(self, request: MetadataRequest, path: str) -> Response:
        version = request.query.get("api-version", "")
        refusal = _refusal(request, version, INSTANCE_VERSIONS, INSTANCE_NEWEST, header_optional=False)
        if refusal is not None:
            return refusal[0]
        if request.method != "GET":
            return error(405, f"Method {request.method} is not allowed; use GET")
        node: object = instance_document(request.vm)
        for part in path[len(INSTANCE_PATH) :].strip("/").split("/"):
            if not part:
                continue
            if not isinstance(node, dict) or part not in node:
                return error(404, f"Resource not found: {request.path}")
            node = node[part]
        text_format = request.query.get("format", "json")
        if text_format == "text":
            if isinstance(node, (dict, list)):
                return error(400, "Bad request. format=text is only supported for leaf nodes")
            text = str(node).encode()
            return Response(
                status=200, body=text, content_type="text/plain; charset=utf-8", broken=text[: len(text) // 2]
            )
        if text_format != "json":
            return error(400, "Bad request. format must be json or text")
        return json_response(200, node, document=True)

    # ---- attested data

    def _attested(self, request: MetadataRequest) -> Response:
        version = request.query.get("api-version", "")
        refusal = _refusal(request, version, ATTESTED_VERSIONS, ATTESTED_NEWEST, header_optional=False)
        if refusal is not None:
            return refusal[0]
        if request.method != "GET":
            return error(405, f"Method {request.method} is not allowed; use GET")
        nonce = request.query.get("nonce")
        if nonce is not None and not _NONCE.fullmatch(nonce):
            return error(400, _BAD_NONCE)
        try:
            authority = self.attestation
        except ImportError:
            return error(500, "attested documents need the cryptography package; pip install cryptography")
        document = authority.sign(vm_id(request.vm), SIM_SUBSCRIPTION_ID, nonce, self._wall_now())
        return json_response(200, document, document=True)

    def _wall_now(self) -> datetime:
        # Attested documents carry real wall-clock times, whatever the speed: their verifiers read real clocks.
        if self._clock is None:
            return datetime.now(timezone.utc)
        return datetime.fromtimestamp(self._clock.wall_now(), timezone.utc)


def _refusal(
    request: MetadataRequest,
    version: str,
    versions: Sequence[str],
    newest: Sequence[str],
    header_optional: bool = True,
) -> tuple[Response, str] | None:
    """The 400 IMDS answers before looking at the request, with the approval-log outcome for it."""
    if request.header("X-Forwarded-For") is not None:
        return error(400, _PROXIED), "proxied"
    if version not in versions:
        return error(400, _BAD_VERSION, newest), "bad-api-version"
    header_ok = (request.header("Metadata") or "").lower() == "true"
    if not header_ok and not (header_optional and version == PREVIEW_VERSION):
        return error(400, _MISSING_HEADER), "missing-header"
    return None


def parse_start_requests(body: bytes) -> list[str] | None:
    """EventIds of a `{"StartRequests": [{"EventId": ...}]}` body, or None when it is malformed.

    An empty list is well-formed: it names nothing to start.
    """
    try:
        payload: object = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(payload, dict):
        return None
    requests = payload.get("StartRequests")
    if not isinstance(requests, list):
        return None
    event_ids = []
    for item in requests:
        event_id = item.get("EventId") if isinstance(item, dict) else None
        if not isinstance(event_id, str) or not event_id:
            return None
        event_ids.append(event_id)
    return event_ids
