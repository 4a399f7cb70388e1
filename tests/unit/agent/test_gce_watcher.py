"""The GCE key watcher and identity reads, with a scripted metadata client (no HTTP)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest

from agent.sources.gce.client import GceKeyWatcher, GceMetadataClient, GceObservation, GceReading
from agent.sources.http import MetadataHttp, MetadataUnavailableError
from tests.kit import FakeClock
from wire.gce_ids import MAINTENANCE_EVENT_KEY, UPCOMING_MAINTENANCE_KEY

NOW = datetime(2026, 11, 25, 9, 0, tzinfo=timezone.utc)


class ScriptedClient(GceMetadataClient):
    """Answers each read with the next scripted value; records what was asked."""

    def __init__(self, answers: Iterator[tuple[str | None, str]]) -> None:
        super().__init__(MetadataHttp("http://metadata.invalid", {}))
        self._answers = answers
        self.asked: list[tuple[str, bool, str | None]] = []

    def read(self, key: str, *, wait: bool = False, last_etag: str | None = None) -> GceReading:
        self.asked.append((key, wait, last_etag))
        value, etag = next(self._answers)
        return GceReading(key=key, value=value, etag=etag)


@dataclass
class Emitted:
    seen: list[str | None] = field(default_factory=list)

    def __call__(self, observation: GceObservation) -> None:
        self.seen.append(observation.reading.value)


def test_a_garbled_answer_is_not_kept_and_the_next_read_is_on_the_last_good_etag() -> None:
    # GIVEN a watcher that read NONE (etag e1)
    client = ScriptedClient(iter([("NONE", "e1"), ('"NO', "e2"), ("MIGRATE_ON_HOST_MAINTENANCE", "e3"), ("x", "e3")]))
    emitted = Emitted()
    watcher = GceKeyWatcher(client, MAINTENANCE_EVENT_KEY, emitted, clock=FakeClock(NOW, monotonic=100.0))
    watcher.step(wait=False)
    # WHEN the long-poll that carries a change comes back garbled
    with pytest.raises(MetadataUnavailableError) as failed:
        watcher.step(wait=True)
    # THEN it is a retryable failure of kind malformed, not a reading
    assert failed.value.kind == "malformed"
    assert "maintenance-event answered a value that does not parse" in str(failed.value)
    # AND the next long-poll asks on the last good ETag, so the server answers the change at once
    watcher.step(wait=True)
    assert client.asked[2] == (MAINTENANCE_EVENT_KEY, True, "e1")
    assert emitted.seen == ["NONE", "MIGRATE_ON_HOST_MAINTENANCE"]


def test_an_absent_key_is_a_reading() -> None:
    client = ScriptedClient(iter([(None, "e0")]))
    emitted = Emitted()
    GceKeyWatcher(client, UPCOMING_MAINTENANCE_KEY, emitted, clock=FakeClock(NOW, monotonic=100.0)).step(wait=False)
    assert emitted.seen == [None]


@pytest.mark.parametrize("answer", ["\x00\xff<garbage>", "12a", "-5", "1" * 21, "  "])
def test_an_instance_id_that_is_not_decimal_is_refused_for_a_retry(answer: str) -> None:
    client = ScriptedClient(iter([(answer, "e")]))
    with pytest.raises(MetadataUnavailableError) as failed:
        client.instance_id()
    assert failed.value.kind in {"malformed", "client_error"}


def test_a_decimal_instance_id_is_the_identity() -> None:
    assert ScriptedClient(iter([("4520031799277581759\n", "e")])).instance_id() == "4520031799277581759"


def test_a_long_poll_that_comes_back_unchanged_at_once_is_paced_to_a_second() -> None:
    clock = FakeClock(NOW, monotonic=100.0)
    watcher = GceKeyWatcher(ScriptedClient(iter([])), MAINTENANCE_EVENT_KEY, Emitted(), clock=clock)
    # an answer right after the request: a full second after the answer
    assert watcher.pause_after_unchanged(clock.monotonic()) == 1.0
    # an answer that took most of a second: still a full second, so no two requests share a second
    assert watcher.pause_after_unchanged(clock.monotonic() - 0.9) == 1.0
    # a long-poll the server held for a while: the next one goes out at once
    assert watcher.pause_after_unchanged(clock.monotonic() - 5.0) == 0.0


class FailingClient(GceMetadataClient):
    """Answers every read with the 503 GCE sends while a maintenance goes on."""

    def __init__(self) -> None:
        super().__init__(MetadataHttp("http://metadata.invalid", {}))

    def read(self, key: str, *, wait: bool = False, last_etag: str | None = None) -> GceReading:
        raise MetadataUnavailableError("server_error", f"GET {key} answered 503", 503)


@dataclass
class CountingStop:
    """A stop event that records each wait and is set after `waits` of them."""

    waits: int
    waited: list[float] = field(default_factory=list)

    def is_set(self) -> bool:
        return len(self.waited) >= self.waits

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.append(timeout or 0.0)
        return self.is_set()


def test_a_503_is_read_again_within_a_quarter_second_and_only_a_lasting_one_backs_off() -> None:
    # GIVEN a metadata server answering 503, as during a maintenance
    watcher = GceKeyWatcher(FailingClient(), MAINTENANCE_EVENT_KEY, Emitted(), clock=FakeClock(NOW, monotonic=100.0))
    stop = CountingStop(waits=6)

    # WHEN the watcher keeps trying
    watcher.run(stop)  # type: ignore[arg-type]

    # THEN the first retry goes out at once (a 503 lasts under a second), the next ones back off,
    # never past the 5 s cap (a live migration is announced only 60 s ahead)
    first, *later = stop.waited
    assert first <= 0.25
    assert all(0.5 <= delay <= 5.0 for delay in later)
    assert max(later) > first
