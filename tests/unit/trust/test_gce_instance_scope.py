"""A GCE report speaks for one instance of the deployment's scope, not for whatever VM has its name.

The attacks: a Google-signed identity token of *another* VM named like a victim — in another zone of
a trusted project, in another trusted project, in a project nobody trusts (anyone can create one),
or of an instance deleted and re-created under the victim's name — sent with a report of the
victim's maintenance. Each must be refused as `unverified` and move nothing.

Tokens are signed by the simulator's identity issuer (real RSA keys and certificates, Google's
token format) and attached by the agent's own prover; the functions verify them with a trust
document as the simulator writes one, through the core's `process`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest

pytest.importorskip("google.auth", reason="google-auth is not installed (the 3.9 compatibility run omits it)")

from agent.proofs import GceIdentityProver
from functions.core.policy import Policy
from functions.core.process import Deps, Outcome, process
from functions.local_app.balancer import LocalPool
from functions.local_app.store import SqliteStore
from functions.trust.gce_instances import GceInstance, StaticInstanceDirectory
from functions.trust.gce_token import StaticCerts
from functions.trust.trust_file import TrustFileError, verifier_from_trust
from functions.trust.verifiers import GceTokenVerifier
from simulator.gce_identity import TokenIssuer
from tests.factories import azure_event
from tests.kit import FakeClock, RecordingSender
from wire.envelope import decode, encode, envelope_for_event
from wire.identity import DEFAULT_AUDIENCE, TRUST_FILE_FORMAT, Identity, IdentityVerifier, UnverifiedError
from wire.model import Cloud, EventKind, EventStatus

HOME, NEIGHBOUR, STRANGER = "shop-prod", "shop-staging", "attacker-project"
ZONE, OTHER_ZONE = "europe-west1-b", "us-east1-c"
VICTIM = "gce-0"
VICTIM_ID = "4113390128391523715"
NOBODY = StaticInstanceDirectory([])


@dataclass(frozen=True)
class Vm:
    """What a token says about the VM that asked for it."""

    project: str
    zone: str
    instance_id: str
    name: str = VICTIM

    @property
    def resource(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instances/{self.name}"


GENUINE = Vm(HOME, ZONE, VICTIM_ID)
ATTACKERS = {
    "same name, another zone": Vm(HOME, OTHER_ZONE, "7000000000000000001"),
    "same name, another trusted project": Vm(NEIGHBOUR, ZONE, "7000000000000000002"),
    "same name, an untrusted project": Vm(STRANGER, ZONE, "7000000000000000003"),
    "deleted and re-created (another id)": Vm(HOME, ZONE, "7000000000000000004"),
}


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer.generate()


class IssuedTokens:
    """The metadata server of `vm`: tokens signed by `issuer` for whatever audience is asked."""

    def __init__(self, issuer: TokenIssuer, vm: Vm) -> None:
        self._issuer, self._vm = issuer, vm

    def identity_token(self, audience: str) -> str:
        return self._issuer.issue(
            audience,
            instance_name=self._vm.name,
            instance_id=self._vm.instance_id,
            project_id=self._vm.project,
            project_number="123456789012",
            zone=self._vm.zone,
            full=True,
            now=datetime.now(timezone.utc),
        )


def trust_document(issuer: TokenIssuer, **gce: object) -> dict[str, object]:
    """The deployment knows the genuine gce-0 only, and trusts its own and its staging project."""
    section: dict[str, object] = {
        "certs": issuer.certs(),
        "audience": DEFAULT_AUDIENCE,
        "projects": [HOME, NEIGHBOUR],
        "instances": {GENUINE.resource: GENUINE.instance_id},
    }
    section.update(gce)
    return {"format": TRUST_FILE_FORMAT, "gce": section}


def report_of_victim(issuer: TokenIssuer, sent_by: Vm) -> bytes:
    """A report of gce-0's maintenance, proven with the identity token of the VM `sent_by`."""
    event = azure_event(
        cloud=Cloud.GCE,
        event_id="gce-maintenance-1",
        kind=EventKind.LIVE_MIGRATE,
        status=EventStatus.SCHEDULED,
        reporter=VICTIM,
        resources=(VICTIM,),
        not_before=None,
        duration_seconds=None,
        event_source=None,
    )
    body = encode(envelope_for_event(event, datetime.now(timezone.utc)))
    return GceIdentityProver(IssuedTokens(issuer, sent_by), DEFAULT_AUDIENCE).prove(body)


@dataclass
class Functions:
    pool: LocalPool
    store: SqliteStore
    verifier: IdentityVerifier

    def deliver(self, body: bytes) -> Outcome:
        deps = Deps(
            self.store,
            self.pool,
            RecordingSender(),
            self.store,
            Policy(),
            verifier=self.verifier,
            monotonic=FakeClock().monotonic,
        )
        return process(body, deps, datetime.now(timezone.utc))

    def unverified(self) -> list[str]:
        return [record.reason for record in self.store.query() if record.kind == "unverified"]


@pytest.fixture
def functions(issuer: TokenIssuer) -> Iterator[Functions]:
    pool = LocalPool(":memory:")
    pool.add("gce", (VICTIM, "gce-1"))
    store = SqliteStore(":memory:")
    yield Functions(pool, store, verifier_from_trust(trust_document(issuer)))
    store.close()


@pytest.mark.parametrize("attacker", list(ATTACKERS.values()), ids=list(ATTACKERS))
def test_a_token_of_another_instance_named_like_the_victim_drains_nothing(
    functions: Functions, issuer: TokenIssuer, attacker: Vm
) -> None:
    # GIVEN a Google-signed token of a VM named gce-0 that is not the deployment's gce-0
    forged = report_of_victim(issuer, sent_by=attacker)

    # WHEN it comes with a report of gce-0's maintenance
    outcome = functions.deliver(forged)

    # THEN the report is refused, and gce-0 stays in its pool
    assert outcome.result == "unverified"
    assert functions.pool.members("gce") == [VICTIM, "gce-1"]
    (reason,) = functions.unverified()
    assert attacker.instance_id in reason or attacker.project in reason


def test_the_genuine_instance_is_verified_and_named_by_its_resource_in_the_audit(
    functions: Functions, issuer: TokenIssuer
) -> None:
    # GIVEN gce-0's own report, with its own token
    outcome = functions.deliver(report_of_victim(issuer, sent_by=GENUINE))

    # THEN it drains gce-0, and the audit names the instance by project, zone, name and id
    assert outcome.result == "processed"
    assert functions.pool.members("gce") == ["gce-1"]
    (event,) = [record for record in functions.store.query() if record.kind == "event"]
    sender = event.detail["sender"]
    assert sender.startswith(f"reported by {VICTIM}, attested")
    assert GENUINE.resource in sender
    assert VICTIM_ID in sender


def test_a_trust_file_without_projects_is_refused_saying_what_to_add(issuer: TokenIssuer) -> None:
    document = trust_document(issuer)
    gce = document["gce"]
    assert isinstance(gce, dict)
    del gce["projects"]
    with pytest.raises(TrustFileError, match=r"gce\.projects"):
        verifier_from_trust(json.loads(json.dumps(document)))


def test_a_verifier_without_a_project_allow_list_cannot_be_made(issuer: TokenIssuer) -> None:
    with pytest.raises(ValueError, match="project"):
        GceTokenVerifier(certs=StaticCerts(issuer.certs()), audience=DEFAULT_AUDIENCE, projects=None, directory=NOBODY)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="project"):
        GceTokenVerifier(certs=StaticCerts(issuer.certs()), audience=DEFAULT_AUDIENCE, projects=[], directory=NOBODY)


def test_a_name_two_instances_of_the_scope_carry_speaks_for_neither(issuer: TokenIssuer) -> None:
    # GIVEN the staging project also has a gce-0, and both projects are trusted
    twin = ATTACKERS["same name, another trusted project"]
    instances = {GENUINE.resource: GENUINE.instance_id, twin.resource: twin.instance_id}
    verifier = verifier_from_trust(trust_document(issuer, instances=instances))

    # THEN neither's token is gce-0's: the refusal says what to do
    for sender in (GENUINE, twin):
        with pytest.raises(UnverifiedError, match=r"2 instances .* are named gce-0.*rename all but one, or narrow"):
            verify(verifier, report_of_victim(issuer, sent_by=sender))


def test_trusted_zones_refuse_a_token_of_another_zone(issuer: TokenIssuer) -> None:
    verifier = verifier_from_trust(trust_document(issuer, zones=[OTHER_ZONE]))
    with pytest.raises(UnverifiedError, match="in a zone this deployment does not trust"):
        verify(verifier, report_of_victim(issuer, sent_by=GENUINE))


def test_the_directory_is_asked_with_the_id_the_token_proves(issuer: TokenIssuer) -> None:
    # (so that a directory that caches can list again for an instance made since)
    class Recording(StaticInstanceDirectory):
        def __init__(self, instances: list[GceInstance]) -> None:
            super().__init__(instances)
            self.asked: list[tuple[str, str | None]] = []

        def instances_named(self, name: str, *, expecting: str | None = None) -> Sequence[GceInstance]:
            self.asked.append((name, expecting))
            return super().instances_named(name, expecting=expecting)

    directory = Recording([GceInstance(GENUINE.project, GENUINE.zone, VICTIM, VICTIM_ID)])
    verifier = GceTokenVerifier(
        certs=StaticCerts(issuer.certs()), audience=DEFAULT_AUDIENCE, projects=[HOME], directory=directory
    )
    identity = verify(verifier, report_of_victim(issuer, sent_by=GENUINE))
    assert (identity.vm, identity.resource) == (VICTIM, GENUINE.resource)
    assert directory.asked == [(VICTIM, VICTIM_ID)]


def verify(verifier: IdentityVerifier, body: bytes) -> Identity:
    now = datetime.now(timezone.utc)
    return verifier.verify(decode(body), now, now)
