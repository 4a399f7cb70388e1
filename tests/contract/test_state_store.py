"""The StateStore contract (functions/core/ports.py), role by role, on every backend: SQLite, Table
Storage (Azurite) and Firestore (Google's emulator); tests/contract/backends.py opens them.

What is true of one backend only (its keys, its limits, its errors, its wiring) is tested beside
it: tests/unit/functions/test_sqlite_store.py, tests/contract/azure/test_tables.py,
tests/contract/gcp/test_firestore.py. Races use two clients over the same state, as two workers
would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from typing import Any, TypeVar

import pytest

from functions.core.policy import Policy, Pool
from functions.core.ports import Claim, JsonObject, Reservation
from functions.core.process import CLAIM_LEASE, Deps, process
from tests.contract.backends import BACKENDS, HELD_UNTIL, NOW, Backend, open_backend, reboot
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.identity import ReporterName
from wire.model import EventStatus

LEASE = CLAIM_LEASE
T = TypeVar("T")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    with open_backend(request) as opened:
        yield opened


def race(first: Callable[[], T], second: Callable[[], T]) -> list[T]:
    """Run both at the same moment (as far as two threads can) and return both answers."""
    barrier = threading.Barrier(2)

    def run(call: Callable[[], T]) -> T:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(run, first), pool.submit(run, second)]
        return [future.result(timeout=60) for future in futures]


# ---------------------------------------------------------------- Claims


def test_a_first_claim_is_ours_and_a_second_is_busy_while_the_lease_runs(backend: Backend) -> None:
    # GIVEN an envelope nobody has claimed
    # WHEN it is claimed, and claimed again within the lease
    first = backend.store.claim("envelope-1", NOW, LEASE)
    second = backend.store.claim("envelope-1", NOW + LEASE / 2, LEASE)

    # THEN the first invocation owns it and the second must retry later
    assert (first, second) == (Claim.CLAIMED, Claim.BUSY)


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


def test_a_completed_claim_answers_done_for_ever(backend: Backend) -> None:
    # GIVEN an envelope processed to the end
    backend.store.claim("envelope-1", NOW, LEASE)
    backend.store.complete("envelope-1", NOW)

    # WHEN its duplicate arrives, even long after any lease
    answer = backend.store.claim("envelope-1", NOW + timedelta(days=3), LEASE)

    # THEN it is acknowledged as a duplicate
    assert answer is Claim.DONE


def test_an_expired_lease_is_taken_over_once(backend: Backend) -> None:
    # GIVEN a claim whose invocation died (its lease ran out)
    backend.store.claim("envelope-1", NOW, LEASE)
    later = NOW + LEASE + timedelta(seconds=1)

    # WHEN the redelivery claims it, and another copy right after
    takeover = backend.store.claim("envelope-1", later, LEASE)
    again = backend.store.claim("envelope-1", later + timedelta(seconds=1), LEASE)

    # THEN the redelivery takes it over with a fresh lease
    assert (takeover, again) == (Claim.CLAIMED, Claim.BUSY)


def test_completing_or_abandoning_an_unknown_claim_changes_nothing(backend: Backend) -> None:
    # GIVEN envelopes never claimed, completed or abandoned all the same (a bug or a lost claim)
    backend.store.complete("never-claimed", NOW)
    backend.store.abandon("never-abandoned", NOW)

    # WHEN they are claimed
    # THEN they are ours, as any first claim
    assert backend.store.claim("never-claimed", NOW, LEASE) is Claim.CLAIMED
    assert backend.store.claim("never-abandoned", NOW, LEASE) is Claim.CLAIMED


def test_keys_with_characters_stores_forbid_stay_distinct(backend: Backend) -> None:
    # GIVEN keys with characters Table keys or Firestore ids refuse, and an escape of one of them
    keys = ["a/b", "a%2Fb", "a\\b", "a#b", "a?b", "a\tb", "a%b", "__a__", ".."]

    # WHEN each is claimed
    answers = [backend.store.claim(key, NOW, LEASE) for key in keys]

    # THEN every one is its own claim
    assert answers == [Claim.CLAIMED] * len(keys)


@pytest.mark.parametrize("expired", [False, True], ids=["new", "expired"])
def test_two_workers_racing_for_a_claim_take_it_once(backend: Backend, expired: bool) -> None:
    # GIVEN an envelope never claimed, or claimed by an invocation that died, and two workers holding it
    if expired:
        backend.store.claim("envelope-1", NOW, LEASE)
    later = NOW + LEASE * 2
    other = backend.another_client()

    # WHEN both claim it at once
    answers = race(
        lambda: backend.store.claim("envelope-1", later, LEASE),
        lambda: other.claim("envelope-1", later, LEASE),
    )

    # THEN exactly one of them processes it
    assert sorted(answers) == [Claim.BUSY, Claim.CLAIMED]


# ---------------------------------------------------------------- Budget


def test_reserve_admits_within_the_limit_and_refuses_beyond_it(backend: Backend) -> None:
    # GIVEN a pool of budget 2 with one VM drained by event A
    assert backend.store.reserve("web", "azure:a", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL)

    # WHEN event B asks for one more VM, then event C for another
    second = backend.store.reserve("web", "azure:b", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL).admitted
    third = backend.store.reserve("web", "azure:c", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL).admitted

    # THEN B fits and C waits
    assert (second, third) == (True, False)


def test_an_event_alone_in_its_pool_is_admitted_whatever_its_size(backend: Backend) -> None:
    # GIVEN an empty pool of budget 1
    # WHEN one event asks for three VMs
    # THEN it goes: nothing else is drained (docs/contracts.md#budget-and-trust)
    assert backend.store.reserve("web", "azure:a", ["web-0", "web-1", "web-2"], 1, now=NOW, expires_at=HELD_UNTIL)


def test_reserve_is_idempotent_per_event(backend: Backend) -> None:
    # GIVEN event A admitted into a full pool of budget 1
    assert backend.store.reserve("web", "azure:a", ["web-0"], 1, now=NOW, expires_at=HELD_UNTIL)

    # WHEN A asks again (a retry), and B asks for another VM
    retry = backend.store.reserve("web", "azure:a", ["web-0"], 1, now=NOW, expires_at=HELD_UNTIL).admitted
    other = backend.store.reserve("web", "azure:b", ["web-1"], 1, now=NOW, expires_at=HELD_UNTIL).admitted

    # THEN A is admitted again and takes no second slot: B still waits
    assert (retry, other) == (True, False)


def test_vms_shared_by_two_events_count_once(backend: Backend) -> None:
    # GIVEN event A holding web-0 and web-1 in a pool of budget 2
    assert backend.store.reserve("web", "azure:a", ["web-0", "web-1"], 2, now=NOW, expires_at=HELD_UNTIL)

    # WHEN B asks for VMs A already holds
    # THEN it is admitted: no new VM leaves the pool
    assert backend.store.reserve("web", "azure:b", ["web-1", "web-0"], 2, now=NOW, expires_at=HELD_UNTIL)


def test_another_vm_of_an_admitted_event_joins_its_reservation_and_counts(backend: Backend) -> None:
    # GIVEN event A admitted for web-0 in a pool of budget 2
    assert backend.store.reserve("web", "azure:a", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL)

    # WHEN web-1's own report of A asks for it, whatever the limit (A is admitted already)
    joined = backend.store.reserve("web", "azure:a", ["web-1"], 1, now=NOW, expires_at=HELD_UNTIL).admitted

    # THEN it is admitted, and the pool counts both: event B finds no room until A is released
    assert joined
    assert not backend.store.reserve("web", "azure:b", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL)
    backend.store.release("web", "azure:a")
    assert backend.store.reserve("web", "azure:b", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL)


def test_the_vms_that_joined_an_event_are_forgotten_when_it_lets_its_slot_go(backend: Backend) -> None:
    # GIVEN event A admitted for web-0 in a pool of budget 2, joined by web-1, then released
    assert backend.store.reserve("web", "azure:a", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL)
    assert backend.store.reserve("web", "azure:a", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL)
    backend.store.release("web", "azure:a")

    # WHEN A is admitted again for web-0 (a later maintenance with the same id), and B asks for one VM
    again = backend.store.reserve("web", "azure:a", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL).admitted
    other = backend.store.reserve("web", "azure:b", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL).admitted

    # THEN both go: web-1's join ended with A's first reservation, it is not counted again
    assert (again, other) == (True, True)


def test_a_vm_joining_an_event_admitted_alone_still_counts_and_goes_with_its_release(backend: Backend) -> None:
    # GIVEN event A admitted alone for web-0 (its report named no other VM) in a pool of budget 2
    assert backend.store.reserve("web", "azure:a", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL, alone=True)

    # WHEN web-1's report of A joins it all the same, twice (a redelivery)
    joined = backend.store.reserve("web", "azure:a", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL, alone=True)
    again = backend.store.reserve("web", "azure:a", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL, alone=True)

    # THEN it counts with A: B finds no room until A is released, and then A's join counts no more
    assert (joined.admitted, again.admitted) == (True, True)
    assert not backend.store.reserve("web", "azure:b", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL)
    backend.store.release("web", "azure:a")
    assert backend.store.reserve("web", "azure:a", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL, alone=True)
    assert backend.store.reserve("web", "azure:b", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL)


def test_release_frees_the_slot_and_pools_are_separate(backend: Backend) -> None:
    # GIVEN a full pool of budget 1, and another pool
    assert backend.store.reserve("web", "azure:a", ["web-0"], 1, now=NOW, expires_at=HELD_UNTIL)
    assert not backend.store.reserve("web", "azure:b", ["web-1"], 1, now=NOW, expires_at=HELD_UNTIL)
    assert backend.store.reserve("db", "azure:c", ["db-0"], 1, now=NOW, expires_at=HELD_UNTIL)

    # WHEN the first event releases its slot (twice: a redelivery), and an unknown event releases
    backend.store.release("web", "azure:a")
    backend.store.release("web", "azure:a")
    backend.store.release("web", "azure:unknown")

    # THEN the waiting event fits, and the other pool is as it was
    assert backend.store.reserve("web", "azure:b", ["web-1"], 1, now=NOW, expires_at=HELD_UNTIL)
    assert not backend.store.reserve("db", "azure:d", ["db-1"], 1, now=NOW, expires_at=HELD_UNTIL)


def test_no_limit_admits_everything(backend: Backend) -> None:
    # GIVEN an unlimited pool holding one event
    assert backend.store.reserve("default", "azure:a", ["vm-0"], None, now=NOW, expires_at=HELD_UNTIL)

    # WHEN many more ask
    # THEN all are admitted
    assert all(
        backend.store.reserve("default", f"azure:{n}", [f"vm-{n}"], None, now=NOW, expires_at=HELD_UNTIL)
        for n in range(1, 6)
    )


@pytest.mark.parametrize("round_", range(5))
def test_two_events_racing_for_the_last_slot_admit_exactly_one(backend: Backend, round_: int) -> None:
    # GIVEN a pool of budget 2 with one slot taken, and two workers
    pool = f"web-{round_}"
    assert backend.store.reserve(pool, "azure:a", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL)
    other = backend.another_client()

    # WHEN two events ask for the last slot at the same moment
    answers = race(
        lambda: backend.store.reserve(pool, "azure:b", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL).admitted,
        lambda: other.reserve(pool, "azure:c", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL).admitted,
    )

    # THEN exactly one is admitted, and the budget holds afterwards
    assert sorted(answers) == [False, True]
    assert not backend.store.reserve(pool, "azure:d", ["web-3"], 2, now=NOW, expires_at=HELD_UNTIL)


def test_a_budget_read_a_moment_ago_is_only_a_first_guess(backend: Backend) -> None:
    # GIVEN a pool of budget 2 holding event A, read by a step (its glance) before it reserves
    assert backend.store.reserve("web", "azure:a", ["web-0"], 2, now=NOW, expires_at=HELD_UNTIL)
    stale = backend.store.glance([], pools=["web"]).budgets.get("web")
    # ... and, since, another worker took the last slot for event B
    assert backend.another_client().reserve("web", "azure:b", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL)

    # WHEN event C reserves with that read as its first
    late = backend.store.reserve("web", "azure:c", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL, seen=stale)

    # THEN it is refused: the budget is as stored, not as read
    assert not late
    # AND a read that saw the pool full, once a slot is free again, admits on a fresh read
    full = backend.store.glance([], pools=["web"]).budgets.get("web")
    backend.another_client().release("web", "azure:b")
    assert backend.store.reserve("web", "azure:c", ["web-2"], 2, now=NOW, expires_at=HELD_UNTIL, seen=full)
    assert not backend.store.reserve("web", "azure:d", ["web-3"], 2, now=NOW, expires_at=HELD_UNTIL)


def test_an_expired_reservation_no_longer_counts_and_is_reported_once(backend: Backend) -> None:
    # GIVEN a pool of budget 1 held by event A until NOW + 30 min
    until = NOW + timedelta(minutes=30)
    assert backend.store.reserve("web", "azure:a", ["web-0"], 1, now=NOW, expires_at=until)

    # WHEN B asks just before A's expiry, then at it, then C asks (another client) after B's admission
    before = backend.store.reserve(
        "web", "azure:b", ["web-1"], 1, now=until - timedelta(seconds=1), expires_at=HELD_UNTIL
    )
    at = backend.store.reserve("web", "azure:b", ["web-1"], 1, now=until, expires_at=HELD_UNTIL)
    after = backend.another_client().reserve("web", "azure:c", ["web-2"], 1, now=until, expires_at=HELD_UNTIL)

    # THEN B waits, then is admitted in A's place, which is reported once, with its terms; C waits for B
    assert (before.admitted, before.expired) == (False, ())
    assert at.admitted
    assert at.expired == (Reservation("azure:a", ("web-0",), NOW, until),)
    assert (after.admitted, after.expired) == (False, ())
    # (A's release, when its end comes after all, changes nothing)
    backend.store.release("web", "azure:a")
    assert not backend.store.reserve("web", "azure:d", ["web-3"], 1, now=until, expires_at=HELD_UNTIL)


def test_an_expired_reservation_is_removed_and_reported_also_when_the_event_still_waits(backend: Backend) -> None:
    # GIVEN a pool of budget 1: A's reservation expires at NOW + 10 min, B (a larger event) holds until later
    soon = NOW + timedelta(minutes=10)
    assert backend.store.reserve("web", "azure:a", ["web-0"], 2, now=NOW, expires_at=soon)
    assert backend.store.reserve("web", "azure:b", ["web-1"], 2, now=NOW, expires_at=HELD_UNTIL)

    # WHEN C asks for two VMs after A expired, and again
    first = backend.store.reserve("web", "azure:c", ["web-2", "web-3"], 2, now=soon, expires_at=HELD_UNTIL)
    second = backend.store.reserve("web", "azure:c", ["web-2", "web-3"], 2, now=soon, expires_at=HELD_UNTIL)

    # THEN C waits for B, and A's expiry is reported by the first call only
    assert (first.admitted, [held.event_key for held in first.expired]) == (False, ["azure:a"])
    assert (second.admitted, second.expired) == (False, ())


def test_a_later_report_of_an_admitted_event_never_extends_its_hold(backend: Backend) -> None:
    # GIVEN event A admitted until NOW + 30 min, joined by web-1's report with a later expiry
    until = NOW + timedelta(minutes=30)
    assert backend.store.reserve("web", "azure:a", ["web-0"], 2, now=NOW, expires_at=until)
    assert backend.store.reserve("web", "azure:a", ["web-1"], 2, now=NOW, expires_at=until + timedelta(hours=1))

    # WHEN B asks at A's first expiry
    answer = backend.store.reserve("web", "azure:b", ["web-2", "web-3"], 2, now=until, expires_at=HELD_UNTIL)

    # THEN A no longer counts, with its VMs as admitted (the joined ones are forgotten with it)
    assert answer.admitted
    assert [(held.event_key, held.expires_at) for held in answer.expired] == [("azure:a", until)]


def test_an_event_whose_own_reservation_expired_is_admitted_afresh(backend: Backend) -> None:
    # GIVEN event A whose reservation expired, alone in its pool
    until = NOW + timedelta(minutes=30)
    assert backend.store.reserve("web", "azure:a", ["web-0"], 1, now=NOW, expires_at=until)

    # WHEN a later step of A asks again
    again = backend.store.reserve("web", "azure:a", ["web-0"], 1, now=until, expires_at=until + timedelta(minutes=15))

    # THEN its old reservation is reported expired, and it holds a new one, which counts
    assert again.admitted
    assert [held.event_key for held in again.expired] == ["azure:a"]
    later = until + timedelta(minutes=1)
    assert not backend.store.reserve("web", "azure:b", ["web-1"], 1, now=later, expires_at=HELD_UNTIL)


# ---------------------------------------------------------------- DrainLedger


def test_drains_are_remembered_per_event_with_their_mementos(backend: Backend) -> None:
    # GIVEN VMs drained for event A, with mementos of different shapes, and one for event B
    memento = {"azure_lb": {"nic": [{"nic_id": "/subscriptions/s/x", "ip_configuration": "ipconfig1", "pools": []}]}}
    nested: JsonObject = {"readiness": True, "nested": [[1, 2], {"a": None}]}
    backend.store.record_drain("azure:a", "web-0", memento)
    backend.store.record_drain("azure:a", "web.1/odd", nested)
    backend.store.record_drain("azure:a", "web-2", {})
    backend.store.record_drain("azure:b", "web-3", {"readiness": True})

    # WHEN each event's drains are read
    # THEN each sees its own, exactly as recorded (arrays in arrays too), and other events nothing
    assert dict(backend.store.drains("azure:a")) == {"web-0": memento, "web.1/odd": nested, "web-2": {}}
    assert dict(backend.store.drains("azure:b")) == {"web-3": {"readiness": True}}
    assert dict(backend.store.drains("azure:none")) == {}


def test_a_drain_recorded_again_replaces_its_memento(backend: Backend) -> None:
    # GIVEN a VM whose drain was recorded when located
    backend.store.record_drain("azure:a", "web-0", {"state": "located"})

    # WHEN it is recorded again once removed
    backend.store.record_drain("azure:a", "web-0", {"state": "removed"})

    # THEN the latest memento wins
    assert dict(backend.store.drains("azure:a")) == {"web-0": {"state": "removed"}}


def test_forget_drain_removes_one_vm_then_the_last(backend: Backend) -> None:
    # GIVEN two VMs drained for event A, and one for event B
    backend.store.record_drain("azure:a", "web-0", {})
    backend.store.record_drain("azure:a", "web/1", {})
    backend.store.record_drain("azure:b", "web-0", {})

    # WHEN A's VMs are restored one by one (the last one twice: a redelivery)
    backend.store.forget_drain("azure:a", "web-0")
    after_one = dict(backend.store.drains("azure:a"))
    backend.store.forget_drain("azure:a", "web/1")
    backend.store.forget_drain("azure:a", "web/1")

    # THEN each forget removes that VM only, and of that event only
    assert after_one == {"web/1": {}}
    assert dict(backend.store.drains("azure:a")) == {}
    assert dict(backend.store.drains("azure:b")) == {"web-0": {}}


def test_glance_reads_the_values_and_drains_asked_and_stores_nothing(backend: Backend) -> None:
    # GIVEN an event's end remembered, drains of two of its VMs, and another event's drain
    backend.store.remember("ended|azure:a|web-0", b"ended\x00")
    backend.store.record_drain("azure:a", "web-0", {"state": "removed"})
    backend.store.record_drain("azure:a", "web/1", {"state": "located"})
    backend.store.record_drain("azure:b", "web-2", {})

    # WHEN a step glances at two remembered keys, three VMs of event A and a pool's budget
    glanced = backend.store.glance(
        ["ended|azure:a|web-0", "ended|azure:a|web/1"], "azure:a", ["web-0", "web/1", "web-2"], ["web"]
    )

    # THEN it reads what is stored (nothing for what is not), and changes nothing
    assert dict(glanced.recalled) == {"ended|azure:a|web-0": b"ended\x00", "ended|azure:a|web/1": None}
    assert dict(glanced.drains) == {"web-0": {"state": "removed"}, "web/1": {"state": "located"}}
    assert backend.store.recall("ended|azure:a|web/1") is None
    assert backend.store.glance(["ended|azure:z"]).drains == {}
    assert backend.store.reserve("web", "azure:a", ["web-0"], 1, now=NOW, expires_at=HELD_UNTIL)


def test_a_drain_is_recorded_unless_its_event_ended_and_the_end_is_returned(backend: Backend) -> None:
    # GIVEN an event not ended yet
    # WHEN a VM's drain is recorded on that condition
    first = backend.store.record_drain_unless("azure:a", "web-0", {"state": "removed"}, "ended|azure:a|web-0")

    # THEN it is recorded, and nothing is returned nor remembered
    assert first is None
    assert dict(backend.store.drains("azure:a")) == {"web-0": {"state": "removed"}}
    assert backend.store.recall("ended|azure:a|web-0") is None

    # WHEN the event's end is remembered (by another worker), and another VM's drain is recorded
    backend.another_client().remember("ended|azure:a|web-1", b"completed")
    found = backend.store.record_drain_unless("azure:a", "web-1", {"state": "removed"}, "ended|azure:a|web-1")

    # THEN the end is returned, as remembered (the record may be written or not: the caller puts back
    # what it drained either way)
    assert found == b"completed"
    assert backend.store.recall("ended|azure:a|web-1") == b"completed"


def test_all_drains_lists_every_event_s_drains_in_order_and_nothing_else(backend: Backend) -> None:
    # GIVEN drains of two events (one with a key Table keys escape), a forgotten one, and other state
    backend.store.record_drain("gce:b/1", "vm-0", {"state": "removed", "drained_at": "2026-03-01T12:00:00.000Z"})
    backend.store.record_drain("azure:a", "web-1", {"memento": {"pools": ["web"]}, "state": "removed"})
    backend.store.record_drain("azure:a", "web-0", {"state": "located"})
    backend.store.record_drain("azure:a", "web-2", {})
    backend.store.forget_drain("azure:a", "web-2")
    backend.store.claim("drain:azure:a", NOW, LEASE)
    backend.store.park("web", "drain;x", b"{}", NOW)
    backend.store.remember("drain:azure:z", b"not a drain")

    # WHEN every drain is listed (the operator's recovery)
    listed = backend.store.all_drains()

    # THEN each VM still drained is there once, with its record, by event then VM
    assert [(drain.event_key, drain.vm, drain.record) for drain in listed] == [
        ("azure:a", "web-0", {"state": "located"}),
        ("azure:a", "web-1", {"memento": {"pools": ["web"]}, "state": "removed"}),
        ("gce:b/1", "vm-0", {"state": "removed", "drained_at": "2026-03-01T12:00:00.000Z"}),
    ]


def test_all_drains_of_an_empty_ledger_is_empty(backend: Backend) -> None:
    assert list(backend.store.all_drains()) == []


# ---------------------------------------------------------------- Memory


def test_remember_keeps_the_first_value(backend: Backend) -> None:
    # GIVEN a command remembered under its key
    first = b'{"command_id":"c1","issued_at":"2026-03-01T12:00:00Z"}\x00\xff'
    assert backend.store.remember("command:c1", first) == first

    # WHEN a retry re-builds it with another issued_at, and another command is remembered
    answer = backend.store.remember("command:c1", b'{"command_id":"c1","issued_at":"2026-03-01T12:00:09Z"}')
    other = backend.store.remember("command:c2", b"command-2")

    # THEN the retry gets the very bytes of the first attempt; another key keeps its own
    assert (answer, other) == (first, b"command-2")


def test_recall_reads_what_remember_stored_and_never_stores(backend: Backend) -> None:
    # GIVEN a key with characters Table keys and Firestore ids refuse, never remembered
    key = "ended|azure:a/b\\c#d?e%f__g__"

    # WHEN it is recalled, THEN there is nothing, and the recall stored nothing either
    assert backend.store.recall(key) is None
    assert backend.store.remember(key, b"first\x00\xff") == b"first\x00\xff"

    # THEN a recall reads what remember stored, from any client, and a recall changes nothing
    assert backend.store.recall(key) == b"first\x00\xff"
    assert backend.another_client().recall(key) == b"first\x00\xff"
    assert backend.store.remember(key, b"second") == b"first\x00\xff"
    assert backend.store.recall("ended|azure:other") is None


def test_two_retries_racing_to_remember_agree_on_one_value(backend: Backend) -> None:
    # GIVEN two workers building the same command with different bytes
    other = backend.another_client()

    # WHEN both remember it at once
    answers = race(
        lambda: backend.store.remember("command:race", b"value-0"),
        lambda: other.remember("command:race", b"value-1"),
    )

    # THEN both send the same bytes
    assert answers[0] == answers[1]


# ---------------------------------------------------------------- Parking


def test_parked_events_come_oldest_first_and_keep_their_place(backend: Backend) -> None:
    # GIVEN three events waiting in a pool (parked out of key order) and one in another pool
    backend.store.park("web", "azure:c", b"c-1", NOW)
    backend.store.park("web", "azure:a", b"a-1", NOW + timedelta(seconds=1))
    backend.store.park("web", "azure:b", b"b-1", NOW + timedelta(seconds=2))
    backend.store.park("db", "azure:d", b"d-1", NOW)

    # WHEN the oldest is parked again with a later envelope, and the newest leaves
    backend.store.park("web", "azure:c", b"c-2", NOW + timedelta(seconds=5))
    backend.store.unpark("web", "azure:b")

    # THEN the line is unchanged but for the one that left, with the newer envelope
    parked = backend.store.parked("web")
    assert [(p.event_key, p.envelope, p.parked_at) for p in parked] == [
        ("azure:c", b"c-2", NOW),
        ("azure:a", b"a-1", NOW + timedelta(seconds=1)),
    ]
    assert [p.event_key for p in backend.store.parked("db")] == ["azure:d"]


def test_events_parked_at_the_same_moment_wait_in_key_order(backend: Backend) -> None:
    # GIVEN two events parked at the same moment, the later key first
    backend.store.park("web", "azure:e2", b"2", NOW)
    backend.store.park("web", "azure:e1", b"1", NOW)

    # WHEN the line is read
    # THEN ties go by event key
    assert [p.event_key for p in backend.store.parked("web")] == ["azure:e1", "azure:e2"]


def test_unpark_removes_only_that_event(backend: Backend) -> None:
    # GIVEN two events waiting in a pool, and the same event key waiting in another
    backend.store.park("web", "azure:e1", b"1", NOW)
    backend.store.park("web", "azure:e2", b"2", NOW)
    backend.store.park("db", "azure:e1", b"3", NOW)

    # WHEN one leaves its pool (twice: a redelivery)
    backend.store.unpark("web", "azure:e1")
    backend.store.unpark("web", "azure:e1")

    # THEN the others still wait
    assert [p.event_key for p in backend.store.parked("web")] == ["azure:e2"]
    assert [p.event_key for p in backend.store.parked("db")] == ["azure:e1"]
    assert backend.store.parked("none") == []


# ---------------------------------------------------------------- sizes that come from the input
# The largest values an event can bring must fit every store: a Table Storage property holds at
# most 64 KiB and an entity 1 MiB, a Firestore document 1 MiB (the peers refuse more, as the clouds do).

# 1,000 VMs (the most an event lists) of 80 characters (the longest name): 83,000 characters of JSON.
LARGEST_EVENT_VMS = [f"vmss-{n:04d}-" + "x" * 70 + f"_{n:03d}" for n in range(1000)]


def test_an_event_of_a_thousand_long_vm_names_takes_its_budget_slot(backend: Backend) -> None:
    # GIVEN a pool of budget 1000, and the largest event there can be
    # WHEN it reserves its slot, and another event asks for one VM more
    admitted = backend.store.reserve("web", "azure:a", LARGEST_EVENT_VMS, 1000, now=NOW, expires_at=HELD_UNTIL).admitted
    second = backend.store.reserve("web", "azure:b", ["web-extra"], 1000, now=NOW, expires_at=HELD_UNTIL).admitted

    # THEN the first is admitted and every one of its VMs counts against the budget
    assert (admitted, second) == (True, False)
    backend.store.release("web", "azure:a")
    assert backend.store.reserve("web", "azure:b", ["web-extra"], 1000, now=NOW, expires_at=HELD_UNTIL)


def test_a_memento_larger_than_a_property_is_kept_whole(backend: Backend) -> None:
    # GIVEN a VM in 400 backend pools: a memento of about 100 KB
    pools = [
        f"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb/pool-{n}" for n in range(400)
    ]
    memento = {"memento": {"nic": [{"nic_id": "/subscriptions/s/nic-0", "pools": pools}]}, "state": "removed"}

    # WHEN its drain is recorded and read back
    backend.store.record_drain("azure:a", "web-0", memento)

    # THEN it comes back as it was; recording a small one again replaces it whole
    assert dict(backend.store.drains("azure:a")) == {"web-0": memento}
    backend.store.record_drain("azure:a", "web-0", {"state": "located"})
    assert dict(backend.store.drains("azure:a")) == {"web-0": {"state": "located"}}


def test_the_drains_of_an_event_of_many_vms_outgrow_any_one_document(backend: Backend) -> None:
    # GIVEN 250 VMs drained for one event, each memento about 5 KB (a VM in 50 backend pools):
    # more than one Firestore document or Table entity holds
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
    assert dict(backend.store.drains("azure:e2")) == {}


def test_a_value_and_an_envelope_larger_than_a_property_are_kept_whole(backend: Backend) -> None:
    # GIVEN a remembered value of 100 KB and an envelope of 250 KB waiting for the budget
    value = bytes(range(256)) * 400
    envelope = b"e" * (250 * 1024)

    # WHEN they are stored, then the envelope is replaced by a small one
    assert backend.store.remember("command:big", value) == value
    backend.store.park("web", "azure:a", envelope, NOW)
    (parked,) = backend.store.parked("web")
    backend.store.park("web", "azure:a", b"small", NOW + timedelta(seconds=1))

    # THEN each reads back whole, the replacement without a trace of the larger one
    assert backend.store.recall("command:big") == value
    assert parked.envelope == envelope
    assert [(p.envelope, p.parked_at) for p in backend.store.parked("web")] == [(b"small", NOW)]


# ---------------------------------------------------------------- the core's process on every backend


def _deps(backend: Backend, balancer: FakeBalancer, sender: RecordingSender, policy: Policy | None = None) -> Deps:
    return Deps(
        store=backend.store,
        balancer=balancer,
        sender=sender,
        audit=backend.audit,
        policy=policy or Policy(),
        verifier=ReporterName(),
        monotonic=FakeClock().monotonic,
    )


def test_process_runs_a_whole_lifecycle_with_a_budget_on_this_backend(backend: Backend) -> None:
    # GIVEN a pool that may have one VM drained, and two reboots of its VMs
    balancer, sender = FakeBalancer({"web": ["web-0", "web-1"]}), RecordingSender()
    policy = Policy(pools=(Pool("web", frozenset({"web-0", "web-1"}), max_drained=1),))
    deps = _deps(backend, balancer, sender, policy)
    first, second = reboot(EventStatus.SCHEDULED, "E1", ("web-0",)), reboot(EventStatus.SCHEDULED, "E2", ("web-1",))

    # WHEN both are scheduled (each delivered twice), then the first completes
    outcomes = [process(body, deps, NOW).result for body in (first, first, second, second)]
    done = process(reboot(EventStatus.COMPLETED, "E1", ("web-0",)), deps, NOW + timedelta(minutes=20))

    # THEN the duplicates did nothing, the second waited for the budget and went once the first ended
    assert outcomes == ["processed", "duplicate", "processed", "duplicate"]
    assert [taken.action for taken in done.actions] == ["restore", "drain", "approve"]
    assert (balancer.drained, balancer.restored) == (["web-0", "web-1"], ["web-0"])
    assert [command.event_id for command in sender.commands] == ["E1", "E2"]
    assert backend.store.parked("web") == []
    assert [entry.kind for entry in backend.audit.query(event_id="E2")][:3] == ["event", "decision", "action"]


def test_process_drains_nothing_for_a_scheduled_step_that_comes_after_its_completion(backend: Backend) -> None:
    # GIVEN an event whose completion was processed first (the trigger's subscription is not ordered)
    balancer, sender = FakeBalancer({"web": ["web-0", "web-1"]}), RecordingSender()
    deps = _deps(backend, balancer, sender)
    process(reboot(EventStatus.COMPLETED), deps, NOW)

    # WHEN its scheduled step arrives
    late = process(reboot(EventStatus.SCHEDULED), deps, NOW + timedelta(minutes=1))

    # THEN it is acknowledged with nothing drained or approved, and audited as late
    assert [(taken.action, taken.reason) for taken in late.actions] == [
        ("none", "late: event already completed at 2026-03-01T12:00:00Z, nothing to do")
    ]
    assert (balancer.drained, sender.commands) == ([], [])


def test_process_puts_back_a_vm_whose_event_completed_while_it_was_taken_out(backend: Backend) -> None:
    # GIVEN a scheduled step of a VM's own event, and its completion processed by another worker
    # while the step's removal is under way (the completion finds the VM located, still in its pool)
    balancer, sender = FakeBalancer({"web": ["web-0", "web-1"]}), RecordingSender()
    deps = _deps(backend, balancer, sender)
    other = replace(deps, store=backend.another_client())
    completions: list[Any] = []
    own = ("web-0",)
    balancer.on(
        "remove",
        lambda vm: completions.append(process(reboot(EventStatus.COMPLETED, vms=own), other, NOW)),
        times=1,
    )

    # WHEN the step goes on: it takes web-0 out, records it removed with its check of the end
    outcome = process(reboot(EventStatus.SCHEDULED, vms=own), deps, NOW)

    # THEN it finds the end and puts web-0 back itself: nothing is left out, nothing approved
    assert [taken.action for taken in completions[0].actions] == ["restore"]
    assert [(taken.action, taken.vm) for taken in outcome.actions] == [("drain", "web-0"), ("restore", "web-0")]
    assert balancer.members("web") == ["web-0", "web-1"]
    assert sender.commands == []
    assert dict(backend.store.drains("azure:e-reboot")) == {}
