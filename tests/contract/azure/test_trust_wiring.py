"""The Azure app's verifier as its settings build it, checked with real proofs.

The simulator's IMDS issues attested documents signed by a PKI it makes for the run; the agent's
prover attaches them; the verifier `build_verifier` makes from the app settings checks them. Only
the roots differ from a deployment: the simulator's, given in MBRIDGE_TRUST_ROOTS, instead of
DigiCert Global Root G2. Issuing CAs are fetched by `fetch_issuer`, checked here against a local
HTTP server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.proofs import AzureAttestedProver
from agent.sources.azure.client import AzureImdsClient
from functions.azure_app import settings as names
from functions.azure_app.settings import Settings, SettingsError
from functions.azure_app.vm_directory import StaticVmDirectory, VmDirectoryConfigError
from functions.azure_app.wiring import (
    MAX_ISSUER_BYTES,
    IssuerFetchFailedError,
    build_verifier,
    fetch_issuer,
)
from functions.trust.azure_attested import IssuerNotServedError
from functions.trust.trust_file import TrustFileError
from simulator.azure_api import SIM_SUBSCRIPTION_ID, vm_id
from simulator.server import Simulator
from tests.factories import azure_event
from wire.envelope import decode, encode, envelope_for_event
from wire.identity import IdentityVerifier, UnverifiedError
from wire.model import EventKind, EventStatus

VMS = ("web-0", "web-1")
OTHER_SUBSCRIPTION = "11111111-2222-3333-4444-555555555555"
BASE = {
    names.EVENTS_TOPIC: "maintenance-events",
    names.EVENTS_SUBSCRIPTION: "functions",
    names.SERVICEBUS_NAMESPACE: "mybus.servicebus.windows.net",
    names.TABLE_ENDPOINT: "https://myaccount.table.core.windows.net",
}


@pytest.fixture(scope="module")
def simulator() -> Iterator[Simulator]:
    with Simulator(cloud="azure", vm_names=VMS) as started:
        yield started


def trust(simulator: Simulator) -> dict[str, Any]:
    section = simulator.trust()["azure"]
    assert isinstance(section, dict)
    return section


def proven(simulator: Simulator, vm: str = "web-0") -> bytes:
    """A report of `vm`'s own event, with the proof its agent attaches."""
    event = azure_event(
        event_id="E-1", kind=EventKind.REBOOT, status=EventStatus.SCHEDULED, reporter=vm, resources=(vm,)
    )
    body = encode(envelope_for_event(event, datetime.now(timezone.utc)))
    client = AzureImdsClient.for_base_url(simulator.base_urls[VMS.index(vm)])
    try:
        return AzureAttestedProver(client, lambda: 0.0).prove(body)
    finally:
        client.close()


def verify(verifier: IdentityVerifier | None, body: bytes) -> str:
    assert verifier is not None
    now = datetime.now(timezone.utc)
    return verifier.verify(decode(body), now, now).vm


def simulated(simulator: Simulator) -> dict[str, str]:
    """App settings trusting the simulator's PKI and subscription. The intermediates are given:
    without them the verifier would fetch the issuing CA from the URL the signer names."""
    section = trust(simulator)
    return {
        **BASE,
        names.TRUST_ROOTS: section["roots"],
        names.TRUST_INTERMEDIATES: section["intermediates"],
        names.TRUST_SUBSCRIPTIONS: SIM_SUBSCRIPTION_ID,
        names.TRUST_RESOURCE_GROUPS: "vms",
    }


def simulated_directory() -> StaticVmDirectory:
    return StaticVmDirectory({SIM_SUBSCRIPTION_ID: {vm_id(vm): vm for vm in VMS}})


class UnusedCredential:
    """The app's identity, where nothing may ask it for a token."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        raise AssertionError(f"no token should be requested, asked for {scopes}")


class RefusedCredential:
    """An identity that cannot sign in (no managed identity on the app)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.exceptions import ClientAuthenticationError

        raise ClientAuthenticationError("no managed identity endpoint")


# ---------------------------------------------------------------- trust: attested, from the settings


def test_attested_documents_are_checked_against_the_configured_roots_and_subscriptions(
    simulator: Simulator, tmp_path: Path
) -> None:
    # GIVEN the simulator's roots as a PEM file, its intermediates as PEM text written on one line
    # (as an app setting may hold it), and its subscription trusted
    section = trust(simulator)
    roots = tmp_path / "roots.pem"
    roots.write_text(section["roots"], encoding="ascii")
    settings = Settings.from_env(
        {
            **BASE,
            names.TRUST_ROOTS: str(roots),
            names.TRUST_INTERMEDIATES: section["intermediates"].replace("\n", "\\n"),
            names.TRUST_SUBSCRIPTIONS: SIM_SUBSCRIPTION_ID.upper(),
            names.TRUST_RESOURCE_GROUPS: "vms",
        }
    )

    # WHEN the app builds its verifier (the VMs looked up in a fixed directory)
    verifier = build_verifier(settings, UnusedCredential(), directory=simulated_directory())

    # THEN each VM's proven report is that VM's
    assert verify(verifier, proven(simulator, "web-0")) == "web-0"
    assert verify(verifier, proven(simulator, "web-1")) == "web-1"


def test_a_vm_of_a_subscription_not_trusted_is_refused(simulator: Simulator) -> None:
    settings = Settings.from_env({**simulated(simulator), names.TRUST_SUBSCRIPTIONS: OTHER_SUBSCRIPTION})
    verifier = build_verifier(settings, UnusedCredential(), directory=simulated_directory())

    with pytest.raises(UnverifiedError, match="does not trust"):
        verify(verifier, proven(simulator))


def test_by_default_only_documents_chaining_to_digicert_global_root_g2_are_accepted(simulator: Simulator) -> None:
    # GIVEN no roots configured: Azure's public root, which the simulator's PKI does not chain to
    environ = {key: value for key, value in simulated(simulator).items() if key != names.TRUST_ROOTS}
    settings = Settings.from_env(environ)
    verifier = build_verifier(settings, UnusedCredential(), directory=simulated_directory())

    # WHEN a document signed by another CA is checked THEN it is no proof
    with pytest.raises(UnverifiedError, match="does not chain to a trusted root"):
        verify(verifier, proven(simulator))


def test_the_vm_is_looked_up_through_the_compute_api_on_the_apps_identity(simulator: Simulator) -> None:
    # GIVEN the wiring's own directory, on an identity that cannot sign in
    settings = Settings.from_env(simulated(simulator))
    verifier = build_verifier(settings, RefusedCredential())

    # WHEN a genuine document is checked THEN its vmId is looked up in Azure Resource Manager,
    # and the refusal names the role to grant
    with pytest.raises(VmDirectoryConfigError, match="Reader"):
        verify(verifier, proven(simulator))


# ---------------------------------------------------------------- a trust file, and trust: reporter-name


def test_a_trust_file_alone_gives_the_verifier(simulator: Simulator, tmp_path: Path) -> None:
    # GIVEN the trust file the simulator writes for its run, and no other trust setting
    path = tmp_path / "trust.json"
    path.write_text(json.dumps(simulator.trust()), encoding="utf-8")
    settings = Settings.from_env({**BASE, names.TRUST_FILE: str(path)})

    # WHEN the app builds its verifier THEN it verifies with the file (its roots and its VMs),
    # asking Azure for nothing
    verifier = build_verifier(settings, UnusedCredential())
    assert verify(verifier, proven(simulator, "web-1")) == "web-1"
    assert (settings.trust_roots, settings.trust_subscriptions) == ((), ())


def test_a_trust_file_that_went_away_fails_the_build_naming_the_setting(simulator: Simulator, tmp_path: Path) -> None:
    path = tmp_path / "trust.json"
    path.write_text(json.dumps(simulator.trust()), encoding="utf-8")
    settings = Settings.from_env({**BASE, names.TRUST_FILE: str(path)})
    path.unlink()

    with pytest.raises(SettingsError, match="MBRIDGE_TRUST_FILE: cannot read the trust file") as raised:
        build_verifier(settings, UnusedCredential())
    assert isinstance(raised.value.__cause__, TrustFileError)


def test_reporter_name_trust_builds_no_verifier_and_needs_no_trust_setting() -> None:
    settings = Settings.from_env({**BASE, names.POLICY: '{"trust": "reporter-name"}'})

    assert build_verifier(settings, UnusedCredential()) is None
    assert (settings.trust_roots, settings.trust_subscriptions) == ((), ())


# ---------------------------------------------------------------- fetching an issuing CA


class IssuerServer:
    """Answers every GET with `status`, `body` and `headers`; records the paths asked for."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b""
        self.headers: dict[str, str] = {}
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.paths.append(self.path)
                self.send_response(server.status)
                for name, value in server.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=lambda: self._http.serve_forever(poll_interval=0.02), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def issuer_server() -> Iterator[IssuerServer]:
    server = IssuerServer()
    yield server
    server.stop()


def test_the_issuing_ca_is_fetched_as_served(issuer_server: IssuerServer) -> None:
    issuer_server.body = b"\x30\x82 a DER certificate"
    assert fetch_issuer(f"{issuer_server.url}/pkiops/certs/issuer.crt") == issuer_server.body


def test_a_redirect_is_not_followed(issuer_server: IssuerServer) -> None:
    issuer_server.status = 302
    issuer_server.headers = {"Location": f"{issuer_server.url}/elsewhere.crt"}

    with pytest.raises(IssuerNotServedError, match="HTTP 302"):
        fetch_issuer(f"{issuer_server.url}/issuer.crt")
    assert issuer_server.paths == ["/issuer.crt"]


def test_an_answer_larger_than_a_certificate_is_refused(issuer_server: IssuerServer) -> None:
    issuer_server.body = b"x" * (MAX_ISSUER_BYTES + 1)

    with pytest.raises(IssuerNotServedError, match="more than 65536 bytes"):
        fetch_issuer(f"{issuer_server.url}/issuer.crt")


def test_a_not_found_answer_is_an_answer(issuer_server: IssuerServer) -> None:
    # A 4xx will not change on a retry: the verifier refuses the document for good
    issuer_server.status = 404
    with pytest.raises(IssuerNotServedError, match="HTTP 404"):
        fetch_issuer(f"{issuer_server.url}/issuer.crt")


def test_a_server_error_may_pass(issuer_server: IssuerServer) -> None:
    # A 5xx may: the verifier has the message tried again (and remembers the failure meanwhile)
    issuer_server.status = 503
    with pytest.raises(IssuerFetchFailedError, match="HTTP 503"):
        fetch_issuer(f"{issuer_server.url}/issuer.crt")
