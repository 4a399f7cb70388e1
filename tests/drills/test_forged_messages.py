"""Drill: 1,000 forged messages from compromised VMs, interleaved with genuine reports.

Every proof here is real: the victims' and the attackers' agents prove their identity with the
agent's own provers against the simulator's metadata services (Azure attested documents, GCE
identity tokens, over HTTP), and the functions verify with the run's trust file. The attackers
have everything a compromised VM has: their own genuine proofs, the events their metadata shows
(an Azure VM sees the events of its whole availability set), and the bus.

The forgeries, in equal parts and at seeded random places among the genuine messages:
- no proof at all;
- the attacker's own proof on a report that claims to come from a victim ("wrong VM");
- a victim's genuine proof lifted from one of its messages onto another message ("reused");
- a genuine proof presented after it expired (the bus took the message hours later);
- the attacker, as itself, reporting an event of other VMs ("from a VM not named");
- forged `completed` / `canceled` of the victims' genuine events;
- forged command results (an approval accepted or rejected) in a victim's name;
- an Azure victim's genuine attested document, lifted from its message, with a key "ground" to
  match the document's 10-digit nonce ("ground-key"): every signature checks out. Grinding is
  simulated, not done: the verifier's nonce rule maps the attacker's key to the lifted document's
  nonce. The forgery reaches the bus after the message it lifted the document from, as it must;
- a Google-signed token of another instance with a GCE victim's name ("foreign-instance"): in
  another zone of the trusted project, in a project of the attacker's own, or a re-created one with
  another id — signed by the same issuer as the genuine tokens;
- a victim's genuine message taken from the bus's dead letters and resubmitted two hours later
  ("resubmitted"): judged at its new enqueue time, its proof has expired, and the refusal names the
  operator's way to finish what it left (`mbridge recover`);
- an attested document Azure's CA (the simulator's) genuinely signed for a VM of the attacker's that is
  also named like an Azure victim, in another resource group of the trusted subscription or in a
  subscription of its own ("other-scope"): its vmId is nobody in the trusted scope;
- an attested document signed under a forger's own PKI, whose signer names an Azure issuing CA and
  caIssuers URLs on www.microsoft.com ("issuer-storm"): refused as unverified, never retried, and the
  verifier's fetches of issuers (counted by the fake host it fetches from) stay at one per URL;
- an unproven report from a made-up VM whose name is chat markup (`<!channel>`, a disguised link)
  ("notice-flood"). Every run goes through the webhook notifier as the apps wire it: the genuine
  notices must all reach the (recording) webhook as without the forgeries, and the forgeries only
  as summaries on their own queue, their markup made inert.

Done when: the run's effects — every drain, approval and restore, in order, and the budget —
are exactly those of the genuine messages alone, each forgery is audited as refused, and the
webhook got the genuine notices of the baseline plus summaries.

A budget held by a compromised pool member is not a forgery (its proofs are its own, its event is
its own) and changes the effects (its own VM is drained), so it is a test of its own with its own
baseline: web-9 self-reports a Reboot that never ends, again and again, and the victims' genuine
events are still drained and approved as without it, past the budget when their NotBefore is near,
or after its reservation expired (audited).
"""

from __future__ import annotations

import base64
import json
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone

import pytest
from asn1crypto import cms  # type: ignore[import-untyped]
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from agent.proofs import AzureAttestedProver, GceIdentityProver, Prover
from agent.sources.azure.client import AzureImdsClient
from agent.sources.gce.client import GceMetadataClient
from functions.core.notify import NotifyingAuditLog, WebhookTemplate
from functions.core.policy import Policy, Pool
from functions.core.process import Deps, process
from functions.core.refusals import DEFAULT_SUMMARY_SECONDS
from functions.local_app.store import SqliteStore
from functions.notify import WebhookNotifier
from functions.trust.azure_attested import IssuerNotServedError, clear_issuer_cache
from functions.trust.trust_file import verifier_from_trust
from functions.trust.verifiers import CloudVerifier
from simulator import Simulator
from simulator.attestation import AttestationAuthority
from simulator.azure_api import SIM_SUBSCRIPTION_ID, vm_id
from simulator.gce_api.project import PROJECT_ID, ZONE
from simulator.gce_identity import TokenIssuer
from tests.drills.conftest import drill_seed, say
from tests.factories import azure_event
from tests.identity import microsoft_name
from tests.kit import FakeBalancer, FakeClock, RecordingSender, RecordingWebhook
from wire.envelope import encode, envelope_for_command_result, envelope_for_event
from wire.identity import (
    AZURE_ATTESTED,
    AZURE_SESSION_KEY,
    AZURE_SIGNATURE,
    DEFAULT_AUDIENCE,
    GCE_TOKEN,
    PROOF_ATTRIBUTES,
    TRUST_FILE_FORMAT,
    session_nonce,
    signed_digest,
    token_audience,
)
from wire.model import Cloud, CommandResult, EventKind, EventSource, EventStatus, MaintenanceEvent

pytestmark = pytest.mark.drill

SEED = 20261125
FORGERIES = 1000
AZURE_VICTIMS = ("web-0", "web-1", "web-2", "web-3")
AZURE_ATTACKER = "web-9"
GCE_VICTIMS = ("gce-0", "gce-1")
GCE_ATTACKER = "gce-9"
EVENTS_PER_VICTIM = 3
KINDS = (
    "no-proof",
    "wrong-vm",
    "reused",
    "expired",
    "not-named",
    "forged-end",
    "forged-result",
    "ground-key",
    "foreign-instance",
    "resubmitted",
    "other-scope",
    "issuer-storm",
    "notice-flood",
)
# What each kind of forgery must be refused for (the reason in its audit record).
REASONS = {
    "no-proof": ("no Azure proof", "no GCE identity token"),
    "wrong-vm": ("the proof is web-9's", "the proof is gce-9's"),
    "reused": ("made for another message", "not valid proof for this message"),
    "expired": ("expire",),
    "not-named": ("not-self: web-9 reports", "not-self: gce-9 reports"),
    "forged-end": ("the proof is web-9's", "the proof is gce-9's"),
    "forged-result": ("the proof is web-9's", "the proof is gce-9's", "no Azure proof", "no GCE identity token"),
    "ground-key": ("first seen with another key",),
    "resubmitted": ("mbridge recover",),
    # a project of the attacker's: not on the list; another zone or id: another VM with the same name
    "foreign-instance": ("not allowed", "not in the allowed", "is another VM with the same name"),
    # another subscription: not trusted; another resource group of the trusted one: its vmId is nobody
    "other-scope": ("which this deployment does not trust", "is in this deployment's scope"),
    # a shipped issuer that did not sign it: no fetch; another Azure issuer: its URL answered 404 (once)
    "issuer-storm": ("(which is known) did not sign it", "did not serve the signer's issuing CA"),
    "notice-flood": ("no Azure proof", "no GCE identity token"),
}
# Where another instance with a GCE victim's name lives: (project, zone, instance id).
FOREIGN_INSTANCES = (
    (PROJECT_ID, "us-east1-b", "7000000000000000001"),  # another zone of the trusted project
    ("attackers-own-project", ZONE, "7000000000000000002"),  # anyone can make a project and a VM
    (PROJECT_ID, ZONE, "7000000000000000003"),  # deleted and re-created: another id
)
# Where a VM of the attacker's with an Azure victim's name lives: (subscription, resource group).
OTHER_SCOPES = (
    (SIM_SUBSCRIPTION_ID, "sandbox"),  # another resource group of the trusted subscription
    (str(uuid.uuid5(uuid.NAMESPACE_URL, "drill/attackers-own-subscription")), "web"),  # a subscription of its own
)
# Issuers a forger's signer claims: one of Azure's not shipped with the functions (so it may be fetched,
# from the first of many caIssuers URLs on www.microsoft.com), and one of the shipped ones.
FORGED_ISSUERS = ("Microsoft TLS G2 RSA CA OCSP 06", "Microsoft Azure RSA TLS Issuing CA 03")
# A name a chat reads as "notify everyone" and a link showing other text than where it goes.
MARKUP_VM = "<!channel> <https://evil.example|web-0>"
# The notices' JSON body: the one line people read, and what a test compares runs by.
TEMPLATE = WebhookTemplate.parse(
    '{"text": "${summary}", "kind": "${kind}", "action": "${action}", "vm": "${vm}", "event": "${event_id}", '
    '"reason": "${reason}"}'
)
# One slot for the whole pool: a forged event holding it would make a genuine one wait.
POLICY = Policy(pools=(Pool("web", frozenset((*AZURE_VICTIMS, AZURE_ATTACKER)), max_drained=1),))


class Effects:
    """What the functions did, in order: the ground truth compared between the two runs."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.pool = FakeBalancer({"web": (*AZURE_VICTIMS, AZURE_ATTACKER), "gce": (*GCE_VICTIMS, GCE_ATTACKER)})
        self.sender = RecordingSender()
        self.pool.on("remove", lambda vm: self.log.append(("drain", vm)))
        self.pool.on("restore", lambda vm: self.log.append(("restore", vm)))
        self.sender.on_send(
            lambda command: self.log.append((f"{command.type.value} {command.event_id}", command.target))
        )


@dataclass(frozen=True)
class Message:
    body: bytes
    accepted_at: datetime
    forged: str | None = None  # the kind of forgery, None for a genuine report
    after: bytes | None = None  # the genuine message it was lifted from: it cannot reach the bus before it


@dataclass(frozen=True)
class OwnImds:
    """The IMDS of a VM the attacker controls, as its prover asks it: documents for `vm` signed by
    `authority` (Azure's, for the attacker's own VM elsewhere; a forger's PKI, for a forged signer)."""

    authority: AttestationAuthority
    vm: str  # its vmId
    subscription: str

    def attested_document(self, nonce: str) -> str:
        return self.authority.sign(self.vm, self.subscription, nonce, datetime.now(timezone.utc))["signature"]


class IssuerHost:
    """Microsoft's PKI host as the verifier fetches issuers from it: every URL asked is counted, and
    none of the forgers' is there (HTTP 404)."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def __call__(self, url: str) -> bytes:
        self.urls.append(url)
        raise IssuerNotServedError("HTTP 404")


class GroundKeys:
    """The nonce rule of a verifier that believes the attacker's keys were ground: each registered key
    gives the nonce of the document it was "ground" for; every other key, the real rule."""

    def __init__(self) -> None:
        self.nonces: dict[bytes, str] = {}

    def __call__(self, public: bytes) -> str:
        return self.nonces.get(public) or session_nonce(public)

    def grind(self, document: str) -> Ed25519PrivateKey:
        """A key the verifier takes as matching `document`'s nonce (the document's own key's nonce)."""
        key = Ed25519PrivateKey.generate()
        public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.nonces[public] = _nonce_of(document)
        return key


@dataclass
class Clouds:
    azure: Simulator
    gce: Simulator
    provers: dict[str, Prover]
    verifier: CloudVerifier
    closers: list[Callable[[], None]]
    ground: GroundKeys
    gce_issuer: TokenIssuer
    issuer_host: IssuerHost
    # per Azure victim: the provers of the attacker's VMs named like it in other scopes, and of forged signers
    other_scopes: dict[str, list[AzureAttestedProver]]
    forged_signers: dict[str, list[AzureAttestedProver]]
    issuer_urls: frozenset[str]  # the first caIssuers URL of each forged signer


@pytest.fixture(scope="module")
def clouds() -> Iterator[Clouds]:
    with (
        Simulator(cloud="azure", vm_names=[*AZURE_VICTIMS, AZURE_ATTACKER]) as azure,
        Simulator(cloud="gce", vm_names=[*GCE_VICTIMS, GCE_ATTACKER]) as gce,
    ):
        provers: dict[str, Prover] = {}
        closers: list[Callable[[], None]] = []
        for vm, url in zip(azure.vm_names, azure.base_urls):
            client = AzureImdsClient.for_base_url(url)
            closers.append(client.close)
            provers[vm] = AzureAttestedProver(client, time.monotonic)
        for vm, url in zip(gce.vm_names, gce.base_urls):
            gce_client = GceMetadataClient.for_base_url(url)
            closers.append(gce_client.close)
            provers[vm] = GceIdentityProver(gce_client, DEFAULT_AUDIENCE)
        trust = {**azure.trust(), **gce.trust(), "format": TRUST_FILE_FORMAT}
        ground = GroundKeys()
        issuer = gce._gce_api.identity if gce._gce_api is not None else None  # the run's "Google"
        assert issuer is not None
        assert azure._azure_api is not None
        signs_as_azure = azure._azure_api.attestation  # the run's "Azure" CA
        extra_urls = [f"http://www.microsoft.com/pkiops/certs/forged-{n}.crt" for n in range(5)]
        forgers = [
            AttestationAuthority.generate(intermediate_name=microsoft_name(name), extra_issuer_urls=extra_urls)
            for name in FORGED_ISSUERS
        ]
        other_scopes = {
            vm: [
                AzureAttestedProver(OwnImds(signs_as_azure, _vm_id_in(vm, *scope), scope[0]), time.monotonic)
                for scope in OTHER_SCOPES
            ]
            for vm in AZURE_VICTIMS
        }
        forged_signers = {
            vm: [
                AzureAttestedProver(OwnImds(forger, vm_id(vm), SIM_SUBSCRIPTION_ID), time.monotonic)
                for forger in forgers
            ]
            for vm in AZURE_VICTIMS
        }
        host = IssuerHost()
        verifier = verifier_from_trust(trust, nonce_of=ground, fetch_issuer=host)
        yield Clouds(
            azure,
            gce,
            provers,
            verifier,
            closers,
            ground,
            issuer,
            host,
            other_scopes,
            forged_signers,
            frozenset(forger.issuer_url for forger in forgers),
        )
        for close in closers:
            close()


def lifecycle(vm: str, index: int, start: datetime) -> list[MaintenanceEvent]:
    """A victim's own report of one of its events, step by step."""
    azure = vm in AZURE_VICTIMS
    event = MaintenanceEvent(
        cloud=Cloud.AZURE if azure else Cloud.GCE,
        event_id=f"{vm}-event-{index}",
        kind=EventKind.REBOOT if azure else EventKind.LIVE_MIGRATE,
        status=EventStatus.SCHEDULED,
        reporter=vm,
        sequence=str(index),
        resources=(vm,),
        not_before=start + timedelta(minutes=15) if azure else None,
        duration_seconds=-1 if azure else None,
        event_source=EventSource.PLATFORM if azure else None,
        description="genuine",
        raw={"index": index},
    )
    return [
        replace(event, status=status) for status in (EventStatus.SCHEDULED, EventStatus.STARTED, EventStatus.COMPLETED)
    ]


def genuine_messages(clouds: Clouds, start: datetime) -> list[Message]:
    """Each victim's events one after the other, reported by the victim itself."""
    messages = []
    at = start
    for index in range(EVENTS_PER_VICTIM):
        for vm in (*AZURE_VICTIMS, *GCE_VICTIMS):
            for step in lifecycle(vm, index, start):
                at += timedelta(seconds=1)
                body = clouds.provers[vm].prove(encode(envelope_for_event(step, at)))
                messages.append(Message(body, at))
    return messages


def forgeries(clouds: Clouds, genuine: list[Message], rng: random.Random, start: datetime) -> list[Message]:
    forged = []
    for number in range(FORGERIES):
        kind = KINDS[number % len(KINDS)]
        victim = rng.choice((*AZURE_VICTIMS, *GCE_VICTIMS))
        attacker = AZURE_ATTACKER if victim in AZURE_VICTIMS else GCE_ATTACKER
        index = rng.randrange(EVENTS_PER_VICTIM)
        scheduled, _started, completed = lifecycle(victim, index, start)
        at = start + timedelta(seconds=rng.uniform(0, 60))
        # A short Freeze (approved at once, no drain) is what an attacker forges to start a Reboot early.
        freeze = replace(scheduled, kind=EventKind.FREEZE, duration_seconds=5) if victim in AZURE_VICTIMS else scheduled
        if kind == "no-proof":
            body = encode(envelope_for_event(freeze, at))
        elif kind == "wrong-vm":
            body = clouds.provers[attacker].prove(encode(envelope_for_event(freeze, at)))
        elif kind == "reused":
            lifted = json.loads(rng.choice([m.body for m in genuine if victim.encode() in m.body]))
            document = json.loads(encode(envelope_for_event(freeze, at)))
            document.update({name: lifted[name] for name in PROOF_ATTRIBUTES if name in lifted})
            body = json.dumps(document).encode()
        elif kind == "expired":
            body = clouds.provers[victim].prove(encode(envelope_for_event(freeze, at)))
            forged.append(Message(body, at + timedelta(hours=7), kind))
            continue
        elif kind == "not-named":
            about_others = replace(freeze, reporter=attacker, sequence="x")
            body = clouds.provers[attacker].prove(encode(envelope_for_event(about_others, at)))
        elif kind == "forged-end":
            end = completed if rng.random() < 0.5 else replace(completed, status=EventStatus.CANCELED)
            body = clouds.provers[attacker].prove(encode(envelope_for_event(end, at)))
        elif kind == "foreign-instance":
            gce_victim = victim if victim in GCE_VICTIMS else rng.choice(GCE_VICTIMS)
            scheduled_gce = lifecycle(gce_victim, index, start)[0]
            project, zone, instance = rng.choice(FOREIGN_INSTANCES)
            report = envelope_for_event(scheduled_gce, at)
            document = json.loads(encode(report))
            document[GCE_TOKEN] = clouds.gce_issuer.issue(
                token_audience(DEFAULT_AUDIENCE, report.digest),
                instance_name=gce_victim,
                instance_id=instance,
                project_id=project,
                project_number="123456789012",
                zone=zone,
                full=True,
                now=at,
            )
            body = json.dumps(document).encode()
        elif kind in ("other-scope", "issuer-storm"):
            # The attacker's own VM named like an Azure victim elsewhere, or a forged signer, speaks for it.
            azure_victim = victim if victim in AZURE_VICTIMS else rng.choice(AZURE_VICTIMS)
            scheduled_azure = lifecycle(azure_victim, index, start)[0]
            freeze = replace(scheduled_azure, kind=EventKind.FREEZE, duration_seconds=5)
            provers = clouds.other_scopes if kind == "other-scope" else clouds.forged_signers
            body = rng.choice(provers[azure_victim]).prove(encode(envelope_for_event(freeze, at)))
        elif kind == "notice-flood":
            markup = replace(
                freeze,
                reporter=MARKUP_VM,
                resources=(MARKUP_VM,),
                description="<!here> @everyone [click](https://evil.example)",
            )
            body = encode(envelope_for_event(markup, at))
        elif kind == "resubmitted":
            source = rng.choice(genuine)
            forged.append(Message(source.body, source.accepted_at + timedelta(hours=2), kind, after=source.body))
            continue
        elif kind == "ground-key":
            # An Azure victim's own genuine message, its document lifted and a key ground for it.
            azure_victim = victim if victim in AZURE_VICTIMS else rng.choice(AZURE_VICTIMS)
            scheduled_azure = lifecycle(azure_victim, index, start)[0]
            freeze = replace(scheduled_azure, kind=EventKind.FREEZE, duration_seconds=5)
            source = rng.choice([m for m in genuine if f"/azure/{azure_victim}".encode() in m.body])
            document = json.loads(source.body)[AZURE_ATTESTED]
            key = clouds.ground.grind(document)
            forged.append(Message(_signed_with(key, freeze, document, at), at, kind, after=source.body))
            continue
        else:
            result = CommandResult(
                command_id=f"forged-{number}", accepted=rng.random() < 0.5, event_id=scheduled.event_id, target=victim
            )
            cloud = Cloud.AZURE if victim in AZURE_VICTIMS else Cloud.GCE
            unproven = encode(envelope_for_command_result(result, cloud, at))
            body = clouds.provers[attacker].prove(unproven) if rng.random() < 0.5 else unproven
        forged.append(Message(body, at, kind))
    return forged


@dataclass
class Run:
    effects: Effects
    store: SqliteStore
    webhook: RecordingWebhook
    notifier: WebhookNotifier
    results: dict[str, int] = field(default_factory=dict)
    # per forged message: its kind, and the reason of the one audit record its processing wrote
    refusals: list[tuple[str, str]] = field(default_factory=list)

    def notices(self) -> list[tuple[str, str, str, str]]:
        """The genuine notices the webhook got, in order: (kind, action, VM, event)."""
        return [(b["kind"], b["action"], b["vm"], b["event"]) for b in self.webhook.bodies() if b["kind"] != "refused"]

    def summaries(self) -> list[dict[str, str]]:
        return [body for body in self.webhook.bodies() if body["kind"] == "refused"]


def run(clouds: Clouds, messages: list[Message]) -> Run:
    """The messages through process(), its audit log announced through the webhook notifier as the apps
    wire it; once all are processed, the summary interval passes and what was handed over goes out."""
    effects = Effects()
    store = SqliteStore(":memory:")
    clock = FakeClock()
    webhook = RecordingWebhook()
    notifier = WebhookNotifier(webhook)
    audit = NotifyingAuditLog(store, notifier, TEMPLATE, monotonic=clock.monotonic)
    result = Run(effects, store, webhook, notifier)
    deps = Deps(store, effects.pool, effects.sender, audit, POLICY, verifier=clouds.verifier, monotonic=clock.monotonic)
    clear_issuer_cache()
    clouds.issuer_host.urls.clear()
    for message in messages:
        now = max(message.accepted_at, datetime.now(timezone.utc))
        before = len(store.query())
        outcome = process(message.body, deps, now, accepted_at=message.accepted_at)
        result.results[outcome.result] = result.results.get(outcome.result, 0) + 1
        if message.forged is not None:
            written = store.query()[before:]
            result.refusals.append((message.forged, " | ".join(f"{r.kind}: {r.reason}" for r in written)))
    clock.advance(DEFAULT_SUMMARY_SECONDS)
    audit.summarise_due()
    assert notifier.settle(30.0)
    notifier.close()
    return result


def test_a_thousand_forged_messages_change_nothing_and_the_genuine_events_go_as_without_them(clouds: Clouds) -> None:
    started = time.monotonic()
    seed = drill_seed(SEED)
    rng = random.Random(seed)
    start = datetime.now(timezone.utc)
    # GIVEN the victims' genuine reports, and 1,000 forgeries of every kind by their neighbours
    genuine = genuine_messages(clouds, start)
    forged = forgeries(clouds, genuine, rng, start)
    attacked = list(genuine)
    for message in forged:
        earliest = (
            0 if message.after is None else attacked.index(next(m for m in attacked if m.body == message.after)) + 1
        )
        attacked.insert(rng.randrange(earliest, len(attacked) + 1), message)
    # the flood opens with the markup: the first refusal is summarised at once, quoting it
    first = next(i for i, m in enumerate(attacked) if m.forged)
    markup = next(i for i, m in enumerate(attacked) if m.forged == "notice-flood")
    attacked[first], attacked[markup] = attacked[markup], attacked[first]
    built = time.monotonic() - started

    # WHEN the functions take the genuine reports alone, and then the attacked stream
    baseline = run(clouds, genuine)
    attack = run(clouds, attacked)

    # THEN every drain, approval and restore is the baseline's, in the same order: no forgery drained,
    # approved, restored or held a budget slot (one slot for the whole pool: a held one would reorder)
    assert attack.effects.log == baseline.effects.log
    drains = [e for e in baseline.effects.log if e[0] == "drain"]
    assert len(drains) == len(AZURE_VICTIMS + GCE_VICTIMS) * EVENTS_PER_VICTIM
    assert attack.store.parked("web") == attack.store.parked("gce") == []
    # AND each forgery wrote exactly one audit record, a refusal that says why, for the reason of its kind
    assert len(attack.refusals) == FORGERIES
    for kind, reason in attack.refusals:
        assert reason.count(" | ") == 0, (kind, reason)
        assert reason.startswith(("unverified: ", "not-self: ")), (kind, reason)
        assert any(expected in reason for expected in REASONS[kind]), (kind, reason)
    assert attack.results.get("processed", 0) == len(genuine)
    # AND the issuer-storm forgeries cost at most one fetch per caIssuers URL a forger named first
    fetched = clouds.issuer_host.urls
    assert len(fetched) == len(set(fetched)), fetched
    assert set(fetched) <= clouds.issuer_urls, fetched
    # AND the webhook got every genuine notice of the baseline, in order, none dropped, and the forgeries
    # only as summaries counting all of them (the first at once, the rest when the interval is over),
    # the attacker's markup inert
    assert attack.notices() == baseline.notices()
    assert attack.notices()
    assert attack.notifier.counts()["dropped"] == 0
    summaries = attack.summaries()
    assert len(summaries) == 2, summaries
    counted = [int(n) for summary in summaries for n in re.findall(r"(\d+) (?:unverified|not-self)", summary["reason"])]
    assert sum(counted) == FORGERIES
    assert "&lt;!channel&gt; &lt;https:\u200b//evil.example|web-0&gt;" in summaries[0]["text"], summaries[0]
    for body in attack.webhook.bodies():
        assert not any(raw in value for value in body.values() for raw in ("<!", "<http", "https://")), body
    results = attack.results
    say(
        "forged-messages",
        seed=seed,
        forged=FORGERIES,
        genuine=len(genuine),
        refused_unverified=results.get("unverified", 0),
        refused_not_self=results.get("not-self", 0),
        issuer_fetches=len(fetched),
        notices=len(attack.notices()),
        actions=len(attack.effects.log),
        build_s=round(built, 1),
        duration_s=round(time.monotonic() - started, 1),
    )


def _vm_id_in(vm: str, subscription: str, group: str) -> str:
    """The vmId of another VM named `vm` (a vmId is unique across Azure, whatever the name)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"drill/{subscription}/{group}/{vm}"))


def _nonce_of(document: str) -> str:
    """The nonce inside an attested document (its signed JSON), read with asn1crypto."""
    signed = cms.ContentInfo.load(base64.b64decode(document))["content"]
    content = json.loads(signed["encap_content_info"]["content"].native)
    return str(content["nonce"])


def _signed_with(key: Ed25519PrivateKey, event: MaintenanceEvent, document: str, at: datetime) -> bytes:
    """The message as an agent holding `key` publishes it, with `document` attached."""
    envelope = envelope_for_event(event, at)
    body = json.loads(encode(envelope))
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    body[AZURE_ATTESTED] = document
    body[AZURE_SESSION_KEY] = base64.b64encode(public).decode()
    body[AZURE_SIGNATURE] = base64.b64encode(key.sign(signed_digest(envelope.digest))).decode()
    return json.dumps(body).encode()


def reboot(vm: str, status: EventStatus, not_before: datetime | None) -> MaintenanceEvent:
    """An Azure Reboot of `vm` (event `<vm>-reboot`), as its own agent reports it."""
    return azure_event(
        event_id=f"{vm}-reboot",
        kind=EventKind.REBOOT,
        status=status,
        reporter=vm,
        resources=(vm,),
        not_before=not_before if status is EventStatus.SCHEDULED else None,
        duration_seconds=-1,
    )


def test_a_budget_held_by_a_never_ending_self_report_drains_and_approves_the_victims_as_without_it(
    clouds: Clouds,
) -> None:
    # GIVEN web-9 (a pool member, compromised) reporting a Reboot of its own VM, NotBefore 15 min away,
    # as scheduled again and again and never as started or completed: its reservation of the pool's one
    # slot expires at t0 + 30 min, and one reported again after that is admitted afresh (to t0 + 78 min)
    t0 = datetime.now(timezone.utc) + timedelta(minutes=1)
    minutes = [*range(0, 30, 3), 48, 50]
    held = [
        (t0 + timedelta(minutes=m), reboot(AZURE_ATTACKER, EventStatus.SCHEDULED, t0 + timedelta(minutes=15)))
        for m in minutes
    ]
    # AND the victims' genuine Reboots: web-0's and web-2's first seen 20 s before NotBefore (within the
    # drain period and margin: drained past the budget), web-1's and web-3's after a reservation expired
    victims: list[tuple[datetime, MaintenanceEvent]] = []
    for vm, first_seen, notice in (("web-0", 5, 20), ("web-1", 31, 15 * 60), ("web-2", 52, 20), ("web-3", 80, 60)):
        seen = t0 + timedelta(minutes=first_seen)
        not_before = seen + timedelta(seconds=notice)
        victims += [
            (seen, reboot(vm, EventStatus.SCHEDULED, not_before)),
            (not_before, reboot(vm, EventStatus.STARTED, None)),
            (not_before + timedelta(seconds=30), reboot(vm, EventStatus.COMPLETED, None)),
        ]
    timeline = sorted([*held, *victims], key=lambda step: step[0])
    genuine = [Message(clouds.provers[e.reporter].prove(encode(envelope_for_event(e, at))), at) for at, e in timeline]
    alone = [m for m in genuine if f"/azure/{AZURE_ATTACKER}".encode() not in m.body]

    # WHEN the functions take the victims' reports alone, and then with web-9's among them
    baseline = run(clouds, alone)
    attack = run(clouds, genuine)

    # THEN the victims were drained, approved and put back as without web-9's hold, in the same order
    def of_victims(effects: Effects) -> list[tuple[str, str]]:
        return [effect for effect in effects.log if effect[1] != AZURE_ATTACKER]

    assert of_victims(attack.effects) == of_victims(baseline.effects)
    assert [e for e in of_victims(baseline.effects) if e[0] == "drain"] == [("drain", vm) for vm in AZURE_VICTIMS]
    assert attack.results == {"processed": len(genuine)}
    # AND web-9's own VM was drained for its own event (legitimately) and never put back by anyone else
    assert ("drain", AZURE_ATTACKER) in attack.effects.log
    assert ("restore", AZURE_ATTACKER) not in attack.effects.log
    # AND each of its two holds was audited as expired, once, by the victim's admission that found it
    expired = [
        r.reason for r in attack.store.query(vm=AZURE_ATTACKER) if r.kind == "action" and "expired at" in r.reason
    ]
    assert len(expired) == 2, expired
    assert all(reason.startswith("the budget slot of event web-9-reboot in pool 'web' expired") for reason in expired)
    # AND the victims near their NotBefore went past the budget, with the reason said
    past = [r.vm for r in attack.store.query() if r.kind == "action" and r.reason.startswith("drained past the budget")]
    assert past == ["web-0", "web-2"]
