"""A verified report speaks only for its own VM: the attacks of a compromised VM, at the core.

The proofs here come from a stand-in of the `IdentityVerifier` port that binds a VM name to the
message digest the way the real proofs do (tests/identity.py; functions/trust/ checks the
cloud-signed ones).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import pytest

from functions.core.policy import Policy, PolicyError, Pool, policy_from_mapping
from functions.core.process import Deps, Outcome, process
from functions.core.proofs_seen import ProofsSeen
from functions.local_app.balancer import LocalPool
from functions.local_app.store import SqliteStore
from tests.factories import azure_event
from tests.identity import ProofsOfTest, proven
from tests.kit import FakeClock, RecordingSender
from wire.envelope import encode, envelope_for_command_result, envelope_for_event
from wire.identity import GCE_TOKEN
from wire.model import Cloud, CommandResult, EventKind, EventStatus, MaintenanceEvent

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
SET = ("web-0", "web-1", "web-2", "web-3", "web-4", "web-5")


@dataclass
class World:
    store: SqliteStore
    pool: LocalPool
    sent: RecordingSender
    policy: Policy = field(default_factory=Policy)
    clock: FakeClock = field(default_factory=lambda: FakeClock(NOW))  # the invocation's elapsed time

    def deps(self) -> Deps:
        return Deps(
            self.store,
            self.pool,
            self.sent,
            self.store,
            self.policy,
            verifier=ProofsOfTest(),
            monotonic=self.clock.monotonic,
        )

    def deliver(self, body: bytes, at: datetime = NOW) -> Outcome:
        return process(body, self.deps(), at)

    def report(self, event: MaintenanceEvent, by: str, at: datetime = NOW) -> Outcome:
        return self.deliver(proven(envelope_for_event(event, at), by), at)

    def members(self) -> list[str]:
        return self.pool.members("web")

    def audit(self, kind: str) -> list[str]:
        return [record.reason for record in self.store.query() if record.kind == kind]


WorldType = TypeVar("WorldType", bound=World)


@contextmanager
def opened(kind: type[WorldType], vms: tuple[str, ...], path: Path | str = ":memory:") -> Iterator[WorldType]:
    """A world of `kind` whose pool `web` holds `vms`, on stores in memory (its store and audit log
    on the database file `path` when given)."""
    pool = LocalPool(":memory:")
    pool.add("web", vms)
    store = SqliteStore(path)
    try:
        yield kind(store, pool, RecordingSender())
    finally:
        store.close()
        pool.close()


@pytest.fixture
def world() -> Iterator[World]:
    with opened(World, SET) as made:
        yield made


def reboot(status: EventStatus = EventStatus.SCHEDULED, of: str = "web-0", **fields: Any) -> MaintenanceEvent:
    values: dict[str, Any] = {
        "kind": EventKind.REBOOT,
        "status": status,
        "reporter": of,
        "resources": (of,),
        "duration_seconds": -1,
        "not_before": NOW + timedelta(minutes=15),
        "event_id": "E-REBOOT",
    }
    values.update(fields)
    return azure_event(**values)


def test_another_vms_genuine_reboot_republished_as_a_short_freeze_is_refused_and_the_genuine_one_is_handled(
    world: World,
) -> None:
    # GIVEN web-0's genuine Reboot, republished by a compromised web-1 as a 5 s Freeze of web-0
    # (same event id, so the same envelope id), with web-1's own valid proof
    genuine = reboot()
    forged = replace(genuine, kind=EventKind.FREEZE, duration_seconds=5)
    assert envelope_for_event(forged, NOW).id == envelope_for_event(genuine, NOW).id

    # WHEN the forgery arrives first
    refused = world.report(forged, by="web-1")

    # THEN nothing is approved or drained, and the audit log says why
    assert refused.result == "unverified"
    assert world.sent.commands == []
    assert world.members() == list(SET)
    assert world.audit("unverified") == ["unverified: the proof is web-1's, the report says it comes from web-0"]

    # AND web-0's own report afterwards is no duplicate: drained, approved after the drain period
    handled = world.report(genuine, by="web-0")
    assert handled.result == "processed"
    assert [(a.action, a.vm) for a in handled.actions] == [("drain", "web-0"), ("approve", "web-0")]
    (approval,) = world.sent.commands
    assert approval.execute_at == NOW + timedelta(seconds=30)
    assert "web-0" not in world.members()


def test_a_key_ground_to_match_a_genuine_attested_document_is_refused_alerted_and_the_genuine_report_counts(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN web-0's genuine Reboot, proven with its attested document D and the key K1 it was issued for
    genuine = reboot()
    handled = world.deliver(proven(envelope_for_event(genuine, NOW), "web-0", document="D", key="K1"))
    assert [(a.action, a.vm) for a in handled.actions] == [("drain", "web-0"), ("approve", "web-0")]

    # WHEN an attacker who lifted D from the bus ground a key K2 whose nonce matches D's, and sends
    # the same event as a 5 s Freeze (the same envelope id) signed with it: every signature checks out
    forged = replace(genuine, kind=EventKind.FREEZE, duration_seconds=5)
    refused = world.deliver(proven(envelope_for_event(forged, NOW), "web-0", document="D", key="K2"))

    # THEN it is refused, audited and alerted on; nothing more is approved
    assert refused.result == "unverified"
    (reason,) = world.audit("unverified")
    assert "first seen with another key" in reason
    assert [r.alert for r in caplog.records if getattr(r, "alert", None)] == ["proof-reused"]  # type: ignore[attr-defined]
    assert len(world.sent.commands) == 1
    # AND the genuine agent's later messages with D and K1 still count
    completed = world.deliver(proven(envelope_for_event(reboot(EventStatus.COMPLETED), NOW), "web-0", "D", "K1"))
    assert [(a.action, a.vm) for a in completed.actions] == [("restore", "web-0")]


class ProofRequests(SqliteStore):
    """The store, counting what it is asked about proof bindings (keys `proof|...`)."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self.asked: list[str] = []

    def remember(self, key: str, value: bytes) -> bytes:
        if key.startswith("proof|"):
            self.asked.append("remember")
        return super().remember(key, value)

    def recall(self, key: str) -> bytes | None:
        if key.startswith("proof|"):
            self.asked.append("recall")
        return super().recall(key)

    def taken(self) -> list[str]:
        asked, self.asked = self.asked, []
        return asked


def test_a_documents_first_value_is_asked_of_the_store_once_per_process_and_another_value_always(
    world: World,
) -> None:
    # GIVEN a store counting its proof requests, and the deps of one function process on it
    store = ProofRequests()
    process_deps = replace(world.deps(), store=store, audit=store)

    def deliver(status: EventStatus, key: str, deps: Deps = process_deps) -> str:
        return process(proven(envelope_for_event(reboot(status), NOW), "web-0", "D", key), deps, NOW).result

    # WHEN web-0's first message with document D and its key K1 comes, then its next one
    # THEN the first is read and written, the next costs nothing: this process found K1 first
    assert (deliver(EventStatus.SCHEDULED, "K1"), store.taken()) == ("processed", ["recall", "remember"])
    assert (deliver(EventStatus.STARTED, "K1"), store.taken()) == ("processed", [])

    # WHEN another process (a new instance) takes web-0's next message
    other_process = replace(process_deps, proofs_seen=ProofsSeen())
    # THEN it reads the binding once, and writes nothing
    assert (deliver(EventStatus.COMPLETED, "K1", other_process), store.taken()) == ("processed", ["recall"])

    # WHEN a key ground to match D comes to the process that knows K1, twice
    # THEN each is asked of the store, and refused
    assert [deliver(EventStatus.COMPLETED, "K2") for _ in range(2)] == ["unverified", "unverified"]
    assert store.taken() == ["recall", "recall"]
    store.close()


def test_a_forgery_that_passed_verification_first_never_makes_the_genuine_report_a_duplicate(world: World) -> None:
    # GIVEN a forgery in web-0's name that got past verification (same event, same envelope id, other
    # content: a 5 s Freeze in place of the Reboot) and was processed first
    genuine = reboot()
    forged = replace(genuine, kind=EventKind.FREEZE, duration_seconds=5)
    assert world.deliver(proven(envelope_for_event(forged, NOW), "web-0")).result == "processed"

    # WHEN web-0's genuine report arrives
    handled = world.deliver(proven(envelope_for_event(genuine, NOW), "web-0"))

    # THEN it is acted on (drained): a claim is per message, not per envelope id and VM
    assert handled.result == "processed"
    assert ("drain", "web-0") in [(a.action, a.vm) for a in handled.actions]
    assert "web-0" not in world.members()


def test_a_report_without_proof_or_with_a_proof_made_for_another_message_moves_nothing(world: World) -> None:
    event = reboot()
    bare = encode(envelope_for_event(event, NOW))
    # a genuine proof of web-0, lifted from one of its messages and put on a forged one
    lifted = json.loads(proven(envelope_for_event(reboot(EventStatus.COMPLETED), NOW), by="web-0"))[GCE_TOKEN]
    moved = json.loads(bare)
    moved[GCE_TOKEN] = lifted

    outcomes = [world.deliver(bare), world.deliver(json.dumps(moved).encode())]

    assert [o.result for o in outcomes] == ["unverified", "unverified"]
    assert world.audit("unverified") == [
        "unverified: no proof of identity",
        "unverified: the proof was made for another message",
    ]
    assert world.members() == list(SET)
    assert world.sent.commands == []


def test_a_forged_redeploy_naming_six_vms_moves_only_the_reporter_itself(world: World) -> None:
    # GIVEN a compromised web-1 reporting a Redeploy of the whole pool, itself among them
    redeploy = reboot(of="web-1", kind=EventKind.REDEPLOY, resources=SET, event_id="E-FORGED")

    # WHEN it is processed
    outcome = world.report(redeploy, by="web-1")

    # THEN only web-1 leaves the pool: a report speaks only for its own VM; and the Redeploy is not
    # approved, since that would start it for the five others still in their pools
    assert [(a.action, a.vm) for a in outcome.actions] == [("drain", "web-1"), ("none", "web-1")]
    assert world.sent.commands == []
    assert world.members() == [vm for vm in SET if vm != "web-1"]

    # AND the same Redeploy without web-1 in it moves nobody at all
    others = replace(redeploy, resources=SET[2:], event_id="E-FORGED-2")
    assert world.report(others, by="web-1").result == "not-self"
    assert world.members() == [vm for vm in SET if vm != "web-1"]
    assert world.audit("not-self") == [
        "not-self: web-1 reports an event of other VMs; only their own reports move them"
    ]


def test_a_forged_event_of_another_vm_takes_no_budget_slot(world: World) -> None:
    # GIVEN a pool that may have one VM out, and web-1 reporting a Reboot of web-2 (not of itself)
    world.policy = Policy(pools=(Pool("web", frozenset(SET), max_drained=1),))
    forged = reboot(of="web-2", reporter="web-1", resources=("web-2",), event_id="E-FORGED")
    assert world.report(forged, by="web-1").result == "not-self"

    # WHEN web-0's genuine Reboot arrives
    genuine = world.report(reboot(), by="web-0")

    # THEN it is admitted at once: the forgery holds nothing
    assert [a.action for a in genuine.actions] == ["drain", "approve"]
    assert world.store.parked("web") == []


def test_a_forged_completion_neither_puts_the_vm_back_early_nor_shadows_the_genuine_one(world: World) -> None:
    # GIVEN web-0 drained for its Reboot
    world.report(reboot(), by="web-0")
    assert "web-0" not in world.members()

    # WHEN web-1 forges web-0's completion and cancellation (its own proof; or none)
    for status in (EventStatus.COMPLETED, EventStatus.CANCELED):
        assert world.report(reboot(status), by="web-1").result == "unverified"
        assert world.deliver(encode(envelope_for_event(reboot(status), NOW))).result == "unverified"

    # THEN web-0 stays out until its own completion, which is no duplicate and puts it back
    assert "web-0" not in world.members()
    done = world.report(reboot(EventStatus.COMPLETED), by="web-0", at=NOW + timedelta(minutes=20))
    assert [(a.action, a.vm) for a in done.actions] == [("restore", "web-0")]
    assert world.members() == list(SET)


def test_a_vm_reporting_its_own_part_of_an_event_of_several_vms_does_not_end_it_for_the_others(
    world: World,
) -> None:
    # GIVEN a Reboot of web-0 and web-1, each drained on its own report
    pair: dict[str, Any] = {"resources": ("web-0", "web-1")}
    world.report(reboot(**pair), by="web-0")
    world.report(reboot(of="web-1", **pair), by="web-1")
    assert world.members() == ["web-2", "web-3", "web-4", "web-5"]

    # WHEN web-0 (compromised, or just first) reports the event completed
    world.report(reboot(EventStatus.COMPLETED, **pair), by="web-0", at=NOW + timedelta(minutes=20))

    # THEN web-0 is back and web-1 is still out, its lifecycle untouched
    assert world.members() == ["web-0", "web-2", "web-3", "web-4", "web-5"]
    late = world.report(reboot(EventStatus.STARTED, of="web-1", **pair), by="web-1", at=NOW + timedelta(minutes=21))
    assert late.decision is not None
    assert late.decision.rule == "2-started"


def test_a_forged_command_result_is_audited_as_unverified(world: World) -> None:
    result = CommandResult(command_id="c" * 32, accepted=True, event_id="E-REBOOT", target="web-0", reason="")
    envelope = envelope_for_command_result(result, Cloud.AZURE, NOW)

    assert world.deliver(proven(envelope, by="web-1")).result == "unverified"
    assert world.deliver(proven(envelope, by="web-0")).result == "command-result"
    kinds = [(record.kind, record.vm) for record in world.store.query()]
    assert kinds == [("unverified", "web-0"), ("command-result", "web-0")]


def test_without_a_verifier_nothing_is_trusted_unless_the_policy_says_reporter_name(world: World) -> None:
    body = encode(envelope_for_event(reboot(), NOW))

    # GIVEN no verifier: under the default trust (attested), nothing is acted on, and the audit says why
    outcome = process(
        body, Deps(world.store, world.pool, world.sent, world.store, Policy(), monotonic=world.clock.monotonic), NOW
    )
    assert outcome.result == "unverified"
    assert "no identity verifier is configured" in world.audit("unverified")[0]
    assert world.members() == list(SET)

    # WHEN the policy takes reporters at their word
    policy = Policy(trust="reporter-name")
    outcome = process(
        body, Deps(world.store, world.pool, world.sent, world.store, policy, monotonic=world.clock.monotonic), NOW
    )

    # THEN the reporter's own VM is moved, and the audit record says on whose word
    assert [(a.action, a.vm) for a in outcome.actions] == [("drain", "web-0"), ("approve", "web-0")]
    (event,) = [record for record in world.store.query() if record.kind == "event"]
    assert event.detail["sender"] == "reported by web-0, taken at its word (trust: reporter-name)"


def test_the_trust_setting_is_validated() -> None:
    assert policy_from_mapping({"trust": "reporter-name"}).trust == "reporter-name"
    assert Policy().trust == "attested"
    with pytest.raises(PolicyError, match="'attested'"):
        policy_from_mapping({"trust": "anyone"})
