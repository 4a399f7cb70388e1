"""`Simulator`, the public entry point (also a context manager): one HTTP server per VM on consecutive
ports, all sharing one simulator state.

It validates the settings, builds the shared state and the APIs, schedules the scenario, and starts
and stops the threads. The HTTP servers are in vm_servers.py, the dispatch of a request in routing.py.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Callable

from simulator.azure_api import SIM_LOCATION, SIM_RESOURCE_GROUP, SIM_SUBSCRIPTION_ID, AzureApi, vm_id
from simulator.clock import Clock
from simulator.control import Actions, ControlApi, SimContext, state_view
from simulator.departures import Departures
from simulator.faults import FaultBook
from simulator.gce_api import PROJECT_ID, ZONE, GceApi, GceState, instance_id
from simulator.routing import Router
from simulator.scenarios import Scenario, check_fits, schedule
from simulator.store import AzureHome, CentralFeed, Cloud, EventStore, SimLog, Timeline
from simulator.traffic import TrafficLog, VmTraffic
from simulator.vm_servers import VmServer, bind_consecutive, url_of
from wire.identity import DEFAULT_AUDIENCE, TRUST_FILE_FORMAT

_VM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


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
        self._servers: list[VmServer] = []
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
        self._servers = bind_consecutive(self.host, self.port, self.vm_names)
        urls = tuple(url_of(self.host, server.server_address[1]) for server in self._servers)
        ctx = self._context(urls)
        actions = Actions(ctx)
        self._azure_api = AzureApi(ctx.store)
        self._gce_api = GceApi(ctx.gce, ctx.clock, ctx.cond, lambda vm: ctx.timeline.stopped or ctx.departures.gone(vm))
        router = Router(ctx, ControlApi(ctx, actions), self._azure_api, self._gce_api, self._stop)
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
        central = CentralFeed(clock, cond, log, AzureHome(SIM_SUBSCRIPTION_ID, SIM_RESOURCE_GROUP, SIM_LOCATION))
        return SimContext(
            cloud=self.cloud,
            clock=clock,
            cond=cond,
            timeline=timeline,
            log=log,
            store=EventStore(clock, cond, timeline, log, names, departures, central),
            gce=GceState(clock, cond, log, names, departures, central),
            faults=FaultBook(clock, cond, log, self.cloud, names),
            traffic=TrafficLog(names),
            departures=departures,
            central=central,
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
        certificates, project and instances on GCE. The keys are made for this run, when first needed."""
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
            # The instance directory: each VM's resource name and id, as its tokens name it.
            "instances": {
                f"projects/{PROJECT_ID}/zones/{ZONE}/instances/{vm}": instance_id(vm) for vm in self.vm_names
            },
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
