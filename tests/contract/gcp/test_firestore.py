"""The StateStore and AuditLog contract, on the SQLite store and on Firestore (Google's emulator).

One behavioural test set runs on both backends, so the Firestore store is held to exactly what
the local store does. Each Firestore test works in a project of its own on one shared emulator
(tests/peers_firestore.py), so tests never see each other's documents.

The last tests run the wired app (functions/gcp_app/wiring.py) against the Firestore and Pub/Sub
emulators: an envelope in, commands out on the commands topic.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import google.cloud.pubsub_v1 as pubsub_v1  # type: ignore[import-untyped]  # the library ships no py.typed
import pytest
from google.api_core import exceptions as api_errors
from google.cloud import firestore

from agent.proofs import AzureAttestedProver
from agent.sources.azure.client import AzureImdsClient
from functions.core.keys import claim_key
from functions.core.policy import Policy, Pool
from functions.core.ports import AuditLog, AuditRecord, Claim, JsonObject, StateStore
from functions.core.process import CLAIM_LEASE, Deps, process
from functions.gcp_app.entry import handle_message
from functions.gcp_app.firestore_store import FirestoreAuditLog, FirestoreStateStore, doc_id
from functions.gcp_app.settings import Settings
from functions.gcp_app.wiring import build_deps
from functions.local_app.store import SqliteStore
from simulator import Simulator
from tests.factories import azure_event
from wire.envelope import encode, envelope_for_event
from wire.identity import ReporterName
from wire.model import EventKind, EventStatus, MaintenanceEvent

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
LEASE = CLAIM_LEASE
T = TypeVar("T")


@dataclass
class Backend:
    name: str
    store: StateStore
    audit: AuditLog


def new_project() -> str:
    return f"mbridge-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["sqlite", pytest.param("firestore", marks=pytest.mark.peer)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "sqlite":
        sqlite = SqliteStore(":memory:")
        yield Backend("sqlite", sqlite, sqlite)
        sqlite.close()
        return
    request.getfixturevalue("firestore_emulator")
    client = firestore.Client(project=new_project())
    yield Backend("firestore", FirestoreStateStore(client), FirestoreAuditLog(client))
    client.close()  # type: ignore[no-untyped-call]  # the library leaves it unannotated


def race(count: int, action: Callable[[int], T]) -> list[T]:
    """Run `action(i)` in `count` threads released at the same moment; their results in order."""
    barrier = threading.Barrier(count)
    results: dict[int, T] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = action(index)
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return [results[index] for index in range(count)]


# ---------------------------------------------------------------- claims


def test_a_new_claim_is_ours_and_a_second_one_within_the_lease_is_busy(backend: Backend) -> None:
    assert backend.store.claim("envelope-1", NOW, LEASE) is Claim.CLAIMED
    assert backend.store.claim("envelope-1", NOW + timedelta(seconds=1), LEASE) is Claim.BUSY


def test_an_abandoned_claim_is_taken_over_at_once_but_a_done_one_stays_done(backend: Backend) -> None:
    # GIVEN a claim whose invocation failed and gave it back, and another that completed
    backend.store.claim("envelope-1", NOW, LEASE)
    backend.store.abandon("envelope-1", NOW + timedelta(seconds=1))
    backend.store.claim("envelope-2", NOW, LEASE)
    backend.store.complete("envelope-2", NOW)
    backend.store.abandon("envelope-2", NOW)

    # WHEN both are claimed again seconds later, well within the lease
    again = backend.store.claim("envelope-1", NOW + timedelta(seconds=2), LEASE)
    done = backend.store.claim("envelope-2", NOW + timedelta(seconds=2), LEASE)

    # THEN the abandoned one is ours at once; abandoning never undoes a completion
    assert (again, done) == (Claim.CLAIMED, Claim.DONE)


def test_a_completed_claim_is_done_even_after_its_lease(backend: Backend) -> None:
    # GIVEN a claim that was completed
    backend.store.claim("envelope-1", NOW, LEASE)
    backend.store.complete("envelope-1", NOW)
    # WHEN the same envelope arrives long after THEN it is a duplicate
    assert backend.store.claim("envelope-1", NOW + timedelta(days=2), LEASE) is Claim.DONE


def test_an_expired_lease_is_taken_over_once(backend: Backend) -> None:
    # GIVEN an invocation that claimed and died
    backend.store.claim("envelope-1", NOW, LEASE)
    # WHEN the redelivery comes after the lease THEN it takes the claim, and holds it anew
    later = NOW + LEASE + timedelta(seconds=1)
    assert backend.store.claim("envelope-1", later, LEASE) is Claim.CLAIMED
    assert backend.store.claim("envelope-1", later + timedelta(seconds=1), LEASE) is Claim.BUSY


def test_completing_an_unknown_claim_changes_nothing(backend: Backend) -> None:
    backend.store.complete("never-claimed", NOW)
    assert backend.store.claim("never-claimed", NOW, LEASE) is Claim.CLAIMED


def test_two_deliveries_racing_for_one_claim_give_it_to_exactly_one(backend: Backend) -> None:
    outcomes = race(2, lambda _: backend.store.claim("envelope-race", NOW, LEASE))
    assert sorted(claim.value for claim in outcomes) == ["busy", "claimed"]


def test_two_redeliveries_racing_for_an_expired_claim_give_it_to_exactly_one(backend: Backend) -> None:
    backend.store.claim("envelope-race", NOW, LEASE)
    later = NOW + LEASE + timedelta(seconds=1)
    outcomes = race(2, lambda _: backend.store.claim("envelope-race", later, LEASE))
    assert sorted(claim.value for claim in outcomes) == ["busy", "claimed"]


# ---------------------------------------------------------------- budget


def test_reserve_admits_within_the_limit_and_refuses_beyond_it(backend: Backend) -> None:
    # GIVEN a pool that may have two VMs drained, with web-0 drained for E1
    assert backend.store.reserve("web", "E1", ["web-0"], 2)
    # WHEN E2 asks for web-1, and E3 for web-2
    second = backend.store.reserve("web", "E2", ["web-1"], 2)
    third = backend.store.reserve("web", "E3", ["web-2"], 2)
    # THEN E2 fits, E3 does not
    assert (second, third) == (True, False)


def test_reserve_is_idempotent_per_event(backend: Backend) -> None:
    assert backend.store.reserve("web", "E1", ["web-0"], 1)
    assert backend.store.reserve("web", "E1", ["web-0"], 1)
    assert not backend.store.reserve("web", "E2", ["web-1"], 1)


def test_another_vm_of_an_admitted_event_joins_its_reservation_and_counts(backend: Backend) -> None:
    # GIVEN E1 admitted for web-0 in a pool of budget 2; web-1's own report of E1 joins it
    assert backend.store.reserve("web", "E1", ["web-0"], 2)
    assert backend.store.reserve("web", "E1", ["web-1"], 1)
    # THEN the pool counts both: E2 finds no room until E1 is released
    assert not backend.store.reserve("web", "E2", ["web-2"], 2)
    backend.store.release("web", "E1")
    assert backend.store.reserve("web", "E2", ["web-2"], 2)


def test_an_event_larger_than_the_budget_is_admitted_when_nothing_else_is_drained(backend: Backend) -> None:
    assert backend.store.reserve("web", "E1", ["web-0", "web-1", "web-2"], 1)


def test_vms_shared_by_two_events_count_once(backend: Backend) -> None:
    assert backend.store.reserve("web", "E1", ["web-0", "web-1"], 2)
    assert backend.store.reserve("web", "E2", ["web-1", "web-0"], 2)


def test_release_frees_the_slot(backend: Backend) -> None:
    backend.store.reserve("web", "E1", ["web-0"], 1)
    backend.store.release("web", "E1")
    backend.store.release("web", "E1")  # a redelivered release is harmless
    assert backend.store.reserve("web", "E2", ["web-1"], 1)


def test_pools_have_separate_budgets_and_none_is_unlimited(backend: Backend) -> None:
    assert backend.store.reserve("web", "E1", ["web-0"], 1)
    assert backend.store.reserve("db", "E2", ["db-0"], 1)
    assert all(backend.store.reserve("default", f"E{n}", [f"vm-{n}"], None) for n in range(3, 7))


@pytest.mark.parametrize("round_", range(3))
def test_two_events_racing_for_the_last_slot_are_never_both_admitted(backend: Backend, round_: int) -> None:
    # GIVEN a pool of limit 2 with one slot taken
    pool = f"web-{round_}"
    backend.store.reserve(pool, "E0", ["web-0"], 2)
    # WHEN two events reserve the last slot at the same moment
    admitted = race(2, lambda index: backend.store.reserve(pool, f"E{index + 1}", [f"web-{index + 1}"], 2))
    # THEN exactly one got it
    assert sorted(admitted) == [False, True]


# ---------------------------------------------------------------- drains


def test_drains_remember_each_vm_and_its_memento(backend: Backend) -> None:
    # GIVEN two VMs drained for an event, with mementos of different shapes
    groups: JsonObject = {"instance_groups": [{"zone": "europe-west1-b", "name": "web", "instance": "u/web-0"}]}
    backend.store.record_drain("azure:e1", "web-0", groups)
    backend.store.record_drain("azure:e1", "web.1/odd", {"readiness": True, "nested": [[1, 2], {"a": None}]})
    # THEN both come back exactly, and other events see nothing
    assert backend.store.drains("azure:e1") == {
        "web-0": groups,
        "web.1/odd": {"readiness": True, "nested": [[1, 2], {"a": None}]},
    }
    assert backend.store.drains("azure:e2") == {}


def test_a_drain_recorded_again_replaces_its_memento(backend: Backend) -> None:
    backend.store.record_drain("azure:e1", "web-0", {"v": 1})
    backend.store.record_drain("azure:e1", "web-0", {"v": 2})
    assert backend.store.drains("azure:e1") == {"web-0": {"v": 2}}


def test_forget_drain_removes_one_vm_then_the_last(backend: Backend) -> None:
    backend.store.record_drain("azure:e1", "web-0", {})
    backend.store.record_drain("azure:e1", "web-1", {})
    backend.store.forget_drain("azure:e1", "web-0")
    assert list(backend.store.drains("azure:e1")) == ["web-1"]
    backend.store.forget_drain("azure:e1", "web-1")
    backend.store.forget_drain("azure:e1", "web-1")  # a redelivered forget is harmless
    assert backend.store.drains("azure:e1") == {}


def test_the_drains_of_an_event_of_many_vms_outgrow_any_one_document(backend: Backend) -> None:
    # GIVEN 250 VMs drained for one event, each memento about 5 KB (a VM in 20 backend pools):
    # more than the 1 MiB a Firestore document holds
    pools = [
        f"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb/pool-{n}" for n in range(50)
    ]
    vms = [f"vmss-web_{n}" for n in range(250)]

    # WHEN each drain is recorded, then one forgotten
    for vm in vms:
        backend.store.record_drain("azure:e1", vm, {"memento": {"pools": pools}, "state": "removed"})
    backend.store.forget_drain("azure:e1", vms[0])

    # THEN every other one is on record, with its memento
    drains = backend.store.drains("azure:e1")
    assert sorted(drains) == sorted(vms[1:])
    assert drains[vms[-1]] == {"memento": {"pools": pools}, "state": "removed"}
    assert backend.store.drains("azure:e2") == {}


# ---------------------------------------------------------------- remembered values


def test_remember_keeps_the_first_value(backend: Backend) -> None:
    first = b"\x00\xffcommand-1"
    assert backend.store.remember("command:abc", first) == first
    assert backend.store.remember("command:abc", b"command-2") == first
    assert backend.store.remember("command:other", b"command-3") == b"command-3"


def test_recall_reads_what_remember_stored_and_never_stores(backend: Backend) -> None:
    # GIVEN a key never remembered (with characters Firestore refuses in document ids)
    key = "ended|azure:a/b__c__"

    # WHEN it is recalled, THEN there is nothing, and the recall stored nothing either
    assert backend.store.recall(key) is None
    assert backend.store.remember(key, b"first\x00\xff") == b"first\x00\xff"

    # THEN a recall reads what remember stored, and changes nothing
    assert backend.store.recall(key) == b"first\x00\xff"
    assert backend.store.remember(key, b"second") == b"first\x00\xff"
    assert backend.store.recall("ended|azure:other") is None


def test_two_retries_racing_to_remember_agree_on_one_value(backend: Backend) -> None:
    values = race(2, lambda index: backend.store.remember("command:race", f"value-{index}".encode()))
    assert values[0] == values[1]


# ---------------------------------------------------------------- waits


def test_parked_events_come_back_oldest_first_per_pool(backend: Backend) -> None:
    # GIVEN two events waiting in "web" (the later one parked first) and one in "db"
    backend.store.park("web", "azure:e2", b"envelope-2", NOW + timedelta(minutes=2))
    backend.store.park("web", "azure:e1", b"envelope-1", NOW + timedelta(minutes=1))
    backend.store.park("db", "azure:e3", b"envelope-3", NOW)
    # THEN each pool lists its own, oldest first, with their envelopes and times
    waiting = backend.store.parked("web")
    assert [(p.event_key, p.envelope, p.parked_at) for p in waiting] == [
        ("azure:e1", b"envelope-1", NOW + timedelta(minutes=1)),
        ("azure:e2", b"envelope-2", NOW + timedelta(minutes=2)),
    ]
    assert [p.event_key for p in backend.store.parked("db")] == ["azure:e3"]


def test_parking_again_replaces_the_envelope_but_keeps_the_place_in_line(backend: Backend) -> None:
    backend.store.park("web", "azure:e1", b"scheduled", NOW)
    backend.store.park("web", "azure:e2", b"other", NOW + timedelta(minutes=1))
    backend.store.park("web", "azure:e1", b"started", NOW + timedelta(minutes=5))
    waiting = backend.store.parked("web")
    assert [(p.event_key, p.envelope, p.parked_at) for p in waiting] == [
        ("azure:e1", b"started", NOW),
        ("azure:e2", b"other", NOW + timedelta(minutes=1)),
    ]


def test_unpark_removes_only_that_event(backend: Backend) -> None:
    backend.store.park("web", "azure:e1", b"1", NOW)
    backend.store.park("web", "azure:e2", b"2", NOW)
    backend.store.unpark("web", "azure:e1")
    backend.store.unpark("web", "azure:e1")
    assert [p.event_key for p in backend.store.parked("web")] == ["azure:e2"]


# ---------------------------------------------------------------- audit


def record(kind: str, vm: str, event_id: str, **fields: Any) -> AuditRecord:
    return AuditRecord(time=NOW, kind=kind, envelope_id=f"env-{event_id}", event_id=event_id, vm=vm, **fields)


def test_audit_returns_records_in_the_order_written_by_vm_and_by_event(backend: Backend) -> None:
    # GIVEN records of two events on two VMs, written in this order (all at the same `time`)
    written = [
        record("event", "web-0", "E-ONE"),
        record("decision", "web-0", "E-ONE", rule="5-azure-scheduled"),
        record("event", "web-1", "E-TWO"),
        record("action", "web-1", "E-ONE", action="drain"),
        record("action", "web-0", "E-ONE", action="approve", at=NOW + timedelta(seconds=30)),
        record("action", "web-1", "E-TWO", action="drain"),
    ]
    for entry in written:
        backend.audit.append(entry)
    # THEN queries keep the written order
    assert list(backend.audit.query()) == written
    assert list(backend.audit.query(vm="web-0")) == [written[0], written[1], written[4]]
    assert list(backend.audit.query(event_id="E-ONE")) == [written[0], written[1], written[3], written[4]]
    assert list(backend.audit.query(vm="web-1", event_id="E-TWO")) == [written[2], written[5]]


def test_audit_matches_event_ids_case_insensitively(backend: Backend) -> None:
    backend.audit.append(record("event", "web-0", "C7061BAC-AFDC-4513-B24B-AA5F13A16123"))
    found = backend.audit.query(event_id="c7061bac-afdc-4513-b24b-aa5f13a16123")
    assert [entry.event_id for entry in found] == ["C7061BAC-AFDC-4513-B24B-AA5F13A16123"]


def test_audit_round_trips_every_field_at_millisecond_precision(backend: Backend) -> None:
    # GIVEN a record with every field set and a time below the millisecond
    precise = NOW + timedelta(microseconds=123_456)
    entry = AuditRecord(
        time=precise,
        kind="action",
        envelope_id="env",
        event_id="E",
        vm="web-0",
        action="approve",
        status="scheduled",
        rule="5-azure-scheduled",
        reason="drained; approve after the drain period",
        at=precise + timedelta(seconds=30),
        detail={"resources": ["web-0", "web-1"], "nested": [[1]], "n": 1.5},
    )
    backend.audit.append(entry)
    (stored,) = backend.audit.query(vm="web-0")
    # THEN it comes back whole, its times at the audit log's millisecond precision
    assert stored.time == NOW + timedelta(microseconds=123_000)
    assert stored.at == NOW + timedelta(seconds=30, microseconds=123_000)
    assert (stored.kind, stored.rule, stored.reason, stored.detail) == (
        entry.kind,
        entry.rule,
        entry.reason,
        entry.detail,
    )


# ---------------------------------------------------------------- the core's process on each backend


@dataclass
class Recorded:
    drained: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    commands: list[Any] = field(default_factory=list)

    def locate(self, vm: str) -> JsonObject | None:
        return {"pools": ["web"]}

    def remove(self, vm: str, memento: JsonObject) -> None:
        self.drained.append(vm)

    def restore(self, vm: str, memento: JsonObject) -> None:
        self.restored.append(vm)

    def send(self, command: Any) -> None:
        self.commands.append(command)


def reboot(status: EventStatus, event_id: str = "E-REBOOT", vms: tuple[str, ...] = ("web-0", "web-1")) -> bytes:
    event: MaintenanceEvent = azure_event(
        kind=EventKind.REBOOT,
        status=status,
        event_id=event_id,
        reporter=vms[0],
        resources=vms,
        duration_seconds=-1,
        not_before=NOW + timedelta(minutes=15),
    )
    return encode(envelope_for_event(event, NOW))


def test_process_runs_a_whole_lifecycle_with_a_budget_on_this_backend(backend: Backend) -> None:
    # GIVEN a pool that may have one VM drained, and two reboots of its VMs
    world = Recorded()
    policy = Policy(pools=(Pool("web", frozenset({"web-0", "web-1"}), max_drained=1),))
    deps = Deps(
        store=backend.store, balancer=world, sender=world, audit=backend.audit, policy=policy, verifier=ReporterName()
    )
    first, second = reboot(EventStatus.SCHEDULED, "E1", ("web-0",)), reboot(EventStatus.SCHEDULED, "E2", ("web-1",))

    # WHEN both are scheduled (each delivered twice), then the first completes
    outcomes = [process(body, deps, NOW).result for body in (first, first, second, second)]
    done = process(reboot(EventStatus.COMPLETED, "E1", ("web-0",)), deps, NOW + timedelta(minutes=20))

    # THEN the duplicates did nothing, the second waited for the budget and went once the first ended
    assert outcomes == ["processed", "duplicate", "processed", "duplicate"]
    assert [taken.action for taken in done.actions] == ["restore", "drain", "approve"]
    assert (world.drained, world.restored) == (["web-0", "web-1"], ["web-0"])
    assert [command.event_id for command in world.commands] == ["E1", "E2"]
    assert backend.store.parked("web") == []
    assert [entry.kind for entry in backend.audit.query(event_id="E2")][:3] == ["event", "decision", "action"]


def test_process_drains_nothing_for_a_scheduled_step_that_comes_after_its_completion(backend: Backend) -> None:
    # GIVEN an event whose completion was processed first (the trigger's subscription is not ordered)
    world = Recorded()
    deps = Deps(
        store=backend.store, balancer=world, sender=world, audit=backend.audit, policy=Policy(), verifier=ReporterName()
    )
    process(reboot(EventStatus.COMPLETED), deps, NOW)

    # WHEN its scheduled step arrives
    late = process(reboot(EventStatus.SCHEDULED), deps, NOW + timedelta(minutes=1))

    # THEN it is acknowledged with nothing drained or approved, and audited as late
    assert [(taken.action, taken.reason) for taken in late.actions] == [
        ("none", "late: event already completed at 2026-03-01T12:00:00Z, nothing to do")
    ]
    assert (world.drained, world.commands) == ([], [])


# ---------------------------------------------------------------- Firestore specifics


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
    answers = [store.reserve("default", f"azure:{n}", LARGEST_EVENT_VMS, None) for n in range(14)]

    # WHEN the pool's document is full
    # THEN the next event is not admitted (it waits for a slot, as for a budget) instead of failing
    assert (answers[0], answers[-1]) == (True, False)
    refused = answers.index(False)
    assert answers == [True] * refused + [False] * (len(answers) - refused)
    # ... and it is admitted once another event lets its slot go
    store.release("default", "azure:0")
    assert store.reserve("default", f"azure:{refused}", LARGEST_EVENT_VMS, None)
    client.close()  # type: ignore[no-untyped-call]  # the library leaves it unannotated


@pytest.mark.peer
def test_drains_kept_in_one_document_per_event_are_still_read_and_forgotten(firestore_emulator: str) -> None:
    # GIVEN the drains of an event as earlier versions kept them: one document, a map of VMs
    client = firestore.Client(project=new_project())
    store = FirestoreStateStore(client)
    legacy = {"event_key": "azure:e1", "vms": {"web-0": '{"state": "removed"}', "web-1": "{}"}}
    client.collection("mbridge_drains").document(doc_id("azure:e1")).set(legacy)
    store.record_drain("azure:e1", "web-2", {"state": "located"})

    # WHEN they are read, and two are forgotten
    before = dict(store.drains("azure:e1"))
    store.forget_drain("azure:e1", "web-0")
    store.forget_drain("azure:e1", "web-2")

    # THEN the old and the new records are one list, and forgetting works on both
    assert before == {"web-0": {"state": "removed"}, "web-1": {}, "web-2": {"state": "located"}}
    assert dict(store.drains("azure:e1")) == {"web-1": {}}
    client.close()  # type: ignore[no-untyped-call]  # the library leaves it unannotated


# ---------------------------------------------------------------- the wired app on the emulators


@pytest.mark.peer
def test_the_wired_app_acts_once_and_publishes_commands_for_each_vm(
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

    # THEN each VM was drained through its agent and approved its own part, each command addressed
    # by the attribute `target`; the redelivery added nothing
    assert [(taken.action, taken.vm) for taken in first.actions] == [("drain", "web-0"), ("approve", "web-0")]
    assert [(taken.action, taken.vm) for taken in other.actions] == [("drain", "web-1"), ("approve", "web-1")]
    assert again.result == "duplicate"
    received = pull(subscriber, subscription, expected=4)
    assert sorted((m.attributes["type"], m.attributes["target"]) for m in received) == [
        ("approve", "web-0"),
        ("approve", "web-1"),
        ("drain", "web-0"),
        ("drain", "web-1"),
    ]
    assert pull(subscriber, subscription, expected=1, wait=2.0) == []
    assert deps.store.claim(claim_key(first.envelope_id, "web-0"), now, LEASE) is Claim.DONE
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
