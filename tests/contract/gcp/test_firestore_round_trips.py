"""How many RPCs each step of the Firestore StateStore takes, against Google's emulator: the
conditional writes that replaced transactions (a transaction is three RPCs: begin, read, commit)
must stay one or two, with the same answers (the behaviour itself is the contract suite's,
tests/contract/test_state_store.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from google.cloud import firestore

from bench.store_counting import RoundTrips, counting_firestore
from functions.core.ports import Claim
from functions.core.process import CLAIM_LEASE
from functions.gcp_app.firestore_store import FirestoreStateStore, doc_id
from tests.contract.backends import HELD_UNTIL, NOW, new_project

pytestmark = pytest.mark.peer


@dataclass
class Counted:
    store: FirestoreStateStore
    counter: RoundTrips
    client: firestore.Client

    def rpcs(self) -> int:
        return self.counter.total()[0]


@pytest.fixture
def counted(firestore_emulator: str) -> Iterator[Counted]:
    counter = RoundTrips()
    client = counting_firestore(firestore.Client(project=new_project()), counter)
    yield Counted(FirestoreStateStore(client), counter, client)
    client.close()


def test_completing_a_claim_is_one_rpc(counted: Counted) -> None:
    counted.store.claim("envelope-1", NOW, CLAIM_LEASE)
    counted.counter.reset()
    counted.store.complete("envelope-1", NOW)
    assert counted.rpcs() == 1
    assert counted.store.claim("envelope-1", NOW, CLAIM_LEASE) is Claim.DONE


def test_a_duplicate_finds_its_claim_done_in_two_rpcs(counted: Counted) -> None:
    counted.store.claim("envelope-1", NOW, CLAIM_LEASE)
    counted.store.complete("envelope-1", NOW)
    counted.counter.reset()
    assert counted.store.claim("envelope-1", NOW, CLAIM_LEASE) is Claim.DONE
    assert counted.rpcs() == 2  # the refused create, one read


def test_admitting_an_event_into_a_pool_is_a_read_and_a_write(counted: Counted) -> None:
    # An empty pool admits any event: its joins are not read
    assert counted.store.reserve("web", "azure:e1", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL)
    assert counted.counter.total() == (2, 1)
    counted.counter.reset()
    # A pool that holds events reads the VMs that joined them too, to count them
    assert counted.store.reserve("web", "azure:e2", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL)
    assert counted.counter.total() == (3, 1)


def test_a_vm_already_in_its_events_reservation_costs_one_read(counted: Counted) -> None:
    assert counted.store.reserve("web", "azure:e1", ["web-0", "web-1"], 2, now=NOW, expires_at=HELD_UNTIL)
    counted.counter.reset()
    assert counted.store.reserve("web", "azure:e1", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL)
    assert counted.counter.total() == (1, 0)


def test_releasing_a_slot_is_a_read_a_write_and_a_query_of_its_joins(counted: Counted) -> None:
    counted.store.reserve("web", "azure:e1", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL)
    counted.store.reserve("web", "azure:e2", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL)
    counted.counter.reset()
    counted.store.release("web", "azure:e1")
    assert counted.counter.total() == (3, 1)
    assert not counted.store.reserve(
        "web", "azure:e3", ["web-2", "web-3"], 2, now=NOW, expires_at=HELD_UNTIL
    )  # e2 still holds its VM


def test_forgetting_a_drain_is_a_delete_and_one_read_of_the_earlier_layout(counted: Counted) -> None:
    counted.store.record_drain("azure:e1", "web-0", {"pools": ["web"]})
    counted.counter.reset()
    counted.store.forget_drain("azure:e1", "web-0")
    assert counted.rpcs() == 2
    assert counted.store.drains("azure:e1") == {}


def test_forgetting_a_drain_of_an_event_whose_drains_were_read_is_the_delete_alone(counted: Counted) -> None:
    # As a completion does: it reads the event's drains (no document of the earlier layout among
    # them), puts the VM back, then forgets its drain
    counted.store.record_drain("azure:e1", "web-0", {"pools": ["web"]})
    assert counted.store.drains("azure:e1") == {"web-0": {"pools": ["web"]}}
    counted.counter.reset()
    counted.store.forget_drain("azure:e1", "web-0")
    assert counted.rpcs() == 1
    assert counted.store.drains("azure:e1") == {}


def test_parking_an_event_is_one_rpc_and_parking_it_again_two(counted: Counted) -> None:
    counted.store.park("web", "azure:e1|web-0", b"first", NOW)
    assert counted.rpcs() == 1
    counted.counter.reset()
    counted.store.park("web", "azure:e1|web-0", b"second", NOW.replace(hour=13))
    assert counted.rpcs() == 2  # the refused create, the update of its envelope
    [parked] = counted.store.parked("web")
    assert (parked.envelope, parked.parked_at) == (b"second", NOW)


class _RaceBeforeFirstCommit:
    """In front of a client's GAPIC stub: runs `race` once, just before the first commit goes out."""

    def __init__(self, inner: Any, race: Callable[[], object]) -> None:
        self._inner = inner
        self._race = race
        self.raced: list[object] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name != "commit":
            return attribute

        def commit(*args: Any, **kwargs: Any) -> Any:
            if not self.raced:
                self.raced.append(self._race())
            return attribute(*args, **kwargs)

        return commit


def test_a_budget_write_that_meets_another_writer_is_applied_again_to_what_it_left(firestore_emulator: str) -> None:
    # GIVEN a pool with room for one more VM, and a worker whose first budget write is preceded by
    # another worker taking that last slot (after the first one read the pool)
    project = new_project()
    first, second = firestore.Client(project=project), firestore.Client(project=project)
    other = FirestoreStateStore(second)
    other.reserve("web", "azure:e1", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL)
    racing = _RaceBeforeFirstCommit(
        first._firestore_api,
        lambda: other.reserve("web", "azure:e2", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL).admitted,
    )
    first._firestore_api_internal = racing
    # WHEN it reserves the slot
    admitted = FirestoreStateStore(first).reserve("web", "azure:e3", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL)
    # THEN its conditional write failed, it read again, and saw the pool full (a plain write would
    # have admitted a third VM into a budget of two)
    assert racing.raced == [True]
    assert not admitted
    for client in (first, second):
        client.close()  # type: ignore[no-untyped-call]  # the library leaves it unannotated


def test_a_vm_joining_an_admitted_event_writes_its_own_record_not_the_pools(counted: Counted) -> None:
    # GIVEN event e1 admitted for web-0 in a pool of budget 2 (every other VM of a large event
    # joins it, each with its own report, at about the same time)
    assert counted.store.reserve("web", "azure:e1", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL)
    [pool] = list(counted.client.collection("mbridge_budget_pools").stream())
    counted.counter.reset()
    # WHEN web-1's own report joins it
    assert counted.store.reserve("web", "azure:e1", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL)
    # THEN that is one write, of web-1's own record, between two reads of the pool (the second
    # makes sure the event did not let its slot go meanwhile): the pool's document, which the
    # other VMs read, is as it was, so their joins never conflict with this one
    assert counted.counter.total() == (3, 1)
    assert pool.reference.get().update_time == pool.update_time
    # and web-1 counts: the next event finds the pool full until e1 lets its slot go
    assert not counted.store.reserve("web", "azure:e2", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL)
    counted.store.release("web", "azure:e1")
    assert counted.store.reserve("web", "azure:e2", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL)


def test_a_vm_joining_an_event_that_lets_its_slot_go_meanwhile_admits_it_afresh(firestore_emulator: str) -> None:
    # GIVEN event e1 admitted for web-0, and a worker whose join of e1 for web-1 is preceded, after it
    # read the pool, by e1 letting its slot go (its last drained VM was put back)
    project = new_project()
    first, second = firestore.Client(project=project), firestore.Client(project=project)
    other = FirestoreStateStore(second)
    assert other.reserve("web", "azure:e1", ["web-0"], 1, now=NOW, expires_at=HELD_UNTIL)
    racing = _RaceBeforeFirstCommit(first._firestore_api, lambda: other.release("web", "azure:e1"))
    first._firestore_api_internal = racing
    # WHEN web-1 joins e1
    admitted = FirestoreStateStore(first).reserve("web", "azure:e1", ["web-1"], 1, now=NOW, expires_at=HELD_UNTIL)
    # THEN its join was taken back and e1 admitted afresh for web-1, which counts (a join of a
    # reservation that is gone would have let web-1 be drained uncounted)
    assert racing.raced == [None]
    assert admitted
    assert not other.reserve("web", "azure:e2", ["web-2"], 1, now=NOW, expires_at=HELD_UNTIL)
    assert list(second.collection("mbridge_budget_pools").document(doc_id("web")).collection("joins").stream()) == []
    for client in (first, second):
        client.close()  # type: ignore[no-untyped-call]  # the library leaves it unannotated
