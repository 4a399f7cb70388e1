"""HTTP serving: one ThreadingHTTPServer per VM on consecutive ports, all sharing one simulator state.

`Simulator` is the public entry point (also a context manager). A request goes: control API (/_sim/)
straight to `ControlApi`; metadata paths first through the faults, then to the cloud's API module.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import socket
import threading
from collections.abc import Sequence
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Callable
from urllib.parse import parse_qs, urlsplit

from simulator.azure_api import SCHEDULED_EVENTS_PATH, SIM_SUBSCRIPTION_ID, AzureApi, parse_start_requests, vm_id
from simulator.clock import Clock
from simulator.control import CONTROL_PREFIX, Actions, ControlApi, SimContext, state_view
from simulator.departures import Departures
from simulator.faults import FaultBook
from simulator.gce_api import PROJECT_ID, GceApi, GceState
from simulator.scenarios import Scenario, check_fits, schedule
from simulator.store import (
    ApprovalResult,
    Cloud,
    EventStore,
    MetadataRequest,
    Response,
    SimLog,
    Timeline,
)
from simulator.traffic import TrafficLog, VmTraffic
from wire.identity import DEFAULT_AUDIENCE, TRUST_FILE_FORMAT

_MAX_BODY = 1 << 20
_VM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")
_PORT_ATTEMPTS = 50


class _Router:
    """Dispatches one request of one VM; shared by all VM servers of a simulator."""

    def __init__(self, ctx: SimContext, control: ControlApi, azure: AzureApi, gce: GceApi, stop: threading.Event):
        self._ctx = ctx
        self._control = control
        self._azure = azure
        self._gce = gce
        self._stop = stop

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
        response = self._metadata(request)
        self._ctx.traffic.record(request.vm, None if response is None else response.status)
        return response

    def _metadata(self, request: MetadataRequest) -> Response | None:
        azure = self._ctx.cloud is Cloud.AZURE
        # IMDS documents the slow first call for Scheduled Events; on GCE any first request is delayed.
        first_call = request.path.rstrip("/") == SCHEDULED_EVENTS_PATH if azure else True
        admission = self._ctx.faults.admit(request.vm, first_call)
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


class _VmServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # long-polls must not hold up stop()

    def __init__(self, address: tuple[str, int], vm: str) -> None:
        self.vm = vm
        self.router: _Router | None = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, connection: socket.socket, open_now: bool) -> None:
        with self._connections_lock:
            if open_now:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_for_good(self) -> None:
        """Refuse new connections and cut the open ones (kept-alive clients, pending long-polls)."""
        self.shutdown()
        self.server_close()
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # already closed by its client
                connection.shutdown(socket.SHUT_RDWR)


class _VmServer6(_VmServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _VmServer
    server_version = "maintenance-bridge-simulator"
    # Both metadata services speak HTTP/1.1 with keep-alive; clients that reuse connections
    # (requests.Session) must behave here as they will on a VM. Every answer has a Content-Length.
    protocol_version = "HTTP/1.1"
    # An answer is written as headers, then body: with Nagle's algorithm on, the body waits for the
    # client's delayed ACK of the headers (40 ms on Linux) on a kept-alive connection. The metadata
    # services answer without that delay; so does the simulator.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, open_now=True)

    def finish(self) -> None:
        self.server.track(self.connection, open_now=False)
        super().finish()

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: object) -> None:
        # Requests are not logged: the simulator logs what changed, not every poll.
        return

    def _dispatch(self) -> None:
        parts = urlsplit(self.path)
        query = {key: values[0] for key, values in parse_qs(parts.query, keep_blank_values=True).items()}
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        body = self.rfile.read(min(max(length, 0), _MAX_BODY)) if length > 0 else b""
        if length > _MAX_BODY:
            self.close_connection = True  # the unread rest would be taken for the next request
        request = MetadataRequest(
            method=self.command,
            path=parts.path,
            query=query,
            headers={key.lower(): value for key, value in self.headers.items()},
            body=body,
            vm=self.server.vm,
        )
        router = self.server.router
        if router is None:
            self._write(Response(status=503, body=b'{"error": "the simulator is starting"}'))
            return
        response = router.route(request)
        if response is None:
            self.close_connection = True  # the `drop` fault: close without any answer
            return
        self._write(response)

    def _write(self, response: Response) -> None:
        self.send_response(response.status)
        if response.body or response.status != 200:
            self.send_header("Content-Type", response.content_type)
        for name, value in response.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        try:
            self.end_headers()
            self.wfile.write(response.body)
        except OSError:
            # The client gave up (a timeout on a long-poll), or its VM stopped answering meanwhile.
            self.close_connection = True


class Simulator:
    """A local Azure IMDS Scheduled Events or GCE metadata service for one or more VMs.

    Each VM gets its own port (consecutive ports, `port=0` finds a free run); all VMs share one event
    store, one clock and one timeline. Use it as a context manager or call start() and stop().
    """

    def __init__(
        self,
        cloud: str | None = None,
        vm_names: Sequence[str] | None = None,
        speed: float = 1.0,
        scenario: Scenario | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if cloud is None:
            cloud = scenario.cloud.value if scenario is not None else Cloud.AZURE.value
        if cloud not in {c.value for c in Cloud}:
            raise ValueError(f"cloud must be 'azure' or 'gce', got {cloud!r}")
        self.cloud = Cloud(cloud)
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not math.isfinite(speed) or speed <= 0:
            raise ValueError(f"speed must be a positive number (documented timings are divided by it), got {speed!r}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be between 0 and 65535 (0 finds a free run of ports), got {port}")
        names = list(vm_names) if vm_names else self._default_names(scenario)
        for name in names:
            if not isinstance(name, str) or not _VM_NAME.fullmatch(name):
                raise ValueError(f"VM name {name!r} is not usable: letters, digits, '.', '_' and '-' only")
        if len(set(names)) != len(names):
            raise ValueError(f"VM names must be unique, got {names}")
        if scenario is not None:
            check_fits(scenario, self.cloud, names)
        self.vm_names: list[str] = names
        self.speed = float(speed)
        self.scenario = scenario
        self.host = host
        self.port = port
        self._servers: list[_VmServer] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._ctx: SimContext | None = None
        self._actions: Actions | None = None
        self._azure_api: AzureApi | None = None
        self._gce_api: GceApi | None = None

    def _default_names(self, scenario: Scenario | None) -> list[str]:
        if scenario is not None:
            return list(scenario.vms)
        return ["vm-0"] if self.cloud is Cloud.AZURE else ["gce-vm-0"]

    # ---- lifecycle

    def start(self) -> Simulator:
        if self._ctx is not None or self._stop.is_set():
            raise RuntimeError("this simulator was already started (or stopped); create a new one")
        self._servers = _bind_consecutive(self.host, self.port, self.vm_names)
        urls = tuple(_url(self.host, server.server_address[1]) for server in self._servers)
        ctx = self._context(urls)
        actions = Actions(ctx)
        self._azure_api = AzureApi(ctx.store)
        self._gce_api = GceApi(ctx.gce, ctx.clock, ctx.cond, lambda vm: ctx.timeline.stopped or ctx.departures.gone(vm))
        router = _Router(ctx, ControlApi(ctx, actions), self._azure_api, self._gce_api, self._stop)
        ctx.log.add(
            f"{self.cloud.value} simulator at speed {self.speed:g}: "
            + ", ".join(f"{vm} {url}" for vm, url in zip(ctx.vm_names, urls))
        )
        if self.scenario is not None:
            ctx.log.add(f"scenario {self.scenario.name}: {len(self.scenario.steps)} step(s)")
            schedule(self.scenario, actions, ctx.timeline, ctx.log, ctx.vm_names[0])
        ctx.timeline.run_due()  # steps at 0 (a first-call delay, say) apply before the first request
        for server in self._servers:
            server.router = router
        self._ctx, self._actions = ctx, actions
        self._spawn(ctx.timeline.run_forever, "sim-timeline")
        for vm, server in zip(ctx.vm_names, self._servers):
            self._spawn(functools.partial(server.serve_forever, poll_interval=0.1), f"sim-{vm}")
        ctx.departures.close_with(self._close_port)
        return self

    def _close_port(self, vm: str) -> None:
        # Called under the simulator's lock: shutdown() waits for the serving loop, so off this thread.
        server = self._servers[self.vm_names.index(vm)]
        threading.Thread(target=server.close_for_good, name=f"sim-close-{vm}", daemon=True).start()

    def _context(self, urls: tuple[str, ...]) -> SimContext:
        cond = threading.Condition(threading.RLock())
        clock = Clock(self.speed)  # the simulated clock starts now, at launch
        log = SimLog(clock, cond)
        timeline = Timeline(clock, cond)
        names = tuple(self.vm_names)
        departures = Departures(cond, timeline, log, names, self.speed)
        return SimContext(
            cloud=self.cloud,
            clock=clock,
            cond=cond,
            timeline=timeline,
            log=log,
            store=EventStore(clock, cond, timeline, log, names, departures),
            gce=GceState(clock, cond, log, names, departures),
            faults=FaultBook(clock, cond, log, self.cloud, names),
            traffic=TrafficLog(names),
            departures=departures,
            vm_names=names,
            urls=urls,
            default_names=self.scenario.vms if self.scenario is not None else (),
            scenario_name=self.scenario.name if self.scenario is not None else None,
        )

    def stop(self) -> None:
        """Stop serving; long-polls and fault delays in flight end at once. Safe to call twice."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._ctx is not None:
            self._ctx.timeline.stop()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- views

    @property
    def base_urls(self) -> list[str]:
        """One base URL per VM, in the order of `vm_names` (what a client's --metadata-url takes)."""
        return list(self._started().urls)

    def approvals(self) -> list[dict[str, object]]:
        """The approval log: every POST of StartRequests, also refused ones (GET /_sim/approvals)."""
        return [dict(record) for record in self._started().store.approvals()]

    def traffic(self) -> dict[str, VmTraffic]:
        """Metadata requests per VM: total, by status, and the most in any one real second (GET /_sim/traffic)."""
        return self._started().traffic.snapshot()

    def gce_values(self) -> dict[str, dict[str, object]]:
        """Per VM: the GCE keys' values and `watched`, whether maintenance-event was queried directly
        since the last maintenance event (the `gce` part of GET /_sim/state); {} on Azure."""
        context = self._started()
        return context.gce.snapshot() if context.cloud is Cloud.GCE else {}

    def state(self) -> dict[str, object]:
        """Everything at once (GET /_sim/state); also when no VM's port answers any more."""
        return state_view(self._started())

    def log_entries(self) -> list[dict[str, object]]:
        """What happened, in order (GET /_sim/log)."""
        return [dict(entry) for entry in self._started().log.entries()]

    def trust(self) -> dict[str, object]:
        """What verifies the proofs of identity this run issues (a trust file's document: see
        functions/trust/trust_file.py): its test PKI's roots and VMs on Azure, its signing
        certificates on GCE. The keys are made for this run, when first needed."""
        self._started()
        if self.cloud is Cloud.AZURE:
            assert self._azure_api is not None
            authority = self._azure_api.attestation
            azure: dict[str, object] = {
                "roots": authority.roots_pem().decode("ascii"),
                "intermediates": authority.intermediates_pem().decode("ascii"),
                "subscriptions": [SIM_SUBSCRIPTION_ID],
                "vms": {vm_id(vm): vm for vm in self.vm_names},
            }
            return {"format": TRUST_FILE_FORMAT, "azure": azure}
        assert self._gce_api is not None
        gce: dict[str, object] = {
            "certs": self._gce_api.identity.certs(),
            "audience": DEFAULT_AUDIENCE,
            "projects": [PROJECT_ID],
        }
        return {"format": TRUST_FILE_FORMAT, "gce": gce}

    def advance_clock(self, seconds: float) -> float:
        """Jump `seconds` documented seconds ahead (POST /_sim/clock/advance); returns the new sim time."""
        self._started()
        assert self._actions is not None
        return self._actions.advance_clock(seconds)

    def _started(self) -> SimContext:
        if self._ctx is None:
            raise RuntimeError("the simulator is not started; call start() or use it in a with-block")
        return self._ctx

    def _spawn(self, target: Callable[[], object], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _bind_consecutive(host: str, port: int, vm_names: Sequence[str]) -> list[_VmServer]:
    """One bound server per VM on consecutive ports starting at `port` (0: any free run)."""
    server_cls = _VmServer6 if ":" in host else _VmServer
    if port != 0:
        return _bind_run(server_cls, host, port, vm_names)
    for _ in range(_PORT_ATTEMPTS):
        # Let the OS pick the first port, then try to take the ones after it.
        first = server_cls((host, 0), vm_names[0])
        base = first.server_address[1]
        try:
            rest = _bind_run(server_cls, host, base + 1, vm_names[1:]) if len(vm_names) > 1 else []
        except OSError:
            first.server_close()
            continue
        return [first, *rest]
    raise OSError(f"found no {len(vm_names)} consecutive free ports on {host}; pass --port explicitly")


def _bind_run(server_cls: type[_VmServer], host: str, port: int, vm_names: Sequence[str]) -> list[_VmServer]:
    servers: list[_VmServer] = []
    try:
        for offset, vm in enumerate(vm_names):
            if port + offset > 65535:
                raise OSError(f"port {port + offset} is out of range")
            servers.append(server_cls((host, port + offset), vm))
    except OSError as exc:
        for server in servers:
            server.server_close()
        raise OSError(
            f"cannot listen on {host}:{port}..{port + len(vm_names) - 1} for {len(vm_names)} VM(s): {exc}; "
            f"choose another --port (0 finds free ports)"
        ) from exc
    return servers
