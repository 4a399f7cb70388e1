"""The Cloud Functions app's verifier as its settings build it, checked with real proofs.

The simulator's metadata server issues identity tokens signed with keys it makes for the run; the
agent's prover attaches them; the verifier `build_verifier` makes from the environment checks them
with the certificates it fetches from MBRIDGE_TRUST_CERTS_URL, here a local server that serves the
simulator's certificates in the shape of Google's. The instances are the simulator's, as its trust
file lists them (the Compute API's directory is tested in test_compute.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.proofs import GceIdentityProver
from agent.sources.gce.client import GceMetadataClient
from functions.gcp_app.settings import Settings
from functions.gcp_app.wiring import build_verifier
from functions.trust.gce_instances import StaticInstanceDirectory
from simulator.gce_api import PROJECT_ID, ZONE
from simulator.server import Simulator
from tests.factories import azure_event
from wire.envelope import decode, encode, envelope_for_event
from wire.identity import DEFAULT_AUDIENCE, IdentityVerifier, UnverifiedError
from wire.model import Cloud, EventKind, EventStatus

VMS = ("gce-0", "gce-1")


class CertsServer:
    """Serves one set of certificates as Google serves its own, and counts the requests."""

    def __init__(self, certs: object) -> None:
        body = json.dumps(certs).encode()
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Cache-Control", "public, max-age=3600")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}/oauth2/v1/certs"
        self._thread = threading.Thread(target=lambda: self._http.serve_forever(poll_interval=0.02), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture(scope="module")
def simulator() -> Iterator[Simulator]:
    with Simulator(cloud="gce", vm_names=VMS) as started:
        yield started


@pytest.fixture(scope="module")
def certs(simulator: Simulator) -> Iterator[CertsServer]:
    section = simulator.trust()["gce"]
    assert isinstance(section, dict)
    server = CertsServer(section["certs"])
    yield server
    server.stop()


def proven(simulator: Simulator, vm: str = "gce-0", audience: str = DEFAULT_AUDIENCE) -> bytes:
    """A report of `vm`'s own notice, with the identity token its agent attaches."""
    event = azure_event(
        cloud=Cloud.GCE,
        event_id="gce-maintenance-1",
        kind=EventKind.LIVE_MIGRATE,
        status=EventStatus.SCHEDULED,
        reporter=vm,
        resources=(vm,),
    )
    body = encode(envelope_for_event(event, datetime.now(timezone.utc)))
    client = GceMetadataClient.for_base_url(simulator.base_urls[VMS.index(vm)])
    try:
        return GceIdentityProver(client, audience).prove(body)
    finally:
        client.close()


@pytest.fixture(scope="module")
def instances(simulator: Simulator) -> StaticInstanceDirectory:
    section = simulator.trust()["gce"]
    assert isinstance(section, dict)
    return StaticInstanceDirectory.from_resources(section["instances"])


def verify(verifier: IdentityVerifier | None, body: bytes) -> str:
    assert verifier is not None
    now = datetime.now(timezone.utc)
    return verifier.verify(decode(body), now, now).vm


def test_identity_tokens_of_the_functions_project_are_verified_with_the_fetched_certificates(
    simulator: Simulator, certs: CertsServer, instances: StaticInstanceDirectory
) -> None:
    # GIVEN a function in the VMs' project, fetching the certificates from the configured URL
    settings = Settings.from_env({"GOOGLE_CLOUD_PROJECT": PROJECT_ID, "MBRIDGE_TRUST_CERTS_URL": certs.url})

    # WHEN it builds its verifier
    verifier = build_verifier(settings, instances)

    # THEN each VM's proven report is that VM's, and the certificates were fetched once
    before = certs.requests
    assert verify(verifier, proven(simulator, "gce-0")) == "gce-0"
    assert verify(verifier, proven(simulator, "gce-1")) == "gce-1"
    assert certs.requests - before == 1


def test_vms_of_another_project_are_trusted_only_when_listed(
    simulator: Simulator, certs: CertsServer, instances: StaticInstanceDirectory
) -> None:
    # GIVEN a function in project shop-prod, and VMs in the simulator's project
    base = {"MBRIDGE_GCP_PROJECT": "shop-prod", "MBRIDGE_TRUST_CERTS_URL": certs.url}
    body = proven(simulator)

    # THEN their tokens are refused by default, and accepted once their project is listed
    with pytest.raises(UnverifiedError, match=PROJECT_ID):
        verify(build_verifier(Settings.from_env(base), instances), body)
    listed = Settings.from_env({**base, "MBRIDGE_TRUST_PROJECTS": f"shop-prod,{PROJECT_ID}"})
    assert verify(build_verifier(listed, instances), body) == "gce-0"


def test_a_token_for_another_audience_is_refused(
    simulator: Simulator, certs: CertsServer, instances: StaticInstanceDirectory
) -> None:
    # GIVEN agents asking for tokens for their default audience, and functions expecting another
    settings = Settings.from_env(
        {
            "GOOGLE_CLOUD_PROJECT": PROJECT_ID,
            "MBRIDGE_TRUST_CERTS_URL": certs.url,
            "MBRIDGE_TRUST_AUDIENCE": "https://mbridge.example.com",
        }
    )
    verifier = build_verifier(settings, instances)

    # THEN a token is accepted only for the configured audience
    with pytest.raises(UnverifiedError, match="audience"):
        verify(verifier, proven(simulator))
    assert verify(verifier, proven(simulator, audience="https://mbridge.example.com")) == "gce-0"


def test_a_trust_file_alone_gives_the_verifier(simulator: Simulator, tmp_path: Path) -> None:
    # GIVEN the trust file the simulator writes for its run, and certificates nowhere to be fetched
    path = tmp_path / "trust.json"
    path.write_text(json.dumps(simulator.trust()), encoding="utf-8")
    settings = Settings.from_env(
        {
            "GOOGLE_CLOUD_PROJECT": "shop-prod",
            "MBRIDGE_TRUST_FILE": str(path),
            "MBRIDGE_TRUST_CERTS_URL": "http://127.0.0.1:9/certs",
        }
    )

    # WHEN the function builds its verifier THEN it verifies with the file's certificates and projects
    assert verify(build_verifier(settings), proven(simulator, "gce-1")) == "gce-1"


def test_reporter_name_trust_builds_no_verifier() -> None:
    settings = Settings.from_env({"GOOGLE_CLOUD_PROJECT": "shop-prod", "MBRIDGE_POLICY": '{"trust": "reporter-name"}'})
    assert build_verifier(settings) is None


def test_zones_narrow_the_trusted_vms(
    simulator: Simulator, certs: CertsServer, instances: StaticInstanceDirectory
) -> None:
    base = {"GOOGLE_CLOUD_PROJECT": PROJECT_ID, "MBRIDGE_TRUST_CERTS_URL": certs.url}
    elsewhere = Settings.from_env({**base, "MBRIDGE_TRUST_ZONES": "europe-west1-b"})
    with pytest.raises(UnverifiedError, match="MBRIDGE_TRUST_ZONES"):
        verify(build_verifier(elsewhere, instances), proven(simulator))
    here = Settings.from_env({**base, "MBRIDGE_TRUST_ZONES": f"europe-west1-b,{ZONE}"})
    assert verify(build_verifier(here, instances), proven(simulator)) == "gce-0"
