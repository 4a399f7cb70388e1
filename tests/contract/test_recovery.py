"""An operator's recovery (functions/core/recovery.py) on every backend: SQLite, Table Storage (Azurite)
and Firestore (the emulator), as `mbridge recover` runs it on the deployment's own state."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from functions.core.policy import Policy, Pool
from functions.core.process import Deps, process
from functions.core.recovery import Recovery, RecoveryRefusedError, recover, still_drained
from tests.contract.backends import BACKENDS, NOW, Backend, open_backend, reboot
from tests.kit import FakeBalancer, FakeClock, RecordingSender
from wire.errors import PermanentError
from wire.identity import ReporterName
from wire.model import EventStatus


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    with open_backend(request) as opened:
        yield opened


def deps_on(backend: Backend, balancer: FakeBalancer, sender: RecordingSender) -> Deps:
    """The functions' ports on this backend, with a pool that may have one VM drained."""
    policy = Policy(pools=(Pool("web", frozenset({"web-0", "web-1"}), max_drained=1),))
    return Deps(
        store=backend.store,
        balancer=balancer,
        sender=sender,
        audit=backend.audit,
        policy=policy,
        verifier=ReporterName(),
        monotonic=FakeClock().monotonic,
    )


def test_a_lost_completion_is_finished_by_a_forced_recovery_which_frees_the_slot_and_is_audited(
    backend: Backend,
) -> None:
    # GIVEN web-0 drained for E1, whose completion never came, and E2 of web-1 waiting for the pool's slot
    balancer, sender = FakeBalancer({"web": ["web-0", "web-1"]}), RecordingSender()
    deps = deps_on(backend, balancer, sender)
    process(reboot(EventStatus.SCHEDULED, "E1", ("web-0",)), deps, NOW)
    process(reboot(EventStatus.SCHEDULED, "E2", ("web-1",)), deps, NOW)
    (listed,) = still_drained(backend.store)

    # WHEN an operator asks to put web-0 back, first without --force, then with it
    later = NOW + timedelta(hours=3)
    asked = Recovery(vm="web-0", event_id="e1", operator="alice", reason="completion lost; OPS-7")
    with pytest.raises(RecoveryRefusedError, match="never seen") as refused:
        recover(deps, asked, later)
    drained_before = list(balancer.drained)
    done = recover(deps, Recovery(**{**vars(asked), "force": True}), later)

    # THEN the listing showed web-0 for E1 with no end seen; the first ask changed nothing and said to check
    assert (listed.vm, listed.event_id, listed.state, listed.ended, listed.kind) == (
        "web-0",
        "e1",
        "removed",
        None,
        "reboot",
    )
    assert "--force" in str(refused.value)
    assert drained_before == ["web-0"]
    # AND the forced one put web-0 back through the completion's path: the slot went to E2, drained and approved
    assert [(taken.action.value, taken.vm) for taken in done.actions] == [
        ("restore", "web-0"),
        ("drain", "web-1"),
        ("approve", "web-1"),
    ]
    assert (balancer.drained, balancer.restored) == (["web-0", "web-1"], ["web-0"])
    assert [(entry.vm, entry.event_id) for entry in still_drained(backend.store)] == [("web-1", "e2")]
    # AND the audit log names who did what, refused and done
    recoveries = [record for record in backend.audit.query(vm="web-0") if record.kind == "recovery"]
    assert [(record.action, record.detail["operator"], record.detail["forced"]) for record in recoveries] == [
        ("none", "alice", False),
        ("restore", "alice", True),
    ]
    assert recoveries[0].reason.startswith("refused: the end of event e1 was never seen")
    assert "its end was never seen (forced): completion lost; OPS-7" in recoveries[1].reason


def test_after_a_recovery_a_late_step_of_the_event_drains_nothing_and_a_resubmitted_end_nothing_more(
    backend: Backend,
) -> None:
    # GIVEN web-0 put back by hand for E1 (its completion lost)
    balancer, sender = FakeBalancer({"web": ["web-0", "web-1"]}), RecordingSender()
    deps = deps_on(backend, balancer, sender)
    process(reboot(EventStatus.SCHEDULED, "E1", ("web-0",)), deps, NOW)
    forced = Recovery(vm="web-0", event_id="E1", operator="alice", reason="lost", force=True)
    recover(deps, forced, NOW + timedelta(hours=1))

    # WHEN a redelivered `started` of E1 arrives, and then its completion
    late = process(reboot(EventStatus.STARTED, "E1", ("web-0",)), deps, NOW + timedelta(hours=2))
    ended = process(reboot(EventStatus.COMPLETED, "E1", ("web-0",)), deps, NOW + timedelta(hours=2))

    # THEN the VM is not drained again (the recovery stored the end), and the completion finds nothing to put back
    assert [taken.reason for taken in late.actions] == [
        "late: event already completed at 2026-03-01T13:00:00Z, nothing to do"
    ]
    assert [taken.reason for taken in ended.actions] == ["nothing drained by this system"]
    assert (balancer.drained, balancer.restored) == (["web-0"], ["web-0"])


def test_a_failed_restore_keeps_the_drain_for_a_recovery_that_needs_no_force(backend: Backend) -> None:
    # GIVEN a completion processed whose restore failed for good (its end is stored, the drain kept)
    balancer, sender = FakeBalancer({"web": ["web-0", "web-1"]}), RecordingSender()
    deps = deps_on(backend, balancer, sender)
    process(reboot(EventStatus.SCHEDULED, "E1", ("web-0",)), deps, NOW)
    balancer.fail("restore", PermanentError("no role on the pool"), vm="web-0")
    with pytest.raises(PermanentError):
        process(reboot(EventStatus.COMPLETED, "E1", ("web-0",)), deps, NOW + timedelta(minutes=20))

    # WHEN the operator puts it back once the role is granted, without --force
    done = recover(
        deps, Recovery(vm="web-0", event_id="E1", operator="bob", reason="role fixed"), NOW + timedelta(hours=2)
    )

    # THEN it is back, and nothing is drained any more
    assert [(taken.action.value, taken.vm) for taken in done.actions] == [("restore", "web-0")]
    assert balancer.restored == ["web-0"]
    assert still_drained(backend.store) == []


def test_a_vm_or_event_with_no_drain_record_is_refused_and_audited(backend: Backend) -> None:
    deps = deps_on(backend, FakeBalancer({"web": ["web-0"]}), RecordingSender())
    with pytest.raises(RecoveryRefusedError, match="recover list"):
        recover(deps, Recovery(vm="web-0", event_id="E9", operator="carol", reason="?", force=True), NOW)
    (record,) = backend.audit.query(vm="web-0")
    assert (record.kind, record.action, record.detail["operator"]) == ("recovery", "none", "carol")
