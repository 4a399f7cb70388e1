"""GCE metadata as a VM sees it under /computeMetadata/v1/: the request checks, `wait_for_change`
long-polls on the ETag of a path, and instance identity tokens.

`instance/service-accounts/default/identity` issues instance identity tokens signed with keys made
for this run (`GceApi.identity`, see gce_identity.py); it is the one path that is not a stored value.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable

from simulator.clock import Clock
from simulator.gce_api.answers import Served, etag_of, metadata_tree, render, serve, text_answer
from simulator.gce_api.project import PREFIX, PROJECT_ID, PROJECT_NUMBER, ZONE, instance_id
from simulator.gce_api.state import GceState
from simulator.store import MetadataRequest, Response

if TYPE_CHECKING:
    from simulator.gce_identity import TokenIssuer

DEFAULT_TIMEOUT_SEC = 60
MAX_TIMEOUT_SEC = 300

_FORBIDDEN_NO_FLAVOR = (
    "Your client does not have permission to get this URL from this server. Missing Metadata-Flavor:Google header.\n"
)
_FORBIDDEN_PROXIED = "Requests with an X-Forwarded-For header are refused; call the metadata server directly.\n"

IDENTITY_PATH = "instance/service-accounts/default/identity"
IDENTITY_FORMATS = ("standard", "full")  # the documented values of `format`; standard is the default
_NO_AUDIENCE = "non-empty audience parameter required\n"  # GCE's answer (400) without an audience


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
            return text_answer(403, _FORBIDDEN_PROXIED)
        if request.header("Metadata-Flavor") != "Google":
            return text_answer(403, _FORBIDDEN_NO_FLAVOR)
        if request.method != "GET":
            return text_answer(405, f"Method {request.method} is not allowed; the metadata server is read-only.\n")
        if not request.path.startswith(PREFIX):
            return text_answer(404, f"Not found: {request.path}; metadata lives under {PREFIX}\n")
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
            return text_answer(404, f"Not found: {request.path}\n", etag=etag_of(path, None))
        try:
            served = self._wait_or_now(request, path, recursive)
        except ValueError as exc:
            return text_answer(400, f"{exc}\n")
        return render(served, request.query.get("alt", ""))

    def _identity_token(self, request: MetadataRequest) -> Response:
        """A new token at every request (no ETag, no long-poll), as text/html like GCE sends it."""
        audience = request.query.get("audience", "")
        if not audience:
            return text_answer(400, _NO_AUDIENCE)
        requested_format = request.query.get("format", "standard")
        if requested_format not in IDENTITY_FORMATS:
            return text_answer(400, f"format must be one of {', '.join(IDENTITY_FORMATS)}, got {requested_format!r}\n")
        # licenses=TRUE adds the license codes of the VM's images: a simulated VM boots none.
        if request.query.get("licenses", "FALSE").upper() not in {"TRUE", "FALSE"}:
            return text_answer(400, f"licenses must be TRUE or FALSE, got {request.query['licenses']!r}\n")
        try:
            issuer = self.identity
        except ImportError:
            return text_answer(500, "identity tokens need the google-auth package; pip install google-auth\n")
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
        return serve(metadata_tree(vm, self._state.get(vm)), path, recursive)


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
