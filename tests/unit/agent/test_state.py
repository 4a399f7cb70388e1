"""The outbox and source state: atomic, ordered, durable across reopening."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agent.state import AgentState
from tests.unit.agent.full_disk import no_room_to_grow, write_until_it_fails
from wire.errors import RetryableError
from wire.transports.base import OutboundMessage


def message(n: int) -> OutboundMessage:
    return OutboundMessage(envelope_id=f"id-{n}", body=f'{{"n":{n}}}'.encode(), key="vm-0", attributes={"type": "t"})


def test_rows_come_out_in_the_order_they_went_in(tmp_path: Path) -> None:
    state = AgentState(tmp_path / "agent.db")
    state.record([(message(1), 1.0), (message(2), 2.0)], {"azure": {"e": 1}})
    state.record([(message(3), 3.0)])
    seen = []
    while (pending := state.next_pending()) is not None:
        seen.append(pending.message.envelope_id)
        state.mark_published(pending.seq, 10.0)
    assert seen == ["id-1", "id-2", "id-3"]
    assert state.depth() == 0


def test_a_failed_publish_keeps_the_row_first_in_line(tmp_path: Path) -> None:
    state = AgentState(tmp_path / "agent.db")
    state.record([(message(1), 1.0), (message(2), 2.0)])
    first = state.next_pending()
    assert first is not None
    state.mark_failed(first.seq, "bus down")
    again = state.next_pending()
    assert again is not None
    assert (again.message.envelope_id, again.attempts) == ("id-1", 1)


def test_state_and_rows_survive_reopening(tmp_path: Path) -> None:
    # GIVEN a state written and the process gone
    state = AgentState(tmp_path / "agent.db")
    state.record([(message(1), 1.0)], {"azure": {"e1": {"EventId": "e1"}}})
    state.close()

    # WHEN it is opened again
    reopened = AgentState(tmp_path / "agent.db")

    # THEN the unpublished row and the source state are there
    assert reopened.load("azure") == {"e1": {"EventId": "e1"}}
    pending = reopened.next_pending()
    assert pending is not None
    assert pending.message == message(1)


def test_state_and_rows_are_written_together_or_not_at_all(tmp_path: Path) -> None:
    # GIVEN a record whose second row fails inside the transaction, after the state was written
    state = AgentState(tmp_path / "agent.db")
    broken = OutboundMessage(envelope_id="id-x", body=object(), key="vm-0")  # type: ignore[arg-type]

    # WHEN it is recorded
    with pytest.raises(sqlite3.Error):
        state.record([(message(1), 1.0), (broken, 2.0)], {"azure": {"new": 1}})

    # THEN neither the state nor the first row was written
    assert state.load("azure") is None
    assert state.depth() == 0


def test_prune_forgets_only_published_rows(tmp_path: Path) -> None:
    state = AgentState(tmp_path / "agent.db")
    state.record([(message(1), 1.0), (message(2), 2.0)])
    first = state.next_pending()
    assert first is not None
    state.mark_published(first.seq, 5.0)
    assert state.prune(published_before=6.0) == 1
    assert [m.envelope_id for m in state.messages()] == ["id-2"]


def test_a_full_disk_is_reported_as_such_retryable_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    # GIVEN a state whose disk fills up while the agent records (the page limit: see full_disk.py)
    path = tmp_path / "agent.db"
    state = AgentState(path)
    make_room = no_room_to_grow(state._db)

    # WHEN it records until a record fails
    error = write_until_it_fails(lambda n: state.record([(message(n), float(n))], {"azure": {"n": n}}))

    # THEN the error is the full disk, naming the file, and one to retry: not a failed ROLLBACK
    # hiding it (SQLite already rolled the transaction back)
    assert isinstance(error, RetryableError), repr(error)
    assert "database or disk is full" in str(error)
    assert str(path) in str(error)
    assert "rollback" not in str(error)
    # ... and the failed record left nothing: the state and rows are those of the last good one
    written = state.depth()
    assert state.load("azure") == {"n": written - 1}

    # WHEN there is room again, THEN the same record goes through
    make_room()
    state.record([(message(written), 0.0)], {"azure": {"n": written}})
    assert (state.depth(), state.load("azure")) == (written + 1, {"n": written})
