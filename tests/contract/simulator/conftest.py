"""Fixtures for the simulator contract tests: real simulators on port 0 and small documented-API clients.

The clients are written from the vendors' docs and docs/simulator.md, not from the simulator's code:
`Metadata: true` for Azure, `Metadata-Flavor: Google` for GCE, JSON bodies for the control API.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable

import pytest
import requests

from simulator import Simulator, load_scenario

API_VERSION = "2020-07-01"
METADATA = {"Metadata": "true"}
FLAVOR = {"Metadata-Flavor": "Google"}
TIMEOUT = 10.0


class VmClient:
    """One VM's endpoint: Azure IMDS or GCE metadata paths, plus the /_sim/ control API."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    # ---- Azure

    def get_events(self, version: str | None = API_VERSION, headers: dict[str, str] | None = None) -> requests.Response:
        params = {} if version is None else {"api-version": version}
        return requests.get(
            f"{self.base_url}/metadata/scheduledevents",
            params=params,
            headers=METADATA if headers is None else headers,
            timeout=TIMEOUT,
        )

    def events(self, version: str = API_VERSION) -> dict[str, Any]:
        response = self.get_events(version)
        assert response.status_code == 200, response.text
        document: dict[str, Any] = response.json()
        return document

    def approve(
        self, *event_ids: str, body: str | None = None, headers: dict[str, str] | None = None
    ) -> requests.Response:
        payload = body if body is not None else _start_requests(event_ids)
        return requests.post(
            f"{self.base_url}/metadata/scheduledevents",
            params={"api-version": API_VERSION},
            headers=METADATA if headers is None else headers,
            data=payload,
            timeout=TIMEOUT,
        )

    # ---- GCE

    def gce(
        self, path: str, params: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> requests.Response:
        return requests.get(
            f"{self.base_url}/computeMetadata/v1/{path}",
            params=params or {},
            headers=FLAVOR if headers is None else headers,
            timeout=TIMEOUT + 300,
            allow_redirects=False,
        )

    # ---- control API

    def control(self, method: str, path: str, body: object = None) -> requests.Response:
        return requests.request(method, f"{self.base_url}/_sim/{path}", json=body, timeout=TIMEOUT)

    def post_ok(self, path: str, body: object) -> Any:
        response = self.control("POST", path, body)
        assert response.status_code in (200, 201), response.text
        return response.json()

    def add_event(self, **body: object) -> dict[str, Any]:
        response = self.control("POST", "events", body)
        assert response.status_code == 201, response.text
        event: dict[str, Any] = response.json()
        return event

    def advance(self, seconds: float) -> float:
        return float(self.post_ok("clock/advance", {"seconds": seconds})["sim_time"])

    def state(self) -> dict[str, Any]:
        response = self.control("GET", "state")
        assert response.status_code == 200, response.text
        state: dict[str, Any] = response.json()
        return state

    def get_list(self, path: str) -> list[dict[str, Any]]:
        response = self.control("GET", path)
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()
        return items


def _start_requests(event_ids: tuple[str, ...]) -> str:
    import json

    return json.dumps({"StartRequests": [{"EventId": event_id} for event_id in event_ids]})


StartSim = Callable[..., Simulator]


@pytest.fixture
def start_sim() -> Iterator[StartSim]:
    """Start simulators on free ports; stopped after the test.

    Azure's 5 requests/s limit is switched off unless `rate_limit=True`: tests poll faster than a
    real client would, and the rate limit has tests of its own.
    """
    started: list[Simulator] = []

    def start(scenario: str | None = None, rate_limit: bool = False, **kwargs: Any) -> Simulator:
        sim = Simulator(scenario=load_scenario(scenario) if scenario else None, **kwargs)
        started.append(sim)
        sim.start()
        if not rate_limit and sim.cloud.value == "azure":
            VmClient(sim.base_urls[0]).post_ok("faults", {"rate_limit": False})
        return sim

    yield start
    for sim in started:
        sim.stop()


def clients(sim: Simulator) -> list[VmClient]:
    return [VmClient(url) for url in sim.base_urls]


@pytest.fixture
def azure(start_sim: StartSim) -> VmClient:
    """One Azure VM ("vm-0") with nothing scheduled, at speed 1 (tests move time with clock advance)."""
    return clients(start_sim(cloud="azure"))[0]


@pytest.fixture
def gce(start_sim: StartSim) -> VmClient:
    """One GCE VM ("gce-vm-0"), all values at their defaults."""
    return clients(start_sim(cloud="gce"))[0]
