"""What is Firestore's own in the StateStore and AuditLog on it, against Google's emulator: document ids,
a pool's reservations in one document, the drains earlier versions kept, and the wired app on the
Firestore and Pub/Sub emulators (an envelope in, commands out on the commands topic).

What every store does (claims, budget, drains, remembered values, waits, the audit log) is one
suite over SQLite, Azurite and the Firestore emulator: tests/contract/test_state_store.py and
tests/contract/test_audit_log.py. Each test here works in a project of its own on one shared
emulator (tests/peers_firestore.py), so tests never see each other's documents.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1  # type: ignore[import-untyped]  # the library ships no py.typed
import pytest
from google.api_core import exceptions as api_errors
from google.cloud import firestore

from agent.proofs import AzureAttestedProver
from agent.sources.azure.client import AzureImdsClient
from functions.core.holds import LONGEST_HOLD
from functions.core.keys import claim_key
from functions.core.ports import Claim, Reservation
from functions.core.process import CLAIM_LEASE
from functions.gcp_app.entry import handle_message
from functions.gcp_app.firestore_store import FirestoreStateStore, doc_id
from functions.gcp_app.settings import Settings
from functions.gcp_app.wiring import build_deps
from simulator import Simulator
from tests.contract.backends import HELD_UNTIL, NOW, new_project, reboot
from wire.envelope import decode
from wire.model import EventStatus

LEASE = CLAIM_LEASE


def test_document_ids_are_safe_for_any_key() -> None:
    ids = {doc_id(key) for key in ("azure:c706/x", "a/b/c", "..", "__name__", "")}
    assert len(ids) == 5
    assert all(len(value) == 64 and "/" not in value for value in ids)


@pytest.mark.peer
def test_firestore_documents_keep_the_keys_readable(firestore_emulator: str) -> None:
    # GIVEN a claim and a drain stored under keys with '/' in them
    client = firestore.Client(project=new_project())
    store = FirestoreStateStore(client, prefix="app1_")
    store.claim("azure:guid/with/slashes", NOW, LEASE)
    store.record_drain("azure:guid/with/slashes", "web-0", {"readiness": True})
    # THEN the documents live under the prefix, with hashed ids and the keys as fields
    claims = [snapshot.to_dict() for snapshot in client.collection("app1_claims").stream()]
    drains = [snapshot.to_dict() for snapshot in client.collection("app1_drains").stream()]
    assert [entry["key"] for entry in claims if entry] == ["azure:guid/with/slashes"]
    assert [entry["event_key"] for entry in drains if entry] == ["azure:guid/with/slashes"]
    assert list(client.collection("mbridge_claims").stream()) == []
    client.close()  # type: ignore[no-untyped-call]  # the library leaves it unannotated


# 1,000 VMs (the most an event lists) of 80 characters (the longest name).
LARGEST_EVENT_VMS = [f"vmss-{n:04d}-" + "x" * 70 + f"_{n:03d}" for n in range(1000)]


@pytest.mark.peer
def test_a_pool_whose_reservations_fill_a_document_makes_the_next_event_wait(firestore_emulator: str) -> None:
    # GIVEN an unlimited pool holding events of 1,000 long VM names each (about 85 KB apiece)
    client = firestore.Client(project=new_project())
    store = FirestoreStateStore(client)
    answers = [
        store.reserve("default", f"azure:{n}", LARGEST_EVENT_VMS, None, now=NOW, expires_at=HELD_UNTIL).admitted
        for n in range(14)
    ]

    # WHEN the pool's document is full
    # THEN the next event is not admitted (it waits for a slot, as for a budget) instead of failing
    assert (answers[0], answers[-1]) == (True, False)
    refused = answers.index(False)
    assert answers == [True] * refused + [False] * (len(answers) - refused)
    # ... and it is admitted once another event lets its slot go
    store.release("default", "azure:0")
    assert store.reserve("default", f"azure:{refused}", LARGEST_EVENT_VMS, None, now=NOW, expires_at=HELD_UNTIL)
    client.close()  # type: ignore[no-untyped-call]  # the library leaves it unannotated


@pytest.mark.peer
def test_drains_kept_in_one_document_per_event_are_still_read_and_forgotten(firestore_emulator: str) -> None:
    # GIVEN the drains of an event as earlier versions kept them: one document, a map of VMs
    client = firestore.Client(project=new_project())
    store = FirestoreStateStore(client)
    legacy = {"event_key": "azure:e1", "vms": {"web-0": '{"state": "removed"}', "web-1": "{}"}}
    client.collection("mbridge_drains").document(doc_id("azure:e1")).set(legacy)
    store.record_drain("azure:e1", "web-2", {"state": "located"})

    # WHEN they are read (and listed with every drain), and two are forgotten
    before = dict(store.drains("azure:e1"))
    listed = {drain.vm: drain.record for drain in store.all_drains() if drain.event_key == "azure:e1"}
    store.forget_drain("azure:e1", "web-0")
    store.forget_drain("azure:e1", "web-2")

    # THEN the old and the new records are one list, and forgetting works on both
    assert before == {"web-0": {"state": "removed"}, "web-1": {}, "web-2": {"state": "located"}}
    assert listed == before
    assert dict(store.drains("azure:e1")) == {"web-1": {}}
    client.close()  # type: ignore[no-untyped-call]  # the library leaves it unannotated


# ---------------------------------------------------------------- the wired app on the emulators


@pytest.mark.peer
def test_the_wired_app_acts_once_and_publishes_the_commands_of_both_vms(
    firestore_emulator: str, pubsub_emulator: str, tmp_path: Path
) -> None:
    # GIVEN the app wired as deployed (Firestore state, Pub/Sub commands, readiness drains, senders
    # verified) in a fresh project, trusting a simulator's VMs, and a subscription on its commands topic
    project = new_project()
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = publisher.create_topic(name=f"projects/{project}/topics/maintenance-commands").name
    subscription = f"projects/{project}/subscriptions/all-commands"
    subscriber.create_subscription(name=subscription, topic=topic, ack_deadline_seconds=10)
    with Simulator(cloud="azure", vm_names=["web-0", "web-1"]) as sim:
        trust = tmp_path / "trust.json"
        trust.write_text(json.dumps(sim.trust()), encoding="utf-8")
        deps = build_deps(Settings(project=project, trust_file=str(trust)))
        provers = {
            vm: AzureAttestedProver(AzureImdsClient.for_base_url(url), time.monotonic)
            for vm, url in zip(sim.vm_names, sim.base_urls)
        }
        web_0 = provers["web-0"].prove(reboot(EventStatus.SCHEDULED))
        web_1 = provers["web-1"].prove(reboot(EventStatus.SCHEDULED, vms=("web-1", "web-0")))

        # WHEN each VM's own report of a scheduled reboot of both arrives, and web-0's again (a redelivery)
        now = datetime.now(timezone.utc)
        first = handle_message(web_0, deps, now)
        other = handle_message(web_1, deps, now)
        again = handle_message(web_0, deps, now)

    # THEN each VM was drained through its agent on its own report, and the event approved once, by
    # the report that found both out; each command addressed by the attribute `target`; the
    # redelivery added nothing
    assert [(taken.action, taken.vm) for taken in first.actions] == [("drain", "web-0"), ("none", "web-0")]
    assert [(taken.action, taken.vm) for taken in other.actions] == [("drain", "web-1"), ("approve", "web-1")]
    assert again.result == "duplicate"
    received = pull(subscriber, subscription, expected=3)
    assert sorted((m.attributes["type"], m.attributes["target"]) for m in received) == [
        ("approve", "web-1"),
        ("drain", "web-0"),
        ("drain", "web-1"),
    ]
    assert pull(subscriber, subscription, expected=1, wait=2.0) == []
    assert deps.store.claim(claim_key(first.envelope_id, "web-0", decode(web_0).digest), now, LEASE) is Claim.DONE
    publisher.stop()
    subscriber.close()


def pull(subscriber: Any, subscription: str, *, expected: int, wait: float = 10.0) -> list[Any]:
    """Messages from `subscription` (acknowledged) until `expected` arrived or `wait` passed."""
    messages: list[Any] = []
    deadline = time.monotonic() + wait
    while len(messages) < expected and time.monotonic() < deadline:
        try:
            response = subscriber.pull(subscription=subscription, max_messages=10, timeout=1.0, retry=None)
        except api_errors.DeadlineExceeded:
            continue
        if response.received_messages:
            subscriber.acknowledge(
                subscription=subscription, ack_ids=[item.ack_id for item in response.received_messages]
            )
            messages.extend(item.message for item in response.received_messages)
    return messages


@pytest.mark.peer
def test_a_reservation_an_earlier_version_wrote_holds_the_longest_hold_from_when_it_is_found(
    firestore_emulator: str,
) -> None:
    # GIVEN a pool's document as the version before expiries wrote it: entries without times
    client = firestore.Client(project=new_project())
    entry = {"event_key": "azure:e-old", "vms": ["web-0"], "token": "t-old"}
    client.collection("mbridge_budget_pools").document(doc_id("web")).set({"pool": "web", "reservations": [entry]})
    store = FirestoreStateStore(client)

    # WHEN events ask for its slot when it is first found, before the longest hold from then, and at it
    first = store.reserve("web", "azure:e1", ["web-1"], 1, now=NOW, expires_at=HELD_UNTIL)
    before = store.reserve("web", "azure:e1", ["web-1"], 1, now=NOW + LONGEST_HOLD / 2, expires_at=HELD_UNTIL)
    at = store.reserve("web", "azure:e1", ["web-1"], 1, now=NOW + LONGEST_HOLD, expires_at=HELD_UNTIL)

    # THEN it counts until then, and is reported expired once, without an admission time
    assert (first.admitted, before.admitted, at.admitted) == (False, False, True)
    assert at.expired == (Reservation("azure:e-old", ("web-0",), None, NOW + LONGEST_HOLD),)
    client.close()  # type: ignore[no-untyped-call]  # the library leaves it unannotated
