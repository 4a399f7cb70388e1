"""While a peer of the Pub/Sub variant starts (a JVM emulator takes about ten seconds), the demo says
that it is waiting and for what, every few seconds, instead of printing nothing. The clock and the
sleep are the test's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from mbridge.demo.emulators import PeerProcess, PeerStartError, wait_ready


class Running:
    """A process that has not exited."""

    returncode = None

    def poll(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def peer(tmp_path: Path) -> PeerProcess:
    return PeerProcess("pubsub-emulator", "127.0.0.1:1", cast(Any, Running()), tmp_path / "pubsub-emulator.log")


def test_a_slow_start_is_reported_every_few_seconds_until_the_peer_is_ready(tmp_path: Path) -> None:
    clock, said = Clock(), list[str]()
    ready_at = clock.now + 12.0

    wait_ready(
        peer(tmp_path), lambda: clock.now >= ready_at, timeout=60,
        on_wait=said.append, every=5.0, monotonic=clock.monotonic, sleep=clock.sleep,
    )  # fmt: skip

    assert said == ["still waiting for pubsub-emulator (5 s)", "still waiting for pubsub-emulator (10 s)"]


def test_a_quick_start_says_nothing(tmp_path: Path) -> None:
    clock, said = Clock(), list[str]()

    wait_ready(
        peer(tmp_path), lambda: True, on_wait=said.append, every=5.0, monotonic=clock.monotonic, sleep=clock.sleep
    )

    assert said == []


def test_it_still_gives_up_at_the_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock, said = Clock(), list[str]()
    monkeypatch.setattr(PeerProcess, "stop", lambda self: None)

    with pytest.raises(PeerStartError, match="did not become ready within 12 s"):
        wait_ready(
            peer(tmp_path), lambda: False, timeout=12,
            on_wait=said.append, every=5.0, monotonic=clock.monotonic, sleep=clock.sleep,
        )  # fmt: skip

    assert len(said) == 2
