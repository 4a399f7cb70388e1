"""The fleet benchmark at a tiny size on the local bus: what it counts is what it must be."""

from __future__ import annotations

from pathlib import Path

from bench.fleet import CYCLE, CYCLE_MESSAGES, FleetSize, WaveRun, local_figures, run_local

TINY = FleetSize(
    agents=20,
    wave=5,
    wave_seconds=1.0,
    burst=5,
    lone=1,
    processes=1,
    threads=4,
    idle_window=1.0,
    wave_timeout=60.0,
)


def assert_each_event_approved_once_with_its_messages(run: WaveRun, count: int) -> None:
    assert not run.problems
    assert not run.failures
    assert len(run.events) == count
    assert set(run.approved) == set(run.events)
    assert all(run.posts[key] == 1 for key in run.events)  # one StartRequests POST per event
    for key in run.events:  # a scheduled report, the approve command and its result: nothing else
        assert run.messages[key] == CYCLE, key
    assert sum(run.kinds().values()) == CYCLE_MESSAGES * count
    assert run.exact_cycles() == count
    assert run.unsettled == 0
    assert run.invocations == 2 * count  # the report and the approval's result
    assert run.lb_writes == count  # one removal each; nothing restored before the event ends


def test_a_tiny_fleet_holds_nothing_idle_and_approves_each_event_once(tmp_path: Path) -> None:
    run = run_local(tmp_path, TINY, in_process=True)

    assert run.idle.receives_held
    assert max(run.idle.receives_held) == 0
    assert max(run.idle.paths_open) == 0
    assert run.idle.counts["receive_calls"] == 0
    assert_each_event_approved_once_with_its_messages(run.lone, TINY.lone)
    assert_each_event_approved_once_with_its_messages(run.wave, TINY.wave)
    assert_each_event_approved_once_with_its_messages(run.burst, TINY.burst)
    # The wave arrived on its schedule: spread over its seconds, not at once.
    assert 0.5 * TINY.wave_seconds < run.wave.arrival_span() < 2 * TINY.wave_seconds
    assert run.burst.arrival_span() < TINY.wave_seconds / 2
    figures = {figure.name: figure for figure in local_figures(run)}
    for name in (
        "fleet.local.idle_receives_held",
        "fleet.local.wave_approvals",
        "fleet.local.wave_commands_unsettled",
        "fleet.local.messages_per_event",
        "fleet.local.burst_approvals",
        "fleet.local.burst_commands_unsettled",
        "fleet.local.burst_messages_per_event",
    ):
        assert figures[name].met, name
    assert figures["fleet.local.burst_p99_over_lone_p99"].target is None
    assert figures["fleet.local.wave_p99_over_lone_p99"].value is not None
