"""GCE metadata as a VM sees it under /computeMetadata/v1/, with ETags and `wait_for_change` long-polls.

Values change only through the control API or scenario steps (`GceState.apply`). One fidelity rule
lives here: GCE gives the 60-second warning only if `instance/maintenance-event` was queried directly
since the last maintenance event; an unwatched VM's maintenance happens with the value left at NONE.

`instance/service-accounts/default/identity` issues instance identity tokens signed with keys made
for this run (`GceApi.identity`, see gce_identity.py); it is the one path that is not a stored value.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from enum import Enum
from typing import TYPE_CHECKING, Callable, TypedDict

from simulator.clock import Clock, rfc3339
from simulator.departures import Departures
from simulator.store import FieldError, MetadataRequest, Response, SimLog, bool_field

if TYPE_CHECKING:
    from simulator.gce_identity import TokenIssuer

PREFIX = "/computeMetadata/v1/"
PROJECT_ID = "maintenance-bridge-sim"
PROJECT_NUMBER = str(10**11 + int(hashlib.sha256(PROJECT_ID.encode()).hexdigest(), 16) % (9 * 10**11))
ZONE = "us-central1-a"

# A Spot VM gets 30 s between ACPI G2 Soft Off and G3 Mechanical Off once preempted: then it is off.
PREEMPTED_SHUTDOWN_SECONDS = 30.0

DEFAULT_TIMEOUT_SEC = 60
MAX_TIMEOUT_SEC = 300
SKIPPED_WARNING = "warning skipped: maintenance-event was not queried since the last event"

_FORBIDDEN_NO_FLAVOR = (
    "Your client does not have permission to get this URL from this server. Missing Metadata-Flavor:Google header.\n"
)
_FORBIDDEN_PROXIED = "Requests with an X-Forwarded-For header are refused; call the metadata server directly.\n"

IDENTITY_PATH = "instance/service-accounts/default/identity"
IDENTITY_FORMATS = ("standard", "full")  # the documented values of `format`; standard is the default
_NO_AUDIENCE = "non-empty audience parameter required\n"  # GCE's answer (400) without an audience


class GceKey(str, Enum):
    MAINTENANCE_EVENT = "maintenance-event"
    UPCOMING_MAINTENANCE = "upcoming-maintenance"
    PREEMPTED = "preempted"


class MaintenanceEvent(str, Enum):
    NONE = "NONE"
    MIGRATE = "MIGRATE_ON_HOST_MAINTENANCE"
    TERMINATE = "TERMINATE_ON_HOST_MAINTENANCE"


class UpcomingJson(TypedDict):
    """instance/upcoming-maintenance, keys in the documented order; canReschedule is a string there."""

    maintenanceType: str
    canReschedule: str
    latestWindowStartTime: str
    maintenanceStatus: str
    windowEndTime: str
    windowStartTime: str


@dataclass(frozen=True)
class UpcomingPatch:
    """Fields to set on upcoming-maintenance; unset ones keep their value (or the default when new).

    Window times are either given verbatim (RFC 3339) or relative, in documented seconds from the
    moment the change is applied (`window_start_in`, `window_length`).
    """

    maintenance_type: str | None = None
    can_reschedule: bool | None = None
    maintenance_status: str | None = None
    window_start_in: float | None = None
    window_length: float | None = None
    window_start_time: str | None = None
    window_end_time: str | None = None
    latest_window_start_time: str | None = None


@dataclass(frozen=True)
class GceChange:
    """A POST /_sim/gce body (also a scenario `gce` step), validated."""

    key: GceKey
    vm: str | None = None
    maintenance_event: MaintenanceEvent | None = None
    preempted: bool | None = None
    upcoming: UpcomingPatch | None = None  # None with key upcoming-maintenance removes it
    require_watch: bool = True
    keep_serving: bool = False  # a preempted VM is not shut down


@dataclass(frozen=True)
class VmMetadata:
    maintenance_event: MaintenanceEvent = MaintenanceEvent.NONE
    upcoming: UpcomingJson | None = None
    preempted: bool = False
    watched: bool = False  # maintenance-event queried directly since the last maintenance event


_UPCOMING_DEFAULT_START_IN = 3600.0
_UPCOMING_DEFAULT_LENGTH = 4 * 3600.0  # the documented example window is about four hours
_UPCOMING_FIELDS = {
    "maintenanceType",
    "canReschedule",
    "maintenanceStatus",
    "windowStartTime",
    "windowEndTime",
    "latestWindowStartTime",
    "window_start_in",
    "window_length",
}


def parse_gce_change(body: Mapping[str, object]) -> GceChange:
    allowed = {"vm", "key", "value", "require_watch", "keep_serving"}
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise FieldError(unknown[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")
    vm = body.get("vm")
    if vm is not None and (not isinstance(vm, str) or not vm):
        raise FieldError("vm", "must be a VM name ('$0' means the first VM)")
    require_watch = bool_field(body, "require_watch", default=True)
    raw_key = body.get("key")
    keys = ", ".join(k.value for k in GceKey)
    if raw_key not in {k.value for k in GceKey}:
        raise FieldError("key", f"must be one of {keys}, got {raw_key!r}")
    key = GceKey(raw_key)
    if "value" not in body:
        raise FieldError("value", "is required (null removes upcoming-maintenance)")
    value = body["value"]
    change = GceChange(key=key, vm=vm, require_watch=require_watch, keep_serving=bool_field(body, "keep_serving"))
    if key is GceKey.MAINTENANCE_EVENT:
        names = ", ".join(m.value for m in MaintenanceEvent)
        if value not in {m.value for m in MaintenanceEvent}:
            raise FieldError("value", f"maintenance-event must be one of {names}, got {value!r}")
        return replace(change, maintenance_event=MaintenanceEvent(value))
    if key is GceKey.PREEMPTED:
        preempted = _bool_value(value)
        if preempted is None:
            raise FieldError("value", f"preempted must be TRUE or FALSE, got {value!r}")
        return replace(change, preempted=preempted)
    if value is None:
        return change
    if not isinstance(value, dict):
        raise FieldError("value", "upcoming-maintenance must be an object, or null to remove it")
    return replace(change, upcoming=_parse_upcoming(value))


def _parse_upcoming(value: Mapping[str, object]) -> UpcomingPatch:
    unknown = sorted(set(value) - _UPCOMING_FIELDS)
    if unknown:
        raise FieldError(f"value.{unknown[0]}", f"unknown field; allowed: {', '.join(sorted(_UPCOMING_FIELDS))}")
    strings: dict[str, str | None] = {}
    for name in ("maintenanceType", "maintenanceStatus", "windowStartTime", "windowEndTime", "latestWindowStartTime"):
        raw = value.get(name)
        if raw is not None and (not isinstance(raw, str) or not raw):
            raise FieldError(f"value.{name}", "must be a non-empty string")
        strings[name] = raw
    status = strings["maintenanceStatus"]
    if status is not None and status not in {"PENDING", "ONGOING"}:
        raise FieldError("value.maintenanceStatus", "must be PENDING or ONGOING")
    can_reschedule = None
    if "canReschedule" in value:
        can_reschedule = _bool_value(value["canReschedule"])
        if can_reschedule is None:
            raise FieldError("value.canReschedule", 'must be true/false or the strings "true"/"false"')
    seconds: dict[str, float | None] = {}
    for name in ("window_start_in", "window_length"):
        raw_seconds = value.get(name)
        if raw_seconds is not None and (
            isinstance(raw_seconds, bool) or not isinstance(raw_seconds, (int, float)) or raw_seconds < 0
        ):
            raise FieldError(f"value.{name}", "must be documented seconds >= 0")
        seconds[name] = None if raw_seconds is None else float(raw_seconds)
    return UpcomingPatch(
        maintenance_type=strings["maintenanceType"],
        can_reschedule=can_reschedule,
        maintenance_status=status,
        window_start_in=seconds["window_start_in"],
        window_length=seconds["window_length"],
        window_start_time=strings["windowStartTime"],
        window_end_time=strings["windowEndTime"],
        latest_window_start_time=strings["latestWindowStartTime"],
    )


def _bool_value(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {"true", "false"}:
        return value.lower() == "true"
    return None


def etag_of(path: str, text: str | None) -> str:
    """16 lowercase hex digits over the key and its value; an absent key has an ETag of its own."""
    material = f"{path}\n{text}" if text is not None else f"{path}\n<absent>"
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def instance_id(vm: str) -> str:
    """A stable 19-digit numeric id derived from the name (GCE ids are unsigned 64-bit numbers)."""
    return str(10**18 + int(hashlib.sha256(vm.encode()).hexdigest(), 16) % (9 * 10**18))


@dataclass(frozen=True)
class Served:
    """One path's current answer: `text` None means 404; `is_json` picks the content type."""

    etag: str
    text: str | None
    is_json: bool = False


class GceState:
    """Per-VM mutable metadata values, guarded by the simulator's shared condition."""

    def __init__(
        self,
        clock: Clock,
        cond: threading.Condition,
        log: SimLog,
        vm_names: tuple[str, ...],
        departures: Departures,
    ) -> None:
        self._clock = clock
        self._cond = cond
        self._log = log
        self._vms = {vm: VmMetadata() for vm in vm_names}
        self._departures = departures

    def get(self, vm: str) -> VmMetadata:
        with self._cond:
            return self._vms[vm]

    def snapshot(self) -> dict[str, dict[str, object]]:
        with self._cond:
            return {
                vm: {
                    "maintenance-event": meta.maintenance_event.value,
                    "upcoming-maintenance": dict(meta.upcoming) if meta.upcoming else None,
                    "preempted": "TRUE" if meta.preempted else "FALSE",
                    "watched": meta.watched,
                }
                for vm, meta in self._vms.items()
            }

    def mark_watched(self, vm: str) -> None:
        with self._cond:
            meta = self._vms[vm]
            if not meta.watched:
                self._vms[vm] = replace(meta, watched=True)

    def apply(self, change: GceChange, vm: str, at: float | None = None) -> bool:
        """Apply a change to one VM; False when it was swallowed (the skipped 60-second warning)."""
        now = self._clock.sim_now() if at is None else at
        with self._cond:
            meta = self._vms[vm]
            if change.key is GceKey.MAINTENANCE_EVENT:
                assert change.maintenance_event is not None
                shown = self._set_maintenance_event(vm, meta, change.maintenance_event, change.require_watch, now)
            elif change.key is GceKey.PREEMPTED:
                assert change.preempted is not None
                self._set_preempted(vm, meta, change, now)
                shown = True
            else:
                upcoming = None if change.upcoming is None else self._merge(meta.upcoming, change.upcoming, now)
                self._vms[vm] = replace(meta, upcoming=upcoming)
                if upcoming != meta.upcoming:
                    text = "removed" if upcoming is None else json.dumps(upcoming)
                    self._log.add(f"upcoming-maintenance: {text}", vm=vm, at=now)
                shown = True
            self._cond.notify_all()
            return shown

    def _set_preempted(self, vm: str, meta: VmMetadata, change: GceChange, now: float) -> None:
        self._vms[vm] = replace(meta, preempted=bool(change.preempted))
        if change.preempted == meta.preempted:
            return
        self._log.add(f"preempted: {'TRUE' if change.preempted else 'FALSE'}", vm=vm, at=now)
        if not change.preempted:
            self._departures.stay(vm)  # a rehearsal undone through the control API
        elif not change.keep_serving:
            self._departures.leave_after(vm, now, PREEMPTED_SHUTDOWN_SECONDS, "preempted, shut down")

    def _set_maintenance_event(
        self, vm: str, meta: VmMetadata, value: MaintenanceEvent, require_watch: bool, now: float
    ) -> bool:
        if value is MaintenanceEvent.NONE:
            # The maintenance is over: the VM has to query the key again to get the next warning.
            self._vms[vm] = replace(meta, maintenance_event=value, watched=False)
            if meta.maintenance_event is not MaintenanceEvent.NONE:
                self._log.add(f"maintenance-event: {meta.maintenance_event.value} -> NONE", vm=vm, at=now)
            return True
        if meta.maintenance_event is MaintenanceEvent.NONE and require_watch and not meta.watched:
            self._log.add(f"{SKIPPED_WARNING} ({value.value} not shown)", vm=vm, at=now)
            return False
        self._vms[vm] = replace(meta, maintenance_event=value)
        if value is not meta.maintenance_event:
            self._log.add(f"maintenance-event: {meta.maintenance_event.value} -> {value.value}", vm=vm, at=now)
        return True

    def _merge(self, current: UpcomingJson | None, patch: UpcomingPatch, now: float) -> UpcomingJson:
        merged: UpcomingJson = (
            current.copy()
            if current is not None
            else UpcomingJson(
                maintenanceType="SCHEDULED",
                canReschedule="true",
                latestWindowStartTime="",
                maintenanceStatus="PENDING",
                windowEndTime="",
                windowStartTime="",
            )
        )
        if current is None or patch.window_start_in is not None or patch.window_length is not None:
            start_in = _UPCOMING_DEFAULT_START_IN if patch.window_start_in is None else patch.window_start_in
            length = _UPCOMING_DEFAULT_LENGTH if patch.window_length is None else patch.window_length
            # Real wall-clock times of the compressed timeline, so deadlines downstream are truthful.
            start = rfc3339(self._clock.wall_at(now + start_in), fraction=False)
            merged["windowStartTime"] = start
            merged["latestWindowStartTime"] = start
            merged["windowEndTime"] = rfc3339(self._clock.wall_at(now + start_in + length), fraction=False)
        if patch.maintenance_type is not None:
            merged["maintenanceType"] = patch.maintenance_type
        if patch.can_reschedule is not None:
            merged["canReschedule"] = "true" if patch.can_reschedule else "false"
        if patch.maintenance_status is not None:
            merged["maintenanceStatus"] = patch.maintenance_status
        if patch.window_start_time is not None:
            merged["windowStartTime"] = patch.window_start_time
        if patch.window_end_time is not None:
            merged["windowEndTime"] = patch.window_end_time
        if patch.latest_window_start_time is not None:
            merged["latestWindowStartTime"] = patch.latest_window_start_time
        # Keep the documented key order whatever was patched.
        return UpcomingJson(
            maintenanceType=merged["maintenanceType"],
            canReschedule=merged["canReschedule"],
            latestWindowStartTime=merged["latestWindowStartTime"],
            maintenanceStatus=merged["maintenanceStatus"],
            windowEndTime=merged["windowEndTime"],
            windowStartTime=merged["windowStartTime"],
        )


class GceApi:
    """Answers /computeMetadata/v1/ for every VM of one simulator.

    `identity` signs the instance identity tokens; without one, keys are made when first needed
    (the first token, or the first read of `identity`), so a simulator that serves no token spends
    nothing on RSA key generation and runs where google-auth is not installed.
    """

    def __init__(
        self,
        state: GceState,
        clock: Clock,
        cond: threading.Condition,
        stopping: Callable[[str], bool],
        identity: TokenIssuer | None = None,
    ) -> None:
        self._state = state
        self._clock = clock
        self._cond = cond
        self._stopping = stopping  # (vm) -> the simulator stops, or that VM stopped answering
        self._identity = identity
        self._identity_lock = threading.Lock()
        self._created = int(clock.wall_now())  # every VM of the simulator was created at its launch

    @property
    def identity(self) -> TokenIssuer:
        """The issuer of this simulator's identity tokens; `identity.certs()` is what to trust."""
        with self._identity_lock:
            if self._identity is None:
                from simulator.gce_identity import TokenIssuer

                self._identity = TokenIssuer.generate(now=self._wall_now())
            return self._identity

    def handle(self, request: MetadataRequest) -> Response:
        if request.header("X-Forwarded-For") is not None:
            return _text(403, _FORBIDDEN_PROXIED)
        if request.header("Metadata-Flavor") != "Google":
            return _text(403, _FORBIDDEN_NO_FLAVOR)
        if request.method != "GET":
            return _text(405, f"Method {request.method} is not allowed; the metadata server is read-only.\n")
        if not request.path.startswith(PREFIX):
            return _text(404, f"Not found: {request.path}; metadata lives under {PREFIX}\n")
        path = request.path[len(PREFIX) :]
        if path == IDENTITY_PATH:
            return self._identity_token(request)
        if path == "instance/maintenance-event":
            # Only a direct query of the key counts as watching it; a parent directory does not.
            self._state.mark_watched(request.vm)
        recursive = request.query.get("recursive", "").lower() == "true"
        if self._serve(request.vm, path, recursive) is None:
            if not path.endswith("/") and self._serve(request.vm, path + "/", recursive) is not None:
                headers = (("Metadata-Flavor", "Google"), ("Location", request.path + "/"))
                return Response(status=301, body=b"", content_type="text/html; charset=utf-8", headers=headers)
            return _text(404, f"Not found: {request.path}\n", etag=etag_of(path, None))
        try:
            served = self._wait_or_now(request, path, recursive)
        except ValueError as exc:
            return _text(400, f"{exc}\n")
        return _render(served, request.query.get("alt", ""))

    def _identity_token(self, request: MetadataRequest) -> Response:
        """A new token at every request (no ETag, no long-poll), as text/html like GCE sends it."""
        audience = request.query.get("audience", "")
        if not audience:
            return _text(400, _NO_AUDIENCE)
        requested_format = request.query.get("format", "standard")
        if requested_format not in IDENTITY_FORMATS:
            return _text(400, f"format must be one of {', '.join(IDENTITY_FORMATS)}, got {requested_format!r}\n")
        # licenses=TRUE adds the license codes of the VM's images: a simulated VM boots none.
        if request.query.get("licenses", "FALSE").upper() not in {"TRUE", "FALSE"}:
            return _text(400, f"licenses must be TRUE or FALSE, got {request.query['licenses']!r}\n")
        try:
            issuer = self.identity
        except ImportError:
            return _text(500, "identity tokens need the google-auth package; pip install google-auth\n")
        vm = request.vm
        token = issuer.issue(
            audience,
            instance_name=vm,
            instance_id=instance_id(vm),
            project_id=PROJECT_ID,
            project_number=PROJECT_NUMBER,
            zone=ZONE,
            full=requested_format == "full",
            now=self._wall_now(),
            instance_creation_timestamp=self._created,
        )
        return Response(
            status=200,
            body=token.encode("ascii"),
            content_type="text/html; charset=utf-8",
            headers=(("Metadata-Flavor", "Google"),),
            broken=token[: len(token) // 2].encode("ascii"),  # the `malformed` fault: a cut-off token
        )

    def _wall_now(self) -> datetime:
        # Tokens carry real wall-clock times, whatever the speed: their verifiers read real clocks.
        return datetime.fromtimestamp(self._clock.wall_now(), timezone.utc)

    def _wait_or_now(self, request: MetadataRequest, path: str, recursive: bool) -> Served:
        current = self._serve(request.vm, path, recursive)
        assert current is not None
        if request.query.get("wait_for_change", "").lower() != "true":
            return current
        timeout = _timeout(request.query.get("timeout_sec"))
        last_etag = request.query.get("last_etag") or current.etag
        if last_etag != current.etag:
            return current
        # Block on the shared condition: every change notifies it, and so does stop().
        deadline = self._clock.real_now() + timeout
        with self._cond:
            while True:
                current = self._serve(request.vm, path, recursive) or current
                remaining = deadline - self._clock.real_now()
                if current.etag != last_etag or remaining <= 0 or self._stopping(request.vm):
                    return current
                self._cond.wait(remaining)

    def _serve(self, vm: str, path: str, recursive: bool) -> Served | None:
        """The answer for `path` (a directory when it ends in "/"), or None when no such path exists."""
        node: object = self._tree(vm)
        for part in (p for p in path.split("/") if p):
            if not isinstance(node, dict) or not _is_directory(node) or part not in node:
                return None
            node = node[part]
        if path == "" or path.endswith("/"):
            if not isinstance(node, dict) or not _is_directory(node):
                return None
            if recursive:
                text = json.dumps(_camel_tree(node))
                return Served(etag=etag_of(path, text), text=text, is_json=True)
            listing = "".join(
                f"{name}/\n" if _is_directory(child) else f"{name}\n"
                for name, child in sorted(node.items())
                if child is not None
            )
            return Served(etag=etag_of(path, listing), text=listing)
        if _is_directory(node):
            return None
        if node is None:
            return Served(etag=etag_of(path, None), text=None)
        if isinstance(node, dict):
            text = json.dumps(node)
            return Served(etag=etag_of(path, text), text=text, is_json=True)
        return Served(etag=etag_of(path, str(node)), text=str(node))

    def _tree(self, vm: str) -> dict[str, object]:
        meta = self._state.get(vm)
        instance: dict[str, object] = {
            "hostname": f"{vm}.{ZONE}.c.{PROJECT_ID}.internal",
            "id": instance_id(vm),
            "maintenance-event": meta.maintenance_event.value,
            "name": vm,
            "preempted": "TRUE" if meta.preempted else "FALSE",
            "upcoming-maintenance": None if meta.upcoming is None else dict(meta.upcoming),
            "zone": f"projects/{PROJECT_NUMBER}/zones/{ZONE}",
        }
        project: dict[str, object] = {"numeric-project-id": PROJECT_NUMBER, "project-id": PROJECT_ID}
        return {"instance": instance, "project": project}


def _is_directory(node: object) -> bool:
    # upcoming-maintenance is the one JSON-valued key; every other dict is a directory.
    return isinstance(node, dict) and "maintenanceStatus" not in node


def _camel_tree(node: dict[str, object]) -> dict[str, object]:
    """A recursive directory answer: GCE names keys in camelCase there (maintenanceEvent)."""
    result: dict[str, object] = {}
    for name, child in sorted(node.items()):
        if child is None:
            continue
        head, *rest = name.split("-")
        key = head + "".join(word.capitalize() for word in rest)
        result[key] = _camel_tree(child) if isinstance(child, dict) and _is_directory(child) else child
    return result


def _timeout(raw: str | None) -> float:
    if raw is None:
        return float(DEFAULT_TIMEOUT_SEC)
    try:
        seconds = int(raw)
    except ValueError:
        raise ValueError(f"timeout_sec must be a whole number of seconds, got {raw!r}") from None
    if seconds <= 0:
        raise ValueError("timeout_sec must be a positive number of seconds")
    return float(min(seconds, MAX_TIMEOUT_SEC))


def _text(status: int, text: str, etag: str | None = None) -> Response:
    headers: tuple[tuple[str, str], ...] = (("Metadata-Flavor", "Google"),)
    if etag is not None:
        headers += (("ETag", etag),)
    return Response(status=status, body=text.encode(), content_type="text/html; charset=utf-8", headers=headers)


def _render(served: Served, alt: str) -> Response:
    headers = (("Metadata-Flavor", "Google"), ("ETag", served.etag))
    if served.text is None:
        return Response(status=404, body=b"Not Found\n", content_type="text/html; charset=utf-8", headers=headers)
    if served.is_json:
        return Response(
            status=200,
            body=served.text.encode(),
            content_type="application/json",
            headers=headers,
            broken=_pseudo_json(served.text),
        )
    if alt == "json":
        body = json.dumps(served.text).encode()
        return Response(status=200, body=body, content_type="application/json", headers=headers, broken=b'"NO')
    return Response(
        status=200,
        body=served.text.encode(),
        content_type="application/text",
        headers=headers,
        broken=b"\x00\xff<garbage>\x13",
    )


def _pseudo_json(text: str) -> bytes:
    """The comma-less pseudo-JSON the GCE docs print for upcoming-maintenance: what a sloppy server sends."""
    value = json.loads(text)
    if not isinstance(value, dict):
        return text[: len(text) // 2].encode()
    lines = [f'   "{key}":"{item}"' for key, item in value.items()]
    return ("{\n" + "\n".join(lines) + "\n}\n").encode()
